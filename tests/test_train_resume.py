"""Training: exact resume from a checkpoint, determinism, refusal of foreign checkpoints, divergence handling, and
the short Python API."""

import math
import re

import numpy as np
import pytest
import torch

from pipeline.api import _fitted_digest, fit_model, initialise_model
from pipeline.data.synthetic import make_hmm_dataset, make_lgssm_dataset
from pipeline.decompose import cp_decompose
from pipeline.models.common import ModelConfig
from pipeline.train import (TrainConfig, TrainingDiverged, evaluate, fit, flush_denormal_enabled,
                            load_checkpoint)
from pipeline.two_stage import TwoStageConfig, multilayer_two_stage


@pytest.fixture(scope="module")
def continuous():
    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=12, n_test=4, length=40, seed=0)
    return ds


@pytest.fixture(scope="module")
def discrete():
    ds, _ = make_hmm_dataset(n_states=4, n_symbols=6, n_train=12, n_test=3, length=60, seed=0)
    return ds


def _gru(seed=0):
    return initialise_model(ModelConfig(model="gru", discrete=False, input_dim=2, output_dim=2, state_dim=6,
                                        obs_dim=4, init="xavier"), seed=seed)


@pytest.fixture(scope="module")
def factorized_factory(discrete):
    """A 2SR-initialised factorized PSRNN (rank 8, bias 0.1 × mean state) on the discrete data."""
    cfg = TwoStageConfig(state_dim=6, obs_dim=6, past_dim=6, n_features=200, past_window=2, future_window=2,
                         seed=0)
    tsm = multilayer_two_stage(discrete.train, cfg, discrete=True, vocab_size=6)
    cps = [cp_decompose(layer.W, 8, seed=0) for layer in tsm.layers]
    mc = ModelConfig(model="factorized_psrnn", rank=8, discrete=True, input_dim=6, output_dim=6, state_dim=6,
                     obs_dim=6, n_rff=200, bias_scale=0.1)
    return lambda: initialise_model(mc, two_stage=tsm, cp=cps)


@pytest.fixture(scope="module")
def psrnn_factory(discrete):
    """A 2SR-initialised (full) PSRNN on the discrete data."""
    cfg = TwoStageConfig(state_dim=6, obs_dim=6, past_dim=6, n_features=200, past_window=2, future_window=2,
                         seed=0)
    tsm = multilayer_two_stage(discrete.train, cfg, discrete=True, vocab_size=6)
    mc = ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=6, obs_dim=6, n_rff=200)
    return lambda: initialise_model(mc, two_stage=tsm)


@pytest.fixture(scope="module")
def continuous_factories(continuous):
    """A 2SR-initialised PSRNN and a Kalman filter from linear 2SR on the continuous data (trained on whole
    sequences, bptt 0, as the pipeline trains them)."""
    from pipeline.two_stage import linear_two_stage

    cfg = TwoStageConfig(state_dim=4, obs_dim=4, past_dim=4, n_features=100, past_window=3, future_window=3,
                         seed=0)
    tsm = multilayer_two_stage(continuous.train, cfg, discrete=False)
    lss = linear_two_stage(continuous.train, state_dim=2, past_window=3, future_window=3)
    psrnn = ModelConfig(model="psrnn", discrete=False, input_dim=2, output_dim=2, state_dim=4, obs_dim=4, n_rff=100)
    kf = ModelConfig(model="kf", discrete=False, input_dim=2, output_dim=2, state_dim=2, init="2sr")
    return {"psrnn_whole": lambda: initialise_model(psrnn, two_stage=tsm),
            "kf_whole": lambda: initialise_model(kf, linear=lss)}


def _scrambled(model):
    """The same architecture with other weights: a resumed run must take everything from the checkpoint."""
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


OPTIMISERS = {
    "sgd": dict(optimizer="sgd", lr=0.5),
    "sgd_momentum": dict(optimizer="sgd", momentum=0.9, lr=0.2),
    "adam": dict(optimizer="adam", lr=0.01),
}


def _setup(kind, continuous, discrete, factorized_factory):
    if kind == "gru":
        return continuous, _gru, "mse"
    return discrete, factorized_factory, "bpc"


