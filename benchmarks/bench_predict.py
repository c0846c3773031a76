"""`psrnn predict` on long inputs: streamed in blocks vs every output held in memory (time and peak memory).

``pipeline.inference.predict_file`` filters and writes ``block_rows`` rows at a time (default 65536), so its memory
should not grow with the input beyond the input itself. Side by side, in fresh subprocesses, on the first N
characters of the full PTB train file (5.1M characters) written as a custom-schema Parquet file:

* **streamed**: ``predict_file`` with its default ``block_rows``;
* **in memory**: ``benchmarks/naive_predict.py``, the naive method kept here (as ``naive_two_stage.py`` is for the
  2SR): every output of the whole input computed and held in memory, then written as one table (what
  ``predict_file`` did before it streamed). ``predict_file`` itself can no longer do that: since ``77eb1ea`` it caps
  a block at ``rows_within_budget`` rows (128 MiB of outputs, 152,520 rows for the 44 PTB symbols) whatever
  ``block_rows`` asks, so the "one block" baseline of the records before this one (``predict_file`` with
  ``block_rows`` = the number of rows, key ``one_block``) held every output only up to that many rows.

Two layouts of the same characters: ``stream`` (one trajectory: a long one is filtered alone, its state carried
from block to block) and ``lines`` (one trajectory per text line, ~50 characters each: short trajectories are
filtered side by side). The model is a 2SR-initialised PSRNN of the pipeline's PTB defaults (2000 RFF, state 20,
window 1) fitted once on the paper's 120780 training characters; ``--probabilities`` adds the distribution over the
44 symbols of the PTB vocabulary to every row.

Peak RSS (MiB) is the child's VmHWM, reset just before the call (input file not yet read), so it is what reading
the input, filtering and writing the output took; a child that could not reset it records ``peak_reset`` false,
and the run is not valid for the claims. Both write the same rows: the script compares the two files of every
size (trajectory and step row by row, the predicted symbols, the bits of the next symbol: ``agreement``) and stops
if they differ beyond float rounding or their BPCs differ by more than 1e-6 relative.

    python benchmarks/bench_predict.py            # 1x, 4x, 16x the PTB test length (125k chars), full 5.1M streamed
    python benchmarks/bench_predict.py --quick    # smoke test: 5k and 20k characters, a small model, 1 repeat

The claim (flat memory streamed; the ratios to the in-memory baseline) holds for the defaults (CLAIM: sizes,
layouts, 2000 RFF fitted on the whole training split, 2 threads) with at least 3 repeats; a run with other
settings, a --quick one, one that saw the busy warning or whose CPUs other processes took more than 15% of
(common.FOREIGN_CPU_LIMIT) is recorded with "claims_valid": false and its "claims_invalid_reasons". A full run that
finds the machine busy waits up to --wait-idle seconds for it to become idle, then runs anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (MIN_REPEATS, PTB_TEST_CHARS, HelpFormatter, RunConditions,  # noqa: E402
                               add_busy_arguments, add_out_dir_argument, int_at_least, positive_int, ptb_raw_dir,
                               resolve_ptb_dir, busy_footer, claim_reasons, code_state, finish_record, load_ptb,
                               machine_info, median, parse_args_or_run_child, peak_rss_mb, reset_peak_rss, rss_mb,
                               run_child, table, thread_env)

SCRIPT = Path(__file__).resolve()
DEFAULT_SIZES = [PTB_TEST_CHARS, 4 * PTB_TEST_CHARS, 16 * PTB_TEST_CHARS]
WHOLE_FILE = -1   # --streamed-only's default: the whole PTB train file


def streamed_only_size(text: str) -> int:
    """--streamed-only: a positive length, or -1 (the whole PTB train file)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 and value != WHOLE_FILE:
        raise argparse.ArgumentTypeError(f"expected a positive integer or {WHOLE_FILE} (the whole file), got {text!r}")
    return value
#: the settings of the claim (the defaults); "--streamed-only" [-1] is the whole train file
#: the two implementations; older records have "one_block" instead of "in_memory": predict_file with block_rows =
#: the rows, which since 77eb1ea holds at most rows_within_budget rows' outputs at a time
STREAMED, IN_MEMORY = "streamed", "in_memory"
CLAIM = {"--sizes": DEFAULT_SIZES, "--streamed-only": [WHOLE_FILE], "--layouts": ["stream", "lines"],
         "--probabilities": False, "--threads": 2, "--n-features": 2000, "--fit-chars": None}


