"""Shared helpers of the benchmark scripts: machine details, run conditions and claims, timing, peak memory,
child processes, JSON results.

The benchmarks claim *ratios* measured side by side in one run; absolute times depend on the machine and on what
else runs on it, so every result file records the machine (platform, CPUs, library versions, thread counts, date,
the compiled kernels), the load before the run and the CPU time other processes took during it, and whether the
run can support the claims at all (``claims_valid``, with the reasons why not).
"""

from __future__ import annotations

import argparse
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
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

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
    state now is recorded. ``load_average`` is read now, at the end of the run; the load before it is the
    record's ``load_at_start`` (:class:`RunConditions`). ``kernels`` (:func:`kernel_state`) and ``psrnn_env`` say
    whether the compiled PSRNN kernels could run."""
    import numpy as np
    import scipy

    info: dict[str, Any] = {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        # the model name first: platform.processor() is only the architecture ("x86_64") on many Linux hosts
        "processor": _cpu_model() or platform.processor() or None,
        "cpu_flags": _cpu_flags(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "memory_total_gb": _mem_total_gb(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "env_threads": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
                        if k in os.environ},
        "psrnn_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("PSRNN_")},
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
        info["kernels"] = kernel_state()
    except ImportError:
        info["torch"] = None
    info.update(extra or {})
    return info


def kernel_state() -> dict[str, Any]:
    """Which compiled kernels the PSRNN layers (and the GRU/RNN evaluation) can use in this process: without them
    the same layers run as torch ops, several times slower, and a timing would measure another implementation.

    ``native``: whether :mod:`pipeline.native`'s C library loaded (built on first use); ``native_error``: why not
    (``PSRNN_NATIVE`` off, no compiler, a failed build or load). ``triton``: the installed version (None: not
    installed). ``triton_kernels``: whether :mod:`pipeline.native.triton_kernels` loads, on a machine with CUDA
    (None without CUDA, where they never run); ``triton_error``: why not."""
    import importlib
    from importlib import metadata

    import torch

    from pipeline import native

    out: dict[str, Any] = {"native": False, "native_error": None, "triton": None, "triton_kernels": None,
                           "triton_error": None}
    if not native.enabled():
        out["native_error"] = f"disabled: PSRNN_NATIVE={os.environ.get('PSRNN_NATIVE')}"
    elif native.library() is not None:
        out["native"] = True
    else:
        try:
            native.build()
            out["native_error"] = "built, but did not load (see pipeline.native's RuntimeWarning)"
        except native.NativeBuildError as exc:
            out["native_error"] = str(exc)
    try:
        out["triton"] = metadata.version("triton")
    except metadata.PackageNotFoundError:
        pass
    if torch.cuda.is_available():
        out["triton_kernels"] = native.gpu_kernels() is not None
        if not native.gpu_enabled():
            out["triton_error"] = f"disabled: PSRNN_TRITON={os.environ.get('PSRNN_TRITON')}"
        elif not out["triton_kernels"]:
            try:
                importlib.import_module("pipeline.native.triton_kernels")
            except Exception as exc:  # what made gpu_kernels() give up, whatever it was
                out["triton_error"] = f"{type(exc).__name__}: {exc}"
    return out


# ------------------------------------------------------------------------------------ busy machine, claims


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; all of them where that is unknown)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _load_and_threshold(threads: int) -> tuple[float, int, float] | None:
    """(1-minute load average, usable CPUs, the load above which ``threads`` more threads oversubscribe them)."""
    if not hasattr(os, "getloadavg"):
        return None
    cpus = usable_cpus()
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


@dataclass
class BusyCheck:
    """What :func:`wait_until_idle` saw: the warning the run starts with (None: the machine was idle), the 1-minute
    load average when the check began and, after a wait, when the run started."""

    warning: str | None
    load_at_start: float | None
    load_after_wait: float | None = None
    waited_s: float = 0.0


def wait_until_idle(threads: int, *, wait_s: float = DEFAULT_WAIT_IDLE, allow_busy: bool = False,
                    quick: bool = False, poll_s: float = 5.0) -> BusyCheck:
    """:func:`busy_warning` at the start of a run, printed; a full run (not ``quick``, not ``allow_busy``) that
    finds the machine busy first polls the load every ``poll_s`` seconds for up to ``wait_s`` seconds and starts
    as soon as it is below the threshold (then the warning is None: the run saw an idle machine). It never refuses
    to run: if the machine is still busy after the wait, the warning is kept (and printed) and the run goes on."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    warning = busy_warning(threads)
    if warning is None:
        return BusyCheck(None, load)
    _, _, threshold = _load_and_threshold(threads)  # type: ignore[misc]
    if threshold <= 0:   # more threads than CPUs: no load is low enough, waiting would not help
        print(warning + " [the run's own threads oversubscribe the CPUs: not waiting]", flush=True)
        return BusyCheck(warning, load)
    if quick or allow_busy or wait_s <= 0:
        print(warning + (" [--allow-busy: not waiting]" if allow_busy and not quick else ""), flush=True)
        return BusyCheck(warning, load)
    print(f"{warning}\nwaiting up to {wait_s:.0f} s for the 1-minute load average to drop below {threshold:.2f} "
          "(--allow-busy starts at once, --wait-idle S sets the wait) ...", flush=True)
    t0 = time.monotonic()
    while (left := wait_s - (time.monotonic() - t0)) > 0:
        time.sleep(min(poll_s, left))
        if busy_warning(threads) is None:
            after = os.getloadavg()[0]
            print(f"load average {after:.2f} after {time.monotonic() - t0:.0f} s: starting", flush=True)
            return BusyCheck(None, load, after, time.monotonic() - t0)
    warning = busy_warning(threads)
    if warning is not None:
        warning += f" [still busy after waiting {wait_s:.0f} s]"
        print(warning + "; starting anyway", flush=True)
    return BusyCheck(warning, load, os.getloadavg()[0], time.monotonic() - t0)


