"""Streaming vs materialised 2SR on PTB: speed, peak memory, epoch-0 BPC (part A); streaming scaling (part B).

A. On the PTB training stream (default: the paper's 1001 lines, 120780 characters), 2000 RFF per family, history
   and future windows of 5, state 20: the naive 2SR (benchmarks/naive_two_stage.py) and the streaming 2SR
   (pipeline.two_stage.regress_layer: the regressions of two_stage_regression, with its defaults: randomised range
   finder, float32 feature chunks) each run in a fresh subprocess, which then completes the initialisation as
   multilayer_two_stage does: one filtering pass over the training data (filter_states) and the softmax decoder
   fitted by L-BFGS (fit_decoder), each timed. Reported (medians of the repeats): the 2SR wall time and its peak
   RSS, the filter and decoder times, two ratios
     * speedup = naive / streaming 2SR time: the regressions alone, what the >= 10x claim is about;
     * end-to-end initialisation speedup = (naive 2SR + filter + decoder) / (streaming 2SR + filter + decoder);
   and the epoch-0 test BPC of the 1-layer PSRNN each initialises (pipeline.api.initialise_model and
   pipeline.train.evaluate on the whole PTB test stream). Claim: the two BPCs differ by less than 0.01 bits.

B. The streaming 2SR at 1x, 4x and 16x the PTB training length (the first N characters of full/ptb.train.txt):
   time (should grow at most linearly) and peak RSS (should stay roughly flat).

Each child first runs its 2SR once, untimed, on the first 2000 characters with 64 features: the first call's costs
(imports, BLAS thread pools) stay out of every timing, the 1x base of part B's ratios included.

Peak RSS (MiB) is the child's VmHWM, reset (``/proc/self/clear_refs``) just before the 2SR call, so it is the peak
while the 2SR ran (data already loaded; torch is imported only afterwards, for the BPC). ``peak_delta`` subtracts
the RSS at the reset, i.e. what the 2SR itself added. A child that could not reset it records ``peak_reset``
false, and the run is not valid for the claims.

The claims hold for the settings of CLAIM_A and CLAIM_B (the defaults) with at least 3 repeats of each figure; a
run with other settings, a --quick one, one that saw the busy warning or whose CPUs other processes took more than
15% of (common.FOREIGN_CPU_LIMIT) is recorded with "claims_valid": false and its "claims_invalid_reasons". A full
run that finds the machine busy waits up to --wait-idle seconds for it to become idle, then runs anyway.

    python benchmarks/bench_two_stage.py            # full sizes (naive needs ~10 GB of RAM and minutes)
    python benchmarks/bench_two_stage.py --quick    # smoke test: 5000 / 2000-32000 characters, 200 RFF, 1 run
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (MIN_REPEATS, PTB_TEST_CHARS, PTB_TRAIN_CHARS, HelpFormatter,  # noqa: E402
                               RunConditions, add_busy_arguments, int_at_least, positive_float, positive_int,
                               positive_int_list, ptb_raw_dir, resolve_ptb_dir, add_out_dir_argument, blas_threads,
                               busy_footer, claim_reasons, code_state, finish_record, load_ptb, median,
                               one_layer_model, parse_args_or_run_child, peak_rss_mb, reset_peak_rss, rss_mb,
                               run_child, table, thread_env, usable_cpus)

SCRIPT = Path(__file__).resolve()
#: the settings part A's claims (>= 10x, peak memory, BPC within 0.01) were measured at: the paper's PTB train and
#: test splits, the pipeline's 2000 RFF and state 20, windows of 5 and 5, the library's randomised range finder,
#: the naive side and the BPC present (the pipeline's PTB params use a future window of 1; the records and the
#: README's figures of this comparison are at 5)
CLAIM_A = {"--lines": 1001, "--train-chars": PTB_TRAIN_CHARS, "--test-chars": PTB_TEST_CHARS, "--n-features": 2000,
           "--state-dim": 20, "--past-window": 5, "--future-window": 5, "--svd": "randomized", "--skip-naive": False,
           "--no-bpc": False}
#: part B's (time at most linear, memory flat): the same 2SR at 1x, 4x and 16x the PTB train length
CLAIM_B = {"--scales": [1, 4, 16], "--base-chars": PTB_TRAIN_CHARS, "--n-features": 2000, "--state-dim": 20,
           "--past-window": 5, "--future-window": 5, "--svd": "randomized"}
WARMUP_CHARS, WARMUP_FEATURES = 2000, 64   # the untimed first 2SR of every child
PARTS = ("a", "b", "ab")


def parts_value(text: str) -> str:
    """--parts: 'a', 'b' or 'ab' ('ba' is 'ab'); anything else is refused when parsed, before anything runs (an
    unknown part once ran nothing and still wrote, over the real record, one that held no measurement)."""
    value = "".join(sorted(set(text)))
    if not text or len(text) != len(value) or value not in PARTS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(PARTS)}, got {text!r}")
    return value


# ------------------------------------------------------------------------------------------------- child


def child_main(spec: dict) -> dict:
    """One measurement in this (fresh) process: load PTB, run one 2SR; optionally (``init``) complete the
    initialisation (filter + decoder, timed) and (``bpc``) evaluate its epoch-0 test BPC; returns the report."""
    from pipeline.two_stage import TwoStageConfig, regress_layer

    ds = load_ptb(Path(spec["raw_dir"]), spec["lines"])
    train = ds.train[0]
    if spec.get("train_chars"):
        if spec["train_chars"] > len(train):
            raise ValueError(f"asked for {spec['train_chars']} training characters, the file has {len(train)}")
        train = train[: spec["train_chars"]].copy()
    V = len(ds.vocab)
    cfg = TwoStageConfig(**spec["cfg"])
    if spec["impl"] == "naive":
        from benchmarks.naive_two_stage import naive_two_stage_regression as fn
    else:
        fn = regress_layer  # the regressions, as the naive method does them (no mean-state filtering pass)
    # untimed: the first call's imports and thread-pool start-up, for both methods alike
    fn([train[:WARMUP_CHARS]], TwoStageConfig(**{**spec["cfg"], "n_features": WARMUP_FEATURES}), discrete=True,
       vocab_size=V)
    gc.collect()
    rss0 = rss_mb()
    reset_ok = reset_peak_rss()
    t0 = time.perf_counter()
    layer = fn([train], cfg, discrete=True, vocab_size=V)
    seconds = time.perf_counter() - t0
    peak = peak_rss_mb()
    out = {"impl": spec["impl"], "seconds": seconds, "peak_rss_mb": peak, "rss_before_mb": rss0,
           "peak_delta_mb": None if rss0 is None or not reset_ok else peak - rss0, "peak_reset": reset_ok,
           "train_chars": int(len(train)), "vocab_size": V, "n_windows": layer.diagnostics["n_windows"],
           "blas_threads": blas_threads()}
    if spec.get("init") or spec.get("bpc"):
        # the rest of multilayer_two_stage's 1-layer initialisation: filter_states, then fit_decoder (timed apart)
        timings: dict[str, float] = {}
        tsm = one_layer_model(layer, [train], cfg, discrete=True, vocab_size=V, timings=timings)
        out.update(timings)
        out["init_total_s"] = seconds + timings["filter_s"] + timings["decoder_s"]
    if spec.get("bpc"):
        import torch

        from pipeline.api import initialise_model
        from pipeline.models.common import ModelConfig
        from pipeline.train import evaluate

        test = ds.test[0][: spec["test_chars"]] if spec.get("test_chars") else ds.test[0]
        t1 = time.perf_counter()
        model = initialise_model(ModelConfig(model="psrnn", discrete=True, input_dim=V, output_dim=V,
                                             state_dim=cfg.state_dim, obs_dim=cfg.obs_dim, n_rff=cfg.n_features,
                                             init="2sr", bias_scale=0.0), two_stage=tsm, seed=cfg.seed)
        res = evaluate(model, [test], device=torch.device("cpu"))
        out.update({"test_bpc": res["bpc"], "test_accuracy": res["accuracy"], "test_chars": int(len(test)),
                    "bpc_eval_s": time.perf_counter() - t1,   # model build + test evaluation: not initialisation
                    "singular_values_future": layer.diagnostics["singular_values"]["future"][:5]})
    return out


# ------------------------------------------------------------------------------------------------ parent


def _child(spec: dict, args) -> dict:
    res = run_child(SCRIPT, spec, timeout=args.timeout, env=thread_env(args.threads))
    line = (f"  {res['impl']:9s} {res['train_chars']:>9,d} chars: {res['seconds']:8.2f} s, "
            f"peak {res['peak_rss_mb']:8.1f} MiB")
    if "filter_s" in res:
        line += f"; filter {res['filter_s']:.2f} s, decoder {res['decoder_s']:.2f} s"
    if "test_bpc" in res:
        line += f", test BPC {res['test_bpc']:.4f}"
    print(line, flush=True)
    return res


def _summary(runs: list[dict]) -> dict:
    """Medians over the runs of one figure, every run's value beside them; ``peak_reset`` is false if any child
    could not reset its peak RSS (its peak then includes the data loading), ``blas_threads`` each child's pools."""
    out = {"n": len(runs), "seconds": median([r["seconds"] for r in runs]),
           "peak_rss_mb": median([r["peak_rss_mb"] for r in runs]),
           "seconds_all": [r["seconds"] for r in runs], "peak_rss_mb_all": [r["peak_rss_mb"] for r in runs],
           "peak_reset": all(r["peak_reset"] for r in runs), "blas_threads": [r["blas_threads"] for r in runs]}
    deltas = [r["peak_delta_mb"] for r in runs if r.get("peak_delta_mb") is not None]
    out["peak_delta_mb"] = median(deltas) if deltas else None
    for k in ("filter_s", "decoder_s", "init_total_s"):   # part A: the rest of the initialisation, every run
        vals = [r[k] for r in runs if k in r]
        if vals:
            out[k] = median(vals)
            out[k + "_all"] = vals
    for k in ("train_chars", "n_windows", "test_bpc", "test_accuracy", "test_chars"):
        vals = [r[k] for r in runs if k in r]
        if vals:
            out[k] = vals[0]
    return out


