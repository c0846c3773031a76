"""What four choices of the 2SR initialisations buy: the numbers behind the README's "Choices the paper leaves open".

Run on a workspace where the default `dvc repro` has run (its prepared data, 2SR and CP artifacts are read; nothing
in it is written), all measured on the test split at epoch 0 unless said otherwise:

* **obs_inverse** — the continuous sets' 1-layer PSRNN with ``two_stage.obs_inverse`` true (the default) and false:
  features, 2SR and initial model recomputed from the prepared data with the dataset's params; also the test MSE
  after the dataset's default training (``--train``), which for PSRNNs at lr 1 shows how far SGD throws each start.
* **linear encoder** — the PSRNN's RFF encoder U_oᵀ·√(2/D)·cos(Ωx + β) against the best affine map fitted to it by
  least squares on the training observations (same W, b, q₁ and decoder): what the paper's "linear encoder"
  (Sec. 6) would cost the 2SR start on continuous data. R² of the fit is reported.
* **decoder refit** — the 2SR decoder is fitted on states filtered with the full W and b = 0; variants with a bias
  (factorized PSRNNs, ``bias_scale`` > 0) or with CP factors filter otherwise, and the initialise stage regresses
  their decoder again on their own filtered training states (``api.initialise_model(decoder_data=...)``). Here the
  initial model as initialise builds it against the same model with the 2SR decoder.
* **kf** — the Kalman filter's linear 2SR as it is (stage 2 ridge-regularised like stage 1, the noise covariance of
  the joint state/observation residuals) against the first version (stage-2 ridge 10⁻⁸ of the mean eigenvalue, the
  innovations form: gain regressed on the residuals, Q = K S Kᵀ, M = K S, R = S): epoch-0 test MSE and the spectral
  radius of A with the dataset's ``kf`` params and, on lgssm, at 12 and 16 states; with ``--train`` also after the
  dataset's default training. The linear 2SR is deterministic, so seeds differ only in training.

    python benchmarks/ablate_init.py --root /path/to/workspace          # all four, seeds from params.yaml
    python benchmarks/ablate_init.py --root . --parts encoder --seeds 0

Writes ``benchmarks/results/ablate_init.json`` (or into ``--out-dir``) with the machine details and the code
measured (a subset of ``--parts``: ``ablate_init_<parts>.json``, so that it never overwrites the full result).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (HelpFormatter, add_out_dir_argument, code_state, machine_info,  # noqa: E402
                               positive_int, table, workspace, write_results)

CONTINUOUS = ("swimmer", "handwriting", "mocap", "lgssm")
DECODER_RUNS = ("ptb:factorized_psrnn_r60", "ptb:factorized_psrnn_r10", "hmm:factorized_psrnn_r10", "hmm:psrnn",
                "hmm:psrnn_2layer", "swimmer:factorized_psrnn_r10", "swimmer:factorized_psrnn_r40",
                "handwriting:factorized_psrnn_r10", "handwriting:factorized_psrnn_r40", "mocap:factorized_psrnn_r10",
                "mocap:factorized_psrnn_r40", "lgssm:factorized_psrnn_r5")


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
    """Epoch-0 test metrics with the 2SR decoder (fitted to the states of W with b = 0) and with the decoder the
    initialise stage gives, regressed on the model's own filtered training states where it filters otherwise."""
    import torch

    from pipeline.metrics import primary_metric
    from pipeline.train import evaluate
    from pipeline.workflow.initialise import initial_model
    from pipeline.workflow.spectral import load_two_stage

    rows = []
    for run in runs:
        name, variant = run.split(":")
        v = params.dataset(name).variant(variant)
        for seed in seeds:
            model, ds = initial_model(params, root, name, variant, seed)
            metric = primary_metric(ds.discrete)
            own = evaluate(model, ds.test)[metric]
            stale = load_two_stage(root, name, seed, v.n_layers).decoder_for(every_layer=v.skip, delta=v.delta)
            with torch.no_grad():
                model.decoder.weight.copy_(torch.as_tensor(stale.weight))
                model.decoder.bias.copy_(torch.as_tensor(stale.bias))
            row = {"dataset": name, "variant": variant, "seed": seed, "metric": metric,
                   "two_stage_decoder": evaluate(model, ds.test)[metric], "refitted_decoder": own}
            print(row, flush=True)
            rows.append(row)
    return rows


def innovations_form_kf(trajectories, *, state_dim: int, past_window: int, future_window: int, ridge: float):
    """The first version of ``pipeline.two_stage.linear_two_stage``, kept as the reference of the ``kf`` part: the
    same stage 1, then A and C with a ridge of 10⁻⁸ × the mean eigenvalue, and the innovations-form noise model."""
    from pipeline.two_stage import LinearStateSpace, _ridge_solve, linear_stage_one

    trajs = [np.asarray(t, dtype=np.float64).reshape(len(t), -1) for t in trajectories]
    stage1 = linear_stage_one(trajs, state_dim=state_dim, past_window=past_window, future_window=future_window,
                              ridge=ridge)
    X, Xs, O, nxt = stage1.states, stage1.shifted_states, stage1.windows.obs, stage1.consecutive
    lam2 = 1e-8 * np.trace(X.T @ X) / state_dim
    A = _ridge_solve(X.T @ X, X.T @ Xs, lam2).T
    C = _ridge_solve(X.T @ X, X.T @ O, lam2).T
    E = O[nxt] - X[nxt] @ C.T                       # innovations
    S = E.T @ E / len(nxt)
    K = _ridge_solve(E.T @ E, E.T @ (X[nxt + 1] - X[nxt] @ A.T), 1e-8 * np.trace(E.T @ E)).T
    return LinearStateSpace(A=A, C=C, Q=K @ S @ K.T, R=S, M=K @ S, x0=X.mean(0),
                            P0=np.cov(X.T).reshape(state_dim, state_dim), mean=stage1.mean)


