"""Shared helpers of the benchmark scripts: machine details, timing, peak memory, child processes, JSON results.

The benchmarks claim *ratios* measured side by side in one run; absolute times depend on the machine and on what
else runs on it, so every result file records the machine (platform, CPUs, library versions, thread counts, date).
"""

from __future__ import annotations

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


def machine_info(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where and with what a benchmark ran (imports torch only if it is already imported or importable)."""
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
        "git_commit": _git_commit(),
    }
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


def busy_warning(threads: int) -> str | None:
    """A warning when other processes already load the CPUs this benchmark wants (timings would be contended:
    OpenMP/BLAS pools that spin-wait on oversubscribed cores can run many times slower)."""
    if not hasattr(os, "getloadavg"):
        return None
    load = os.getloadavg()[0]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load + threads > cpus + 0.5:
        return (f"WARNING: load average {load:.2f} on {cpus} CPUs before starting; with {threads} thread(s) the "
                "timings will be contended (run on an idle machine for the figures you report)")
    return None


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


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


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


def one_layer_model(layer, trajectories, cfg, *, discrete: bool, vocab_size: int = 0):
    """The 1-layer initialisation that :func:`pipeline.two_stage.multilayer_two_stage` builds around a 2SR layer:
    states filtered through the training data (their mean unnormalised update sets ``mean_state``), then the
    decoder regression from states to the next observation."""
    from dataclasses import asdict

    from pipeline.two_stage import TwoStageModel, filter_states, fit_decoder

    states, mean_z = filter_states(layer, trajectories, return_unnormalised_mean=True)
    layer.mean_state = mean_z
    decoder = fit_decoder(states, trajectories, discrete=discrete, vocab_size=vocab_size, ridge=cfg.decoder_ridge)
    return TwoStageModel(layers=[layer], decoder=decoder, discrete=discrete, vocab_size=vocab_size,
                         config=asdict(cfg))


def blas_threads() -> list[int] | None:
    try:
        from threadpoolctl import threadpool_info

        return [p.get("num_threads") for p in threadpool_info()]
    except Exception:
        return None


# --------------------------------------------------------------------------------------------- output


def write_results(name: str, payload: dict[str, Any], *, quick: bool = False) -> Path:
    """Write ``benchmarks/results/<name>.json`` (``<name>_quick.json`` for smoke runs, so they never overwrite
    a full result)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}{'_quick' if quick else ''}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False, default=_json_default) + "\n")
    tmp.replace(path)
    return path


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
