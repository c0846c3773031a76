"""Training and evaluation throughput (characters per second) of the PSRNNs and the torch RNN baselines on PTB.

Training: truncated BPTT on the PTB train stream (the paper's 1001 lines, 120780 characters) cut into ``--batch``
parallel streams, windows of ``--bptt`` steps, SGD lr 1 with gradient clipping 0.25 — the inner loop of
pipeline.train.fit, step for step (make_streams, the windows' targets counted on the CPU, detach_state, forward,
masked_loss, backward, clip_grad_norm_, the finite-loss, max-loss and finite-gradient-norm checks on one host copy,
pipeline.optim.SGD's step), with two
differences: a non-finite or exploded step is counted (``nonfinite_steps``) instead of stopping the run, and there
are no per-epoch evaluations, checkpoints or progress bar. One epoch by default (or ``--windows N``); the first
``--warmup`` windows of each run are not timed. chars/s counts the targets (mask) of the timed windows.

Evaluation: pipeline.train.evaluate over the whole PTB test stream (124767 characters, one stream, state carried),
chars/s = targets / seconds, after one untimed evaluation of each model (first-call costs: the C library's load,
the Triton kernels' compilation). The PSRNNs (C on the CPU, Triton on CUDA) and, on the CPU, the GRU and RNN
evaluate in hand-written kernels; the LSTM always runs torch.nn.LSTM (oneDNN / cuDNN): the "eval / lstm" ratios
compare those kernels with torch's LSTM, not the cells alone.

Models (hidden/state 20, embedding/observation 20): psrnn, factorized_psrnn (rank 60), lstm / gru / rnn
(pipeline.models.RecurrentBaseline: torch.nn.LSTM / GRU / RNN), built by pipeline.api.initialise_model with
init="random" (PSRNNs) or "xavier" (baselines): the weights do not matter for speed. Every model is rebuilt for
every repeat, the repeats are interleaved across models, and the medians are reported with ratios to the LSTM.

    python benchmarks/bench_throughput.py                 # 1 epoch per model and repeat, 2 torch threads
    python benchmarks/bench_throughput.py --device cuda   # on a GPU (cuDNN LSTM/GRU/RNN): throughput_cuda.json
    python benchmarks/bench_throughput.py --quick         # smoke test: a few windows, 5000 test characters

The claims hold for CLAIM (the defaults: hidden 20, batch 20, BPTT 35, rank 60, one epoch, the whole test stream,
2 threads on the CPU), the lstm row present, at least 3 repeats, and the compiled kernels running in every PSRNN row
without /torch-ops; a run that misses one of them, a --quick one, one that saw the busy warning (checked on a GPU
run too: its timings depend on the host CPU that launches the kernels) or whose CPUs other processes took more than
15% of (common.FOREIGN_CPU_LIMIT) is recorded with "claims_valid": false and its "claims_invalid_reasons". A full
run that finds the machine busy waits up to --wait-idle seconds for it to become idle, then runs anyway.
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

from benchmarks.common import (MIN_REPEATS, HelpFormatter, RunConditions, add_busy_arguments,  # noqa: E402
                               add_out_dir_argument, busy_footer, claim_reasons, code_state, finish_record,
                               int_at_least, load_ptb, nonnegative_int, positive_float, positive_int, ptb_raw_dir,
                               resolve_ptb_dir, machine_info, median, table)

PSRNNS = ("psrnn", "factorized_psrnn")
BASELINES = ("lstm", "gru", "rnn")
TORCH_OPS = "/torch-ops"   # a model run with the compiled kernels off (PSRNN_NATIVE=0, PSRNN_TRITON=0)
NATIVE_BASELINES = ("gru", "rnn")   # the baselines with a C loop on the CPU (torch.nn.LSTM is oneDNN's already)
#: the settings the throughput claims (the PSRNNs against torch.nn.LSTM) were measured at; --threads only on the CPU
CLAIM = {"--hidden": 20, "--obs-dim": 20, "--batch": 20, "--bptt": 35, "--rank": 60, "--windows": None,
         "--warmup": 2, "--test-chars": None, "--lr": 1.0, "--clip": 0.25}
CLAIM_CPU_THREADS = 2
EVAL_FOOTNOTE = ("the PSRNNs (C on the CPU, Triton on CUDA) and, on the CPU, the GRU and RNN train and evaluate in "
                 "hand-written kernels (/torch-ops rows: torch ops and torch.nn.GRU / RNN instead); the LSTM is "
                 "torch.nn.LSTM (oneDNN / cuDNN)")


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
    is_psrnn = name in PSRNNS
    cfg = ModelConfig(model=name, discrete=True, input_dim=vocab, output_dim=vocab, state_dim=args.hidden,
                      obs_dim=args.obs_dim or args.hidden, rank=args.rank if name == "factorized_psrnn" else None,
                      init="random" if is_psrnn else "xavier")
    return initialise_model(cfg, seed=seed)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_run(model, train, args, device) -> dict:
    """One timed pass of truncated BPTT (the inner loop of pipeline.train.fit; a step it would stop at is counted)."""
    import torch

    from pipeline.batching import make_streams
    from pipeline.metrics import masked_loss
    from pipeline.models.common import detach_state
    from pipeline.optim import SGD
    from pipeline.train_config import TrainConfig

    max_loss = TrainConfig().max_loss
    model.to(device)
    dtype = next(model.parameters()).dtype
    optimizer = SGD(model.parameters(), lr=args.lr)
    on_cpu = make_streams(train, args.batch, discrete=True, dtype=dtype, min_piece=args.bptt + 1)   # as fit
    # as fit: which windows have a target, and which have nothing but, read on the CPU
    scored, full, on_cpu_counts = zip(*[(bool(w[2].any()), bool(w[2].all()), int(w[2].sum()))
                                        for w in on_cpu.windows(args.bptt)])
    streams = on_cpu.to(device, dtype)
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
        if not scored[step]:
            continue
        state = detach_state(state)
        out, state = model(x, state, reset)
        loss = masked_loss(out, y, mask, True, full=full[step])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        # fit's checks, on one copy of the loss and the gradient norm to the host (one device sync per step as there)
        loss_value, gnorm_value = torch.stack([loss.detach().double(), gnorm.detach().double()]).tolist()
        nonfinite += not (math.isfinite(loss_value) and loss_value <= max_loss and math.isfinite(gnorm_value))
        optimizer.step()
        if step >= args.warmup:
            chars += int(on_cpu_counts[step])
    _sync(device)
    seconds = time.perf_counter() - t0 if t0 is not None else float("nan")
    return {"seconds": seconds, "chars": chars, "windows": max(n_windows - args.warmup, 0),
            "chars_per_s": chars / seconds if seconds > 0 else float("nan"), "nonfinite_steps": nonfinite}


def windows_per_epoch(train, args) -> int:
    """The BPTT windows of one training epoch, as :func:`train_run` cuts them."""
    from pipeline.batching import make_streams

    streams = make_streams(train, args.batch, discrete=True, min_piece=args.bptt + 1)
    return math.ceil(streams.length / args.bptt)


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


def recurrence_paths(name: str, model, hidden: int) -> dict[str, str]:
    """Which code runs the recurrence of model ``name`` in training and in evaluation, by the predicates its layers
    use (pipeline.native.usable / gpu_usable on its parameters); call it inside kernels_for(name), after
    ``model.to(device)``. A PSRNN falls back to torch ops where the kernels cannot run (no C compiler, no triton,
    a state larger than GPU_MAX_DIM on CUDA): the timing would then measure another implementation."""
    from pipeline import native

    params = list(model.parameters())
    base = name.removesuffix(TORCH_OPS)
    if base in PSRNNS:
        path = ("C" if native.usable(*params) else "Triton" if native.gpu_usable(hidden, *params) else "torch ops")
        return {"train": path, "eval": path}
    torch_cell = f"torch.nn.{base.upper()}"
    # the GRU and RNN train and filter in C on the CPU (pipeline.models.baselines); the LSTM never does
    path = "C" if base in NATIVE_BASELINES and native.usable(*params) else torch_cell
    return {"train": path, "eval": path}


def _claim_reasons(args, device, models: list[str], paths: dict[str, dict[str, str]], kernels: dict) -> list[str]:
    """Why this run cannot support the claims: its settings (CLAIM, and CLAIM_CPU_THREADS on the CPU), its repeats,
    a missing lstm row, a PSRNN row that ran as torch ops without asking for it."""
    settings = {"--hidden": args.hidden, "--obs-dim": args.obs_dim or args.hidden, "--batch": args.batch,
                "--bptt": args.bptt, "--rank": args.rank, "--windows": args.windows, "--warmup": args.warmup,
                "--test-chars": args.test_chars, "--lr": args.lr, "--clip": args.clip, "--threads": args.threads}
    claim = {**CLAIM, "--threads": CLAIM_CPU_THREADS} if device.type == "cpu" else CLAIM
    reasons = claim_reasons(args.quick, settings, claim, {"--repeats": args.repeats})
    if "lstm" not in models:
        reasons.append("no lstm row (--models): the ratios need torch.nn.LSTM as the reference")
    why = kernels["native_error"] if device.type == "cpu" else kernels["triton_error"]
    reasons += [f"{m} ran as torch ops, not the compiled kernels" + (f" ({why})" if why else "")
                for m in models if m in PSRNNS and paths[m]["train"] == "torch ops"]
    return reasons


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke test: 4 timed windows, 5000 test chars, 1 repeat")
    p.add_argument("--models", default="psrnn,factorized_psrnn,lstm,gru,rnn",
                   help="comma-separated; <model>/torch-ops (psrnn, factorized_psrnn, gru, rnn) runs the "
                        "recurrence as torch ops (torch.nn.GRU / RNN for the baselines), without the compiled kernels "
                        "(C on the CPU, Triton on CUDA)")
    p.add_argument("--torch-ops", action="store_true",
                   help="add the /torch-ops row of every model in --models that has kernels: their speed-up "
                        "measured side by side")
    p.add_argument("--rank", type=positive_int, default=60, help="rank of factorized_psrnn")
    p.add_argument("--hidden", type=positive_int, default=20, help="state / hidden size")
    p.add_argument("--obs-dim", type=positive_int, default=None,
                   help="observation (embedding) size (default: --hidden)")
    p.add_argument("--batch", type=positive_int, default=20, help="parallel training streams")
    p.add_argument("--bptt", type=positive_int, default=35, help="truncated-BPTT window length")
    p.add_argument("--lr", type=float, default=1.0, help="SGD learning rate")
    p.add_argument("--clip", type=positive_float, default=0.25,
                   help="gradient-norm clipping, > 0 (fit's unclipped path is not measured here)")
    p.add_argument("--threads", type=positive_int, default=2, help="torch.set_num_threads")
    p.add_argument("--windows", type=positive_int, default=None,
                   help="timed BPTT windows per run (default: one epoch; --quick: 4 unless given)")
    p.add_argument("--warmup", type=nonnegative_int, default=2,
                   help="untimed windows at the start of each training run (fewer than one epoch's windows)")
    p.add_argument("--test-chars", type=int_at_least(2, "an integer >= 2"), default=None,
                   help="evaluate on the first N test characters only, at least 2 (default: all; --quick: 5000 "
                        "unless given)")
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation throughput")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="runs per figure, at least 1, median reported (default 3; --quick: 1 unless given)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--raw-dir", type=ptb_raw_dir, default=None,
                   help="PTB raw dir holding full/ptb.*.txt (default: $PSRNN_PTB_DIR, data/raw/ptb, "
                        "../shared/data/ptb)")
    p.add_argument("--tag", default=None,
                   help="results file benchmarks/results/throughput_<tag>.json (default: none on the CPU, the "
                        "device type otherwise, so a GPU run never overwrites the CPU figures)")
    add_out_dir_argument(p)
    add_busy_arguments(p)
    args = p.parse_args(argv)
    raw_dir = resolve_ptb_dir(p, args.raw_dir)

    import torch

    from pipeline.train import resolve_device

    if args.quick:
        args.windows = args.windows or 4
        args.test_chars = args.test_chars or 5000
    if args.repeats is None:   # an explicit --repeats is kept, --quick or not
        args.repeats = 1 if args.quick else 3
    try:   # one line when cuda is asked for and absent, or the name is not a device
        device = resolve_device(args.device, "--device")
    except ValueError as exc:
        p.error(str(exc))
    ds = load_ptb(raw_dir)
    V = len(ds.vocab)
    train = ds.train
    test = ds.test[0][: args.test_chars] if args.test_chars else ds.test[0]
    epoch_windows = windows_per_epoch(train, args)
    if args.warmup >= epoch_windows:   # no window would be timed: chars/s would be nan
        p.error(f"--warmup {args.warmup}: expected fewer than the {epoch_windows} BPTT windows of one epoch "
                f"(--batch {args.batch}, --bptt {args.bptt})")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    # the GRU and RNN have kernels of ours on the CPU only: on CUDA they are cuDNN's either way, so a /torch-ops
    # row of theirs would time the same code as their own row
    with_kernels = PSRNNS + (NATIVE_BASELINES if device.type == "cpu" else ())
    if args.torch_ops:
        models += [m + TORCH_OPS for m in with_kernels if m in models and m + TORCH_OPS not in models]
    unknown = [m for m in models if m.removesuffix(TORCH_OPS) not in (*PSRNNS, *BASELINES)
               or (m.endswith(TORCH_OPS) and m.removesuffix(TORCH_OPS) == "lstm")]
    if unknown:
        p.error(f"--models: unknown {unknown}; expected psrnn, factorized_psrnn, gru, rnn (each also with "
                f"{TORCH_OPS}) or lstm")
    same = [m for m in models if m.endswith(TORCH_OPS) and m.removesuffix(TORCH_OPS) not in with_kernels]
    if same:
        p.error(f"--models: {', '.join(same)} on {device.type}: the recurrence is cuDNN's with or without {TORCH_OPS} "
                f"there; expected {TORCH_OPS} only after psrnn or factorized_psrnn on CUDA")
    code = code_state()   # the code measured: taken before the run, compared with the tree after it
    # on a GPU too: the host CPU launches every kernel of these small models
    conditions = RunConditions(args.threads, args)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    print(f"PTB train {len(train[0]):,d} chars, test {len(test):,d} chars, vocab {V}; device {device}, "
          f"torch threads {torch.get_num_threads()}; hidden {args.hidden}, batch {args.batch}, bptt {args.bptt}; "
          f"{'one epoch' if not args.windows else f'{args.windows} windows'} per run (+{args.warmup} untimed), "
          f"{args.repeats} repeat(s), interleaved")

    # which code runs each model's recurrence, and one untimed evaluation each (first-call costs)
    paths = {}
    for m in models:
        model = build(m, V, args).to(device)
        with kernels_for(m):
            paths[m] = recurrence_paths(m, model, args.hidden)
            if not args.no_eval:
                eval_run(model, test, device)
        print(f"  {m:27s} recurrence: train {paths[m]['train']}, eval {paths[m]['eval']}", flush=True)

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
        s = {"n_parameters": params[m], "recurrence": paths[m],
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
    if not args.no_eval:
        print(EVAL_FOOTNOTE)
    if conditions.warning:
        print(busy_footer(conditions.warning))

    machine = machine_info(code=code)
    reasons = _claim_reasons(args, device, models, paths, machine["kernels"])
    payload = {"benchmark": "throughput", "quick": args.quick, "argv": sys.argv[1:] if argv is None else argv,
               "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "claim_settings": {**CLAIM, "--threads (cpu)": CLAIM_CPU_THREADS, "min_repeats": MIN_REPEATS,
                                  "rows": ["lstm"]},
               "device": str(device), "train_chars_total": len(train[0]), "test_chars": len(test),
               "vocab_size": V, "reference": ref, **conditions.finish()}
    reasons += conditions.reasons
    payload.update(summary=summary, runs=runs)
    tag = args.tag if args.tag is not None else ("" if device.type == "cpu" else device.type)
    finish_record("throughput" + (f"_{tag}" if tag else ""), payload, reasons, code=code, quick=args.quick,
                  out_dir=args.out_dir, machine=machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
