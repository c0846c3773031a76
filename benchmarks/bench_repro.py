"""The wall time of the full default `dvc repro`, per stage, in a fresh copy of the project.

The README's "Timing" figure, measured by a script: the project's files as git lists them (tracked and untracked,
not ignored: the working tree that ``code_state`` records; benchmarks/results/ left out) are copied into
``<workdir>/project``, ``<workdir>/shared/data`` links to the raw-data mirror (the default params' ``data.mirror``
is ``../shared/data``, relative to the project; ``$PSRNN_DATA_MIRROR``, which the download stage prefers, is
passed on if set), and the copy becomes a git repository of one commit, as a fresh clone would be. There
``dvc repro`` runs with every ``MLFLOW_*`` and ``DVC_*`` variable removed, so the runs go to the copy's own
SQLite store (``mlflow.db``) and never to the user's. Nothing is written into this project.

Recorded: the total wall time of ``dvc repro``; per stage, the time from DVC's "Running stage" line to the next
stage's (or to the end): the command and DVC's hashing and caching of its outputs; the peak RSS of the largest
process (``getrusage(RUSAGE_CHILDREN)``: the stages); the size of the DVC cache and of the outputs (``dvc.lock``);
the MLflow runs, by experiment and status, against the runs the params ask for; the machine, the code state, the
load at the start and the CPU time other processes took during the run.

Options: ``--set KEY=VALUE`` (repeated; a dotted key of params.yaml, a YAML value: ``--set 'seeds=[0]'``) edits
the copy's params.yaml before the run; ``--target STAGE`` (repeated) runs ``dvc repro STAGE`` (its ancestors
only); ``--quick`` is a smoke run (hmm only, seed 0, psrnn and lstm, 1 epoch, the report's ancestors); ``--keep``
keeps the copy (without it the copy is removed, on a failure too: ``dvc repro`` failing, an error, Ctrl-C; the
``--set`` values are checked on this project's params.yaml before anything is copied). The timing supports the README's figure only with
the default params and every stage (no --set, --target or --quick), on an idle machine
("claims_valid", "claims_invalid_reasons" as in the other scripts).

    python benchmarks/bench_repro.py            # the full default run: ~10 min on 2 cores
    python benchmarks/bench_repro.py --quick    # smoke test
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (EXCLUDED_FROM_DIFF, ROOT, HelpFormatter, RunConditions, add_busy_arguments,  # noqa: E402
                               add_out_dir_argument, busy_footer, claim_reasons, code_state, finish_record, table,
                               usable_cpus)

#: the --quick params: one small synthetic dataset, one seed, two variants, one epoch, one 2SR depth
QUICK_SETTINGS = ("datasets=[hmm]", "seeds=[0]", "hmm.variants=[psrnn, lstm]", "hmm.train.epochs=1",
                  "hmm.two_stage.layers=1")
#: --quick runs the report and its ancestors only: the download and preprocessing of the real datasets, which
#: `dvc repro` runs whatever `datasets` lists, are not part of the smoke test
QUICK_TARGETS = ("report",)
#: the settings of the README's timing: the default params, every stage
CLAIM = {"--set": [], "--target": []}
RUNNING = re.compile(r"Running stage '([^']+)'")
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "bench_repro", "GIT_AUTHOR_EMAIL": "bench_repro@localhost",
                "GIT_COMMITTER_NAME": "bench_repro", "GIT_COMMITTER_EMAIL": "bench_repro@localhost"}


def default_mirror() -> Path:
    """The raw-data mirror as the download stage finds it from this project: ``$PSRNN_DATA_MIRROR``, else the
    default params' ``../shared/data``."""
    return Path(os.environ.get("PSRNN_DATA_MIRROR") or ROOT.parent / "shared" / "data")


def copy_project(dest: Path, mirror: Path) -> int:
    """The project's tracked and untracked, not ignored files (benchmarks/results/ left out) copied into
    ``dest/project``, and ``dest/shared/data`` linked to ``mirror``; returns the number of files copied."""
    listed = subprocess.run(["git", "-c", "core.quotepath=off", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard", "--", ".", f":(exclude){EXCLUDED_FROM_DIFF}"],
                            cwd=ROOT, capture_output=True, check=True).stdout
    project = dest / "project"
    n = 0
    for name in sorted(set(listed.decode("utf-8", "surrogateescape").split("\0")) - {""}):
        src = ROOT / name
        if not src.exists():   # deleted in the working tree, still in the index
            continue
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, project / name, follow_symlinks=False)
        n += 1
    (dest / "shared").mkdir()
    (dest / "shared" / "data").symlink_to(mirror.resolve(), target_is_directory=True)
    return n


