"""The 2SR ridge ratio (λ = ridge · n, the paper's 10⁻²): the numbers behind the README's "ridge" paragraph of
"The model in the library".

* **datasets** (``--root``, a workspace where the default ``dvc repro`` has run, read only): the 1-layer PSRNN's
  epoch-0 test MSE on the continuous sets at each ridge, its features, 2SR and initial model rebuilt from the
  prepared data with the dataset's params but ``two_stage.ridge`` (and one 2SR depth), exactly as the features,
  two_stage and initialise stages build them, in a scratch folder.
* **sine** (no workspace needed): noiseless sines, ``x_t = sin(ω t + φ)`` with ω = 0.25 rad per step and a random
  phase per trajectory, 20 training and 5 test trajectories of 400 steps; a 2SR PSRNN (``fit_model``,
  ``state_dim=10``, ``n_features=500``, ``horizon=5``, no BPTT) at each ridge: its one-step test MSE, and the MSE
  of 50-step forecasts made after the first 350 steps of each test trajectory. A clean, smooth signal is where a
  large ridge over-smooths.

    python benchmarks/ridge_sweep.py --root /path/to/workspace        # both parts, seeds 0 and 1
    python benchmarks/ridge_sweep.py --parts sine

Writes ``benchmarks/results/ridge_sweep.json`` (a subset of ``--parts``: ``ridge_sweep_<parts>.json``), with the
machine details and the code measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (HelpFormatter, add_out_dir_argument, code_state, machine_info,  # noqa: E402
                               positive_int, table, workspace, write_results)

RIDGES = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
DATASETS = ("swimmer", "handwriting", "mocap")
SINE = {"omega": 0.25, "n_train": 20, "n_test": 5, "length": 400, "state_dim": 10, "n_features": 500,
        "horizon": 5, "observed": 350, "ahead": 50}
SINE_QUICK = {**SINE, "n_train": 4, "n_test": 2, "length": 120, "n_features": 100, "observed": 100, "ahead": 20}


def datasets_part(params_raw: dict, root: Path, datasets, ridges, seeds, scratch: Path) -> list[dict[str, Any]]:
    """Epoch-0 test MSE of the 1-layer PSRNN per dataset, ridge and seed, built by the pipeline's own stages."""
    import copy

    from pipeline.config import parse_params
    from pipeline.train import evaluate
    from pipeline.workflow.initialise import initial_model
    from pipeline.workflow.spectral import features, two_stage

    rows = []
    for ridge in ridges:
        work = scratch / f"ridge_{ridge:g}"
        (work / "data").mkdir(parents=True, exist_ok=True)
        link = work / "data" / "prepared"
        if not link.exists():
            link.symlink_to((root / "data" / "prepared").resolve())
        raw = copy.deepcopy(params_raw)
        for name in datasets:
            if not isinstance(raw.get(name), dict):
                raise SystemExit(f"--datasets: {name!r} has no section in {root / 'params.yaml'}")
            raw[name]["two_stage"] = {**(raw[name].get("two_stage") or {}), "ridge": ridge,
                                      "layers": 1}   # the 1-layer PSRNN reads depth 1 alone
            raw[name]["variants"] = ["psrnn"]
        params = parse_params(raw)
        for name in datasets:
            for seed in seeds:
                features(params, work, name, seed)
                two_stage(params, work, name, seed)
                model, ds = initial_model(params, work, name, "psrnn", seed)
                rows.append({"dataset": name, "ridge": ridge, "seed": seed,
                             "init_mse": evaluate(model, ds.test)["mse"]})
                print(f"  {name} ridge {ridge:g} seed {seed}: {rows[-1]['init_mse']:.4g}", file=sys.stderr)
    return rows


def sines(n: int, rng: np.random.Generator, setting: dict[str, Any]) -> list[np.ndarray]:
    t = np.arange(setting["length"])
    return [np.sin(setting["omega"] * t + rng.uniform(0, 2 * np.pi))[:, None] for _ in range(n)]


