"""What each DVC stage does, as functions of (params, project root, dataset, seed...).

``stages/<stage>.py`` only parses its command line and calls one of these. Paths (relative to the root):

    data/raw/<source>/                         download        raw files, sha256-verified
    data/prepared/<dataset>.parquet            preprocess      pipeline.data.schema
    artifacts/<dataset>/s<seed>/features.npz   features        layer-1 RFF maps (frequencies, offsets, widths)
    artifacts/<dataset>/s<seed>/2sr/L<l>.npz   two_stage       a 2SR initialisation of depth l (all its layers)
    artifacts/<dataset>/s<seed>/2sr/kf.npz                     the linear 2SR Kalman filter (continuous data)
    artifacts/<dataset>/s<seed>/cp/r<r>.npz    decompose       CP factors of the layer-1 tensor, rank r
    artifacts/<dataset>/s<seed>/init/<v>.npz   initialise      initial weights of every variant v
    models/<dataset>/<v>/s<seed>/              refine          checkpoint.pt, history.json, run_id, done
    plots/<dataset>/<v>/s<seed>.json           refine          per-epoch curves (dvc plots)
    metrics/<dataset>/<v>_s<seed>.json         evaluate        final metrics (a dvc metrics directory per dataset)
    predictions/<dataset>/<v>_s<seed>.parquet  evaluate        one-step predictions before/after training (continuous)
    reports/figures/*.png, reports/results.md  report
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import DOWNLOADED, DatasetParams, Params, ParamsError, Variant
from pipeline.data.schema import SequenceDataset, read_dataset, write_dataset
from pipeline.io import load_npz, read_json, save_npz, write_json, write_text

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------- paths

def raw_dir(root: Path, source: str) -> Path:
    return root / "data" / "raw" / source


def prepared_path(root: Path, dataset: str) -> Path:
    return root / "data" / "prepared" / f"{dataset}.parquet"


def artifact_dir(root: Path, dataset: str, seed: int) -> Path:
    return root / "artifacts" / dataset / f"s{seed}"


def run_name(variant: str, seed: int) -> str:
    return f"{variant}_s{seed}"


def variant_dir(root: Path, dataset: str, variant: str) -> Path:
    """The output of stage ``refine_<dataset>@<variant>``: one :func:`model_dir` per seed."""
    return root / "models" / dataset / variant


def model_dir(root: Path, dataset: str, variant: str, seed: int) -> Path:
    return variant_dir(root, dataset, variant) / f"s{seed}"


def plot_path(root: Path, dataset: str, variant: str, seed: int) -> Path:
    return root / "plots" / dataset / variant / f"s{seed}.json"


# -------------------------------------------------------------------------------------------- download

def download(params: Params, root: Path, source: str) -> dict[str, str]:
    from pipeline.data.download import MANIFEST, cmu_trial_files, fetch, mirror_from_env

    if source not in DOWNLOADED:
        raise ParamsError(f"download: {source!r} has no raw files (expected one of {DOWNLOADED})")
    mirror_root = mirror_from_env() or (Path(params.data_mirror) if params.data_mirror else None)
    if mirror_root is not None and not mirror_root.is_absolute():
        mirror_root = (root / mirror_root).resolve()
    files = list(MANIFEST[source])
    if source == "mocap" and "mocap" in params.datasets:
        known = {f.path for f in files}
        for trial in params.datasets["mocap"].source.get("trials", []):
            for f in cmu_trial_files(trial):
                if f.path not in known:
                    files.append(f)
                    known.add(f.path)
    mirror = mirror_root / source if mirror_root is not None else None
    return fetch(files, raw_dir(root, source), mirror)


# ------------------------------------------------------------------------------------------ preprocess

def prepare(params: Params, root: Path, dataset: str) -> SequenceDataset:
    """Build the prepared dataset from raw files (or a generator) and write it as Parquet."""
    dp = params.dataset(dataset)
    src = dict(dp.source)
    if dataset == "ptb":
        from pipeline.data.ptb import prepare_ptb

        ds = prepare_ptb(raw_dir(root, "ptb"), **src)
    elif dataset == "handwriting":
        from pipeline.data.handwriting import prepare_handwriting

        ds = prepare_handwriting(raw_dir(root, "handwriting"), **src)
    elif dataset == "mocap":
        from pipeline.data.mocap import prepare_mocap

        ds = prepare_mocap(raw_dir(root, "mocap"), **src)
    elif dataset == "swimmer":
        from pipeline.data import swimmer

        mode = src.pop("mode", "simulate")
        if mode == "authors":
            keep = {k: src[k] for k in ("train_file", "test_file", "n_train", "n_test") if k in src}
            ds = swimmer.load_authors_swimmer(raw_dir(root, "swimmer"), **keep)
        else:
            drop = {"train_file", "test_file", "n_test"}
            ds = swimmer.simulate_swimmer(**{k: v for k, v in src.items() if k not in drop})
    elif dataset == "hmm":
        from pipeline.data.synthetic import make_hmm_dataset

        ds, _ = make_hmm_dataset(**src)
    elif dataset == "lgssm":
        from pipeline.data.synthetic import make_lgssm_dataset

        ds, _ = make_lgssm_dataset(**src)
    elif dataset == "custom":
        from pipeline.data.custom import load_custom

        path = Path(src.pop("path"))
        ds = load_custom(path if path.is_absolute() else root / path, **src)
    else:
        raise ParamsError(f"unknown dataset {dataset!r}")
    _check_lengths(dp, ds)
    write_dataset(prepared_path(root, dataset), ds)
    return ds


def _check_lengths(dp: DatasetParams, ds: SequenceDataset) -> None:
    for split in ("train", "test"):
        if not ds.split(split):
            raise ParamsError(f"{dp.name}.source: the {split} split is empty")
    need = dp.two_stage.past_window + dp.two_stage.future_window + 1
    longest = max(len(t) for t in ds.train)
    if need > longest:
        raise ParamsError(f"{dp.name}.two_stage: past_window + future_window + 1 = {need} exceeds the longest "
                          f"training trajectory ({longest} steps)")
    if any(v.family == "kf" for v in dp.variants):
        need_kf = dp.kf.past_window + dp.kf.future_window + 1
        if need_kf > longest:
            raise ParamsError(f"{dp.name}.kf: past_window + future_window + 1 = {need_kf} exceeds the longest "
                              f"training trajectory ({longest} steps)")


def load_prepared(root: Path, dataset: str) -> SequenceDataset:
    return read_dataset(prepared_path(root, dataset))


# -------------------------------------------------------------------------------------------- features

def _two_stage_config(dp: DatasetParams, seed: int):
    from pipeline.two_stage import TwoStageConfig

    return TwoStageConfig(**{**asdict(dp.two_stage), "seed": seed})


def features(params: Params, root: Path, dataset: str, seed: int) -> Path:
    from pipeline.features import fit_feature_maps, make_windows

    dp = params.dataset(dataset)
    ds = load_prepared(root, dataset)
    cfg = _two_stage_config(dp, seed)
    cfg.validate()
    windows = make_windows(ds.train, cfg.past_window, cfg.future_window, discrete=ds.discrete,
                           vocab_size=ds.obs_dim if ds.discrete else None)
    maps = fit_feature_maps(windows, n_features=cfg.n_features, obs_dim=ds.obs_dim,
                            vocab_size=ds.obs_dim if ds.discrete else 0, widths=cfg.widths,
                            width_scale=cfg.width_scale, seed=seed)
    out = artifact_dir(root, dataset, seed) / "features.npz"
    save_npz(out, maps.to_arrays(), meta={"dataset": dataset, "seed": seed, "two_stage": asdict(cfg),
                                          "n_windows": len(windows)})
    return out


# ------------------------------------------------------------------------------------------- two stage

def two_stage(params: Params, root: Path, dataset: str, seed: int) -> Path:
    from pipeline.features import FeatureMaps
    from pipeline.two_stage import linear_two_stage, two_stage_depths

    dp = params.dataset(dataset)
    ds = load_prepared(root, dataset)
    cfg = _two_stage_config(dp, seed)
    arrays, _ = load_npz(artifact_dir(root, dataset, seed) / "features.npz")
    maps = FeatureMaps.from_arrays(arrays)
    out = artifact_dir(root, dataset, seed) / "2sr"
    out.mkdir(parents=True, exist_ok=True)
    depths = two_stage_depths(ds.train, cfg, n_layers=dp.max_layers, discrete=ds.discrete,
                              vocab_size=ds.obs_dim if ds.discrete else 0, maps=maps)
    for depth, tsm in enumerate(depths, start=1):  # layer l is learned once for all depths >= l
        save_npz(out / f"L{depth}.npz", tsm.to_arrays(), meta={**tsm.meta(), "dataset": dataset, "seed": seed})
    if any(v.family == "kf" for v in dp.variants):
        lss = linear_two_stage(ds.train, state_dim=dp.kf.state_dim, past_window=dp.kf.past_window,
                               future_window=dp.kf.future_window, ridge=dp.kf.ridge)
        save_npz(out / "kf.npz", lss.to_arrays(), meta={"dataset": dataset, "seed": seed, "kf": asdict(dp.kf),
                                                         "diagnostics": lss.diagnostics})
    return out


def load_two_stage(root: Path, dataset: str, seed: int, depth: int):
    from pipeline.two_stage import TwoStageModel

    arrays, meta = load_npz(artifact_dir(root, dataset, seed) / "2sr" / f"L{depth}.npz")
    return TwoStageModel.from_arrays(arrays, meta)


# ------------------------------------------------------------------------------------------- decompose

def decompose(params: Params, root: Path, dataset: str, seed: int) -> Path:
    from pipeline.decompose import cp_decompose

    dp = params.dataset(dataset)
    out = artifact_dir(root, dataset, seed) / "cp"
    out.mkdir(parents=True, exist_ok=True)
    tsm = load_two_stage(root, dataset, seed, 1)
    for rank in dp.ranks:
        f = cp_decompose(tsm.layers[0].W, rank, seed=seed)
        save_npz(out / f"r{rank}.npz", f.as_dict(), meta={"rank": rank, "relative_error": f.relative_error,
                                                           "dataset": dataset, "seed": seed})
    write_json(out / "summary.json", {"ranks": dp.ranks})
    return out


# ------------------------------------------------------------------------------------------ initialise

def model_config(dp: DatasetParams, ds: SequenceDataset, variant: Variant):
    from pipeline.models.common import ModelConfig

    ts = dp.two_stage
    bias = dp.model.factorized_bias_scale if variant.family == "factorized_psrnn" else dp.model.psrnn_bias_scale
    return ModelConfig(model=variant.family, discrete=ds.discrete, input_dim=ds.obs_dim, output_dim=ds.obs_dim,
                       state_dim=dp.kf.state_dim if variant.family == "kf" else ts.state_dim, obs_dim=ts.obs_dim,
                       n_layers=variant.n_layers, rank=variant.rank, n_rff=ts.n_features, init=variant.init,
                       bias_scale=bias)


def initial_model(params: Params, root: Path, dataset: str, variant_name: str, seed: int):
    """The model of a variant, initialised from the 2SR / CP artifacts (or at random)."""
    from pipeline.api import initialise_model
    from pipeline.decompose import CPFactors
    from pipeline.two_stage import LinearStateSpace

    dp = params.dataset(dataset)
    variant = dp.variant(variant_name)
    ds = load_prepared(root, dataset)
    cfg = model_config(dp, ds, variant)
    tsm = cps = lss = None
    adir = artifact_dir(root, dataset, seed)
    if variant.family in ("psrnn", "factorized_psrnn") and variant.init == "2sr":
        tsm = load_two_stage(root, dataset, seed, variant.n_layers)
        if variant.rank is not None:
            a, m = load_npz(adir / "cp" / f"r{variant.rank}.npz")
            cps = [CPFactors(A=a["A"], B=a["B"], C=a["C"], relative_error=m["relative_error"])]
    elif variant.family == "kf":
        a, _ = load_npz(adir / "2sr" / "kf.npz")
        lss = LinearStateSpace.from_arrays(a)
    return initialise_model(cfg, two_stage=tsm, cp=cps, linear=lss, seed=seed), ds


def initialise(params: Params, root: Path, dataset: str, seed: int) -> Path:
    """Initial weights of every variant, one deterministic .npz each: a variant whose initialisation does not
    read the 2SR artifacts (Xavier baselines) keeps the same bytes when they change, so DVC does not retrain it."""
    dp = params.dataset(dataset)
    out = artifact_dir(root, dataset, seed) / "init"
    out.mkdir(parents=True, exist_ok=True)
    for variant in dp.variants:
        model, _ = initial_model(params, root, dataset, variant.name, seed)
        state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        save_npz(out / f"{variant.name}.npz", state, meta={"model_config": model.config.to_dict(), "seed": seed,
                                                           "n_params": model.n_parameters()})
    return out


def load_initial(root: Path, dataset: str, variant: str, seed: int):
    import torch

    from pipeline.models import ModelConfig, build_model

    arrays, meta = load_npz(artifact_dir(root, dataset, seed) / "init" / f"{variant}.npz")
    model = build_model(ModelConfig(**meta["model_config"]))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
    return model


# ---------------------------------------------------------------------------------------------- refine

def _fingerprint(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Path):
            h.update(p.read_bytes())
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
    return h.hexdigest()


def refine(params: Params, root: Path, dataset: str, variant_name: str, seed: int | None = None
           ) -> dict[int, dict[str, Any]]:
    """Stage ``refine_<dataset>@<variant>``: :func:`refine_run` for every seed of params.yaml (or one ``seed``).

    The seeds of a variant share one process, so torch and MLflow are imported once rather than once per run
    (about 10 s each time). A seed already trained with the same configuration (its ``done`` marker holds the
    fingerprint of train config, initial weights and data) is not trained or logged again: adding a seed, or a
    2SR change that leaves this variant's initial weights as they were, costs only the check. Model folders of
    seeds no longer in params.yaml are removed, so the stage's output matches its params."""
    import shutil

    seeds = list(params.seeds) if seed is None else [seed]
    vdir = variant_dir(root, dataset, variant_name)
    if seed is None and vdir.is_dir():
        keep = {f"s{s}" for s in seeds}
        for stale in sorted(vdir.iterdir()):
            if stale.is_dir() and stale.name not in keep:
                log.info("refine %s/%s: removing %s (seed not in params.yaml)", dataset, variant_name, stale)
                shutil.rmtree(stale)
    return {s: refine_run(params, root, dataset, variant_name, s) for s in seeds}