@pytest.mark.parametrize("kind, optimiser", [(k, o) for k in ("gru", "factorized_psrnn") for o in OPTIMISERS]
                         + [("psrnn", "sgd"), ("psrnn_whole", "sgd"), ("kf_whole", "sgd")])
def test_resume_equals_uninterrupted_training(tmp_path, continuous, discrete, factorized_factory, psrnn_factory,
                                              continuous_factories, kind, optimiser):
    """Two epochs in one go == one epoch, checkpoint, resume, one more epoch: bitwise on the CPU. With momentum
    or Adam this needs the optimiser state (momentum buffers, Adam's moments and step count) restored too. Every
    recurrent cell: the GRU baseline, the factorized and the full PSRNN on truncated BPTT, and the PSRNN and the
    Kalman filter on whole sequences (``bptt=0``, the continuous sets' setting)."""
    if kind == "psrnn":
        ds, make, metric = discrete, psrnn_factory, "bpc"
    elif kind.endswith("_whole"):
        ds, make, metric = continuous, continuous_factories[kind], "mse"
    else:
        ds, make, metric = _setup(kind, continuous, discrete, factorized_factory)
    bptt = 0 if kind.endswith("_whole") else 10
    cfg = TrainConfig(epochs=2, bptt=bptt, batch_size=4, seed=3, device="cpu", **OPTIMISERS[optimiser])
    straight = make()
    r1 = fit(straight, ds.train, ds.test, cfg)

    ck = tmp_path / "checkpoint.pt"
    fit(make(), ds.train, ds.test, TrainConfig(**{**cfg.__dict__, "epochs": 1}), checkpoint_path=ck)
    assert load_checkpoint(ck)["epoch"] == 1
    resumed = _scrambled(make())
    r2 = fit(resumed, ds.train, ds.test, cfg, checkpoint_path=ck)
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), f"{name} differs by {float((a - b).abs().max())}"
    assert [h["test"][metric] for h in r1.history] == [h["test"][metric] for h in r2.history]
    assert r1.history[-1]["test"][metric] != r1.history[0]["test"][metric], "training must have moved"
    ckpt = load_checkpoint(ck)
    assert ckpt["epoch"] == 2 and set(ckpt) >= {"model", "optimizer", "model_config", "train_config",
                                                "best_metric", "rng", "history"}


@pytest.mark.parametrize("kind", ["gru", "factorized_psrnn"])
def test_two_fits_with_the_same_seed_are_bitwise_identical(continuous, discrete, factorized_factory, kind):
    ds, make, metric = _setup(kind, continuous, discrete, factorized_factory)
    cfg = TrainConfig(epochs=2, bptt=10, batch_size=4, seed=5, device="cpu", optimizer="sgd", momentum=0.9,
                      lr=0.2)
    a, b = make(), make()
    ra, rb = fit(a, ds.train, ds.test, cfg), fit(b, ds.train, ds.test, cfg)
    strip = [{k: v for k, v in h.items() if k != "seconds"} for h in ra.history]
    assert strip == [{k: v for k, v in h.items() if k != "seconds"} for h in rb.history]
    assert len({h["test"][metric] for h in ra.history}) == 3, "the curve must move for the test to mean anything"
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_resume_refuses_a_checkpoint_of_another_configuration(tmp_path, continuous):
    ds = continuous
    ck = tmp_path / "checkpoint.pt"
    cfg = TrainConfig(epochs=1, lr=0.5, bptt=10, batch_size=4, device="cpu")
    fit(_gru(), ds.train, ds.test, cfg, checkpoint_path=ck)
    before = ck.read_bytes()
    with pytest.raises(ValueError) as err:
        fit(_gru(), ds.train, ds.test, TrainConfig(**{**cfg.__dict__, "epochs": 2, "lr": 0.3, "bptt": 5}),
            checkpoint_path=ck)
    msg = str(err.value)
    assert "\n" not in msg and str(ck) in msg and "train.lr" in msg and "train.bptt" in msg
    assert "train.epochs" not in msg
    other = initialise_model(ModelConfig(model="gru", discrete=False, input_dim=2, output_dim=2, state_dim=7,
                                         obs_dim=4, init="xavier"))
    with pytest.raises(ValueError, match=r"checkpoint\.pt: .*model\.state_dim \(6 in the checkpoint, 7 now\)"):
        fit(other, ds.train, ds.test, cfg, checkpoint_path=ck)
    assert ck.read_bytes() == before
    # more epochs, another max_loss or device, no train evaluation: the same run, extended
    r = fit(_gru(), ds.train, ds.test, TrainConfig(**{**cfg.__dict__, "epochs": 2, "max_loss": 1e9,
                                                     "eval_train": False}), checkpoint_path=ck)
    assert [h["epoch"] for h in r.history] == [0, 1, 2]
    # resume=False starts over whatever the checkpoint holds
    fit(_gru(), ds.train, ds.test, TrainConfig(**{**cfg.__dict__, "lr": 0.3}), checkpoint_path=ck, resume=False)
    assert load_checkpoint(ck)["train_config"]["lr"] == 0.3