def sine_part(ridges, seeds, setting: dict[str, Any] = SINE) -> list[dict[str, Any]]:
    """One-step and 50-step test MSE of a 2SR PSRNN on noiseless sines per ridge and seed (data and 2SR)."""
    import warnings

    from pipeline.api import fit_model

    rows = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        train, test = sines(setting["n_train"], rng, setting), sines(setting["n_test"], rng, setting)
        for ridge in ridges:
            # bias-free and odd in q: the far-side note is not what is measured; and a ridge worse than the last
            # value is a row of the table, not news
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitted = fit_model(train, test, model="psrnn", state_dim=setting["state_dim"],
                                   n_features=setting["n_features"], horizon=setting["horizon"], ridge=ridge,
                                   epochs=0, seed=seed, device="cpu")
                one_step = fitted.evaluate(test)["mse"]
            observed, steps = setting["observed"], setting["ahead"]
            ahead = np.stack(fitted.forecast([x[:observed] for x in test], steps))
            truth = np.stack([x[observed:observed + steps] for x in test])
            rows.append({"ridge": ridge, "seed": seed, "one_step_mse": one_step,
                         "forecast_mse": float(np.mean((ahead - truth) ** 2))})
            print(f"  sine ridge {ridge:g} seed {seed}: one-step {rows[-1]['one_step_mse']:.4g}, "
                  f"{steps}-step {rows[-1]['forecast_mse']:.4g}", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--root", type=workspace, default=None,
                    help="a workspace where the default dvc repro has run (read only); needed by the datasets part "
                         "(default: none)")
    ap.add_argument("--parts", default=None,
                    help="comma-separated: datasets, sine (default: both with --root, else sine)")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds (default: %(default)s)")
    ap.add_argument("--ridges", default=",".join(f"{r:g}" for r in RIDGES),
                    help="comma-separated ridge ratios (default: %(default)s)")
    ap.add_argument("--datasets", default=",".join(DATASETS), help="datasets part (default: %(default)s)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: small sines (4 + 2 trajectories of 120 steps, 100 features); writes *_quick.json")
    add_out_dir_argument(ap)
    args = ap.parse_args(argv)
    parts = set((args.parts or ("datasets,sine" if args.root else "sine")).split(","))
    if parts - {"datasets", "sine"}:
        ap.error(f"--parts: unknown {sorted(parts - {'datasets', 'sine'})}; expected datasets, sine")
    if "datasets" in parts and args.root is None:
        ap.error("--parts datasets: needs --root, a workspace where the default dvc repro has run")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        ridges = [float(r) for r in args.ridges.split(",")]
    except ValueError as exc:
        ap.error(f"--seeds / --ridges: {exc}")

    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    code = code_state()
    out: dict[str, Any] = {"seeds": seeds, "ridges": ridges}
    if "datasets" in parts:
        from pipeline.config import read_yaml

        root = args.root.resolve()
        raw = read_yaml((root / "params.yaml").read_text())
        datasets = [d for d in args.datasets.split(",") if d]
        out["root"] = str(root)
        with tempfile.TemporaryDirectory(prefix="ridge_sweep_") as scratch:
            out["datasets"] = datasets_part(raw, root, datasets, ridges, seeds, Path(scratch))
    setting = SINE_QUICK if args.quick else SINE
    if "sine" in parts:
        out["sine_setting"] = setting
        out["sine"] = sine_part(ridges, seeds, setting)

    def mean(rows, key, **match):
        vals = [r[key] for r in rows if all(r[k] == v for k, v in match.items())]
        return float(np.mean(vals)) if vals else float("nan")

    if "datasets" in out:
        names = list(dict.fromkeys(r["dataset"] for r in out["datasets"]))
        print("\nPSRNN epoch-0 test MSE, mean over seeds")
        print(table(["ridge", *names], [[f"{r:g}", *(mean(out["datasets"], "init_mse", dataset=d, ridge=r)
                                                     for d in names)] for r in ridges]))
    if "sine" in out:
        print("\nnoiseless sine: 2SR PSRNN test MSE, mean over seeds")
        print(table(["ridge", "one-step", f"{setting['ahead']}-step forecast"],
                    [[f"{r:g}", mean(out["sine"], "one_step_mse", ridge=r), mean(out["sine"], "forecast_mse", ridge=r)]
                     for r in ridges]))
    name = "ridge_sweep" if parts == {"datasets", "sine"} else "ridge_sweep_" + "_".join(sorted(parts))
    path = write_results(name, {**out, "machine": machine_info(code=code)}, quick=args.quick, out_dir=args.out_dir)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
