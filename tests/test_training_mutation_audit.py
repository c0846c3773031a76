"""Tests written from a mutation audit of the training modules (pipeline.train, optim, batching, metrics,
train_config): each pins a behaviour that a small, plausible bug changed without any other test noticing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.batching import make_streams
from pipeline.optim import SGD, Adam
from pipeline.train_config import TrainConfig


def test_an_optimiser_over_no_parameters_is_refused():
    """An empty parameter list (a model whose parameters were filtered away) is an error, not a silent no-op."""
    for cls in (SGD, Adam):
        with pytest.raises(ValueError, match="^optimizer got an empty parameter list$"):
            cls([], lr=0.1)
        with pytest.raises(ValueError, match="empty parameter list"):
            cls(iter(()), lr=0.1)


def test_streams_to_converts_inputs_and_targets_alike():
    """Streams.to(device, dtype) converts the targets with the inputs: a bfloat16 / float64 model would otherwise
    compare its outputs with float32 targets."""
    trajs = [np.stack([np.arange(T) + 0.5, np.full(T, 3.0)], axis=1) for T in (5, 3, 4)]
    streams = make_streams(trajs, 2, discrete=False)           # stored as float32
    for dtype in (torch.float64, torch.bfloat16):
        moved = streams.to("cpu", dtype)
        assert moved.x.dtype == moved.y.dtype == dtype
        assert torch.equal(moved.y, streams.y.to(dtype))


def test_an_infinite_min_delta_is_refused():
    """min_delta = inf would make every epoch "no improvement"; validate names it."""
    with pytest.raises(ValueError, match=r"^train\.min_delta: expected a finite number >= 0"):
        TrainConfig(min_delta=float("inf")).validate()
    TrainConfig(min_delta=0.5).validate()


def test_the_sgd_weight_decay_bound_widens_with_momentum():
    """lr x weight_decay must stay below 2 (1 + momentum): momentum 0.9 allows 3.5, and refuses 3.8 and above."""
    TrainConfig(optimizer="sgd", lr=1.0, momentum=0.9, weight_decay=3.5).validate()
    with pytest.raises(ValueError, match=r"is at or above 2 x \(1 \+ momentum\) = 3\.8"):
        TrainConfig(optimizer="sgd", lr=1.0, momentum=0.9, weight_decay=3.8).validate()
    with pytest.raises(ValueError, match=r"= 2, where"):
        TrainConfig(optimizer="sgd", lr=1.0, momentum=0.0, weight_decay=2.0).validate()
    TrainConfig(optimizer="adam", lr=1.0, weight_decay=5.0).validate()   # Adam's step is bounded by lr


# ------------------------------------------------------------------ fit against a written-out reference epoch

def _gru(discrete=False, dim=2):
    from pipeline.api import initialise_model
    from pipeline.models.common import ModelConfig

    return initialise_model(ModelConfig(model="gru", discrete=discrete, input_dim=dim, output_dim=dim, state_dim=5,
                                        obs_dim=4, init="xavier"), seed=3)


def _uneven(trajs):
    """The trajectories cut to unequal lengths, so that streams have padding and windows unscored steps."""
    return [t[:len(t) - 3 * k] for k, t in enumerate(trajs)]


def _reference_epoch(model, train, cfg, discrete):
    """One epoch of truncated BPTT written out: windows of cfg.bptt steps, the state carried from window to window
    and detached, the masked loss, its gradient clipped to cfg.clip (torch's clip_grad_norm_ coefficient), then
    SGD with L2 weight decay."""
    from pipeline.metrics import masked_loss

    params = list(model.parameters())
    streams = make_streams(train, cfg.batch_size, discrete=discrete, dtype=params[0].dtype)
    state = model.init_state(streams.batch_size)
    for x, y, mask, reset in streams.windows(cfg.bptt):
        if not bool(mask.any()):
            continue
        state = tuple(s.detach() for s in state)
        out, state = model(x, state, reset)
        grads = torch.autograd.grad(masked_loss(out, y, mask, discrete), params)
        norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
        coef = min(1.0, cfg.clip / (float(norm) + 1e-6)) if cfg.clip > 0 else 1.0
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(cfg.lr * (g * coef + cfg.weight_decay * p))


@pytest.mark.parametrize("bptt, batch_size, clip, weight_decay", [
    (0, 8, 0.0, 0.0),      # one window of whole streams, padded: the mask matters
    (0, 8, 1e-3, 0.0),     # the update's length is the clip
    (7, 2, 0.0, 0.0),      # several windows: the state is carried across them
    (7, 2, 0.5, 0.05),     # and weight decay, added after clipping
])
def test_one_epoch_of_fit_is_truncated_bptt_with_sgd(features, float64, bptt, batch_size, clip, weight_decay):
    from pipeline.train import fit

    train = _uneven(features.train)
    cfg = TrainConfig(epochs=1, lr=0.3, clip=clip, bptt=bptt, batch_size=batch_size, shuffle=False, device="cpu",
                      eval_train=False, weight_decay=weight_decay)
    ours, ref = _gru(), _gru()
    fit(ours, train, features.test, cfg)
    _reference_epoch(ref, train, cfg, discrete=False)
    for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(ours.parameters(), _gru().parameters()))   # it trained


def test_one_epoch_of_fit_on_symbols_is_truncated_bptt_with_sgd(symbols, float64):
    from pipeline.train import fit

    train = _uneven(symbols.train)
    cfg = TrainConfig(epochs=1, lr=0.5, clip=0.0, bptt=9, batch_size=3, shuffle=False, device="cpu",
                      eval_train=False)
    ours, ref = _gru(True, 4), _gru(True, 4)
    fit(ours, train, symbols.test, cfg)
    _reference_epoch(ref, train, cfg, discrete=True)
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_weight_decay_reaches_either_optimiser(features, float64):
    """train.weight_decay is passed to SGD and to Adam: with it the trained weights differ from those without."""
    from pipeline.train import fit

    for optimizer in ("sgd", "adam"):
        trained = []
        for wd in (0.0, 0.5):
            model = _gru()
            fit(model, features.train, features.test, TrainConfig(epochs=1, lr=0.05, optimizer=optimizer,
                                                                   weight_decay=wd, bptt=0, device="cpu",
                                                                   eval_train=False, shuffle=False))
            trained.append([p.detach().clone() for p in model.parameters()])
        assert any(not torch.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(*trained)), optimizer


# ------------------------------------------------------------------ the order of trajectories, the RNGs, modes

def _orders(monkeypatch, features, **cfg):
    """The ``order`` of the training streams of each epoch of a 3-epoch fit."""
    import pipeline.train
    from pipeline.train import fit

    seen = []
    real = pipeline.train.make_streams

    def recording(trajectories, n_streams, **kwargs):
        if trajectories is features.train and n_streams == 4:
            order = kwargs.get("order")
            seen.append(None if order is None else [int(i) for i in order])
        return real(trajectories, n_streams, **kwargs)

    monkeypatch.setattr(pipeline.train, "make_streams", recording)
    fit(_gru(), features.train, features.test, TrainConfig(epochs=3, lr=0.05, bptt=0, batch_size=4, device="cpu",
                                                           eval_train=False, **cfg))
    return seen


def test_each_epoch_draws_its_own_order_from_the_seed_and_the_epoch(monkeypatch, features, float64):
    seen = _orders(monkeypatch, features, seed=7)
    n = len(features.train)
    assert seen == [np.random.default_rng([7, e]).permutation(n).tolist() for e in (1, 2, 3)]
    assert len({tuple(o) for o in seen}) == 3      # reshuffled every epoch


def test_shuffle_false_keeps_the_given_order(monkeypatch, features, float64):
    assert _orders(monkeypatch, features, shuffle=False) == [None, None, None]


def _draws():
    import random

    return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random()


def test_fit_leaves_the_global_rngs_where_a_seeded_uninterrupted_run_leaves_them(features, float64, tmp_path):
    """fit seeds torch, numpy and random from train.seed; a resumed run restores their states from the
    checkpoint (pipeline.train's docstring), so a fresh and a resumed run leave the same global RNG states."""
    from pipeline.train import fit, seed_everything

    seed_everything(5)
    expected = _draws()
    cfg = dict(lr=0.05, bptt=0, batch_size=4, device="cpu", eval_train=False, seed=5)
    ck = tmp_path / "ck.pt"
    torch.manual_seed(123), np.random.seed(123)
    fit(_gru(), features.train, features.test, TrainConfig(epochs=1, **cfg), checkpoint_path=ck)
    assert _draws() == expected                                   # a fresh run
    torch.manual_seed(321), np.random.seed(321)
    import random
    random.seed(321)
    fit(_gru(), features.train, features.test, TrainConfig(epochs=2, **cfg), checkpoint_path=ck)
    assert _draws() == expected                                   # resumed from epoch 1


def test_evaluate_puts_back_the_mode_it_found(features, float64):
    from pipeline.train import evaluate, predict

    model = _gru()
    for training in (False, True):
        model.train(training)
        evaluate(model, features.test)
        assert model.training is training
        predict(model, features.test)
        assert model.training is training


def test_an_infinite_gradient_with_a_finite_loss_stops_at_its_step(features, float64, tmp_path):
    """A gradient norm of inf (not NaN) stops training before the update, naming the step; it must not reach the
    weights and surface only as a NaN metric at the end of the epoch."""
    from pipeline.train import TrainingDiverged, fit

    model = _gru()
    first = next(model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    first.register_hook(lambda g: torch.full_like(g, math.inf))
    with pytest.raises(TrainingDiverged, match=r"^training diverged at epoch 1, step 0: gradient norm is inf"):
        fit(model, features.train, features.test, TrainConfig(epochs=1, lr=0.1, clip=0.25, bptt=0, device="cpu",
                                                               eval_train=False))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


@pytest.mark.parametrize("clip, weight_decay, remedy", [
    (0.25, 0.0, "lower train.lr or train.clip."),
    (0.0, 0.0, "lower train.lr or turn gradient-norm clipping on (train.clip > 0, e.g. 0.25)."),
    (0.25, 0.01, "lower train.lr or train.clip or train.weight_decay (not bounded by clipping)."),
])
def test_a_stop_names_its_step_and_the_remedy_that_applies(features, float64, clip, weight_decay, remedy):
    """The first update (epoch 1, step 0) of a loss above max_loss stops training; the remedy offers lowering the
    clip only when clipping is on, and lowering the weight decay whenever it is on (however small)."""
    from pipeline.train import TrainingDiverged, fit

    cfg = TrainConfig(epochs=1, lr=0.1, clip=clip, weight_decay=weight_decay, max_loss=1e-9, bptt=0, device="cpu",
                      eval_train=False)
    with pytest.raises(TrainingDiverged) as err:
        fit(_gru(), features.train, features.test, cfg)
    message = str(err.value)
    assert message.startswith("training stopped at epoch 1, step 0: loss is "), message
    assert "above train.max_loss=1e-09" in message and message.endswith("else " + remedy), message


# ------------------------------------------------------------------ small contracts of metrics and train_config

def test_metrics_of_nothing_are_nan_not_an_error():
    from pipeline.metrics import MetricSums

    bpc = MetricSums(discrete=True).result()
    assert set(bpc) == {"bpc", "accuracy"} and all(math.isnan(v) for v in bpc.values())
    mse = MetricSums(discrete=False).result()
    assert set(mse) == {"mse"} and math.isnan(mse["mse"])


def test_restore_best_alone_counts_as_a_schedule():
    assert TrainConfig().schedule_keys == [] and not TrainConfig().scheduled
    assert TrainConfig(restore_best=True).schedule_keys == ["restore_best"] and TrainConfig(restore_best=True).scheduled
    assert TrainConfig(lr_decay=0.5, patience=2, restore_best=True).schedule_keys == ["lr_decay", "patience",
                                                                                     "restore_best"]


def test_seeds_are_refused_from_two_to_the_32():
    from pipeline.train_config import check_seed

    check_seed(2 ** 32 - 1)
    with pytest.raises(ValueError, match=r"^seed=4294967296: expected an integer with 0 <= seed < 2\*\*32$"):
        check_seed(2 ** 32)


def test_monitoring_train_needs_eval_train():
    TrainConfig(monitor="train", eval_train=True).validate()
    with pytest.raises(ValueError, match=r"^train\.monitor: 'train' needs eval_train: true"):
        TrainConfig(monitor="train", eval_train=False).validate()
    assert TrainConfig(eval_train=False).monitored_split(False) == "test"


def test_without_restore_best_the_model_keeps_the_last_epochs_weights(features, float64, tmp_path):
    """restore_best is off by default: when an earlier epoch scored best, fit still returns the last epoch's
    weights (those of the checkpoint's "model"), not the best epoch's."""
    from pipeline.train import fit, load_checkpoint, trained_epoch, trained_weights

    model, ck = _gru(), tmp_path / "ck.pt"
    result = fit(model, features.train, features.test, TrainConfig(epochs=3, lr=8.0, clip=0.0, bptt=0, device="cpu",
                                                                   eval_train=True, shuffle=False),
                 checkpoint_path=ck)
    assert result.best_epoch < 3      # lr 8 overshoots: the last epoch is not the best
    saved = load_checkpoint(ck)
    assert trained_epoch(saved) == 3
    for name, p in model.state_dict().items():
        assert torch.equal(p, saved["model"][name]) and torch.equal(p, trained_weights(saved)[name]), name


@pytest.mark.parametrize("factor", [1.0000001, 1.2, 0.0, -0.5])
def test_an_lr_decay_outside_zero_to_one_is_refused(factor):
    TrainConfig(lr_decay=1.0).validate()
    TrainConfig(lr_decay=1e-3).validate()
    with pytest.raises(ValueError, match=r"^train\.lr_decay: expected a factor in \(0, 1\]"):
        TrainConfig(lr_decay=factor).validate()