def test_resume_refuses_fewer_epochs_than_the_checkpoint_holds(tmp_path, continuous):
    """The checkpoint holds its last epoch only: resumed with fewer epochs, fit returned the longer run."""
    ds = continuous
    ck = tmp_path / "checkpoint.pt"
    cfg = TrainConfig(epochs=2, lr=0.5, bptt=10, batch_size=4, device="cpu")
    fit(_gru(), ds.train, ds.test, cfg, checkpoint_path=ck)
    with pytest.raises(ValueError, match=r"checkpoint\.pt: trained to epoch 2, beyond train\.epochs=1; not resumed: "
                                         r"expected train\.epochs >= 2, or resume=False to start over$"):
        fit(_gru(), ds.train, ds.test, TrainConfig(**{**cfg.__dict__, "epochs": 1}), checkpoint_path=ck)


def test_resume_with_another_eval_train_takes_the_best_on_the_split_now_monitored(tmp_path, continuous):
    """monitor 'auto' without a valid split watches train when eval_train is on, else test; eval_train may change
    on resume, and the best epoch is then taken again from the history's scores on the split now monitored (the
    train best had been compared with test scores)."""
    ds = continuous
    ck = tmp_path / "checkpoint.pt"
    cfg = TrainConfig(epochs=2, lr=1.0, bptt=5, batch_size=3, device="cpu", lr_decay=0.5, eval_train=True)
    first = fit(_gru(), ds.train, ds.test, cfg, checkpoint_path=ck)
    assert first.best_metric == min(h["train"]["mse"] for h in first.history)
    resumed = fit(_gru(), ds.train, ds.test, TrainConfig(**{**cfg.__dict__, "eval_train": False}), checkpoint_path=ck)
    scores = [h["test"]["mse"] for h in resumed.history]
    assert resumed.best_metric == min(scores) and resumed.best_epoch == int(np.argmin(scores))


@pytest.mark.parametrize("seed", [0, 2])
def test_resume_that_moves_the_monitored_split_under_restore_best_restores_or_refuses(tmp_path, seed):
    """With restore_best, a resume whose eval_train moves monitor 'auto' from train to test must restore the best
    test epoch's weights: from the checkpoint when that epoch is its last (seed 0: train and test best at epoch 3),
    else it is refused (seed 2: test best at epoch 0, train at 3), where it had returned the last epoch's weights
    while best_epoch named another; the refusal writes nothing over the checkpoint."""
    rng = np.random.default_rng(seed)
    train = [rng.standard_normal((n, 2)) for n in (6, 7, 5, 8)]
    test = [rng.standard_normal((n, 2)) + 0.5 for n in (6, 7)]
    ck = tmp_path / "checkpoint.pt"
    cfg = TrainConfig(epochs=3, lr=2.0, bptt=0, batch_size=2, device="cpu", restore_best=True, eval_train=True)
    fit(_gru(), train, test, cfg, checkpoint_path=ck)
    history = load_checkpoint(ck)["history"]
    best_test = min(range(4), key=lambda e: history[e]["test"]["mse"])
    best_train = min(range(4), key=lambda e: history[e]["train"]["mse"])
    assert (best_test, best_train) == ((3, 3) if seed == 0 else (0, 3))
    before = ck.read_bytes()
    more = TrainConfig(**{**cfg.__dict__, "eval_train": False, "epochs": 4})
    if seed == 0:
        model = _gru()
        r = fit(model, train, test, more, checkpoint_path=ck)
        assert evaluate(model, test)["mse"] == pytest.approx(r.history[r.best_epoch]["test"]["mse"], rel=1e-6)
    else:
        with pytest.raises(ValueError, match=r"checkpoint\.pt: not resumed under train\.restore_best: "
                                             r"train\.eval_train=False \(it was trained with True\) moves the "
                                             r"monitored split to test, whose best epoch \(0\) it kept no weights "
                                             r"of; expected the train settings it was trained with"):
            fit(_gru(), train, test, more, checkpoint_path=ck)
        assert ck.read_bytes() == before


