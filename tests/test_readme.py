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
    printed = re.search(r"\nprints[^\n]*\n\n```\n(.*?)```", section, re.S)
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