# ------------------------------------------------------------------------------------------------- child


def child_main(spec: dict) -> dict:
    """One predict_file call in this (fresh) process; returns the report."""
    import importlib

    import torch

    from benchmarks.naive_predict import naive_predict_file
    from pipeline.inference import DEFAULT_BLOCK_ROWS, TrainedRun, predict_file
    from pipeline.models import ModelConfig, build_model

    # imported before the peak is reset, so that the figures are the call's own
    for module in ("pyarrow.parquet", "pyarrow.compute", "pipeline.data.custom", "pipeline.metrics", "pipeline.io",
                   "pipeline.train"):
        importlib.import_module(module)

    torch.set_num_threads(spec["threads"])
    saved = torch.load(spec["model"], weights_only=True)
    model = build_model(ModelConfig(**json.loads(spec["config"])))
    model.load_state_dict(saved)
    run = TrainedRun.from_units(model, {"kind": "discrete", "vocab": spec["vocab"]}, dataset="ptb",
                                variant="psrnn", seed=0, epoch=0)
    out = Path(spec["out"])
    base = rss_mb()
    reset_ok = reset_peak_rss()
    t0 = time.perf_counter()
    if spec["impl"] == IN_MEMORY:   # the naive method: every output of the whole input held, then written
        block = spec["rows"]
        summary = naive_predict_file(model, spec["vocab"], spec["input"], out, probabilities=spec["probabilities"])
    else:
        block = DEFAULT_BLOCK_ROWS   # predict_file may take fewer (rows_within_budget); 65536 < 152520 for PTB
        summary = predict_file(run, spec["input"], out, probabilities=spec["probabilities"], block_rows=block)
    seconds = time.perf_counter() - t0
    peak = peak_rss_mb()
    # the output is left for the parent, which compares the two implementations' files, then removes it
    return {"seconds": seconds, "peak_rss_mb": peak, "peak_delta_mb": peak - base, "peak_reset": reset_ok,
            "bpc": summary["metrics"]["bpc"], "rows": summary["rows"],
            "output_mb": out.stat().st_size / 2**20, "block_rows": block}


# ------------------------------------------------------------------------------------------------ parent