def test_resume_onto_a_split_never_scored_under_restore_best_is_refused(tmp_path):
    """eval_train switched on for a run without a valid split moves monitor 'auto' to train, which no epoch of the
    checkpoint was scored on: under restore_best it returned best_epoch 0 at an infinite metric with the last
    epoch's weights; it is refused. Without restore_best the watch of train starts after the checkpoint's epochs
    (its best is the last epoch, whose weights the model holds, until a scored epoch beats it). A checkpoint
    written before `monitor` existed is named as such, not as an eval_train change."""
    rng = np.random.default_rng(1)
    train = [rng.standard_normal((n, 2)) for n in (6, 7, 5, 8)]
    test = [rng.standard_normal((n, 2)) + 0.5 for n in (6, 7)]
    ck = tmp_path / "checkpoint.pt"
    cfg = TrainConfig(epochs=3, lr=2.0, bptt=0, batch_size=2, device="cpu", restore_best=True, eval_train=False)
    fit(_gru(), train, test, cfg, checkpoint_path=ck)
    before = ck.read_bytes()
    with pytest.raises(ValueError, match=r"checkpoint\.pt: not resumed under train\.restore_best: "
                                         r"train\.eval_train=True \(it was trained with False\) moves the monitored "
                                         r"split to train, on which none of its epochs was scored;"):
        fit(_gru(), train, test, TrainConfig(**{**cfg.__dict__, "eval_train": True}), checkpoint_path=ck)
    assert ck.read_bytes() == before
    free = TrainConfig(**{**cfg.__dict__, "restore_best": False})
    fit(_gru(), train, test, free, checkpoint_path=ck, resume=False)
    r = fit(_gru(), train, test, TrainConfig(**{**free.__dict__, "eval_train": True}), checkpoint_path=ck)
    assert (r.best_epoch, r.best_metric) == (3, math.inf)          # no new epoch: the watch has not begun
    r = fit(_gru(), train, test, TrainConfig(**{**free.__dict__, "eval_train": True, "epochs": 4}),
            checkpoint_path=ck)
    assert r.best_epoch == 4 and r.best_metric == r.history[4]["train"]["mse"]

    # a checkpoint of before `monitor` (data seed 8: test's best epoch 0, train's 2): its best was chosen on test
    rng = np.random.default_rng(8)
    train = [rng.standard_normal((n, 2)) for n in (6, 7, 5, 8)]
    test = [rng.standard_normal((n, 2)) + 0.5 for n in (6, 7)]
    fit(_gru(), train, test, TrainConfig(**{**cfg.__dict__, "eval_train": True, "monitor": "test"}),
        checkpoint_path=ck, resume=False)
    ckpt = load_checkpoint(ck)
    history = ckpt["history"]
    assert ckpt["best_epoch"] == 0 and min(range(4), key=lambda e: history[e]["train"]["mse"]) == 2
    del ckpt["train_config"]["monitor"]
    torch.save(ckpt, ck)
    with pytest.raises(ValueError, match=r"not resumed under train\.restore_best: it predates train\.monitor and "
                                         r"chose its best epoch on test, while train is watched now, whose best "
                                         r"epoch \(2\) it kept no weights of"):
        fit(_gru(), train, test, TrainConfig(**{**cfg.__dict__, "eval_train": True}), checkpoint_path=ck)