def part_compare(args, cfg: dict) -> dict:
    print(f"\n== A. naive vs streaming 2SR on PTB train (lines={args.lines}, "
          f"{args.train_chars or 'all'} chars, {cfg['n_features']} RFF, windows {cfg['past_window']}/"
          f"{cfg['future_window']}, state {cfg['state_dim']}) ==")
    print(f"   naive: {0 if args.skip_naive else args.naive_repeats} run(s), streaming: {args.repeats} run(s), "
          "interleaved; medians reported. Each run: the 2SR regressions, then filter + decoder fit (timed apart)")
    base = {"raw_dir": str(args.raw_dir), "lines": args.lines, "train_chars": args.train_chars,
            "test_chars": args.test_chars}
    runs: dict[str, list[dict]] = {"naive": [], "streaming": []}
    stream_cfg = {**cfg, "svd": args.svd}
    for r in range(max(args.repeats, args.naive_repeats)):
        # interleaved, so that load from other processes hits both alike; the BPC (deterministic) only once each
        if r < args.naive_repeats and not args.skip_naive:
            runs["naive"].append(_child({**base, "impl": "naive", "cfg": cfg, "init": True,
                                         "bpc": r == 0 and not args.no_bpc}, args))
        if r < args.repeats:
            runs["streaming"].append(_child({**base, "impl": "streaming", "cfg": stream_cfg, "init": True,
                                             "bpc": r == 0 and not args.no_bpc}, args))
    res = {k: _summary(v) for k, v in runs.items() if v}
    nan = float("nan")
    rows = []
    for k, s in res.items():
        rows.append([k, s["n"], s["seconds"], s.get("filter_s", nan), s.get("decoder_s", nan),
                     s.get("init_total_s", nan), s["peak_rss_mb"],
                     s["peak_delta_mb"] if s["peak_delta_mb"] is not None else nan, s.get("test_bpc", nan)])
    print(table(["2SR", "runs", "2SR s", "filter s", "decoder s", "init total s", "peak RSS MiB", "peak Δ MiB",
                 "epoch-0 test BPC"], rows))
    print("medians; 2SR s = the regressions (regress_layer / the naive method) alone; init total s = median over the "
          "runs of 2SR + filter + decoder (the complete 1-layer initialisation of multilayer_two_stage)")
    if "naive" in res:
        n, s = res["naive"], res["streaming"]
        res["speedup"] = n["seconds"] / s["seconds"]
        res["speedup_covers"] = "the 2SR regressions only: naive_two_stage_regression vs regress_layer"
        res["end_to_end_speedup"] = n["init_total_s"] / s["init_total_s"]
        res["end_to_end_speedup_covers"] = ("the complete 1-layer initialisation: 2SR regressions + filter_states "
                                            "over the training data + fit_decoder (L-BFGS softmax)")
        res["peak_ratio"] = n["peak_rss_mb"] / s["peak_rss_mb"]
        if n.get("peak_delta_mb") and s.get("peak_delta_mb"):
            res["peak_delta_ratio"] = n["peak_delta_mb"] / s["peak_delta_mb"]
        print(f"2SR speedup naive/streaming (the regressions alone; the >= 10x claim): {res['speedup']:.2f}x")
        print(f"end-to-end initialisation speedup (2SR + filter + decoder): {res['end_to_end_speedup']:.2f}x")
        print(f"peak RSS naive/streaming: {res['peak_ratio']:.2f}x"
              + (f" (2SR's own allocation: {res['peak_delta_ratio']:.1f}x)" if "peak_delta_ratio" in res else ""))
        if "test_bpc" in n and "test_bpc" in s:
            res["bpc_difference"] = n["test_bpc"] - s["test_bpc"]
            ok = abs(res["bpc_difference"]) < 0.01
            res["bpc_within_0.01"] = ok
            print(f"epoch-0 test BPC naive - streaming: {res['bpc_difference']:+.4f} bits "
                  f"(claim |diff| < 0.01: {'holds' if ok else 'FAILS'})")
    if args.busy:
        print(busy_footer(args.busy))
    return res


