"""Stage ``initialise``: the initial weights of every model variant, from the 2SR / CP artifacts or at random."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import DatasetParams, Params, Variant
from pipeline.data.schema import SequenceDataset
from pipeline.io import artifact_contents, load_npz, save_npz
from pipeline.messages import psrnn_command
from pipeline.workflow.paths import artifact_dir, load_prepared


def model_config(dp: DatasetParams, ds: SequenceDataset, variant: Variant, kf_state_dim: int | None = None):
    """The model of ``variant``; a Kalman filter's state size is that of its 2SR artifact (``kf_state_dim``), so
    this stage reads no ``kf`` params (the ``two_stage`` stage does)."""
    from pipeline.api import PSRNN_MODELS
    from pipeline.models.common import ModelConfig

    ts = dp.two_stage
    if variant.family == "kf" and kf_state_dim is None:
        raise ValueError("model_config: a Kalman filter needs the state size of its 2SR artifact")
    # Only the fields a model reads: the config is in the initial weights' file, whose bytes are part of every run's
    # fingerprint, so a 2SR size or a PSRNN bias written into a GRU's or the Kalman filter's config retrained them
    # with the very same weights (the RFF count and bias are the PSRNNs', the encoder size d_o not the KF's).
    shape: dict = {}
    if variant.family in PSRNN_MODELS:
        shape["n_rff"] = ts.n_features
        if variant.init == "2sr":
            shape["bias_scale"] = (dp.model.factorized_bias_scale if variant.family == "factorized_psrnn"
                                   else dp.model.psrnn_bias_scale)
    if variant.family != "kf":
        shape["obs_dim"] = ts.obs_dim
    return ModelConfig(model=variant.family, discrete=ds.discrete, input_dim=ds.obs_dim, output_dim=ds.obs_dim,
                       state_dim=kf_state_dim if variant.family == "kf" else ts.state_dim, n_layers=variant.n_layers,
                       rank=variant.rank, init=variant.init, decoder_input="all" if variant.skip else "top",
                       delta=variant.delta, **shape)


def initial_model(params: Params, root: Path, dataset: str, variant_name: str, seed: int):
    """The model of a variant, initialised from the 2SR / CP artifacts (or at random)."""
    from pipeline.api import initialise_model
    from pipeline.decompose import CPFactors
    from pipeline.two_stage import LinearStateSpace
    from pipeline.workflow.spectral import load_two_stage, refuse_stale, tensor_digest

    dp = params.dataset(dataset)
    variant = dp.variant(variant_name)
    ds = load_prepared(root, dataset)
    tsm = cps = lss = None
    adir = artifact_dir(root, dataset, seed)
    if variant.family in ("psrnn", "factorized_psrnn") and variant.init == "2sr":
        tsm = load_two_stage(root, dataset, seed, variant.n_layers, dp)
        try:   # a 2SR artifact of an older version has no change decoders
            tsm.decoder_for(every_layer=variant.skip, delta=variant.delta)
        except ValueError as exc:
            raise ValueError(f"{adir / '2sr' / f'L{variant.n_layers}.npz'}: {exc}; {variant.name} needs it: run the "
                             f"two_stage stage first ({psrnn_command('two_stage', dataset, seed)})") from None
        if variant.rank is not None:
            path = adir / "cp" / f"r{variant.rank}.npz"
            a, m = load_npz(path)
            digest = tensor_digest(tsm.layers[0].W)
            if m.get("tensor_sha256", digest) != digest:   # an artifact without one predates the record
                raise ValueError(f"{path}: decomposed from another layer-1 2SR tensor than {adir / '2sr' / 'L1.npz'}"
                                 f" holds now; run the decompose stage first "
                                 f"({psrnn_command('decompose', dataset, seed)})")
            fix = f"run the decompose stage again ({psrnn_command('decompose', dataset, seed)})"
            with artifact_contents(path, fix):
                cps = [CPFactors(A=a["A"], B=a["B"], C=a["C"], relative_error=m["relative_error"])]
            shape = tsm.layers[0].W.shape   # state x obs x state: factor k is (rank, shape[k])
            for name, f, size in zip("ABC", (cps[0].A, cps[0].B, cps[0].C), shape):
                if np.shape(f) != (variant.rank, size):
                    raise ValueError(f"{path}: factor {name} of shape {np.shape(f)}; expected ({variant.rank}, {size}) "
                                     f"for rank {variant.rank} of the layer-1 tensor of shape {shape}; {fix}")
    elif variant.family == "kf":
        path = adir / "2sr" / "kf.npz"
        a, m = load_npz(path)
        if dp.kf is not None:   # a filter learned with other kf params (stages run by hand, out of order)
            refuse_stale(path, m.get("kf"), dp.kf, None, "learned", "two_stage", dataset, seed, section="kf")
        fix = f"run the two_stage stage again ({psrnn_command('two_stage', dataset, seed)})"
        with artifact_contents(path, fix):
            lss = LinearStateSpace.from_arrays(a)
        _check_linear_shapes(path, lss, ds.obs_dim, fix)
    cfg = model_config(dp, ds, variant, kf_state_dim=None if lss is None else int(lss.A.shape[0]))
    return initialise_model(cfg, two_stage=tsm, cp=cps, linear=lss, seed=seed, decoder_data=ds.train), ds


def _check_linear_shapes(path: Path, lss: Any, m: int, fix: str) -> None:
    """The matrices of a linear 2SR artifact fit one another and the data's ``m`` features (a damaged file failed
    on a tensor size deep in torch, naming nothing)."""
    n = np.shape(lss.A)[0] if np.ndim(lss.A) == 2 else -1
    want = {"A": (n, n), "C": (m, n), "Q": (n, n), "R": (m, m), "M": (n, m), "x0": (n,), "P0": (n, n), "mean": (m,)}
    for name, shape in want.items():
        if n < 1 or np.shape(getattr(lss, name)) != shape:
            shown = ", ".join(f"{k} {np.shape(getattr(lss, k))}" for k in want)
            raise ValueError(f"{path}: matrices of shapes {shown}; expected A (n, n), C ({m}, n), Q (n, n), "
                             f"R ({m}, {m}), M (n, {m}), x0 (n,), P0 (n, n), mean ({m},) for the data's {m} "
                             f"features; {fix}")


def initialise(params: Params, root: Path, dataset: str, seed: int) -> Path:
    """Initial weights of every variant, one deterministic .npz each: a variant whose initialisation does not
    read the 2SR artifacts (Xavier baselines) keeps the same bytes when they change, so DVC does not retrain it."""
    from pipeline.api import far_side_note

    dp = params.dataset(dataset)
    out = artifact_dir(root, dataset, seed) / "init"
    out.mkdir(parents=True, exist_ok=True)
    # by what builds the filter from the 2SR artifacts: a _delta or _skip variant filters as its plain twin
    notes: dict[tuple, str | None] = {}
    for variant in dp.variants:
        model, ds = initial_model(params, root, dataset, variant.name, seed)
        state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        save_npz(out / f"{variant.name}.npz", state, meta={"model_config": model.config.to_dict(), "seed": seed,
                                                           "n_params": model.n_parameters()})
        c = model.config
        filter_key = (c.model, c.init, c.n_layers, c.rank, c.bias_scale)
        if filter_key not in notes:
            notes[filter_key] = far_side_note(model, {"train": ds.train, "valid": ds.valid, "test": ds.test})
        note = notes[filter_key]
        if note:
            key = f"{dataset}.model.{'factorized' if variant.rank is not None else 'psrnn'}_bias_scale"
            print(f"initialise {dataset} s{seed}: note: {variant.name}: {note}; where their error stands apart, "
                  f"{key} 0.05 to 0.2 breaks the symmetry (docs/params.md)", file=sys.stderr)
    return out


def load_initial(root: Path, dataset: str, variant: str, seed: int):
    """The model of ``variant`` with its initial (epoch-0) weights, as the ``initialise`` stage wrote them."""
    from pipeline.models import model_from_config

    path = artifact_dir(root, dataset, seed) / "init" / f"{variant}.npz"
    arrays, meta = load_npz(path)
    with artifact_contents(path, f"run the initialise stage again ({psrnn_command('initialise', dataset, seed)})"):
        config = meta["model_config"]
    return model_from_config(config, arrays, str(path))