def test_a_non_finite_test_metric_names_the_end_of_the_epoch():
    """Found by the evaluation after the epoch's last update: no step to name (steps count from 0, so the number of
    windows named one past the last)."""
    import math

    from pipeline.train import _diverged

    assert _diverged(3, None, "test mse", math.nan, None, clip=0.25) == (
        "training diverged at the end of epoch 3, after its last update: test mse is nan. Lower train.lr or "
        "train.clip.")


def test_unreadable_checkpoint_is_one_line_without_unsafe_advice(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00not a checkpoint at all")
    pickled = tmp_path / "pickled.pt"
    torch.save({"model": np.random.default_rng(0)}, pickled)  # a pickled object weights_only refuses
    for path in (garbage, pickled):
        with pytest.raises(ValueError) as err:
            load_checkpoint(path)
        msg = str(err.value)
        assert msg.startswith(f"{path}: not a readable checkpoint") and "rerun refine" in msg
        assert "\n" not in msg and "weights_only" not in msg.lower(), msg
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "missing.pt")


def test_divergence_names_epoch_and_step_and_keeps_checkpoint(tmp_path, continuous):
    ds = continuous
    ck = tmp_path / "checkpoint.pt"
    model = _gru()
    fit(model, ds.train, ds.test, TrainConfig(epochs=1, lr=0.1, bptt=10, batch_size=4), checkpoint_path=ck)
    before = ck.read_bytes()
    poisoned = [t.copy() for t in ds.train]
    for t in poisoned:
        t[3] = np.nan  # every stream meets a NaN in its first window
    with pytest.raises(TrainingDiverged, match=r"epoch 2, step 0: loss is nan.*checkpoint.*Lower train.lr or "
                                               r"train.clip\.$"):
        fit(model, poisoned, ds.test, TrainConfig(epochs=3, lr=0.1, bptt=10, batch_size=4), checkpoint_path=ck)
    assert ck.read_bytes() == before
    # with clipping off, the advice is to turn it on (a lower clip would change nothing)
    with pytest.raises(TrainingDiverged, match=r"epoch 1, step 0: loss is nan.*Lower train.lr or turn "
                                               r"gradient-norm clipping on \(train.clip > 0, e.g. 0.25\)\.$"):
        fit(_gru(), poisoned, ds.test, TrainConfig(epochs=1, lr=0.1, bptt=10, batch_size=4, clip=0.0))


def test_an_unusable_initial_model_is_named_before_any_update(tmp_path, continuous):
    """NaN weights (e.g. from an absurd bias scale) give a NaN epoch-0 metric: no SGD can repair that, so training
    stops there with a message about the initial model rather than advice to lower the learning rate."""
    model = _gru()
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(TrainingDiverged) as err:
        fit(model, continuous.train, continuous.test, TrainConfig(epochs=1, lr=0.1, bptt=10, batch_size=4),
            checkpoint_path=tmp_path / "checkpoint.pt")
    msg = str(err.value)
    assert msg.startswith("the initial model (epoch 0, before any update) gives a test mse of nan: its weights are "
                          "not usable") and "lr" not in msg and "\n" not in msg
    assert not (tmp_path / "checkpoint.pt").exists()


def test_a_loss_above_max_loss_names_the_setting(continuous):
    """Unnormalised data can have a large but finite loss: the message must say which limit it crossed."""
    big = [t * 1e3 for t in continuous.train]
    with pytest.raises(TrainingDiverged) as err:
        fit(_gru(), big, continuous.test, TrainConfig(epochs=1, lr=0.1, bptt=10, batch_size=4, max_loss=100.0))
    msg = str(err.value)
    assert "epoch 1, step 0: loss is" in msg and "train.max_loss=100" in msg and "\n" not in msg
    assert msg.endswith("else lower train.lr or train.clip.")