def edited_params(params_text: str, settings: list[str]) -> str:
    """params.yaml's text with the ``KEY=VALUE`` overrides (dotted keys; values read as YAML, as DVC reads them); the
    parent of each key must exist. The edited params are validated, so a typo fails now, not minutes into the run:
    ValueError naming the ``--set`` item and what was expected."""
    from pipeline.config import ParamsError, dump_yaml, parse_params, read_yaml

    raw = read_yaml(params_text)
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item}: expected KEY=VALUE, e.g. --set 'seeds=[0]'")
        *parents, leaf = key.split(".")
        node = raw
        for i, part in enumerate(parents):
            node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                raise ValueError(f"--set {item}: params.yaml has no section {'.'.join(parents[:i + 1])}; expected "
                                 "a dotted key under an existing section")
        try:
            node[leaf] = read_yaml(value)
        except Exception as exc:   # the YAML reader's own error, whatever its type
            why = " ".join(str(exc).split())   # one line: the reader's message spans several
            raise ValueError(f"--set {item}: expected a YAML value ({type(exc).__name__}: {why})") from None
    try:
        parse_params(raw)
    except ParamsError as exc:
        raise ValueError(f"--set: the params are not valid: {exc}") from None
    return dump_yaml(raw)


def apply_settings(params_path: Path, settings: list[str]) -> None:
    """:func:`edited_params` written into ``params_path``; SystemExit with its message when a setting is refused."""
    try:
        text = edited_params(params_path.read_text(), settings)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    params_path.write_text(text)


def expected_runs(params_path: Path) -> int:
    """The MLflow runs the params ask for: every variant of every listed dataset, once per seed."""
    from pipeline.config import parse_params, read_yaml

    params = parse_params(read_yaml(params_path.read_text()))
    return len(params.seeds) * sum(len(params.dataset(name).variants) for name in params.selected)


def run_repro(project: Path, env: dict[str, str], targets: list[str]) -> tuple[float, list[dict], int, list[str]]:
    """``dvc repro [targets]`` in ``project``, its output passed through as it comes: (wall seconds, the stages in
    the order they ran with their seconds, exit status, the output's lines)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(["dvc", "repro", *targets], cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    stages: list[dict] = []
    lines: list[str] = []
    for line in proc.stdout:   # type: ignore[union-attr]
        now = time.perf_counter() - t0
        sys.stdout.write(line)
        lines.append(line.rstrip("\n"))
        match = RUNNING.search(line)
        if match:
            if stages:
                stages[-1]["seconds"] = now - stages[-1]["start_s"]
            stages.append({"stage": match.group(1), "start_s": now})
    status = proc.wait()
    total = time.perf_counter() - t0
    if stages:
        stages[-1]["seconds"] = total - stages[-1]["start_s"]
    return total, stages, status, lines


def tree_bytes(path: Path) -> int:
    """The bytes of the regular files under ``path`` (links not followed; 0 if it does not exist)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            file = os.path.join(folder, name)
            if not os.path.islink(file):
                total += os.path.getsize(file)
    return total


def output_bytes(project: Path) -> int:
    """The outputs' bytes as dvc.lock records them (every stage's ``outs``, cached or not)."""
    from pipeline.config import read_yaml

    lock = read_yaml((project / "dvc.lock").read_text())
    return sum(int(out.get("size", 0)) for stage in lock.get("stages", {}).values() for out in stage.get("outs", []))


def mlflow_runs(db: Path) -> dict:
    """The active runs of the SQLite store ``db``: their total, and counts by experiment and by status."""
    if not db.is_file():
        return {"total": 0, "by_experiment": {}, "by_status": {}}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT e.name, r.status, COUNT(*) FROM runs r JOIN experiments e "
                           "ON r.experiment_id = e.experiment_id WHERE r.lifecycle_stage = 'active' "
                           "GROUP BY e.name, r.status").fetchall()
    by_experiment: dict[str, int] = {}
    by_status: dict[str, int] = {}
    for experiment, status, n in rows:
        by_experiment[experiment] = by_experiment.get(experiment, 0) + n
        by_status[status] = by_status.get(status, 0) + n
    return {"total": sum(by_status.values()), "by_experiment": by_experiment, "by_status": by_status}


def _mib(n_bytes: int) -> float:
    return n_bytes / 2**20