def kalman_init(params, root: Path, datasets, seeds, train: bool) -> list[dict[str, Any]]:
    """Epoch-0 (and trained) test MSE of the KF from the current and the first linear 2SR."""
    from dataclasses import asdict

    from pipeline.api import initialise_model
    from pipeline.models.common import ModelConfig
    from pipeline.train import evaluate, fit
    from pipeline.two_stage import linear_two_stage
    from pipeline.workflow.paths import load_prepared

    rows = []
    for name in datasets:
        dp = params.dataset(name)
        if dp.kf is None:
            continue
        ds = load_prepared(root, name)
        kf = asdict(dp.kf)
        sizes = [kf["state_dim"]] + ([12, 16] if name == "lgssm" else [])
        for state_dim in sizes:
            for method, build in (("current", linear_two_stage), ("first", innovations_form_kf)):
                lss = build(ds.train, **{**kf, "state_dim": state_dim})
                config = ModelConfig(model="kf", discrete=False, input_dim=ds.obs_dim, output_dim=ds.obs_dim,
                                     state_dim=state_dim)
                for seed in seeds if train else seeds[:1]:
                    model = initialise_model(config, linear=lss, seed=seed)
                    row = {"dataset": name, "state_dim": state_dim, "method": method, "seed": seed,
                           "spectral_radius_A": float(np.max(np.abs(np.linalg.eigvals(lss.A)))),
                           "init_mse": evaluate(model, ds.test)["mse"]}
                    if train and state_dim == kf["state_dim"]:
                        tcfg = replace(dp.train_config("kf"), seed=seed, eval_train=False)
                        row["trained_mse"] = fit(model, ds.train, ds.test, tcfg).history[-1]["test"]["mse"]
                    print(row, flush=True)
                    rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--root", type=workspace, required=True,
                    help="a workspace where the default dvc repro has run (read only; required)")
    ap.add_argument("--parts", default="inverse,encoder,decoder,kf",
                    help="comma-separated: inverse, encoder, decoder, kf (default: all four)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: params.yaml seeds)")
    ap.add_argument("--datasets", default=",".join(CONTINUOUS),
                    help="continuous datasets for inverse, encoder and kf (default: %(default)s)")
    ap.add_argument("--no-train", action="store_true",
                    help="inverse and kf: epoch 0 only, skip the default training")
    ap.add_argument("--decoder-runs", default=",".join(DECODER_RUNS),
                    help="comma-separated dataset:variant runs of the decoder part (default: %(default)s)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    add_out_dir_argument(ap)
    args = ap.parse_args(argv)

    import tempfile

    import torch
    from pipeline.config import read_yaml

    from pipeline.config import parse_params

    torch.set_num_threads(args.threads)
    code = code_state()   # the code measured: taken before the run, compared with the tree after it
    root = args.root.resolve()
    raw = read_yaml((root / "params.yaml").read_text())
    params = parse_params(raw)
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else params.seeds
    except ValueError:
        ap.error(f"--seeds {args.seeds}: expected comma-separated integers, e.g. 0,1")
    datasets = [d for d in args.datasets.split(",") if d]
    decoder_runs = [r for r in args.decoder_runs.split(",") if r]
    if any(r.count(":") != 1 for r in decoder_runs):
        ap.error(f"--decoder-runs: expected dataset:variant items, got {args.decoder_runs!r}")
    parts = set(args.parts.split(","))
    unknown = parts - {"inverse", "encoder", "decoder", "kf"}
    if unknown:
        ap.error(f"--parts: unknown {sorted(unknown)}; expected inverse, encoder, decoder, kf")
    out: dict[str, Any] = {"root": str(root), "seeds": seeds}
    if "inverse" in parts:
        with tempfile.TemporaryDirectory(prefix="ablate_init_") as scratch:
            out["obs_inverse"] = obs_inverse(raw, root, datasets, seeds, not args.no_train, Path(scratch))
    if "encoder" in parts:
        out["linear_encoder"] = linear_encoder(params, root, datasets, seeds)
    if "decoder" in parts:
        out["decoder_refit"] = decoder_refit(params, root, decoder_runs, seeds)
    if "kf" in parts:
        out["kalman_init"] = kalman_init(params, root, datasets, seeds, not args.no_train)

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
        for run in decoder_runs:
            name, variant = run.split(":")
            before, after = (mean(rows, key, dataset=name, variant=variant)
                             for key in ("two_stage_decoder", "refitted_decoder"))
            lines.append([run, before, after, after - before])
        print(table(["run", "2SR decoder", "refitted", "difference"], lines))
    if "kalman_init" in out:
        rows = out["kalman_init"]
        print("\nkf: test MSE (mean over seeds) and spectral radius of A, current linear 2SR against the first")
        lines = []
        for d, n in dict.fromkeys((r["dataset"], r["state_dim"]) for r in rows):
            cells = [f"{d} ({n} states)"]
            for key in ("init_mse", "trained_mse", "spectral_radius_A"):
                cells += [mean(rows, key, dataset=d, state_dim=n, method=m) for m in ("current", "first")]
            lines.append(cells)
        print(table(["dataset", "epoch 0", "epoch 0, first", "trained", "trained, first", "ρ(A)", "ρ(A), first"],
                    lines))
    every = {"inverse", "encoder", "decoder", "kf"}
    name = "ablate_init" if parts == every else "ablate_init_" + "_".join(p for p in sorted(parts))
    # a subset never overwrites the full result
    path = write_results(name, {"machine": machine_info(code=code), **out}, out_dir=args.out_dir)
    print(f"\nwritten {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