def _write_inputs(text: list[str], sizes: list[int], layout: str, tmp: Path) -> dict[int, Path]:
    """The first N characters of ``text`` (lines) as custom-schema Parquet files: one trajectory, or one per line."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    chars = np.array(list("".join(text)), dtype=object)
    line_id = np.repeat(np.arange(len(text)), [len(line) for line in text])
    paths = {}
    for n in sizes:
        if n > len(chars):
            raise SystemExit(f"asked for {n} characters, the PTB train file has {len(chars)}")
        traj = np.zeros(n, dtype=np.int64) if layout == "stream" else line_id[:n]
        paths[n] = tmp / f"{layout}_{n}.parquet"
        pq.write_table(pa.table({"trajectory": traj, "symbol": chars[:n]}), paths[n])
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--raw-dir", type=ptb_raw_dir, default=None,
                   help="PTB raw directory holding full/ptb.train.txt (default: $PSRNN_PTB_DIR, data/raw/ptb, "
                        "../shared/data/ptb)")
    p.add_argument("--sizes", type=positive_int, nargs="*", default=None,
                   help="input lengths in characters compared side by side, each at most the PTB train file's "
                        "(default: 1x, 4x, 16x the PTB test split; --quick: 5000 20000)")
    p.add_argument("--streamed-only", type=streamed_only_size, nargs="*", default=None,
                   help="lengths run streamed only; -1 is the whole PTB train file (default: -1, too big to hold in "
                        "memory comfortably; --quick: none)")
    p.add_argument("--layouts", nargs="*", default=["stream", "lines"], choices=["stream", "lines"],
                   help="one trajectory, or one trajectory per text line")
    p.add_argument("--probabilities", action="store_true", help="also write every symbol's probability")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="runs per figure, at least 1; the median is reported (default 3; --quick: 1 unless given)")
    p.add_argument("--threads", type=positive_int, default=2, help="torch and BLAS threads in the children")
    p.add_argument("--n-features", type=positive_int, default=None,
                   help="RFF of the model's 2SR (default 2000, the PTB default; --quick: 200)")
    p.add_argument("--fit-chars", type=int_at_least(2, "an integer >= 2"), default=None,
                   help="fit the model on the first N of the paper's 120780 training characters (default: all)")
    p.add_argument("--quick", action="store_true", help="smoke test: small inputs and model, 1 repeat")
    add_out_dir_argument(p)
    add_busy_arguments(p)
    args = parse_args_or_run_child(p, argv, child_main)
    if args is None:   # --child: one measurement, reported
        return 0

    raw_dir = resolve_ptb_dir(p, args.raw_dir)
    if args.quick:
        sizes, streamed_only = args.sizes or [5000, 20000], args.streamed_only or []
    else:
        sizes = args.sizes or DEFAULT_SIZES
        streamed_only = args.streamed_only if args.streamed_only is not None else [WHOLE_FILE]
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)   # explicit: kept
    n_features = args.n_features or (200 if args.quick else 2000)
    # the input's characters, before anything is fitted: a size past the file is refused now, not after the fit
    ptb = load_ptb(raw_dir)                      # the paper's 1001 lines: the model's training data
    full = (Path(raw_dir) / "full" / "ptb.train.txt").read_text().splitlines(keepends=True)
    vocab = set(ptb.vocab)
    text = ["".join(c for c in line if c in vocab) for line in full]
    total = sum(len(line) for line in text)
    for flag, values in (("--sizes", sizes), ("--streamed-only", streamed_only)):
        too_long = [n for n in values if n > total]
        if too_long:
            p.error(f"{flag} {' '.join(map(str, too_long))}: expected at most {total} characters (the PTB train "
                    f"file in the training vocabulary; -1 for all of it in --streamed-only)")
    if args.fit_chars is not None and args.fit_chars > len(ptb.train[0]):
        p.error(f"--fit-chars {args.fit_chars}: expected at most the {len(ptb.train[0])} training characters")
    reasons = claim_reasons(args.quick, {"--sizes": sizes, "--streamed-only": streamed_only,
                                         "--layouts": args.layouts, "--probabilities": args.probabilities,
                                         "--threads": args.threads, "--n-features": n_features,
                                         "--fit-chars": args.fit_chars}, CLAIM, {"--repeats": repeats})
    code = code_state()   # the code measured: taken before the run, compared with the tree after it
    conditions = RunConditions(args.threads, args)

    import torch

    from benchmarks.naive_predict import agree, compare_outputs
    from pipeline.api import fit_model

    torch.set_num_threads(args.threads)
    streamed_only = [total if n == WHOLE_FILE else n for n in streamed_only]
    fit_train = [ptb.train[0][: args.fit_chars]] if args.fit_chars else ptb.train
    print(f"fitting the model (2SR, {n_features} RFF, state 20) on {len(fit_train[0])} characters ...", flush=True)
    fitted = fit_model(fit_train, model="psrnn", n_features=n_features, horizon=1, epochs=0, device="cpu")

    results = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_path = tmp / "model.pt"
        torch.save(fitted.model.state_dict(), model_path)
        from dataclasses import asdict

        config = json.dumps(asdict(fitted.model.config))
        for layout in args.layouts:
            inputs = _write_inputs(text, sorted(set(sizes + streamed_only)), layout, tmp)
            for n, path in inputs.items():
                impls = [STREAMED, IN_MEMORY] if n in sizes else [STREAMED]
                runs: dict[str, list[dict]] = {i: [] for i in impls}
                outs = {impl: tmp / f"out_{impl}.parquet" for impl in impls}
                for _ in range(repeats):   # interleaved, so background load hits both alike
                    for impl in impls:
                        spec = {"impl": impl, "input": str(path), "out": str(outs[impl]),
                                "model": str(model_path), "config": config, "vocab": list(ptb.vocab),
                                "rows": n, "probabilities": args.probabilities, "threads": args.threads}
                        runs[impl].append(run_child(SCRIPT, spec, env=thread_env(args.threads)))
                row = {"layout": layout, "chars": n, "trajectories": int(_count_trajectories(path))}
                for impl, rs in runs.items():
                    row[impl] = {"seconds": median([r["seconds"] for r in rs]),
                                 "peak_rss_mb": median([r["peak_rss_mb"] for r in rs]),
                                 "peak_delta_mb": median([r["peak_delta_mb"] for r in rs]),
                                 "peak_reset": all(r["peak_reset"] for r in rs),
                                 "chars_per_s": n / median([r["seconds"] for r in rs]),
                                 "bpc": rs[0]["bpc"], "output_mb": rs[0]["output_mb"], "runs": rs}
                if IN_MEMORY in row:
                    a, b = row[STREAMED]["bpc"], row[IN_MEMORY]["bpc"]
                    if abs(a - b) > 1e-6 * abs(b):
                        raise SystemExit(f"{layout} {n}: streamed BPC {a} differs from in-memory BPC {b}")
                    row["agreement"] = compare_outputs(outs[STREAMED], outs[IN_MEMORY])
                    if not agree(row["agreement"]):
                        raise SystemExit(f"{layout} {n}: the streamed and in-memory predictions differ: "
                                         f"{row['agreement']}")
                    row["time_ratio"] = row[IN_MEMORY]["seconds"] / row[STREAMED]["seconds"]
                    row["peak_delta_ratio"] = row[IN_MEMORY]["peak_delta_mb"] / row[STREAMED]["peak_delta_mb"]
                for out in outs.values():
                    out.unlink(missing_ok=True)
                results.append(row)
                _print_row(row)

    headers = ["layout", "characters", "trajectories", "streamed s", "streamed chars/s", "streamed peak Δ MiB",
               "in memory s", "in memory peak Δ MiB", "in memory / streamed: time", "peak Δ", "BPC"]
    nan = float("nan")
    rows = [[r["layout"], r["chars"], r["trajectories"], r[STREAMED]["seconds"], r[STREAMED]["chars_per_s"],
             r[STREAMED]["peak_delta_mb"], r.get(IN_MEMORY, {}).get("seconds", nan),
             r.get(IN_MEMORY, {}).get("peak_delta_mb", nan), r.get("time_ratio", nan),
             r.get("peak_delta_ratio", nan), r[STREAMED]["bpc"]] for r in results]
    print()
    print(table(headers, rows))
    print("in memory: benchmarks/naive_predict.py, every output of the whole input held, then written; streamed: "
          "predict_file in blocks of 65,536 rows")
    if conditions.warning:
        print(busy_footer(conditions.warning))
    if not all(r[impl]["peak_reset"] for r in results for impl in (STREAMED, IN_MEMORY) if impl in r):
        reasons.append("a child could not reset its peak RSS (/proc/self/clear_refs): the peaks include what the "
                       "child held before the call")
    payload = {"benchmark": "predict", "quick": args.quick, "argv": sys.argv[1:] if argv is None else argv,
               "settings": {"repeats": repeats, "n_features": n_features, "probabilities": args.probabilities,
                            "fit_chars": len(fit_train[0]), "ptb_train_chars_available": total},
               "baseline": f"{IN_MEMORY}: benchmarks.naive_predict.naive_predict_file, every output of the whole "
                           "input held in memory, then written as one table",
               "claim_settings": {**CLAIM, "min_repeats": MIN_REPEATS}, **conditions.finish()}
    reasons += conditions.reasons
    payload["results"] = results
    finish_record("predict", payload, reasons, code=code, quick=args.quick, out_dir=args.out_dir,
                  machine=machine_info({"threads": args.threads}, code=code))
    return 0


def _count_trajectories(path: Path) -> int:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    return len(pc.unique(pq.read_table(path, columns=["trajectory"]).column("trajectory")))


def _print_row(row: dict) -> None:
    s = row[STREAMED]
    line = (f"{row['layout']:>6} {row['chars']:>9,} chars: streamed {s['seconds']:.2f} s, peak Δ "
            f"{s['peak_delta_mb']:.0f} MiB")
    if IN_MEMORY in row:
        o = row[IN_MEMORY]
        line += (f"; in memory {o['seconds']:.2f} s, peak Δ {o['peak_delta_mb']:.0f} MiB "
                 f"(×{row['peak_delta_ratio']:.1f} memory)")
    print(line, flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
