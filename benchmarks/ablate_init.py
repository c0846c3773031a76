"""What three choices of the 2SR initialisation buy: the numbers behind the README's "Choices the paper leaves open".

Run on a workspace where the default `dvc repro` has run (its prepared data, 2SR and CP artifacts are read; nothing
in it is written), all measured on the test split at epoch 0 unless said otherwise:

* **obs_inverse** — the continuous sets' 1-layer PSRNN with ``two_stage.obs_inverse`` true (the default) and false:
  features, 2SR and initial model recomputed from the prepared data with the dataset's params; also the test MSE
  after the dataset's default training (``--train``), which for PSRNNs at lr 1 shows how far SGD throws each start.
* **linear encoder** — the PSRNN's RFF encoder U_oᵀ·√(2/D)·cos(Ωx + β) against the best affine map fitted to it by
  least squares on the training observations (same W, b, q₁ and decoder): what the paper's "linear encoder"
  (Sec. 5) would cost the 2SR start on continuous data. R² of the fit is reported.
* **decoder refit** — the 2SR decoder is fitted on states filtered with the full W and b = 0; variants with a bias
  (factorized PSRNNs, ``bias_scale`` > 0) or with CP factors start from another filter. Here the decoder is refitted
  on each initial model's own filtered training states.

    python benchmarks/ablate_init.py --root /path/to/workspace          # all three, seeds from params.yaml
    python benchmarks/ablate_init.py --root . --parts encoder --seeds 0

Writes ``benchmarks/results/ablate_init.json`` with the machine details.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, table, write_results  # noqa: E402

CONTINUOUS = ("swimmer", "handwriting", "mocap", "lgssm")
DECODER_RUNS = ("ptb:factorized_psrnn_r60", "ptb:factorized_psrnn_r10", "ptb:psrnn", "hmm:factorized_psrnn_r10",
                "hmm:psrnn")


def obs_inverse(params_raw: dict, root: Path, datasets, seeds, train: bool, scratch: Path) -> list[dict[str, Any]]:
    """Epoch-0 (and trained) test MSE of the PSRNN with and without the observation inverse."""
    import copy

    from pipeline.config import parse_params
    from pipeline.train import evaluate, fit
    from pipeline.workflow.initialise import initial_model
    from pipeline.workflow.spectral import features, two_stage

    rows = []
    for name in datasets:
        for inverse in (True, False):
            work = scratch / ("with" if inverse else "without")
            (work / "data").mkdir(parents=True, exist_ok=True)
            link = work / "data" / "prepared"
            if not link.exists():
                link.symlink_to((root / "data" / "prepared").resolve())
            raw = copy.deepcopy(params_raw)
            raw[name]["two_stage"]["obs_inverse"] = inverse
            params = parse_params(raw)
            dp = params.dataset(name)
            for seed in seeds:
                features(params, work, name, seed)
                two_stage(params, work, name, seed)
                model, ds = initial_model(params, work, name, "psrnn", seed)
                row = {"dataset": name, "obs_inverse": inverse, "seed": seed,
                       "init_mse": evaluate(model, ds.test)["mse"]}
                if train:
                    tcfg = replace(dp.train_config("psrnn"), seed=seed, device="cpu")
                    row["trained_mse"] = fit(model, ds.train, ds.test, tcfg).history[-1]["test"]["mse"]
                    row["epochs"], row["lr"] = tcfg.epochs, tcfg.lr
                print(row, flush=True)
                rows.append(row)
    return rows


def linear_encoder(params, root: Path, datasets, seeds) -> list[dict[str, Any]]:
    """Epoch-0 test MSE with the RFF encoder and with its least-squares affine approximation."""
    import torch

    from pipeline.train import evaluate
    from pipeline.workflow.initialise import initial_model

    rows = []
    for name in datasets:
        for seed in seeds:
            model, ds = initial_model(params, root, name, "psrnn", seed)
            rff = evaluate(model, ds.test)["mse"]
            encoder = model.encoders[0]
            X = np.concatenate(ds.train).astype(np.float64)
            with torch.no_grad():
                O = encoder(torch.as_tensor(X, dtype=encoder.frequencies.dtype)).double().numpy()
            A = np.c_[X, np.ones(len(X))]
            coef, *_ = np.linalg.lstsq(A, O, rcond=None)
            r2 = 1.0 - float(((A @ coef - O) ** 2).sum() / ((O - O.mean(0)) ** 2).sum())
            M = torch.as_tensor(coef, dtype=encoder.frequencies.dtype)

            def affine(x: torch.Tensor, M: torch.Tensor = M) -> torch.Tensor:
                return torch.cat([x, torch.ones(*x.shape[:-1], 1, dtype=x.dtype)], -1) @ M

            encoder.forward = affine   # this instance only: the model is thrown away after
            row = {"dataset": name, "seed": seed, "rff_mse": rff, "linear_mse": evaluate(model, ds.test)["mse"],
                   "r2": r2}
            print(row, flush=True)
            rows.append(row)
    return rows


def decoder_refit(params, root: Path, runs, seeds) -> list[dict[str, Any]]:
    """Epoch-0 test metrics with the 2SR decoder and with one refitted to the initial model's own states."""
    import torch

    from pipeline.metrics import primary_metric
    from pipeline.train import evaluate
    from pipeline.two_stage import fit_decoder
    from pipeline.workflow.initialise import initial_model

    rows = []
    for run in runs:
        name, variant = run.split(":")
        for seed in seeds:
            model, ds = initial_model(params, root, name, variant, seed)
            metric = primary_metric(ds.discrete)
            before = evaluate(model, ds.test)[metric]
            # the model's own forward with the decoder taken out gives what the decoder reads, per step
            decoder, model.decoder = model.decoder, torch.nn.Identity()
            dtype = next(model.parameters()).dtype
            states = []
            with torch.no_grad():
                for traj in ds.train:
                    x = torch.as_tensor(traj)[:, None] if ds.discrete else torch.as_tensor(traj, dtype=dtype)[:, None]
                    states.append(model(x, model.init_state(1))[0][:, 0].double().numpy())
            model.decoder = decoder
            dec = fit_decoder(states, ds.train, discrete=ds.discrete, vocab_size=ds.obs_dim if ds.discrete else 0,
                              ridge=params.dataset(name).two_stage.decoder_ridge)
            with torch.no_grad():
                model.decoder.weight.copy_(torch.as_tensor(dec.weight))
                model.decoder.bias.copy_(torch.as_tensor(dec.bias))
            row = {"dataset": name, "variant": variant, "seed": seed, "metric": metric, "two_stage_decoder": before,
                   "refitted_decoder": evaluate(model, ds.test)[metric]}
            print(row, flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, required=True,
                    help="a workspace where the default dvc repro has run (read only)")
    ap.add_argument("--parts", default="inverse,encoder,decoder",
                    help="comma-separated: inverse, encoder, decoder (default: all three)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: params.yaml seeds)")
    ap.add_argument("--datasets", default=",".join(CONTINUOUS),
                    help="continuous datasets for inverse and encoder (default: %(default)s)")
    ap.add_argument("--no-train", action="store_true", help="inverse: epoch 0 only, skip the default training")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = ap.parse_args(argv)

    import tempfile

    import torch
    import yaml

    from pipeline.config import parse_params

    torch.set_num_threads(args.threads)
    root = args.root.resolve()
    raw = yaml.safe_load((root / "params.yaml").read_text())
    params = parse_params(raw)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else params.seeds
    datasets = [d for d in args.datasets.split(",") if d]
    parts = set(args.parts.split(","))
    unknown = parts - {"inverse", "encoder", "decoder"}
    if unknown:
        ap.error(f"--parts: unknown {sorted(unknown)}; expected inverse, encoder, decoder")
    out: dict[str, Any] = {"root": str(root), "seeds": seeds}
    if "inverse" in parts:
        with tempfile.TemporaryDirectory(prefix="ablate_init_") as scratch:
            out["obs_inverse"] = obs_inverse(raw, root, datasets, seeds, not args.no_train, Path(scratch))
    if "encoder" in parts:
        out["linear_encoder"] = linear_encoder(params, root, datasets, seeds)
    if "decoder" in parts:
        out["decoder_refit"] = decoder_refit(params, root, DECODER_RUNS, seeds)

    def mean(rows, key, **match):
        vals = [r[key] for r in rows if all(r[k] == v for k, v in match.items()) and key in r]
        return float(np.mean(vals)) if vals else float("nan")

    if "obs_inverse" in out:
        rows = out["obs_inverse"]
        print("\nobs_inverse: PSRNN test MSE, mean over seeds")
        print(table(["dataset", "epoch 0, with", "epoch 0, without", "trained, with", "trained, without"],
                    [[d, mean(rows, "init_mse", dataset=d, obs_inverse=True),
                      mean(rows, "init_mse", dataset=d, obs_inverse=False),
                      mean(rows, "trained_mse", dataset=d, obs_inverse=True),
                      mean(rows, "trained_mse", dataset=d, obs_inverse=False)] for d in datasets]))
    if "linear_encoder" in out:
        rows = out["linear_encoder"]
        print("\nencoder: PSRNN epoch-0 test MSE, mean over seeds")
        print(table(["dataset", "RFF encoder", "affine fit", "ratio", "R² of the fit"],
                    [[d, mean(rows, "rff_mse", dataset=d), mean(rows, "linear_mse", dataset=d),
                      mean(rows, "linear_mse", dataset=d) / mean(rows, "rff_mse", dataset=d),
                      mean(rows, "r2", dataset=d)] for d in datasets]))
    if "decoder_refit" in out:
        rows = out["decoder_refit"]
        print("\ndecoder: epoch-0 test BPC / MSE, mean over seeds")
        lines = []
        for run in DECODER_RUNS:
            name, variant = run.split(":")
            before, after = (mean(rows, key, dataset=name, variant=variant)
                             for key in ("two_stage_decoder", "refitted_decoder"))
            lines.append([run, before, after, after - before])
        print(table(["run", "2SR decoder", "refitted", "difference"], lines))
    path = write_results("ablate_init", {"machine": machine_info(), **out})
    print(f"\nwritten {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