def _write_plot(root: Path, dataset: str, variant: str, seed: int, history: list[dict[str, Any]]) -> None:
    rows = []
    for entry in history:
        row = {"epoch": entry["epoch"]}
        for split in ("train", "valid", "test"):
            for k, v in (entry.get(split) or {}).items():
                row[f"{split}_{k}"] = v
        rows.append(row)
    write_json(plot_path(root, dataset, variant, seed), rows)


def refine_run(params: Params, root: Path, dataset: str, variant_name: str, seed: int) -> dict[str, Any]:
    """BPTT of one (variant, seed) from its initial weights, tracked as one MLflow run; resumes from a checkpoint
    of the same configuration after a crash, and does nothing (but rewrite its plot file) when already done."""
    from dataclasses import replace

    from pipeline.train_config import TrainConfig

    dp = params.dataset(dataset)
    variant = dp.variant(variant_name)
    init_path = artifact_dir(root, dataset, seed) / "init" / f"{variant_name}.npz"
    if not init_path.is_file():
        raise FileNotFoundError(f"{init_path}: initial weights not found (run initialise first)")
    tcfg: TrainConfig = replace(dp.train, seed=seed)
    mdir = model_dir(root, dataset, variant_name, seed)
    fingerprint = _fingerprint(asdict(tcfg), init_path, prepared_path(root, dataset))
    done_file, history_file = mdir / "done", mdir / "history.json"
    if done_file.is_file() and done_file.read_text().strip() == fingerprint and history_file.is_file():
        history = read_json(history_file)
        _write_plot(root, dataset, variant_name, seed, history["history"])
        log.info("refine %s/%s seed %d: already trained with this configuration", dataset, variant_name, seed)
        return history

    import torch

    from pipeline.tracking import RunTracker, git_commit
    from pipeline.train import fit, load_checkpoint

    ds = load_prepared(root, dataset)
    model = load_initial(root, dataset, variant_name, seed)
    mdir.mkdir(parents=True, exist_ok=True)
    ckpt = mdir / "checkpoint.pt"
    fp_file = mdir / "fingerprint.txt"
    run_id_file = mdir / "run_id"
    if done_file.exists():
        done_file.unlink()
    resume = ckpt.exists() and fp_file.exists() and fp_file.read_text().strip() == fingerprint
    if not resume:
        for stale in (ckpt, run_id_file, history_file):
            if stale.exists():
                stale.unlink()
    write_text(fp_file, fingerprint + "\n")
    prefix = params.tracking.get("experiment_prefix", "psrnn")
    tags = {"dataset": dataset, "variant": variant_name, "family": variant.family, "seed": str(seed),
            "dvc_stage": os.environ.get("DVC_STAGE", f"refine_{dataset}@{variant_name}")}
    commit = git_commit(root)
    if commit:
        tags["mlflow.source.git.commit"] = commit
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc_exp_name"] = os.environ["DVC_EXP_NAME"]
    previous = run_id_file.read_text().strip() if resume and run_id_file.exists() else None
    tracker = RunTracker(root=root, experiment=f"{prefix}-{dataset}", run_name=run_name(variant_name, seed),
                         run_id=previous, tags=tags)
    write_text(run_id_file, tracker.run_id + "\n")
    tracker.log_params({"dataset": dataset, "variant": variant_name, "seed": seed,
                        "model": model.config.to_dict(), "train": asdict(tcfg),
                        "two_stage": asdict(dp.two_stage), "n_params": model.n_parameters(),
                        "source": dp.source})
    if resume:
        # a kill can fall between an epoch's checkpoint and its MLflow logging: log what the run lacks
        from pipeline.metrics import primary_metric

        logged = tracker.logged_steps(f"test_{primary_metric(ds.discrete)}")
        for entry in load_checkpoint(ckpt)["history"]:
            if entry["epoch"] not in logged:
                tracker.log_epoch(entry)

    def on_epoch(entry: dict[str, Any]) -> None:
        tracker.log_epoch(entry)

    try:
        result = fit(model, ds.train, ds.test, tcfg, valid=ds.valid or None, checkpoint_path=ckpt,
                     resume=resume, on_epoch=on_epoch)
    except BaseException:
        tracker.finish("FAILED")
        raise
    history = {"dataset": dataset, "variant": variant_name, "family": variant.family, "seed": seed,
               "kind": ds.kind, "n_params": model.n_parameters(), "best_epoch": result.best_epoch,
               "best_metric": result.best_metric, "history": result.history}
    write_json(history_file, history)
    _write_plot(root, dataset, variant_name, seed, result.history)
    last = result.history[-1]
    tracker.log_metrics({f"final_test_{k}": v for k, v in last["test"].items()}, step=int(last["epoch"]))
    if params.tracking.get("log_checkpoints", True):
        tracker.log_artifact(ckpt, "checkpoints")
    tracker.log_artifact(mdir / "history.json")
    if params.tracking.get("log_model", True):
        model.load_state_dict(load_checkpoint(ckpt)["model"])
        tracker.log_model(model, pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"])
    tracker.finish()
    write_text(done_file, fingerprint + "\n")
    return history


# -------------------------------------------------------------------------------------------- evaluate

def metrics_dir(root: Path, dataset: str) -> Path:
    return root / "metrics" / dataset


def predictions_dir(root: Path, dataset: str) -> Path:
    return root / "predictions" / dataset


def evaluate_run(params: Params, root: Path, dataset: str, variant_name: str, seed: int,
                 ds: SequenceDataset | None = None) -> dict[str, Any]:
    """Final test metrics of one trained model (the last epoch), its epoch-0 metrics, and, for continuous data, the
    one-step predictions before and after training. MLflow already has these numbers from refine (the last epoch's
    test metrics are logged there as ``final_test_*``), so evaluation does not import it."""
    from pipeline.train import evaluate, load_checkpoint, predict

    dp = params.dataset(dataset)
    variant = dp.variant(variant_name)
    ds = ds if ds is not None else load_prepared(root, dataset)
    mdir = model_dir(root, dataset, variant_name, seed)
    ck = load_checkpoint(mdir / "checkpoint.pt")
    initial = load_initial(root, dataset, variant_name, seed)
    final = copy.deepcopy(initial)
    final.load_state_dict(ck["model"])
    final_metrics = evaluate(final, ds.test)
    initial_metrics = evaluate(initial, ds.test)
    result = {"dataset": dataset, "variant": variant_name, "family": variant.family, "seed": seed,
              "kind": ds.kind, "n_params": final.n_parameters(), "epochs": ck["epoch"],
              "test": final_metrics, "initial_test": initial_metrics,
              "bayes_optimal": ds.meta.get("bayes_optimal")}
    name = run_name(variant_name, seed)
    if not ds.discrete:
        _write_predictions(predictions_dir(root, dataset) / f"{name}.parquet", ds,
                           predict(initial, ds.test), predict(final, ds.test))
    write_json(metrics_dir(root, dataset) / f"{name}.json", result)
    return result


def evaluate_dataset(params: Params, root: Path, dataset: str) -> dict[str, dict[str, Any]]:
    """Stage ``evaluate_<dataset>``: :func:`evaluate_run` for every variant x seed of the dataset, in one process
    (a process per run would spend most of its time importing torch). Every checkpoint is checked to exist before
    any evaluation, so a missing model fails in a second, naming it."""
    from pipeline.progress import progress

    dp = params.dataset(dataset)
    runs = [(v.name, seed) for v in dp.variants for seed in params.seeds]
    checkpoints = [model_dir(root, dataset, v, s) / "checkpoint.pt" for v, s in runs]
    missing = [str(c) for c in checkpoints if not c.is_file()]
    if missing:
        raise FileNotFoundError(f"{missing[0]}: checkpoint not found (run refine first; "
                                f"{len(missing)} of {len(runs)} missing)")
    ds = load_prepared(root, dataset)
    results = {}
    for v, s in progress(runs, desc=f"evaluate {dataset}", unit="run"):
        results[run_name(v, s)] = evaluate_run(params, root, dataset, v, s, ds=ds)
    return results


def _write_predictions(path: Path, ds: SequenceDataset, initial: list[np.ndarray], final: list[np.ndarray]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.io import atomic_path

    cols: dict[str, list] = {"trajectory": [], "step": [], "feature": [], "target": [], "initial": [], "final": []}
    for i, (traj, p0, p1) in enumerate(zip(ds.test, initial, final)):
        T = len(traj)
        for j, name in enumerate(ds.features):
            cols["trajectory"].append(np.full(T - 1, i))
            cols["step"].append(np.arange(1, T))
            cols["feature"].extend([name] * (T - 1))
            cols["target"].append(traj[1:, j])
            cols["initial"].append(p0[:-1, j])
            cols["final"].append(p1[:-1, j])
    table = pa.table({
        "trajectory": pa.array(np.concatenate(cols["trajectory"]).astype(np.int64)),
        "step": pa.array(np.concatenate(cols["step"]).astype(np.int64)),
        "feature": pa.array(cols["feature"], type=pa.string()),
        "target": pa.array(np.concatenate(cols["target"]).astype(np.float64)),
        "initial": pa.array(np.concatenate(cols["initial"]).astype(np.float64)),
        "final": pa.array(np.concatenate(cols["final"]).astype(np.float64)),
    })
    with atomic_path(path, suffix=".parquet") as tmp:
        pq.write_table(table, tmp)


# ---------------------------------------------------------------------------------------------- report

def report(params: Params, root: Path) -> dict[str, list[str]]:
    from pipeline.report import write_report

    return write_report(root, root / "reports", figures=params.report.get("figures"))
