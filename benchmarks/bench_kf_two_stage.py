"""Streaming vs materialised linear 2SR (the Kalman filter's initialisation): time, peak memory, agreement.

On seeded synthetic continuous data (a stable linear-Gaussian system with an 8-dimensional state observed in
--obs-dim 30 dimensions, cut into --trajectories 10 trajectories), with the pipeline's ``kf`` windows on the
continuous sets (past 10, future 10, state 20): at each total length of --steps, the Kalman filter's complete 2SR
``pipeline.two_stage.linear_two_stage`` (stage 1 streamed: ``linear_stage_one``) and the same stage 2 on the
materialised stage 1 (``benchmarks.naive_two_stage.naive_linear_stage_one``: every past, future and shifted window
matrix and both stage-1 predictions held whole, and an n × f SVD) each run in a fresh subprocess. The naive side
runs only up to --naive-max-steps (it needs ~15 KB a step at these sizes).

Reported, medians of the repeats: the wall time and peak RSS of each, at every length; the ratios naive/streaming
where both ran; the streaming time per step across lengths (linear in the length) and its peak RSS (what grows with
the length is O(n·(state + obs)): the states, the observations and stage 2's residuals); and the agreement of the
two: the largest relative difference (Frobenius) of A, C, Q, R, M, x0 and P0, which must be below 1e-8 (both compute
the same estimator; they differ by rounding only).

Peak RSS (MiB) is the child's VmHWM, reset just before the 2SR call (data already generated), as in
bench_two_stage.py. The claims hold for the settings of CLAIM (the defaults) with at least 3 repeats; a --quick run,
one with other settings, or one that saw a busy machine is recorded with "claims_valid": false and its reasons.

    python benchmarks/bench_kf_two_stage.py            # 50k, 200k, 800k steps; naive up to 200k (~3 GB)
    python benchmarks/bench_kf_two_stage.py --quick    # smoke test: 2000 and 8000 steps, 1 run
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks.common import (MIN_REPEATS, HelpFormatter, RunConditions, add_busy_arguments,  # noqa: E402
                               add_out_dir_argument, blas_threads, busy_footer, claim_reasons, code_state,
                               finish_record, int_at_least, median, parse_args_or_run_child, peak_rss_mb,
                               positive_float, positive_int, positive_int_list, reset_peak_rss, rss_mb, run_child,
                               table, thread_env, usable_cpus)

SCRIPT = Path(__file__).resolve()
#: the settings the claims were measured at: the pipeline's kf params of swimmer, mocap and handwriting (windows
#: 10/10, state 20, ridge 1e-3) on 30 observed dimensions, up to 800k steps, the naive side up to 200k
CLAIM = {"--steps": [50000, 200000, 800000], "--naive-max-steps": 200000, "--obs-dim": 30, "--trajectories": 10,
         "--state-dim": 20, "--past-window": 10, "--future-window": 10, "--ridge": 1e-3}
LATENT_DIM = 8        # the order of the system that generates the data
AGREEMENT = 1e-8      # the largest relative difference of the two estimates the benchmark accepts
KEYS = ("A", "C", "Q", "R", "M", "x0", "P0")


def synthetic_series(steps: int, obs_dim: int, trajectories: int, seed: int = 0) -> list[np.ndarray]:
    """``trajectories`` trajectories of ``steps // trajectories`` steps each of a seeded, stable linear-Gaussian
    system: x_{t+1} = A x_t + w_t, o_t = C x_t + v_t (spectral radius of A 0.95, unit-variance noises)."""
    rng = np.random.default_rng(seed)
    A = 0.95 * np.linalg.qr(rng.normal(size=(LATENT_DIM, LATENT_DIM)))[0]
    C = rng.normal(size=(obs_dim, LATENT_DIM)) / np.sqrt(LATENT_DIM)
    length = steps // trajectories
    x = np.zeros((length, trajectories, LATENT_DIM))
    w = rng.normal(size=x.shape)
    for t in range(1, length):   # all trajectories at once, one step at a time
        x[t] = x[t - 1] @ A.T + w[t]
    o = x @ C.T + 0.5 * rng.normal(size=(length, trajectories, obs_dim))
    return [np.ascontiguousarray(o[:, i]) for i in range(trajectories)]


def child_main(spec: dict) -> dict:
    """One measurement in this (fresh) process: generate the data, run one linear 2SR, save its estimate; returns
    the report."""
    from pipeline.two_stage import linear_stage_one, linear_stage_two

    if spec["impl"] == "naive":
        from benchmarks.naive_two_stage import naive_linear_stage_one as stage_one
    else:
        stage_one = linear_stage_one
    kw = {k: spec[k] for k in ("state_dim", "past_window", "future_window", "ridge")}
    # untimed: the first call's imports and thread-pool start-up, for both methods alike
    linear_stage_two(stage_one(synthetic_series(2000, spec["obs_dim"], 2, seed=1), **kw), ridge=kw["ridge"])
    trajs = synthetic_series(spec["steps"], spec["obs_dim"], spec["trajectories"])
    gc.collect()
    rss0 = rss_mb()
    reset_ok = reset_peak_rss()
    t0 = time.perf_counter()
    lss = linear_stage_two(stage_one(trajs, **kw), ridge=kw["ridge"])
    seconds = time.perf_counter() - t0
    peak = peak_rss_mb()
    if spec.get("save"):
        np.savez(spec["save"], **{k: getattr(lss, k) for k in KEYS})
    return {"impl": spec["impl"], "steps": sum(len(t) for t in trajs), "seconds": seconds,
            "peak_rss_mb": peak, "rss_before_mb": rss0,
            "peak_delta_mb": None if rss0 is None or not reset_ok else peak - rss0, "peak_reset": reset_ok,
            "blas_threads": blas_threads()}


def _child(spec: dict, args) -> dict:
    res = run_child(SCRIPT, spec, timeout=args.timeout, env=thread_env(args.threads))
    print(f"  {res['impl']:9s} {res['steps']:>9,d} steps: {res['seconds']:8.2f} s, peak {res['peak_rss_mb']:8.1f} MiB",
          flush=True)
    return res


def _summary(runs: list[dict]) -> dict:
    deltas = [r["peak_delta_mb"] for r in runs if r.get("peak_delta_mb") is not None]
    return {"n": len(runs), "steps": runs[0]["steps"], "seconds": median([r["seconds"] for r in runs]),
            "peak_rss_mb": median([r["peak_rss_mb"] for r in runs]),
            "peak_delta_mb": median(deltas) if deltas else None,
            "seconds_all": [r["seconds"] for r in runs], "peak_rss_mb_all": [r["peak_rss_mb"] for r in runs],
            "peak_reset": all(r["peak_reset"] for r in runs), "blas_threads": [r["blas_threads"] for r in runs]}


def _agreement(naive: Path, streaming: Path) -> dict[str, float]:
    """The relative difference ‖streaming − naive‖ / ‖naive‖ of every estimated matrix."""
    with np.load(naive) as a, np.load(streaming) as b:
        return {k: float(np.linalg.norm(b[k] - a[k]) / max(np.linalg.norm(a[k]), 1e-300)) for k in KEYS}


def compare(args) -> dict:
    print(f"\n== naive vs streaming linear 2SR (Kalman filter): {args.obs_dim} observed dimensions, "
          f"{args.trajectories} trajectories, windows {args.past_window}/{args.future_window}, state "
          f"{args.state_dim}; naive up to {args.naive_max_steps:,d} steps; {args.repeats} run(s) each, interleaved, "
          "medians ==")
    base = {"obs_dim": args.obs_dim, "trajectories": args.trajectories, "state_dim": args.state_dim,
            "past_window": args.past_window, "future_window": args.future_window, "ridge": args.ridge}
    runs: dict[tuple[int, str], list[dict]] = {}
    agreement: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_kf_") as tmp:
        for r in range(args.repeats):
            for steps in args.steps:
                impls = ("naive", "streaming") if steps <= args.naive_max_steps else ("streaming",)
                for impl in impls:   # interleaved, so that load from other processes hits both alike
                    save = str(Path(tmp) / f"{impl}_{steps}.npz") if r == 0 and len(impls) == 2 else None
                    runs.setdefault((steps, impl), []).append(_child({**base, "impl": impl, "steps": steps,
                                                                      "save": save}, args))
                if r == 0 and len(impls) == 2:
                    agreement[str(steps)] = _agreement(Path(tmp) / f"naive_{steps}.npz",
                                                       Path(tmp) / f"streaming_{steps}.npz")
    res: dict = {"naive": {}, "streaming": {}, "ratios": {}, "agreement": agreement}
    for (steps, impl), v in runs.items():
        res[impl][str(steps)] = _summary(v)
    nan = float("nan")
    rows = []
    first = res["streaming"][str(args.steps[0])]
    for steps in args.steps:
        s, n = res["streaming"][str(steps)], res["naive"].get(str(steps))
        ratio = {}
        if n is not None:
            ratio = {"speedup": n["seconds"] / s["seconds"], "peak_ratio": n["peak_rss_mb"] / s["peak_rss_mb"]}
            if n["peak_delta_mb"] and s["peak_delta_mb"]:
                ratio["peak_delta_ratio"] = n["peak_delta_mb"] / s["peak_delta_mb"]
            res["ratios"][str(steps)] = ratio
        s["time_per_step_ratio"] = (s["seconds"] / s["steps"]) / (first["seconds"] / first["steps"])
        worst = max(agreement[str(steps)].values()) if str(steps) in agreement else nan
        rows.append([s["steps"], n["seconds"] if n else nan, s["seconds"], ratio.get("speedup", nan),
                     n["peak_rss_mb"] if n else nan, s["peak_rss_mb"], ratio.get("peak_ratio", nan),
                     s["time_per_step_ratio"], worst])
    print(table(["steps", "naive s", "streaming s", "speedup", "naive peak MiB", "streaming peak MiB", "peak ratio",
                 "streaming s/step vs first", "max rel diff"], rows))
    print("medians; the complete linear_two_stage (stage 1 and 2); s/step vs first <= ~1: linear in the length; "
          f"max rel diff: the largest of A, C, Q, R, M, x0, P0 (must be < {AGREEMENT:g})")
    worst_all = max((max(a.values()) for a in agreement.values()), default=None)
    res["max_relative_difference"] = worst_all
    res["agree"] = None if worst_all is None else worst_all < AGREEMENT
    if worst_all is not None:
        print(f"agreement naive vs streaming: max relative difference {worst_all:.2e} "
              f"({'holds' if res['agree'] else 'FAILS'} < {AGREEMENT:g})")
    if args.busy:
        print(busy_footer(args.busy))
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke test: 2000 and 8000 steps, 1 repeat")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="runs of every figure, at least 1, median reported (default 3; --quick: 1 unless given)")
    p.add_argument("--steps", type=positive_int_list, default=CLAIM["--steps"],
                   help="comma-separated total lengths of the data, in steps (default 50000,200000,800000)")
    p.add_argument("--naive-max-steps", type=int_at_least(0, "an integer >= 0"), default=CLAIM["--naive-max-steps"],
                   help="run the naive side only at lengths up to this (0: never)")
    p.add_argument("--obs-dim", type=positive_int, default=CLAIM["--obs-dim"], help="observed dimensions")
    p.add_argument("--trajectories", type=positive_int, default=CLAIM["--trajectories"],
                   help="trajectories the steps are cut into")
    p.add_argument("--state-dim", type=positive_int, default=CLAIM["--state-dim"], help="the KF's state size")
    p.add_argument("--past-window", type=positive_int, default=CLAIM["--past-window"], help="history window")
    p.add_argument("--future-window", type=positive_int, default=CLAIM["--future-window"], help="future window")
    p.add_argument("--ridge", type=positive_float, default=CLAIM["--ridge"], help="the 2SR ridge ratio")
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="seconds allowed per child process (default: no limit)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="BLAS/OpenMP threads of the children (default: inherited)")
    p.add_argument("--tag", default=None, help="suffix of the results file: results/kf_two_stage_<tag>.json")
    add_out_dir_argument(p)
    add_busy_arguments(p)
    args = parse_args_or_run_child(p, argv, child_main)
    if args is None:   # --child: one measurement, reported
        return 0
    if args.quick and args.steps == CLAIM["--steps"]:
        args.steps = [2000, 8000]
    if args.repeats is None:   # an explicit --repeats is kept, --quick or not
        args.repeats = 1 if args.quick else 3
    shortest = min(args.steps) // args.trajectories
    if shortest < args.past_window + args.future_window + 2:
        p.error(f"--steps {min(args.steps)}: expected at least {args.trajectories} x (past + future window + 2) = "
                f"{args.trajectories * (args.past_window + args.future_window + 2)} steps (each trajectory needs "
                "two consecutive windows)")
    if args.state_dim > args.future_window * args.obs_dim:
        p.error(f"--state-dim {args.state_dim}: expected at most --future-window x --obs-dim = "
                f"{args.future_window * args.obs_dim}")
    code = code_state()
    conditions = RunConditions(args.threads or usable_cpus(), args)
    args.busy = conditions.warning
    t0 = time.perf_counter()
    settings = {"--steps": args.steps, "--naive-max-steps": args.naive_max_steps, "--obs-dim": args.obs_dim,
                "--trajectories": args.trajectories, "--state-dim": args.state_dim,
                "--past-window": args.past_window, "--future-window": args.future_window, "--ridge": args.ridge}
    reasons = claim_reasons(args.quick, settings, CLAIM, {"--repeats": args.repeats})
    payload: dict = {"benchmark": "kf_two_stage", "quick": args.quick,
                     "argv": sys.argv[1:] if argv is None else argv, "settings": settings,
                     "repeats": args.repeats, "child_threads": args.threads,
                     "claim_settings": {"kf": CLAIM, "min_repeats": MIN_REPEATS}}
    payload["compare"] = compare(args)
    payload["total_seconds"] = time.perf_counter() - t0
    payload.update(conditions.finish())
    summaries = [s for impl in ("naive", "streaming") for s in payload["compare"][impl].values()]
    if not all(s["peak_reset"] for s in summaries):
        reasons.append("a child could not reset its peak RSS (/proc/self/clear_refs): the peaks include the data")
    if payload["compare"]["agree"] is False:
        reasons.append(f"the two estimates differ by more than {AGREEMENT:g}")
    reasons += conditions.reasons
    finish_record("kf_two_stage" + (f"_{args.tag}" if args.tag else ""), payload, reasons, code=code,
                  quick=args.quick, out_dir=args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