def test_flush_denormal_mode_is_restored_after_fit_and_evaluate(continuous):
    from pipeline.train import evaluate

    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        assert flush_denormal_enabled()
        for initial in (False, True):
            torch.set_flush_denormal(initial)
            model = _gru()
            fit(model, continuous.train, continuous.test, TrainConfig(epochs=1, lr=0.1, bptt=10, batch_size=4))
            assert flush_denormal_enabled() is initial
            evaluate(model, continuous.test)
            assert flush_denormal_enabled() is initial
    finally:
        torch.set_flush_denormal(False)


def test_fit_model_api_discrete_and_continuous(continuous):
    ds, _ = make_hmm_dataset(n_train=20, n_test=5, length=60, seed=1)
    fitted = fit_model(ds.train, ds.test, model="psrnn", state_dim=6, obs_dim=6, n_features=200, horizon=2,
                       epochs=1, bptt=10, batch_size=5)
    assert [h["epoch"] for h in fitted.history] == [0, 1]
    logits = fitted.predict(ds.test[:2])
    assert logits[0].shape == (60, 6)
    kf = fit_model(continuous.train, continuous.test, model="kf", state_dim=2, horizon=4, epochs=1, bptt=0,
                   batch_size=4, lr=0.05)
    preds = kf.predict(continuous.test)
    assert preds[0].shape == (40, 2)
    mse = np.mean(np.concatenate([(p[:-1] - t[1:]) ** 2 for p, t in zip(preds, continuous.test)]))
    assert mse == pytest.approx(kf.history[-1]["test"]["mse"], rel=1e-4)


def test_fit_model_windows_and_bptt_defaults(continuous):
    ds, _ = make_hmm_dataset(n_train=10, n_test=2, length=60, seed=1)
    kw = dict(model="psrnn", state_dim=4, obs_dim=4, n_features=100, epochs=0)
    fitted = fit_model(ds.train, ds.test, horizon=2, **kw)
    assert fitted.extras["train_config"]["bptt"] == 35          # discrete data: the paper's PTB horizon
    assert (fitted.two_stage.config["past_window"], fitted.two_stage.config["future_window"]) == (2, 2)
    fitted = fit_model(ds.train, ds.test, horizon=2, past_window=4, **kw)
    assert (fitted.two_stage.config["past_window"], fitted.two_stage.config["future_window"]) == (4, 2)
    fitted = fit_model(ds.train, ds.test, horizon=2, two_stage_options={"past_window": 5, "width_scale": 0.5},
                       **kw)
    assert (fitted.two_stage.config["past_window"], fitted.two_stage.config["future_window"]) == (5, 2)
    assert fitted.two_stage.config["width_scale"] == 0.5
    fitted = fit_model(ds.train, ds.test, horizon=2, bptt=7, train_options={"optimizer": "adam"}, **kw)
    assert fitted.extras["train_config"]["bptt"] == 7 and fitted.extras["train_config"]["optimizer"] == "adam"
    kf = fit_model(continuous.train, continuous.test, model="kf", state_dim=2, horizon=3, past_window=5, epochs=0)
    assert kf.extras["train_config"]["bptt"] == 0               # continuous data: whole sequences
    assert kf.extras["windows"] == {"past_window": 5, "future_window": 3}
    with pytest.raises(ValueError, match="two_stage_options: .*obs_dim"):
        fit_model(ds.train, ds.test, two_stage_options={"obs_dim": 3}, **kw)
    with pytest.raises(ValueError,
                       match=r"train_options: unknown key\(s\) \['momentun'\], did you mean 'momentum'\?; "):
        fit_model(ds.train, ds.test, train_options={"momentun": 0.9}, **kw)
    with pytest.raises(ValueError, match=r"train_options: unknown key\(s\) \['epoch', 'momentun', 'zzz'\]; did you "
                                         r"mean 'epochs' for 'epoch', 'momentum' for 'momentun'\?; expected some of "):
        fit_model(ds.train, ds.test, train_options={"momentun": 0.9, "epoch": 3, "zzz": 1}, **kw)