#: the share of the run's CPUs that other processes may take during a run that supports the claims: on 2 CPUs,
#: 0.15 is 0.3 of one core, about what the 1-minute load threshold of the start tolerates (busy_warning)
FOREIGN_CPU_LIMIT = 0.15
#: the fewest repeats of a figure whose median supports a claim (a median of 1 or 2 is one run, or their mean)
MIN_REPEATS = 3


def _busy_cpu_seconds(cpus: Sequence[int] | None) -> float | None:
    """CPU seconds spent busy (user, nice, system, irq, softirq, steal: all but idle and iowait) by every process on
    ``cpus`` (None: all), summed since boot, from /proc/stat; None where it is absent or lacks one of them."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted = {"cpu"} if cpus is None else {f"cpu{c}" for c in cpus}
    jiffies, found = 0, set()
    for line in lines:
        name, *fields = line.split()
        if name in wanted and len(fields) >= 8:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
            jiffies += user + nice + system + irq + softirq + steal   # guest time is already in user
            found.add(name)
    return jiffies / os.sysconf("SC_CLK_TCK") if found == wanted else None


def _own_cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its children that have been waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuContention:
    """The CPU time other processes took on this run's CPUs while it ran (the busy check at the start sees only
    the load before it).

    /proc/stat counts per CPU the time every process kept it busy; less this process's own CPU time and that of
    its waited-for children (``os.times``), that is what the others took. ``foreign_cpu_share`` divides it by the
    wall time × the usable CPUs: 0 on an idle machine, 0.5 when another process kept one of two CPUs busy
    throughout. None where /proc/stat is absent."""

    def __init__(self):
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self._start = self._sample()

    def _sample(self) -> tuple[float, float | None, float]:
        return time.monotonic(), _busy_cpu_seconds(self.cpus), _own_cpu_seconds()

    def measure(self) -> dict[str, Any]:
        """From the start to now: wall time, busy CPU seconds of all and of this run, and the foreign share."""
        (wall0, busy0, own0), (wall1, busy1, own1) = self._start, self._sample()
        n_cpus = len(self.cpus) if self.cpus is not None else (os.cpu_count() or 1)
        wall, own = wall1 - wall0, own1 - own0
        rec: dict[str, Any] = {"wall_s": round(wall, 3), "cpus": n_cpus, "all_busy_cpu_s": None,
                               "own_cpu_s": round(own, 3), "foreign_cpu_share": None, "limit": FOREIGN_CPU_LIMIT}
        if busy0 is not None and busy1 is not None and wall > 0:
            rec["all_busy_cpu_s"] = round(busy1 - busy0, 3)
            # clock ticks round both counts: a share a little below 0 is an idle machine
            rec["foreign_cpu_share"] = round(max(busy1 - busy0 - own, 0.0) / (wall * n_cpus), 4)
        return rec


class RunConditions:
    """What else ran on the machine around a timed run: the busy check at its start (waiting for an idle machine
    as ``--wait-idle`` / ``--allow-busy`` say, :func:`wait_until_idle`) and the CPU contention from then to its end
    (:class:`CpuContention`). :meth:`finish` at the end gives the record's fields and :attr:`reasons`, why they
    make the run unfit for the claims."""

    def __init__(self, threads: int, args):
        self.busy = wait_until_idle(threads, wait_s=args.wait_idle, allow_busy=args.allow_busy, quick=args.quick)
        self.contention = CpuContention()
        self.reasons: list[str] = []

    @property
    def warning(self) -> str | None:
        return self.busy.warning

    def finish(self) -> dict[str, Any]:
        """The record's ``busy_warning``, ``load_at_start``, ``load_after_wait``, ``waited_s``,
        ``foreign_cpu_share`` and ``cpu_contention`` (the details); sets :attr:`reasons`."""
        contention = self.contention.measure()
        share = contention["foreign_cpu_share"]
        self.reasons = []
        if self.busy.warning is not None:
            load = self.busy.load_at_start if self.busy.load_after_wait is None else self.busy.load_after_wait
            self.reasons.append(f"the machine was busy at the start (load average {load:.2f})")
        if share is not None and share > FOREIGN_CPU_LIMIT:
            self.reasons.append(f"other processes took {share:.0%} of the CPUs during the run (limit "
                                f"{FOREIGN_CPU_LIMIT:.0%})")
        return {"busy_warning": self.busy.warning, "load_at_start": self.busy.load_at_start,
                "load_after_wait": self.busy.load_after_wait, "waited_s": round(self.busy.waited_s, 1),
                "foreign_cpu_share": share, "cpu_contention": contention}


def claim_reasons(quick: bool, settings: Mapping[str, Any], claim: Mapping[str, Any],
                  repeats: Mapping[str, int] | None = None) -> list[str]:
    """Why a run's settings cannot support the claims (empty: they can): ``--quick``, every option of ``settings``
    whose value differs from the ``claim``'s (both keyed by the option's name), and every figure of ``repeats``
    taken fewer than :data:`MIN_REPEATS` times."""
    reasons = ["--quick: smoke sizes"] if quick else []
    reasons += [f"{opt} {_setting(settings[opt])} (claim: {_setting(want)})" for opt, want in claim.items()
                if settings[opt] != want]
    reasons += [f"{opt} {n} (claim: at least {MIN_REPEATS})" for opt, n in (repeats or {}).items()
                if n < MIN_REPEATS]
    return reasons


def _setting(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def claims_valid(reasons: Sequence[str]) -> bool:
    """Whether a result may support the claims: no reason against it (settings, repeats, busy machine,
    contention, a failed peak-memory reset, a kernel fallback: each script collects its own)."""
    return not reasons


def claims_record(reasons: Sequence[str]) -> dict[str, Any]:
    """The record's ``claims_valid`` and ``claims_invalid_reasons``."""
    return {"claims_valid": claims_valid(reasons), "claims_invalid_reasons": list(reasons)}