def part_scaling(args, cfg: dict) -> dict:
    scales = args.scales
    lengths = [s * args.base_chars for s in scales]
    # one data source for every scale, so the RSS before the 2SR is the same in every child
    lines = None if max(lengths) > PTB_TRAIN_CHARS else 1001
    print(f"\n== B. streaming 2SR scaling: {', '.join(f'{s}x' for s in scales)} of {args.base_chars:,d} chars "
          f"(first N chars of {'full/ptb.train.txt' if lines is None else 'the 1001-line PTB train'}), "
          f"{cfg['n_features']} RFF, {args.repeats} run(s) each, medians ==")
    runs: dict[int, list[dict]] = {s: [] for s in scales}
    for _ in range(args.repeats):
        for s, n in zip(scales, lengths):
            runs[s].append(_child({"raw_dir": str(args.raw_dir), "lines": lines, "train_chars": n,
                                   "impl": "streaming", "cfg": {**cfg, "svd": args.svd}, "bpc": False},
                                  args))
    res = {str(s): _summary(v) for s, v in runs.items()}
    b = res[str(scales[0])]
    rows = []
    for s in scales:
        r = res[str(s)]
        r["time_ratio"] = r["seconds"] / b["seconds"]
        r["length_ratio"] = r["train_chars"] / b["train_chars"]
        r["peak_ratio"] = r["peak_rss_mb"] / b["peak_rss_mb"]
        rows.append([f"{s}x", r["train_chars"], r["seconds"], r["time_ratio"], r["time_ratio"] / r["length_ratio"],
                     r["peak_rss_mb"], r["peak_ratio"],
                     r["peak_delta_mb"] if r["peak_delta_mb"] is not None else float("nan")])
    print(table(["scale", "chars", "time s", "time ratio", "ratio / length ratio", "peak RSS MiB", "peak ratio",
                 "peak Δ MiB"], rows))
    print("time ratio / length ratio <= 1: linear or better; peak ratio ~ 1: memory independent of length")
    if args.busy:
        print(busy_footer(args.busy))
    return {"scales": scales, "base_chars": args.base_chars, "lines": lines, "results": res}