@pytest.mark.parametrize("model", ["factorized_psrnn", "kf"])
def test_fitted_model_saves_to_one_pickle_free_file_and_loads_back(model, continuous, tmp_path):
    """FittedModel.save / load_fitted: the same predictions, history and configs; the file holds no pickled
    objects (torch.load weights_only reads it); other files are refused in one line naming them."""
    import torch

    from pipeline.api import load_fitted

    if model == "kf":
        data = continuous
        fitted = fit_model(data.train, data.test, model="kf", state_dim=2, horizon=3, epochs=1, lr=0.05,
                           batch_size=4, device="cpu")   # load_fitted's default device (tests/test_cuda.py: GPU)
    else:
        data, _ = make_hmm_dataset(n_train=10, n_test=3, length=60, seed=2)
        fitted = fit_model(data.train, data.test, model=model, rank=5, state_dim=5, obs_dim=5, n_features=100,
                           horizon=2, epochs=1, bptt=10, batch_size=5, device="cpu")
    path = tmp_path / "fitted.pt"
    fitted.save(path)
    raw = torch.load(path, weights_only=True)
    assert raw["model_config"]["model"] == model and not list(tmp_path.glob(".*"))
    again = load_fitted(path)
    assert again.history == fitted.history and again.extras == fitted.extras
    assert type(again.model) is type(fitted.model)
    for a, b in zip(again.predict(data.test), fitted.predict(data.test)):
        np.testing.assert_array_equal(a, b)
    assert again.evaluate(data.test) == fitted.evaluate(data.test)

    torch.save({"model": {}, "epoch": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other\.pt: not a fitted model written by FittedModel\.save"):
        load_fitted(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"junk\.pt: not a readable checkpoint"):
        load_fitted(tmp_path / "junk.pt")
    # a path that is no path: one line, not os.fspath's TypeError
    for bad, shown in ((5, "path=5: expected a file path (str or os.PathLike), not int"),
                       (None, "path=None: expected a file path (str or os.PathLike), not NoneType"),
                       ("", "path='': empty; expected a file path, e.g. 'model.pt'")):
        for call in (fitted.save, load_fitted):
            with pytest.raises(ValueError, match="^" + re.escape(shown) + "$"):
                call(bad)
    # a file from another version of the code: a config key this one lacks, or weights of other shapes
    for i, (change, message) in enumerate([
            (lambda r: r["model_config"].update(attention_heads=4), r"its model_config does not fit this version.s ModelConfig \(.*attention_heads"),
            (lambda r: r["model"].update({next(iter(r["model"])): torch.zeros(1, 1, 1)}),
             rf"its weights do not fit a {model} model of its own config \(.*size mismatch"),
            (lambda r: r["model"].pop(next(iter(r["model"]))), rf"its weights do not fit a {model} model.*Missing")]):
        raw = torch.load(path, weights_only=True)
        change(raw)
        raw["digest"] = _fitted_digest(raw)   # as that version would have written it
        torch.save(raw, tmp_path / f"v{i}.pt")
        with pytest.raises(ValueError, match=rf"v{i}\.pt: {message}"):
            load_fitted(tmp_path / f"v{i}.pt")


def test_a_checkpoint_of_numpy_valued_settings_resumes(tmp_path, continuous):
    """lr=np.float64(0.5) reached the saved train config and the optimizer's param groups, which
    torch.load(weights_only=True) refuses: the checkpoint saved but did not resume ("not a readable checkpoint").
    Numpy scalars are stored as Python numbers, and the resumed run equals the one trained in one go."""
    ds = continuous
    ck = tmp_path / "checkpoint.pt"
    kw = dict(lr=np.float64(0.5), momentum=np.float32(0.5), bptt=np.int64(5), batch_size=3, device="cpu")
    fit(_gru(), ds.train, ds.test, TrainConfig(epochs=1, **kw), checkpoint_path=ck)
    resumed = _gru()
    fit(resumed, ds.train, ds.test, TrainConfig(epochs=2, **kw), checkpoint_path=ck)
    straight = _gru()
    fit(straight, ds.train, ds.test, TrainConfig(epochs=2, **kw))
    for a, b in zip(resumed.parameters(), straight.parameters()):
        assert torch.equal(a, b)