def _run_in_copy(args, work: Path, project: Path, mirror: Path, settings: list[str], params_text: str | None,
                 targets: list[str], reasons: list[str], code: dict, argv: list[str] | None) -> Path:
    """Copy the project into ``work``, run ``dvc repro`` there and write the record (:func:`finish_record`: its
    claims line and path printed); returns its path."""
    t0 = time.perf_counter()
    n_files = copy_project(work, mirror)
    if params_text is not None:
        (project / "params.yaml").write_text(params_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env.update(GIT_IDENTITY, DVC_NO_ANALYTICS="1")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "-c", "commit.gpgsign=false", "commit", "-qm",
                                                               "bench_repro copy"]):
        subprocess.run(cmd, cwd=project, env=env, check=True, capture_output=True)
    setup_s = time.perf_counter() - t0
    print(f"copied {n_files} files into {project} ({setup_s:.1f} s); mirror {mirror}; "
          f"dvc repro {' '.join(targets) or '(every stage)'}" + (f"; params: {', '.join(settings)}" if settings
                                                                 else "; default params"), flush=True)

    # the stages use every CPU (torch's and BLAS's default threads)
    conditions = RunConditions(usable_cpus(), args)
    total, stages, status, lines = run_repro(project, env, targets)
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024   # KiB on Linux
    if status != 0:
        tail = "\n".join(lines[-40:])
        raise SystemExit(f"{tail}\ndvc repro failed (exit {status}) after {total:.0f} s")
    runs = mlflow_runs(project / "mlflow.db")
    expected = expected_runs(project / "params.yaml")
    if runs["total"] != expected:
        reasons.append(f"the MLflow store has {runs['total']} runs, the params ask for {expected}")

    cache_mib, outputs_mib = _mib(tree_bytes(project / ".dvc" / "cache")), _mib(output_bytes(project))
    rows = [[s["stage"], s["seconds"], 100 * s["seconds"] / total] for s in sorted(stages, key=lambda s: -s["seconds"])]
    print()
    print(table(["stage", "seconds", "% of total"], rows))
    print(f"total: {total:.1f} s ({total / 60:.1f} min) for {len(stages)} stages; peak RSS of the largest process "
          f"{peak_mib:,.0f} MiB; DVC cache {cache_mib:,.1f} MiB, outputs {outputs_mib:,.1f} MiB; MLflow runs "
          f"{runs['total']} (params: {expected})")
    if conditions.warning:
        print(busy_footer(conditions.warning))

    payload = {"benchmark": "repro", "quick": args.quick, "argv": sys.argv[1:] if argv is None else argv,
               "settings": settings, "targets": targets, "claim_settings": CLAIM, "mirror": str(mirror),
               "files_copied": n_files, "setup_seconds": setup_s, "total_seconds": total,
               "stages": [{"stage": s["stage"], "start_s": s["start_s"], "seconds": s["seconds"]} for s in stages],
               "peak_rss_mib_largest_process": peak_mib,
               "dvc_cache_mib": cache_mib, "outputs_mib": outputs_mib, "mlflow_runs": runs,
               "expected_runs": expected,
               **conditions.finish()}
    reasons += conditions.reasons
    return finish_record("repro", payload, reasons, code=code, quick=args.quick, out_dir=args.out_dir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a params.yaml override of the copy, e.g. --set 'seeds=[0]' --set ptb.train.epochs=2 "
                        "(repeated; the timing then no longer supports the README's figure; default: none)")
    p.add_argument("--target", action="append", default=[], metavar="STAGE",
                   help="run `dvc repro STAGE` (its ancestors only) instead of every stage (repeated; default: every "
                        "stage)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: " + ", ".join(QUICK_SETTINGS) + "; target " + ", ".join(QUICK_TARGETS))
    p.add_argument("--keep", action="store_true",
                   help="keep the copy, also when the run fails (its path is printed; without it the copy is removed)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="folder in which the copy is made (default: the system's temporary folder)")
    p.add_argument("--mirror", type=Path, default=None,
                   help="the raw-data mirror (default: $PSRNN_DATA_MIRROR, else ../shared/data of this project)")
    add_out_dir_argument(p)
    add_busy_arguments(p)
    args = p.parse_args(argv)
    if shutil.which("dvc") is None:
        p.error("dvc is not installed (pip install dvc)")
    mirror = args.mirror or default_mirror()
    if not mirror.is_dir():
        p.error(f"--mirror: {mirror} is not a folder (the raw-data mirror; set PSRNN_DATA_MIRROR or pass --mirror)")
    if args.workdir is not None and not args.workdir.is_dir():
        p.error(f"--workdir: {args.workdir} is not a folder (the copy is made in an existing folder)")
    settings = [*(QUICK_SETTINGS if args.quick else ()), *args.set]
    targets = args.target or (list(QUICK_TARGETS) if args.quick else [])
    try:   # checked on this project's params.yaml before anything is copied: a typo leaves nothing behind
        params_text = edited_params((ROOT / "params.yaml").read_text(), settings) if settings else None
    except ValueError as exc:
        p.error(str(exc))
    reasons = claim_reasons(args.quick, {"--set": args.set, "--target": args.target}, CLAIM)

    code = code_state()   # the code measured: taken before the copy, compared with the tree after the run
    work = Path(tempfile.mkdtemp(prefix="psrnn_repro_", dir=args.workdir))
    project = work / "project"
    try:
        _run_in_copy(args, work, project, mirror, settings, params_text, targets, reasons, code, argv)
    except BaseException as exc:   # a failure, Ctrl-C included: the copy goes unless --keep asked for it
        if args.keep:
            note = f"the copy is kept (--keep): {project}"
        else:
            shutil.rmtree(work, ignore_errors=True)
            note = f"the copy in {work} is removed (--keep keeps it)"
        if isinstance(exc, SystemExit) and isinstance(exc.code, str):
            raise SystemExit(f"{exc.code}\n{note}") from None
        print(note, file=sys.stderr)
        raise
    if args.keep:
        print(f"the copy is kept: {project}")
    else:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
