"""Shared helpers of the benchmark scripts: machine details, timing, peak memory, child processes, JSON results.

The benchmarks claim *ratios* measured side by side in one run; absolute times depend on the machine and on what
else runs on it, so every result file records the machine (platform, CPUs, library versions, thread counts, date).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
if str(ROOT) not in sys.path:  # scripts are run as `python benchmarks/x.py`: make `pipeline` importable
    sys.path.insert(0, str(ROOT))

PTB_TRAIN_CHARS = 120780   # the paper's PTB train length (first 1001 lines)
PTB_TEST_CHARS = 124767    # test, after dropping the 7 characters unseen in train


# ---------------------------------------------------------------------------------------------- machine


def machine_info(extra: dict[str, Any] | None = None, *, code: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where and with what a benchmark ran (imports torch only if it is already imported or importable).

    ``code`` is :func:`code_state` taken when the run started (the code that was measured); it is recorded, and
    ``git_changed_during_run`` says whether the working tree differs now (None when unknown). Without it, the
    state now is recorded."""
    import numpy as np
    import scipy

    info: dict[str, Any] = {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or _cpu_model(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "memory_total_gb": _mem_total_gb(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "env_threads": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
                        if k in os.environ},
    }
    info.update(_code_record(code))
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [{k: p.get(k) for k in ("internal_api", "num_threads", "version")} for p in threadpool_info()]
    except Exception:  # threadpoolctl is optional
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_interop_threads"] = torch.get_num_interop_threads()
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["cuda_device"] = torch.cuda.get_device_name(0)
            info["cuda_version"] = torch.version.cuda
            info["cudnn_version"] = torch.backends.cudnn.version()
    except ImportError:
        info["torch"] = None
    info.update(extra or {})
    return info


def _load_and_threshold(threads: int) -> tuple[float, int, float] | None:
    """(1-minute load average, usable CPUs, the load above which ``threads`` more threads oversubscribe them)."""
    if not hasattr(os, "getloadavg"):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return os.getloadavg()[0], cpus, cpus + 0.5 - threads


def busy_warning(threads: int) -> str | None:
    """A warning when other processes already load the CPUs this benchmark wants (timings would be contended:
    OpenMP/BLAS pools that spin-wait on oversubscribed cores can run many times slower): the 1-minute load
    average plus ``threads`` exceeds the CPUs + 0.5, i.e. the load is above ``CPUs + 0.5 - threads``."""
    state = _load_and_threshold(threads)
    if state is None:
        return None
    load, cpus, threshold = state
    if load > threshold:
        return (f"WARNING: load average {load:.2f} on {cpus} CPUs before starting; with {threads} thread(s) the "
                "timings will be contended (run on an idle machine for the figures you report)")
    return None


DEFAULT_WAIT_IDLE = 120.0   # seconds a full run waits for a busy machine to become idle (--wait-idle)


def add_busy_arguments(parser) -> None:
    """``--allow-busy`` and ``--wait-idle S``, the same in every timing script."""
    parser.add_argument("--allow-busy", action="store_true",
                        help="start at once even when the machine is busy (the run is still marked "
                             "claims_valid: false)")
    parser.add_argument("--wait-idle", type=float, default=DEFAULT_WAIT_IDLE, metavar="S",
                        help="a full run that finds the machine busy first waits up to S seconds for the 1-minute "
                             "load average to drop below the threshold, then starts anyway, with the warning "
                             "(default %(default)s; 0: do not wait; --quick runs never wait)")


def wait_until_idle(threads: int, *, wait_s: float = DEFAULT_WAIT_IDLE, allow_busy: bool = False,
                    quick: bool = False, poll_s: float = 5.0) -> str | None:
    """:func:`busy_warning` at the start of a run, printed; a full run (not ``quick``, not ``allow_busy``) that
    finds the machine busy first polls the load every ``poll_s`` seconds for up to ``wait_s`` seconds and starts
    as soon as it is below the threshold (then None: the run saw an idle machine). It never refuses to run: if the
    machine is still busy after the wait, the warning is returned (and printed) and the run goes on."""
    warning = busy_warning(threads)
    if warning is None:
        return None
    _, _, threshold = _load_and_threshold(threads)  # type: ignore[misc]
    if threshold <= 0:   # more threads than CPUs: no load is low enough, waiting would not help
        print(warning + " [the run's own threads oversubscribe the CPUs: not waiting]", flush=True)
        return warning
    if quick or allow_busy or wait_s <= 0:
        print(warning + (" [--allow-busy: not waiting]" if allow_busy and not quick else ""), flush=True)
        return warning
    print(f"{warning}\nwaiting up to {wait_s:.0f} s for the 1-minute load average to drop below {threshold:.2f} "
          "(--allow-busy starts at once, --wait-idle S sets the wait) ...", flush=True)
    t0 = time.monotonic()
    while (left := wait_s - (time.monotonic() - t0)) > 0:
        time.sleep(min(poll_s, left))
        if busy_warning(threads) is None:
            print(f"load average {os.getloadavg()[0]:.2f} after {time.monotonic() - t0:.0f} s: starting", flush=True)
            return None
    warning = busy_warning(threads)
    if warning is not None:
        warning += f" [still busy after waiting {wait_s:.0f} s]"
        print(warning + "; starting anyway", flush=True)
    return warning


def claims_valid(quick: bool, warning: str | None) -> bool:
    """Whether a result may support the claims: a full run (not ``--quick``) that did not see the busy warning."""
    return not quick and warning is None


def claims_line(quick: bool, warning: str | None) -> str:
    """The last line of a run's output: ``claims_valid`` and why it is false."""
    why = [w for w, on in (("--quick: smoke sizes", quick), ("the machine was busy", warning is not None)) if on]
    return f"\nclaims_valid: {str(claims_valid(quick, warning)).lower()}" + (f" ({'; '.join(why)})" if why else "")


def busy_footer(warning: str | None) -> str:
    """The footer printed under a results table of a run that saw the busy warning ('' otherwise)."""
    if warning is None:
        return ""
    bar = "!" * 100
    return (f"{bar}\n!! BUSY MACHINE: {warning.removeprefix('WARNING: ')}\n"
            "!! claims_valid = false: these timings are contended; do not report them (rerun on an idle machine)\n"
            f"{bar}")


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _mem_total_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    return None


#: what the benchmarks write; a run's own output is not a change of the code it measured
EXCLUDED_FROM_DIFF = "benchmarks/results"


def _git(args: Sequence[str], root: Path) -> bytes | None:
    """stdout of ``git args`` run in ``root``; None if git is absent, fails, or ``root`` is not in a repository.
    ``--no-optional-locks``: never take the index lock, so a benchmark never gets in the way of a commit."""
    try:
        out = subprocess.run(["git", "--no-optional-locks", *args], cwd=root, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def code_state(root: Path | None = None) -> dict[str, Any]:
    """Which code a run measures: the commit and whether the tracked files differ from it.

    ``git_commit``: ``git rev-parse HEAD``. ``git_dirty``: whether ``git status --porcelain`` lists a tracked file
    (untracked files are not counted; neither is anything under ``benchmarks/results/``). When dirty,
    ``git_diff_sha256`` is the first 12 hex digits of the SHA-256 of ``git diff HEAD`` (binary, no colour, no
    external diff or textconv, fixed ``a/`` ``b/`` prefixes, same exclusion: staged and unstaged changes alike) and
    ``git_modified`` the changed paths, sorted (both None when clean). Every field is None when git or the
    repository is absent."""
    root = Path(root) if root is not None else ROOT
    none: dict[str, Any] = {"git_commit": None, "git_dirty": None, "git_diff_sha256": None, "git_modified": None}
    head = _git(["rev-parse", "HEAD"], root)
    if head is None:
        return none
    spec = ["--", ".", f":(exclude){EXCLUDED_FROM_DIFF}"]
    status = _git(["-c", "core.quotepath=off", "status", "--porcelain=v1", "-z", "--untracked-files=no", *spec],
                  root)
    out: dict[str, Any] = {**none, "git_commit": head.decode().strip() or None}
    if status is None:
        return out
    modified, entries = set(), status.decode("utf-8", "surrogateescape").split("\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        modified.add(entry[3:])
        if entry[0] in "RC":   # a rename or copy: the next entry is the source path (a rename removed it)
            if entry[0] == "R" and i < len(entries) and entries[i]:
                modified.add(entries[i])
            i += 1
    out["git_dirty"] = bool(modified)
    if modified:
        diff = _git(["diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
                     "--dst-prefix=b/", "HEAD", *spec], root)
        out["git_diff_sha256"] = hashlib.sha256(diff).hexdigest()[:12] if diff is not None else None
        out["git_modified"] = sorted(modified)
    return out


def _code_record(start: dict[str, Any] | None) -> dict[str, Any]:
    now = code_state()
    if start is None:
        return {**now, "git_changed_during_run": None}
    changed = None if start.get("git_commit") is None or now.get("git_commit") is None else now != start
    return {**start, "git_changed_during_run": changed}


# ----------------------------------------------------------------------------------------- time, memory


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_mb() -> float | None:
    """Current resident set size of this process (MiB), from /proc (None elsewhere)."""
    kb = _status_kb("VmRSS")
    return None if kb is None else kb / 1024


def peak_rss_mb() -> float:
    """Peak resident set size of this process (MiB): VmHWM from /proc, else getrusage."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb / 1024
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


# ------------------------------------------------------------------------------------------- children

CHILD_MARK = "BENCH_RESULT_JSON: "


def child_report(payload: dict[str, Any]) -> None:
    """The last thing a child prints: its result as one JSON line after a marker."""
    sys.stdout.write(CHILD_MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def thread_env(threads: int | None) -> dict[str, str] | None:
    """The environment of a child whose BLAS/OpenMP pools have ``threads`` threads (None: inherit)."""
    if not threads:
        return None
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        env[k] = str(threads)
    return env


def run_child(script: Path, args: Sequence[str], *, timeout: float | None = None,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python script args`` in a fresh process and return the JSON it reported with :func:`child_report`.

    A fresh process per measurement keeps time and peak memory of one implementation out of the other's.
    """
    cmd = [sys.executable, str(script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"benchmark child failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                           f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(CHILD_MARK):])


# ------------------------------------------------------------------------------------------------ data


def default_ptb_dir() -> Path:
    """``$PSRNN_PTB_DIR``, else the pipeline's ``data/raw/ptb``, else the shared mirror ``../shared/data/ptb``."""
    env = os.environ.get("PSRNN_PTB_DIR")
    candidates = [Path(env)] if env else []
    candidates += [ROOT / "data" / "raw" / "ptb", ROOT.parent / "shared" / "data" / "ptb",
                   Path("/work/shared/data/ptb")]
    for c in candidates:
        if (c / "full" / "ptb.train.txt").is_file():
            return c
    return candidates[0]


def load_ptb(raw_dir: Path, lines: int | None = 1001):
    """The character-level PTB dataset as the pipeline prepares it (one trajectory per split)."""
    from pipeline.data.ptb import prepare_ptb

    return prepare_ptb(Path(raw_dir), lines=lines)


def one_layer_model(layer, trajectories, cfg, *, discrete: bool, vocab_size: int = 0,
                    timings: dict[str, float] | None = None):
    """The 1-layer initialisation that :func:`pipeline.two_stage.multilayer_two_stage` builds around a 2SR layer:
    states filtered through the training data (their mean unnormalised update sets ``mean_state``), then the
    decoder regression from states to the next observation (softmax by L-BFGS when discrete). ``timings``, if
    given, receives the wall times of the two steps: ``filter_s`` and ``decoder_s``."""
    from dataclasses import asdict

    from pipeline.two_stage import TwoStageModel, filter_states, fit_decoder

    (states, mean_z), filter_s = timed(lambda: filter_states(layer, trajectories, return_unnormalised_mean=True))
    layer.mean_state = mean_z
    decoder, decoder_s = timed(lambda: fit_decoder(states, trajectories, discrete=discrete, vocab_size=vocab_size,
                                                   ridge=cfg.decoder_ridge))
    if timings is not None:
        timings.update(filter_s=filter_s, decoder_s=decoder_s)
    return TwoStageModel(layers=[layer], decoder=decoder, discrete=discrete, vocab_size=vocab_size,
                         config=asdict(cfg))


def blas_threads() -> list[int] | None:
    try:
        from threadpoolctl import threadpool_info

        return [p.get("num_threads") for p in threadpool_info()]
    except Exception:
        return None


# --------------------------------------------------------------------------------------------- output


def write_results(name: str, payload: dict[str, Any], *, quick: bool = False,
                  out_dir: Path | None = None) -> Path:
    """Write ``<out_dir>/<name>.json``, by default ``benchmarks/results/`` (``<name>_quick.json`` for smoke runs,
    so they never overwrite a full result)."""
    out_dir = Path(out_dir) if out_dir is not None else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}{'_quick' if quick else ''}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False, default=_json_default) + "\n")
    tmp.replace(path)
    return path


def add_out_dir_argument(parser) -> None:
    parser.add_argument("--out-dir", type=Path, default=None, metavar="DIR",
                        help="folder of the results file (default: benchmarks/results/; tests use a temporary one)")


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:
        pass
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table (also valid Markdown)."""
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(str(c).rjust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in cells)])


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        if c != c:
            return "nan"
        if abs(c) >= 1000:
            return f"{c:,.0f}"
        if abs(c) >= 10:
            return f"{c:.1f}"
        return f"{c:.3g}" if abs(c) < 0.01 and c != 0 else f"{c:.3f}"
    return str(c)