def claims_line(reasons: Sequence[str]) -> str:
    """The last line of a run's output: ``claims_valid`` and why it is false."""
    return "\nclaims_valid: " + ("true" if claims_valid(reasons) else f"false ({'; '.join(reasons)})")


def busy_footer(warning: str | None) -> str:
    """The footer printed under a results table of a run that saw the busy warning ('' otherwise)."""
    if warning is None:
        return ""
    bar = "!" * 100
    return (f"{bar}\n!! BUSY MACHINE: {warning.removeprefix('WARNING: ')}\n"
            "!! claims_valid = false: these timings are contended; do not report them (rerun on an idle machine)\n"
            f"{bar}")


def _cpuinfo_field(name: str) -> str | None:
    """The first ``name`` line of /proc/cpuinfo (None where it is absent)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == name:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str | None:
    return _cpuinfo_field("model name")


#: the vector extensions the C recurrence (-march=native) and BLAS use when present: they explain most of the
#: difference between two CPUs' figures
CPU_FLAGS = ("avx2", "avx512f", "fma")


def _cpu_flags() -> dict[str, bool] | None:
    flags = _cpuinfo_field("flags")
    return None if flags is None else {f: f in flags.split() for f in CPU_FLAGS}


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
#: where an untracked file is code a benchmark runs (the package and the benchmarks): one there makes the tree
#: dirty, as the untracked Triton kernels measured by the first GPU record (commit b4cb67b) should have
UNTRACKED_SCOPE = ("pipeline", "benchmarks")


def _git(args: Sequence[str], root: Path) -> bytes | None:
    """stdout of ``git args`` run in ``root``; None if git is absent, fails, or ``root`` is not in a repository.
    ``--no-optional-locks``: never take the index lock, so a benchmark never gets in the way of a commit."""
    try:
        out = subprocess.run(["git", "--no-optional-locks", *args], cwd=root, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def code_state(root: Path | None = None) -> dict[str, Any]:
    """Which code a run measures: the commit and whether the files differ from it.

    ``git_commit``: ``git rev-parse HEAD``. ``git_dirty``: whether ``git status --porcelain`` lists a tracked file
    or an untracked, not ignored file lies under ``pipeline/`` or ``benchmarks/`` (:data:`UNTRACKED_SCOPE`; nothing
    under ``benchmarks/results/`` counts). When dirty, ``git_modified`` lists the changed tracked paths and
    ``git_untracked`` the untracked ones, sorted, and ``git_diff_sha256`` is the first 12 hex digits of the SHA-256
    of ``git diff HEAD`` (binary, no colour, no external diff or textconv, fixed ``a/`` ``b/`` prefixes, same
    exclusion: staged and unstaged changes alike) followed by each untracked file's name and contents (all three
    None when clean). Every field is None when git or the repository is absent."""
    root = Path(root) if root is not None else ROOT
    none: dict[str, Any] = {"git_commit": None, "git_dirty": None, "git_diff_sha256": None, "git_modified": None,
                            "git_untracked": None}
    head = _git(["rev-parse", "HEAD"], root)
    if head is None:
        return none
    exclude = f":(exclude){EXCLUDED_FROM_DIFF}"
    spec = ["--", ".", exclude]
    status = _git(["-c", "core.quotepath=off", "status", "--porcelain=v1", "-z", "--untracked-files=no", *spec],
                  root)
    untracked = _git(["-c", "core.quotepath=off", "ls-files", "-z", "--others", "--exclude-standard", "--",
                      *UNTRACKED_SCOPE, exclude], root)
    out: dict[str, Any] = {**none, "git_commit": head.decode().strip() or None}
    if status is None or untracked is None:
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
    new_files = sorted(p for p in untracked.decode("utf-8", "surrogateescape").split("\0") if p)
    out["git_dirty"] = bool(modified or new_files)
    if out["git_dirty"]:
        diff = _git(["diff", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
                     "--dst-prefix=b/", "HEAD", *spec], root)
        if diff is not None:
            digest = hashlib.sha256(diff)
            for path in new_files:
                digest.update(b"\0untracked\0" + os.fsencode(path) + b"\0" + _file_bytes(root / path))
            out["git_diff_sha256"] = digest.hexdigest()[:12]
        out["git_modified"] = sorted(modified)
        out["git_untracked"] = new_files
    return out


def _file_bytes(path: Path) -> bytes:
    """A file's contents for the code hash; a symbolic link's target; b'' for one that vanished meanwhile."""
    try:
        return b"link:" + os.fsencode(os.readlink(path)) if path.is_symlink() else path.read_bytes()
    except OSError:
        return b""


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
#: the hidden flag that makes a script's process one child measurement (:func:`run_child`)
CHILD_FLAG = "--child"


def child_report(payload: dict[str, Any]) -> None:
    """The last thing a child prints: its result as one JSON line after a marker."""
    sys.stdout.write(CHILD_MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def parse_args_or_run_child(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                            measure: Callable[[dict[str, Any]], dict[str, Any]]) -> argparse.Namespace | None:
    """``parser.parse_args(argv)``, with the hidden ``--child SPEC`` of a script that measures in fresh processes
    (:func:`run_child`). Given it, this process is one such child: ``measure`` runs on the JSON ``spec``, its result
    is reported (:func:`child_report`) and None is returned (the script ends there, exit status 0). Otherwise the
    parsed arguments."""
    parser.add_argument(CHILD_FLAG, dest="child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_report(measure(json.loads(args.child)))
        return None
    return args


def thread_env(threads: int | None) -> dict[str, str] | None:
    """The environment of a child whose BLAS/OpenMP pools have ``threads`` threads (None: inherit)."""
    if not threads:
        return None
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        env[k] = str(threads)
    return env


def run_child(script: Path, spec: Mapping[str, Any], *, timeout: float | None = None,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python script --child SPEC`` (``spec`` as JSON) in a fresh process and return the JSON it reported
    with :func:`child_report` (the script hands ``--child`` to :func:`parse_args_or_run_child`).

    A fresh process per measurement keeps time and peak memory of one implementation out of the other's.
    """
    cmd = [sys.executable, str(script), CHILD_FLAG, json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"benchmark child failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                           f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(CHILD_MARK):])


# ------------------------------------------------------------------------------------------- arguments
#
# argparse ``type=`` functions: a bad value ends the script with argparse's usage and one line naming the flag, the
# value and what was expected (``error: argument --repeats: expected a positive integer, got '0'``), exit status 2,
# before anything is measured or written.


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The scripts' --help: the description as written, and every option's help ending with its default (store_true
    flags: off) unless the help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


def int_at_least(low: int, what: str | None = None) -> Callable[[str], int]:
    """A ``type=`` function accepting integers >= ``low`` (``what`` names them in the error)."""
    what = what or ("a positive integer" if low == 1 else f"an integer >= {low}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = f"int_at_least_{low}"
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0, "an integer >= 0")


def positive_float(text: str) -> float:
    """A ``type=`` function accepting finite floats > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def positive_int_list(text: str) -> list[int]:
    """A ``type=`` function for comma-separated positive integers (``1,4,16``)."""
    items = [t.strip() for t in text.split(",")]
    try:
        values = [int(t) for t in items]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers (e.g. 1,4,16), got {text!r}")
    return values


def workspace(text: str) -> Path:
    """A ``type=`` function for ``--root``: a folder holding params.yaml (the workspace's outputs are looked up as each part needs them)."""
    root = Path(text)
    if not (root / "params.yaml").is_file():
        raise argparse.ArgumentTypeError(f"expected a workspace where the default dvc repro has run, got {text!r} "
                                         f"({'no such folder' if not root.is_dir() else 'no params.yaml in it'})")
    return root


def ptb_raw_dir(text: str) -> Path:
    """A ``type=`` function accepting a PTB raw folder: one holding ``full/ptb.train.txt``."""
    path = Path(text)
    if not (path / "full" / "ptb.train.txt").is_file():
        raise argparse.ArgumentTypeError(f"expected a PTB raw folder holding full/ptb.train.txt, got {text!r} "
                                         f"({'no such folder' if not path.is_dir() else 'no full/ptb.train.txt in it'})")
    return path


def resolve_ptb_dir(parser: argparse.ArgumentParser, raw_dir: Path | None) -> Path:
    """``--raw-dir``, else :func:`default_ptb_dir`; ends the script with ``parser.error`` when the default holds no
    PTB (``--raw-dir`` itself is checked by :func:`ptb_raw_dir`)."""
    if raw_dir is not None:
        return raw_dir
    found = default_ptb_dir()
    if not (found / "full" / "ptb.train.txt").is_file():
        parser.error(f"--raw-dir: not given, and no PTB found (no full/ptb.train.txt in $PSRNN_PTB_DIR, "
                     f"data/raw/ptb or ../shared/data/ptb: {found}); expected --raw-dir DIR")
    return found


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


def finish_record(name: str, payload: dict[str, Any], reasons: Sequence[str], *, code: dict[str, Any] | None,
                  quick: bool, out_dir: Path | None, machine: dict[str, Any] | None = None) -> Path:
    """The end of a timing script: the claims (:func:`claims_record` of ``reasons``) and the machine
    (:func:`machine_info` with the ``code`` state taken at the start) added to ``payload``, the record written
    (:func:`write_results`), and its claims line and path printed.

    ``machine``: the script's own :func:`machine_info` record, recorded as is instead (``code`` is then unused):
    one taken before the end because the reasons read it (``bench_throughput.py``: its ``kernels``), or with extra
    fields (``bench_predict.py``: ``threads``)."""
    payload.update(claims_record(reasons))
    payload["machine"] = machine if machine is not None else machine_info(code=code)
    path = write_results(name, payload, quick=quick, out_dir=out_dir)
    print(claims_line(reasons))
    print(f"results written to {path}")
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