def _claim_settings(args) -> tuple[dict, list[str]]:
    """The claim settings of the parts this run has (recorded) and why its own settings cannot support them."""
    claims: dict = {"min_repeats": MIN_REPEATS}
    settings = {"--lines": args.lines, "--train-chars": args.train_chars or PTB_TRAIN_CHARS,
                "--test-chars": args.test_chars or PTB_TEST_CHARS, "--n-features": args.n_features,
                "--state-dim": args.state_dim, "--past-window": args.past_window,
                "--future-window": args.future_window, "--svd": args.svd, "--skip-naive": args.skip_naive,
                "--no-bpc": args.no_bpc, "--scales": args.scales, "--base-chars": args.base_chars}
    wanted, repeats = {}, {"--repeats": args.repeats}
    if "a" in args.parts:
        claims["a"] = CLAIM_A
        wanted.update(CLAIM_A)
        if not args.skip_naive:
            repeats["--naive-repeats"] = args.naive_repeats
    if "b" in args.parts:
        claims["b"] = CLAIM_B
        wanted.update(CLAIM_B)
    return claims, claim_reasons(args.quick, settings, wanted, repeats)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke test: part A on 5000 chars, part B on 2000/8000/32000 chars, 200 RFF, 1 repeat")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="runs of each streaming figure (part A, and every scale of part B), at least 1, median "
                        "reported (default 3; --quick: 1 unless given)")
    p.add_argument("--naive-repeats", type=positive_int, default=None,
                   help="runs of the naive 2SR, at least 1, median reported (default 3; --quick: 1 unless given; "
                        "each takes ~1.5 min and ~10 GB at full size; --skip-naive runs none)")
    p.add_argument("--raw-dir", type=ptb_raw_dir, default=None,
                   help="PTB raw dir holding full/ptb.*.txt (default: $PSRNN_PTB_DIR, data/raw/ptb, "
                        "../shared/data/ptb)")
    p.add_argument("--lines", type=positive_int, default=1001,
                   help="PTB lines for part A (1001 = the paper's split)")
    p.add_argument("--train-chars", type=positive_int, default=None,
                   help="part A: keep only the first N train chars (default: all; --quick: 5000)")
    p.add_argument("--test-chars", type=int_at_least(2, "an integer >= 2"), default=None,
                   help="part A: keep only the first N test chars, at least 2 (default: all; --quick: 5000)")
    p.add_argument("--n-features", type=positive_int, default=2000, help="RFF per family (--quick: at most 200)")
    p.add_argument("--state-dim", type=positive_int, default=20,
                   help="state, observation and history projection size")
    p.add_argument("--past-window", type=positive_int, default=5, help="history window (observations)")
    p.add_argument("--future-window", type=positive_int, default=5, help="future window (observations)")
    p.add_argument("--svd", choices=("randomized", "exact"), default="randomized", help="streaming projections")
    p.add_argument("--scales", type=positive_int_list, default=[1, 4, 16],
                   help="part B: comma-separated multiples of --base-chars (default 1,4,16)")
    p.add_argument("--base-chars", type=positive_int, default=PTB_TRAIN_CHARS,
                   help="part B: length of 1x (--quick: 2000 unless given)")
    p.add_argument("--parts", type=parts_value, default="ab", metavar="{a,b,ab}",
                   help="'a' (naive vs streaming), 'b' (scaling) or 'ab'")
    p.add_argument("--skip-naive", action="store_true", help="part A without the naive 2SR")
    p.add_argument("--no-bpc", action="store_true",
                   help="skip the epoch-0 test BPC evaluation (filter and decoder are still fitted and timed)")
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="seconds allowed per child process (default: no limit)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="BLAS/OpenMP threads of the children (OMP/OPENBLAS/MKL_NUM_THREADS; default: inherited)")
    p.add_argument("--tag", default=None,
                   help="suffix of the results file, e.g. a machine's name: results/two_stage_<tag>.json (and "
                        "two_stage_scaling_<tag>.json for part b; default: none)")
    add_out_dir_argument(p)
    add_busy_arguments(p)
    args = parse_args_or_run_child(p, argv, child_main)
    if args is None:   # --child: one measurement, reported
        return 0
    if args.quick:
        args.n_features = min(args.n_features, 200)
        args.train_chars = args.train_chars or 5000
        args.test_chars = args.test_chars or 5000
        args.base_chars = 2000 if args.base_chars == PTB_TRAIN_CHARS else args.base_chars
    if args.repeats is None:   # an explicit --repeats is kept, --quick or not
        args.repeats = 1 if args.quick else 3
    if args.naive_repeats is None:
        args.naive_repeats = 1 if args.quick else 3
    args.raw_dir = resolve_ptb_dir(p, args.raw_dir)
    cfg = {"state_dim": args.state_dim, "obs_dim": args.state_dim, "past_dim": args.state_dim,
           "n_features": args.n_features, "past_window": args.past_window, "future_window": args.future_window,
           "seed": 0}
    print(f"PTB from {args.raw_dir}; 2SR config {cfg}; streaming svd={args.svd}")
    code = code_state()   # the code measured: taken before the run, compared with the tree after it
    # children use every CPU for BLAS unless --threads says otherwise
    conditions = RunConditions(args.threads or usable_cpus(), args)
    args.busy = conditions.warning
    t0 = time.perf_counter()
    claims, reasons = _claim_settings(args)
    payload: dict = {"benchmark": "two_stage", "quick": args.quick, "argv": sys.argv[1:] if argv is None else argv,
                     "config": cfg, "streaming_svd": args.svd, "repeats": args.repeats,
                     "naive_repeats": 0 if args.skip_naive else args.naive_repeats, "child_threads": args.threads,
                     "claim_settings": claims}
    if "a" in args.parts:
        payload["compare"] = part_compare(args, cfg)
    if "b" in args.parts:
        payload["scaling"] = part_scaling(args, cfg)
    if "compare" not in payload and "scaling" not in payload:   # --parts is checked when parsed: never reached
        raise SystemExit(f"--parts {args.parts!r}: no part ran; nothing is written")
    payload["total_seconds"] = time.perf_counter() - t0
    payload.update(conditions.finish())
    summaries = [s for k, s in payload.get("compare", {}).items() if k in ("naive", "streaming")]
    summaries += list(payload.get("scaling", {}).get("results", {}).values())
    if not all(s["peak_reset"] for s in summaries):
        reasons.append("a child could not reset its peak RSS (/proc/self/clear_refs): the peaks include the data "
                       "loading")
    reasons += conditions.reasons
    # each part has its own record, so running one part never overwrites the other's
    name = {"a": "two_stage", "b": "two_stage_scaling"}.get(args.parts, "two_stage")
    finish_record(name + (f"_{args.tag}" if args.tag else ""), payload, reasons, code=code, quick=args.quick,
                  out_dir=args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
