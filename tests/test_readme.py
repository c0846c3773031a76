"""The README's library example runs as printed: the first thing a user copies must work and say what the README
says it prints (2SR start, three BPTT epochs, the unigram and Bayes-optimal BPC of the synthetic HMM), to the last
printed digit give or take two units (the last bits follow the CPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_library_example_prints_what_the_readme_says():
    section = (ROOT / "README.md").read_text().split("## The model in the library", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    printed = re.search(r"\nprints[^`]*?\n\n```\n(.*?)```", section, re.S)
    assert code and printed, "README: the library example and the output it prints"
    out = subprocess.run([sys.executable, "-c", code.group(1)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # the same text, each printed number within 2 units of its last digit: the C recurrence is built for the CPU
    # it runs on (-march=native), so the last bits, and after BPTT at times the third decimal, follow the machine
    number = r"-?\d+\.\d+|-?\d+"
    got, want = out.stdout, printed.group(1)
    assert re.sub(number, "#", got) == re.sub(number, "#", want), got
    for g, w in zip(re.findall(number, got), re.findall(number, want)):
        step = 10.0 ** -len(w.split(".")[1]) if "." in w else 1.0
        assert abs(float(g) - float(w)) <= 2 * step + 1e-12, (got, want)


def _exp_run_commands(text: str) -> list[str]:
    """Every `dvc exp run ...` the text shows: in fenced blocks (with their backslash continuations) and in inline
    code spans (which the Markdown may break across lines)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("dvc exp run"):
                commands.append(line)
    outside = re.sub(r"```.*?```", "", text, flags=re.S)
    commands += [" ".join(m.split()) for m in re.findall(r"`(dvc exp run[^`]*)`", outside)]
    return commands


def _sweep_values(override: str) -> list[str]:
    """A comma sweep (``key=a,b``) queues one experiment per value; a list, a mapping or a deletion is one."""
    key, eq, value = override.partition("=")
    if not eq or value[:1] in "[{" or "," not in value:
        return [override]
    return [f"{key}={v}" for v in value.split(",")]


def test_every_params_override_the_docs_show_validates(tmp_path):
    """The `-S` overrides of every `dvc exp run` in the README and the reference notes, applied by DVC's own code to
    the shipped params.yaml, give params that validate: a command a user copies must not stop on its own params
    (the Swimmer authors-mode one did: -S merges a mapping into the section, whose simulation keys remained)."""
    import shlex
    import shutil

    from dvc.utils.hydra import apply_overrides

    from pipeline.config import load_params

    commands = [c for doc in ("README.md", "docs/reference/README.md")
                for c in _exp_run_commands((ROOT / doc).read_text())]
    with_overrides = [c for c in commands if " -S" in c and "=..." not in c]   # not a placeholder (datasets=...)
    assert len(with_overrides) >= 8, commands
    for n, command in enumerate(with_overrides):
        args = shlex.split(command)
        overrides = [args[i + 1] for i, a in enumerate(args) if a == "-S"]
        sweeps = [_sweep_values(o) for o in overrides]
        for choice in range(max(len(s) for s in sweeps)):
            params = tmp_path / f"params_{n}_{choice}.yaml"
            shutil.copy(ROOT / "params.yaml", params)
            apply_overrides(str(params), [s[min(choice, len(s) - 1)] for s in sweeps])
            load_params(params)   # raises ParamsError naming the key
