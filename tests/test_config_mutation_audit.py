"""Params and the spectral and initialise stages: what a mutation audit of ``config.py``,
``workflow/spectral.py`` and ``workflow/initialise.py`` found untested. Each test fails on a plausible wrong
implementation the rest of the suite let through: inclusive bounds (layers, seeds, the experiment prefix), the
key an override is named by, variant names and their initialisations, the seed each stage's draws and artifacts
belong to, every depth and rank written, each family's bias scale, the KF's own windows and their check."""

import copy

import numpy as np
import pytest

from pipeline.config import ParamsError, Variant, check_windows, parse_params

HMM = {
    "source": {"n_states": 3, "n_symbols": 4, "n_train": 10, "n_test": 4, "length": 60, "seed": 0},
    "two_stage": {"n_features": 32, "state_dim": 4, "obs_dim": 4, "past_dim": 4, "past_window": 2,
                  "future_window": 2},
    "variants": ["psrnn"],
}
LGSSM = {
    "source": {"state_dim": 2, "obs_dim": 2, "n_train": 6, "n_test": 2, "length": 40, "seed": 0},
    "two_stage": {"n_features": 16, "state_dim": 3, "obs_dim": 2, "past_dim": 3, "past_window": 2,
                  "future_window": 2},
    "kf": {"state_dim": 2, "past_window": 3, "future_window": 3},
    "variants": ["psrnn", "kf"],
}


def raw(name="hmm", top=None, **section):
    base = copy.deepcopy(HMM if name == "hmm" else LGSSM)
    base.update(section)
    return {name: base, **(top or {})}


def refused(pattern, r):
    with pytest.raises(ParamsError, match=pattern):
        parse_params(r)


# ------------------------------------------------------------------------------------------- variant names

def test_variant_depth_bound_is_inclusive():
    assert Variant.parse("psrnn_64layer").n_layers == 64          # MAX_LAYERS itself is allowed
    with pytest.raises(ParamsError, match=r"^variants: number of layers in 'psrnn_65layer' must be in 1\.\.64$"):
        Variant.parse("psrnn_65layer")


def test_baseline_inits_kf_from_2sr_and_rnns_xavier():
    assert Variant.parse("kf").init == "2sr"
    assert [Variant.parse(n).init for n in ("lstm", "gru", "rnn")] == ["xavier"] * 3


def test_two_stage_layers_bound_is_inclusive():
    p = parse_params(raw(two_stage={**HMM["two_stage"], "layers": 64}))
    assert p.dataset("hmm").layers == 64
    refused(r"^hmm\.two_stage\.layers: expected at most 64, got an integer 65$",
            raw(two_stage={**HMM["two_stage"], "layers": 65}))


# -------------------------------------------------------------------------------------------------- top level

def test_seeds_default_and_bounds():
    assert parse_params(raw()).seeds == [0]                        # docs/params.md: default [0]
    assert parse_params(raw(top={"seeds": [2**32 - 1]})).seeds == [2**32 - 1]
    refused(r"^seeds: expected a non-empty list of integers in \[0, 2\*\*32\)", raw(top={"seeds": [2**32]}))
    refused(r"^seeds: expected a non-empty list of integers", raw(top={"seeds": [True]}))   # a bool is no seed


def test_experiment_prefix_of_200_characters_is_allowed_201_not():
    assert parse_params(raw(top={"tracking": {"experiment_prefix": "p" * 200}})).tracking["experiment_prefix"]
    refused(r"^tracking\.experiment_prefix: expected at most 200 characters, got 201$",
            raw(top={"tracking": {"experiment_prefix": "p" * 201}}))


def test_experiment_prefix_of_control_characters_is_refused():
    """'psrnn\\n' named an MLflow experiment 'psrnn\\n-hmm', newline and all; letters of any script are fine."""
    assert parse_params(raw(top={"tracking": {"experiment_prefix": "é/ü: run 2"}})).tracking["experiment_prefix"]
    for prefix in ("psrnn\n", "a\tb", "x\x7f", "x\x85"):
        refused(r"^tracking\.experiment_prefix: .* holds the control character .*; expected printable characters$",
                raw(top={"tracking": {"experiment_prefix": prefix}}))


