"""Training and evaluation throughput (characters per second) of the PSRNNs and the torch RNN baselines on PTB.

Training: truncated BPTT on the PTB train stream (the paper's 1001 lines, 120780 characters) cut into ``--batch``
parallel streams, windows of ``--bptt`` steps, SGD lr 1 with gradient clipping 0.25 — the inner loop of
pipeline.train.fit, step for step (make_streams, detach_state, forward, masked_loss, the finite-loss check,
backward, clip_grad_norm_, step), without the per-epoch evaluations. One epoch by default (or ``--windows N``);
the first ``--warmup`` windows of each run are not timed. chars/s counts the targets (mask) of the timed windows.

Evaluation: pipeline.train.evaluate over the whole PTB test stream (124767 characters, one stream, state carried),
chars/s = targets / seconds.

Models (hidden/state 20, embedding/observation 20): psrnn, factorized_psrnn (rank 60), lstm / gru / rnn
(pipeline.models.RecurrentBaseline: torch.nn.LSTM / GRU / RNN), built by pipeline.api.initialise_model with
init="random" (PSRNNs) or "xavier" (baselines): the weights do not matter for speed. Every model is rebuilt for
every repeat, the repeats are interleaved across models, and the medians are reported with ratios to the LSTM.

    python benchmarks/bench_throughput.py                 # 1 epoch per model and repeat, 2 torch threads
    python benchmarks/bench_throughput.py --device cuda   # on a GPU (cuDNN LSTM/GRU/RNN): throughput_cuda.json
    python benchmarks/bench_throughput.py --quick         # smoke test: a few windows, 5000 test characters

On the CPU, a full run that finds the machine busy waits up to --wait-idle seconds for it to become idle, then runs
anyway; a run that saw the busy warning (or a --quick one) is recorded with "claims_valid": false.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (add_busy_arguments, add_out_dir_argument, busy_footer, claims_line,  # noqa: E402
                               claims_valid, code_state, default_ptb_dir, load_ptb, machine_info, median, table,
                               wait_until_idle, write_results)

BASELINES = ("lstm", "gru", "rnn")
TORCH_OPS = "/torch-ops"   # a PSRNN variant run with the compiled kernels off (PSRNN_NATIVE=0, PSRNN_TRITON=0)


@contextlib.contextmanager
def kernels_for(name: str):
    """Inside, a ``<model>/torch-ops`` variant runs its recurrence as plain torch ops (the reference path)."""
    if not name.endswith(TORCH_OPS):
        yield
        return
    saved = {k: os.environ.get(k) for k in ("PSRNN_NATIVE", "PSRNN_TRITON")}
    os.environ.update(PSRNN_NATIVE="0", PSRNN_TRITON="0")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build(name: str, vocab: int, args, seed: int = 0):
    from pipeline.api import initialise_model
    from pipeline.models.common import ModelConfig

    name = name.removesuffix(TORCH_OPS)
    is_psrnn = name in ("psrnn", "factorized_psrnn")
    cfg = ModelConfig(model=name, discrete=True, input_dim=vocab, output_dim=vocab, state_dim=args.hidden,
                      obs_dim=args.obs_dim or args.hidden, rank=args.rank if name == "factorized_psrnn" else None,
                      init="random" if is_psrnn else "xavier")
    return initialise_model(cfg, seed=seed)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_run(model, train, args, device) -> dict:
    """One timed pass of truncated BPTT (the inner loop of pipeline.train.fit)."""
    import torch

    from pipeline.batching import make_streams
    from pipeline.metrics import masked_loss
    from pipeline.models.common import detach_state

    model.to(device)
    dtype = next(model.parameters()).dtype
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    streams = make_streams(train, args.batch, discrete=True).to(device, dtype)
    model.train()
    state = model.init_state(streams.batch_size)
    n_total = math.ceil(streams.length / args.bptt)
    n_windows = min(n_total, args.warmup + args.windows) if args.windows else n_total
    chars, nonfinite, t0 = 0, 0, None
    for step, (x, y, mask, reset) in enumerate(streams.windows(args.bptt)):
        if step >= n_windows:
            break
        if step == args.warmup:
            _sync(device)
            t0 = time.perf_counter()
        if not bool(mask.any()):
            continue
        state = detach_state(state)
        out, state = model(x, state, reset)
        loss = masked_loss(out, y, mask, True)
        if not torch.isfinite(loss) or float(loss.detach()) > 1e6:  # fit's check (a device sync per step)
            nonfinite += 1
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        if step >= args.warmup:
            chars += int(mask.sum())
    _sync(device)
    seconds = time.perf_counter() - t0 if t0 is not None else float("nan")
    return {"seconds": seconds, "chars": chars, "windows": max(n_windows - args.warmup, 0),
            "chars_per_s": chars / seconds if seconds > 0 else float("nan"), "nonfinite_steps": nonfinite}


def eval_run(model, test, device) -> dict:
    from pipeline.train import evaluate

    model.to(device)
    _sync(device)
    t0 = time.perf_counter()
    res = evaluate(model, [test], device=device)
    _sync(device)
    seconds = time.perf_counter() - t0
    chars = len(test) - 1
    return {"seconds": seconds, "chars": chars, "chars_per_s": chars / seconds, "bpc": res["bpc"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke test: 4 timed windows, 5000 test chars, 1 repeat")
    p.add_argument("--models", default="psrnn,factorized_psrnn,lstm,gru,rnn",
                   help="comma-separated; psrnn/torch-ops or factorized_psrnn/torch-ops run the recurrence as torch "
                        "ops, without the compiled kernels (C on the CPU, Triton on CUDA)")
    p.add_argument("--torch-ops", action="store_true",
                   help="add psrnn/torch-ops and factorized_psrnn/torch-ops to --models: the kernels' speed-up "
                        "measured side by side")
    p.add_argument("--rank", type=int, default=60, help="rank of factorized_psrnn")
    p.add_argument("--hidden", type=int, default=20, help="state / hidden size")
    p.add_argument("--obs-dim", type=int, default=None, help="observation (embedding) size; default = --hidden")
    p.add_argument("--batch", type=int, default=20, help="parallel training streams (default 20)")
    p.add_argument("--bptt", type=int, default=35, help="truncated-BPTT window length (default 35)")
    p.add_argument("--lr", type=float, default=1.0, help="SGD learning rate (default 1)")
    p.add_argument("--clip", type=float, default=0.25, help="gradient-norm clipping (default 0.25)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--windows", type=int, default=None, help="timed BPTT windows per run (default: one epoch)")
    p.add_argument("--warmup", type=int, default=2, help="untimed windows at the start of each training run")
    p.add_argument("--test-chars", type=int, default=None, help="evaluate on the first N test characters only")
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation throughput")
    p.add_argument("--repeats", type=int, default=None, help="runs per figure, median reported (default 3; quick 1)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--raw-dir", type=Path, default=None, help="PTB raw dir holding full/ptb.*.txt")
    p.add_argument("--tag", default=None,
                   help="results file benchmarks/results/throughput_<tag>.json (default: none on the CPU, the "
                        "device type otherwise, so a GPU run never overwrites the CPU figures)")
    add_out_dir_argument(p)
    add_busy_arguments(p)
    args = p.parse_args(argv)

    import torch

    from pipeline.train import resolve_device

    if args.quick:
        args.windows = args.windows or 4
        args.test_chars = args.test_chars or 5000
    args.repeats = args.repeats or (1 if args.quick else 3)
    device = resolve_device(args.device, "--device")  # a clear error when cuda is asked for and absent
    code = code_state()   # the code measured: taken before the run, compared with the tree after it
    warning = (wait_until_idle(args.threads, wait_s=args.wait_idle, allow_busy=args.allow_busy, quick=args.quick)
               if device.type == "cpu" else None)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.torch_ops:
        models += [m + TORCH_OPS for m in ("psrnn", "factorized_psrnn") if m in models and m + TORCH_OPS not in models]
    unknown = [m for m in models if m.removesuffix(TORCH_OPS) not in ("psrnn", "factorized_psrnn", *BASELINES)
               or (m.endswith(TORCH_OPS) and m.removesuffix(TORCH_OPS) in BASELINES)]
    if unknown:
        p.error(f"--models: unknown {unknown}; expected psrnn, factorized_psrnn (either with {TORCH_OPS}), "
                f"{', '.join(BASELINES)}")
    ds = load_ptb(args.raw_dir or default_ptb_dir())
    V = len(ds.vocab)
    train = ds.train
    test = ds.test[0][: args.test_chars] if args.test_chars else ds.test[0]
    print(f"PTB train {len(train[0]):,d} chars, test {len(test):,d} chars, vocab {V}; device {device}, "
          f"torch threads {torch.get_num_threads()}; hidden {args.hidden}, batch {args.batch}, bptt {args.bptt}; "
          f"{'one epoch' if not args.windows else f'{args.windows} windows'} per run (+{args.warmup} untimed), "
          f"{args.repeats} repeat(s), interleaved")

    runs = {m: {"train": [], "eval": []} for m in models}
    params = {}
    for r in range(args.repeats):
        for m in models:
            model = build(m, V, args, seed=r)
            params[m] = model.n_parameters()
            with kernels_for(m):
                tr = train_run(model, train, args, device)
            runs[m]["train"].append(tr)
            line = f"  repeat {r + 1} {m:27s} train {tr['chars_per_s']:10,.0f} chars/s ({tr['seconds']:.2f} s)"
            if not args.no_eval:
                with kernels_for(m):
                    ev = eval_run(build(m, V, args, seed=r), test, device)
                runs[m]["eval"].append(ev)
                line += f"   eval {ev['chars_per_s']:10,.0f} chars/s ({ev['seconds']:.2f} s)"
            if tr["nonfinite_steps"]:
                line += f"   [{tr['nonfinite_steps']} non-finite losses]"
            print(line, flush=True)

    summary = {}
    for m in models:
        s = {"n_parameters": params[m],
             "train_chars_per_s": median([x["chars_per_s"] for x in runs[m]["train"]]),
             "train_seconds": median([x["seconds"] for x in runs[m]["train"]]),
             "train_chars": runs[m]["train"][0]["chars"], "train_windows": runs[m]["train"][0]["windows"]}
        if runs[m]["eval"]:
            s["eval_chars_per_s"] = median([x["chars_per_s"] for x in runs[m]["eval"]])
            s["eval_seconds"] = median([x["seconds"] for x in runs[m]["eval"]])
        summary[m] = s
    ref = "lstm" if "lstm" in summary else models[0]
    rows = []
    for m, s in summary.items():
        s["train_ratio_vs_" + ref] = s["train_chars_per_s"] / summary[ref]["train_chars_per_s"]
        row = [m + (f" (rank {args.rank})" if m.startswith("factorized_psrnn") else ""), s["n_parameters"],
               s["train_chars_per_s"], s["train_ratio_vs_" + ref]]
        if "eval_chars_per_s" in s:
            s["eval_ratio_vs_" + ref] = s["eval_chars_per_s"] / summary[ref]["eval_chars_per_s"]
            row += [s["eval_chars_per_s"], s["eval_ratio_vs_" + ref]]
        rows.append(row)
    headers = ["model", "params", "train chars/s", f"train / {ref}"]
    if not args.no_eval:
        headers += ["eval chars/s", f"eval / {ref}"]
    print(f"\nmedians of {args.repeats} repeat(s); ratios > 1 mean faster than {ref}")
    print(table(headers, rows))
    if warning:
        print(busy_footer(warning))

    payload = {"benchmark": "throughput", "quick": args.quick, "argv": sys.argv[1:] if argv is None else argv,
               "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "device": str(device), "train_chars_total": len(train[0]), "test_chars": len(test),
               "vocab_size": V, "reference": ref, "busy_warning": warning,
               "claims_valid": claims_valid(args.quick, warning), "summary": summary, "runs": runs,
               "machine": machine_info(code=code)}
    tag = args.tag if args.tag is not None else ("" if device.type == "cpu" else device.type)
    path = write_results("throughput" + (f"_{tag}" if tag else ""), payload, quick=args.quick, out_dir=args.out_dir)
    print(claims_line(args.quick, warning))
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
