"""Stages ``features``, ``two_stage`` and ``decompose``: the spectral initialisation (RFF maps, 2SR of the depths
1 to ``two_stage.layers`` and, when a ``kf`` section is set, the linear 2SR of the Kalman filter; CP factors per
rank)."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from pipeline.config import DatasetParams, Params, check_windows
from pipeline.io import artifact_contents, load_npz, save_npz, write_json
from pipeline.messages import psrnn_command
from pipeline.workflow.paths import artifact_dir, load_prepared


log = logging.getLogger(__name__)


def _two_stage_config(dp: DatasetParams, seed: int):
    from pipeline.two_stage import TwoStageConfig

    return TwoStageConfig(**{**asdict(dp.two_stage), "seed": seed})


def features(params: Params, root: Path, dataset: str, seed: int) -> Path:
    from pipeline.features import check_discrete_maps, fit_feature_maps, make_windows

    dp = params.dataset(dataset)
    ds = load_prepared(root, dataset)
    cfg = _two_stage_config(dp, seed)
    cfg.validate()
    if ds.discrete:   # here, where the error can name the dataset's keys
        check_discrete_maps(ds.obs_dim, cfg.n_features, cfg.past_window, cfg.future_window, key=f"{dataset}.two_stage")
    windows = make_windows(ds.train, cfg.past_window, cfg.future_window, discrete=ds.discrete,
                           vocab_size=ds.obs_dim if ds.discrete else None)
    maps = fit_feature_maps(windows, n_features=cfg.n_features, obs_dim=ds.obs_dim,
                            vocab_size=ds.obs_dim if ds.discrete else 0, widths=cfg.widths,
                            width_scale=cfg.width_scale, seed=seed)
    out = artifact_dir(root, dataset, seed) / "features.npz"
    save_npz(out, maps.to_arrays(), meta={"dataset": dataset, "seed": seed, "two_stage": asdict(cfg),
                                          "n_windows": len(windows)})
    log.info("features %s seed %d: %d windows, %d RFF per family, kernel widths obs %.4g, past %.4g, future %.4g",
             dataset, seed, len(windows), cfg.n_features, maps.obs.width, maps.past.width, maps.future.width)
    return out


# ------------------------------------------------------------------------------------------- two stage

#: the two_stage params the features stage draws its maps from
FEATURE_PARAMS = ("n_features", "past_window", "future_window", "widths", "width_scale")


def refuse_stale(path: Path, stored: Any, cfg, keys: Sequence[str] | None, made: str, stage: str, dataset: str,
                 seed: int, section: str = "two_stage") -> None:
    """Refuse an artifact made with other ``<dataset>.<section>`` params (``stored``, from its meta) than the
    current ones (``cfg``), compared on ``keys`` (None: every key): stages run by hand, out of order (under
    ``dvc repro`` the ``stage`` that makes it has just run) would silently use it, or fail on a tensor shape."""
    if not isinstance(stored, dict):
        return
    now = json.loads(json.dumps(asdict(cfg), default=str))   # as the meta stores it
    for k in sorted(now) if keys is None else keys:
        if k in stored and stored[k] != now[k]:
            raise ValueError(f"{path}: {made} with {dataset}.{section}.{k}={stored[k]!r}, but params.yaml now says "
                             f"{now[k]!r}; run the {stage} stage first ({psrnn_command(stage, dataset, seed)})")


def two_stage(params: Params, root: Path, dataset: str, seed: int) -> Path:
    import numpy as np

    from pipeline.features import FeatureMaps
    from pipeline.two_stage import linear_two_stage, two_stage_depths

    dp = params.dataset(dataset)
    ds = load_prepared(root, dataset)
    check_windows(dataset, dp, [len(t) for t in ds.train], obs_dim=None if ds.discrete else ds.obs_dim)
    cfg = _two_stage_config(dp, seed)
    path = artifact_dir(root, dataset, seed) / "features.npz"
    arrays, meta = load_npz(path)
    refuse_stale(path, meta.get("two_stage"), cfg, FEATURE_PARAMS, "drawn", "features", dataset, seed)
    fix = f"run the features stage again ({psrnn_command('features', dataset, seed)})"
    with artifact_contents(path, fix):
        maps = FeatureMaps.from_arrays(arrays)
    for name, rff, window in (("obs", maps.obs, 1), ("past", maps.past, cfg.past_window),
                              ("future", maps.future, cfg.future_window)):
        # the shapes these params and data give (a damaged file fails deep in the 2SR otherwise, naming nothing)
        want = (window * ds.obs_dim, cfg.n_features)
        if np.shape(rff.frequencies) != want or np.shape(rff.offsets) != (cfg.n_features,):
            raise ValueError(f"{path}: {name} maps of shapes {np.shape(rff.frequencies)} and {np.shape(rff.offsets)}; "
                             f"expected {want} and ({cfg.n_features},) for {dataset}'s data and two_stage params; "
                             f"{fix}")
    out = artifact_dir(root, dataset, seed) / "2sr"
    out.mkdir(parents=True, exist_ok=True)
    # what is learned follows from the two_stage and kf params alone (not from the variants), so adding or removing
    # a model variant never reruns this stage
    for note in dp.unused_spectral_work():
        log.warning("two_stage %s: %s", dataset, note)
    depths = two_stage_depths(ds.train, cfg, n_layers=dp.layers, discrete=ds.discrete,
                              vocab_size=ds.obs_dim if ds.discrete else 0, maps=maps)
    for depth, tsm in enumerate(depths, start=1):  # layer l is learned once for all depths >= l
        save_npz(out / f"L{depth}.npz", tsm.to_arrays(), meta={**tsm.meta(), "dataset": dataset, "seed": seed})
    if dp.kf is not None:
        lss = linear_two_stage(ds.train, state_dim=dp.kf.state_dim, past_window=dp.kf.past_window,
                               future_window=dp.kf.future_window, ridge=dp.kf.ridge)
        save_npz(out / "kf.npz", lss.to_arrays(), meta={"dataset": dataset, "seed": seed, "kf": asdict(dp.kf),
                                                         "diagnostics": lss.diagnostics})
        log.info("two_stage %s seed %d: Kalman filter of %d states, spectral radius of A %.3g", dataset, seed,
                 dp.kf.state_dim, lss.diagnostics.get("spectral_radius_A", float("nan")))
    return out


def load_two_stage(root: Path, dataset: str, seed: int, depth: int, dp: DatasetParams | None = None):
    """The 2SR of ``depth`` layers; with ``dp``, refused when it was learned with other two_stage params than
    ``dp``'s (stages run by hand, out of order: a changed state_dim gave a shape error deep in initialise)."""
    from pipeline.two_stage import TwoStageModel

    path = artifact_dir(root, dataset, seed) / "2sr" / f"L{depth}.npz"
    arrays, meta = load_npz(path)
    if dp is not None:
        refuse_stale(path, meta.get("config"), _two_stage_config(dp, seed), None, "learned", "two_stage", dataset,
                      seed)
    with artifact_contents(path, f"run the two_stage stage again ({psrnn_command('two_stage', dataset, seed)})"):
        return TwoStageModel.from_arrays(arrays, meta)