# ------------------------------------------------------------------------------------------- dataset sections

def test_setting_key_names_the_override_only_for_the_keys_it_sets():
    r = raw(variants=["psrnn", "lstm"], train={"epochs": 3, "overrides": {"psrnn": {"lr": 0.5}}})
    dp = parse_params(r).dataset("hmm")
    assert dp.setting_key("psrnn", "lr") == "hmm.train.overrides.psrnn.lr"
    assert dp.setting_key("psrnn", "epochs") == "hmm.train.epochs"     # merged from train, not set by the override
    assert dp.setting_key("lstm", "lr") == "hmm.train.lr"
    assert dp.train_config("psrnn").epochs == 3 and dp.train_config("psrnn").lr == 0.5


def test_a_randomly_initialised_deep_psrnn_needs_no_deep_2sr():
    dp = parse_params(raw(variants=["psrnn", "psrnn_3layer_random"])).dataset("hmm")
    assert dp.layers == 1 and dp.variant("psrnn_3layer_random").n_layers == 3
    refused(r"^hmm\.variants: psrnn_3layer needs hmm\.two_stage\.layers >= 3, got 1",
            raw(variants=["psrnn", "psrnn_3layer"]))


# ------------------------------------------------------------------------------- spectral and initialise stages

STAGE_VARIANTS = ["psrnn", "psrnn_2layer_skip", "psrnn_random", "factorized_psrnn_r3", "factorized_psrnn_r5",
                  "lstm"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny hmm project, two seeds, every stage up to initialise run by hand (about a second)."""
    from pipeline.config import dump_yaml, load_params
    from pipeline.workflow import data, initialise, spectral

    root = tmp_path_factory.mktemp("mutC")
    r = raw(top={"seeds": [0, 1]}, variants=STAGE_VARIANTS,
            two_stage={**HMM["two_stage"], "layers": 2},
            model={"psrnn_bias_scale": 0.25, "factorized_bias_scale": 0.5})
    (root / "params.yaml").write_text(dump_yaml(r))
    params = load_params(root / "params.yaml")
    data.prepare(params, root, "hmm")
    for s in (0, 1):
        for stage in (spectral.features, spectral.two_stage, spectral.decompose, initialise.initialise):
            stage(params, root, "hmm", s)
    return params, root


def _init(root, variant, seed):
    from pipeline.io import load_npz

    return load_npz(root / "artifacts" / "hmm" / f"s{seed}" / "init" / f"{variant}.npz")


def test_features_are_drawn_with_the_run_seed(built):
    from pipeline.io import load_npz
    from pipeline.features import window_count
    from pipeline.workflow.paths import load_prepared

    params, root = built
    (a0, m0), (a1, m1) = (load_npz(root / "artifacts" / "hmm" / f"s{s}" / "features.npz") for s in (0, 1))
    assert m0["seed"] == 0 and m1["seed"] == 1 and m1["two_stage"]["seed"] == 1
    assert any(not np.array_equal(a0[k], a1[k]) for k in a0)          # another seed draws other RFF
    ds = load_prepared(root, "hmm")
    assert m0["n_windows"] == window_count([len(t) for t in ds.train], 2, 2)   # windows of the training split


def test_two_stage_writes_every_depth(built):
    from pipeline.workflow.spectral import load_two_stage

    params, root = built
    assert sorted(p.name for p in (root / "artifacts" / "hmm" / "s0" / "2sr").glob("L*.npz")) == ["L1.npz", "L2.npz"]
    assert len(load_two_stage(root, "hmm", 0, 2).layers) == 2 and len(load_two_stage(root, "hmm", 0, 1).layers) == 1


def test_decompose_factors_every_rank_of_the_layer1_tensor_with_the_run_seed(built):
    from pipeline.decompose import cp_decompose
    from pipeline.io import load_npz
    from pipeline.workflow.spectral import load_two_stage, tensor_digest

    params, root = built
    cp = root / "artifacts" / "hmm" / "s1" / "cp"
    assert sorted(p.name for p in cp.glob("r*.npz")) == ["r3.npz", "r5.npz"]
    W = load_two_stage(root, "hmm", 1, 1).layers[0].W
    for rank in (3, 5):
        a, m = load_npz(cp / f"r{rank}.npz")
        assert m["rank"] == rank and m["seed"] == 1 and m["tensor_sha256"] == tensor_digest(W)
        f = cp_decompose(W, rank, seed=1)
        np.testing.assert_array_equal(a["A"], f.A)
        np.testing.assert_array_equal(a["B"], f.B)
        np.testing.assert_array_equal(a["C"], f.C)


def test_initial_configs_carry_the_bias_scale_of_their_family(built):
    from pipeline.models.common import ModelConfig

    params, root = built
    cfg = {v: _init(root, v, 0)[1]["model_config"] for v in STAGE_VARIANTS}
    assert cfg["psrnn"]["bias_scale"] == 0.25
    assert cfg["factorized_psrnn_r3"]["bias_scale"] == 0.5
    assert cfg["psrnn_random"]["bias_scale"] == ModelConfig.__dataclass_fields__["bias_scale"].default   # no 2SR mean
    assert cfg["psrnn_2layer_skip"]["decoder_input"] == "all" and cfg["psrnn"]["decoder_input"] == "top"
    assert cfg["psrnn_2layer_skip"]["n_layers"] == 2


def test_initial_weights_are_those_of_the_run_seed(built):
    params, root = built
    for v in ("lstm", "psrnn_random", "factorized_psrnn_r3", "psrnn_2layer_skip"):
        (a0, m0), (a1, m1) = _init(root, v, 0), _init(root, v, 1)
        assert m0["seed"] == 0 and m1["seed"] == 1
        assert any(not np.array_equal(a0[k], a1[k]) for k in a0), v


def test_initial_factorized_model_uses_its_seeds_cp_factors(built):
    from pipeline.api import initialise_model
    from pipeline.decompose import CPFactors
    from pipeline.io import load_npz
    from pipeline.workflow.initialise import model_config
    from pipeline.workflow.paths import load_prepared
    from pipeline.workflow.spectral import load_two_stage

    params, root = built
    dp, ds = params.dataset("hmm"), load_prepared(root, "hmm")
    a, m = load_npz(root / "artifacts" / "hmm" / "s1" / "cp" / "r3.npz")
    v = dp.variant("factorized_psrnn_r3")
    want = initialise_model(model_config(dp, ds, v), two_stage=load_two_stage(root, "hmm", 1, 1),
                            cp=[CPFactors(A=a["A"], B=a["B"], C=a["C"], relative_error=m["relative_error"])],
                            seed=1, decoder_data=ds.train)
    got, _ = _init(root, "factorized_psrnn_r3", 1)
    for k, t in want.state_dict().items():
        np.testing.assert_array_equal(got[k], t.detach().cpu().numpy(), err_msg=k)


def test_a_random_psrnn_initialises_without_2sr_artifacts(built, tmp_path):
    import shutil

    from pipeline.workflow.initialise import initial_model

    params, root = built
    shutil.copytree(root / "data", tmp_path / "data") if (root / "data").exists() else None
    for p in root.iterdir():   # the prepared data only, no artifacts
        if p.name not in ("artifacts", "params.yaml") and not (tmp_path / p.name).exists():
            (shutil.copytree if p.is_dir() else shutil.copy)(p, tmp_path / p.name)
    model, _ = initial_model(params, tmp_path, "hmm", "psrnn_random", 0)
    assert model.config.init == "random"


def test_kf_config_reads_no_encoder_size():
    from pipeline.models.common import ModelConfig
    from pipeline.workflow.initialise import model_config
    from types import SimpleNamespace

    dp = parse_params(raw("lgssm")).dataset("lgssm")
    ds = SimpleNamespace(discrete=False, obs_dim=2)
    cfg = model_config(dp, ds, dp.variant("kf"), kf_state_dim=2)
    assert cfg.state_dim == 2 and cfg.obs_dim == ModelConfig.__dataclass_fields__["obs_dim"].default
    assert cfg.n_rff == ModelConfig.__dataclass_fields__["n_rff"].default


def test_a_boolean_is_no_count_in_a_source():
    refused(r"^hmm\.source\.n_train: expected an integer, got a boolean true$",
            raw(source={**HMM["source"], "n_train": True}))


def test_a_variant_listed_twice_is_refused():
    refused(r"^hmm\.variants: duplicated variant in \['psrnn', 'lstm', 'psrnn'\]$",
            raw(variants=["psrnn", "lstm", "psrnn"]))


def test_features_refuse_discrete_maps_over_the_bound_from_the_data(built, monkeypatch, tmp_path):
    import pipeline.features
    from pipeline.workflow import spectral

    params, root = built
    monkeypatch.setattr(pipeline.features, "DISCRETE_MAPS_BYTES", 1000)   # (1 + 2 + 2) x 4 x 32 x 8 = 5120 bytes
    monkeypatch.setattr(spectral, "artifact_dir", lambda r, d, s: tmp_path / d / f"s{s}")   # leave `built` intact
    with pytest.raises(ValueError, match=r"^4 symbols: the discrete RFF maps would hold \(1 \+ "
                                         r"hmm\.two_stage\.past_window"):
        spectral.features(params, root, "hmm", 0)
    assert not (tmp_path / "hmm" / "s0" / "features.npz").exists()


def _lgssm(root, kf):
    from pipeline.workflow import data, spectral

    r = raw("lgssm", variants=["kf"], kf=kf)
    params = parse_params(r)
    data.prepare(params, root, "lgssm")
    spectral.features(params, root, "lgssm", 0)
    return params


def test_two_stage_learns_the_kf_with_its_own_past_and_future_windows(tmp_path):
    from pipeline.io import load_npz
    from pipeline.two_stage import linear_two_stage
    from pipeline.workflow import spectral
    from pipeline.workflow.paths import load_prepared

    params = _lgssm(tmp_path, {"state_dim": 2, "past_window": 4, "future_window": 2, "ridge": 0.01})
    spectral.two_stage(params, tmp_path, "lgssm", 0)
    got, meta = load_npz(tmp_path / "artifacts" / "lgssm" / "s0" / "2sr" / "kf.npz")
    assert meta["kf"] == {"state_dim": 2, "past_window": 4, "future_window": 2, "ridge": 0.01}
    want = linear_two_stage(load_prepared(tmp_path, "lgssm").train, state_dim=2, past_window=4, future_window=2,
                            ridge=0.01).to_arrays()
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-12, err_msg=k)


def test_two_stage_checks_the_kf_windows_against_the_prepared_data(tmp_path):
    from pipeline.workflow import spectral

    _lgssm(tmp_path, {"state_dim": 2, "past_window": 3, "future_window": 3})    # trajectories of 40 steps
    longer = raw("lgssm", variants=["kf"], kf={"state_dim": 2, "past_window": 20, "future_window": 19},
                 source={**LGSSM["source"], "length": 60})                     # valid for 60 steps, not for 40
    with pytest.raises(ParamsError, match=r"^lgssm\.kf\.past_window \+ lgssm\.kf\.future_window \+ 2 = 41 exceeds "
                                          r"the longest training trajectory \(40 steps\)"):
        spectral.two_stage(parse_params(longer), tmp_path, "lgssm", 0)


def test_check_windows_names_the_dataset_it_is_given():
    dp = parse_params(raw()).dataset("hmm")
    with pytest.raises(ParamsError, match=r"^other\.two_stage\.past_window \+ other\.two_stage\.future_window \+ 1 "
                                          r"= 2 \+ 2 \+ 1 = 5 exceeds the shortest training trajectory \(4 steps\)"):
        check_windows("other", dp, [4, 9])