# ------------------------------------------------------------------------------------------- decompose

def tensor_digest(W: Any) -> str:
    """The sha256 of a tensor's float64 bytes: a CP artifact records the layer-1 W it was decomposed from, so that
    initialise refuses factors of another W (stages run by hand, out of order)."""
    import hashlib

    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(W, dtype=np.float64).tobytes()).hexdigest()


def decompose(params: Params, root: Path, dataset: str, seed: int) -> Path:
    from pipeline.decompose import cp_decompose

    dp = params.dataset(dataset)
    out = artifact_dir(root, dataset, seed) / "cp"
    out.mkdir(parents=True, exist_ok=True)
    tsm = load_two_stage(root, dataset, seed, 1, dp)
    W = tsm.layers[0].W
    errors = []
    for rank in dp.ranks:
        try:
            f = cp_decompose(W, rank, seed=seed)
        except ValueError as exc:   # a NaN/Inf, all-zero or degenerate tensor: which dataset, seed and variants
            users = ", ".join(v.name for v in dp.variants if v.rank == rank and v.init == "2sr")
            raise ValueError(f"decompose {dataset} seed {seed}: {exc} (the layer-1 2SR tensor "
                             f"{artifact_dir(root, dataset, seed) / '2sr' / 'L1.npz'}, for {users})") from None
        save_npz(out / f"r{rank}.npz", f.as_dict(), meta={"rank": rank, "relative_error": f.relative_error,
                                                           "dataset": dataset, "seed": seed,
                                                           "tensor_sha256": tensor_digest(W)})
        errors.append(f"rank {rank} {f.relative_error:.2g}")
    if errors:   # what each factorized PSRNN starts from: a rank below what W needs is another tensor
        print(f"decompose {dataset} seed {seed}: CP relative reconstruction error ‖W − CP(W)‖ / ‖W‖ of the "
              f"layer-1 2SR tensor: {', '.join(errors)}", file=sys.stderr)
    write_json(out / "summary.json", {"ranks": dp.ranks})
    return out

