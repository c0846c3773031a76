"""The training schedule: learning-rate decay when the monitored metric stops improving, early stopping, the best
epoch's weights as the trained model; each resumes exactly, and bad settings are one-line errors."""

import copy
import math
from pathlib import Path
from dataclasses import asdict

import numpy as np
import pytest
import torch

from pipeline.api import fit_model, initialise_model, load_fitted, model_from_checkpoint
from pipeline.config import ParamsError, parse_params
from pipeline.data.synthetic import make_lgssm_dataset
from pipeline.models.common import ModelConfig
from pipeline.train import (TrainConfig, check_resumable, evaluate, fit, load_checkpoint, trained_epoch,
                            trained_weights)


@pytest.fixture(scope="module")
def data():
    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=16, n_test=4, length=40, seed=0)
    return ds.train[:12], ds.train[12:], ds.test     # train, valid, test


def _gru():
    return initialise_model(ModelConfig(model="gru", discrete=False, input_dim=2, output_dim=2, state_dim=6,
                                        obs_dim=4, init="xavier"), seed=0)


# lr 5 overshoots now and then, so the validation MSE improves, stalls, decays the rate and stops within 15 epochs
SCHEDULE = dict(lr=5.0, bptt=0, batch_size=4, device="cpu", lr_decay=0.5, patience=2)


def _replay(history, cfg, split):
    """The schedule recomputed from the scores alone: the learning rate of every epoch and where training stops."""
    best, best_epoch, lr, rates, stop = history[0][split]["mse"], 0, cfg.lr, [], None
    for entry in history[1:]:
        rates.append(lr)
        if entry[split]["mse"] < best - cfg.min_delta:
            best, best_epoch = entry[split]["mse"], entry["epoch"]
        else:
            lr *= cfg.lr_decay
            if cfg.patience and entry["epoch"] - best_epoch >= cfg.patience:
                stop = entry["epoch"]
                break
    return rates, best_epoch, stop


def test_lr_decays_after_each_epoch_without_improvement_and_training_stops_after_patience(data):
    train, valid, test = data
    cfg = TrainConfig(epochs=15, **SCHEDULE)
    result = fit(_gru(), train, test, cfg, valid=valid)
    history = result.history
    rates, best_epoch, stop = _replay(history, cfg, "valid")
    assert [e["lr"] for e in history[1:]] == pytest.approx(rates, rel=1e-12)
    assert len(set(rates)) >= 3, "the setting must decay the rate more than once to test anything"
    assert stop is not None and history[-1]["epoch"] == stop < cfg.epochs
    assert result.best_epoch == best_epoch and result.stopped_early.startswith("valid mse did not improve for 2")
    assert result.best_metric == min(e["valid"]["mse"] for e in history)


def test_without_a_schedule_the_rate_stays_and_every_epoch_runs(data):
    train, valid, test = data
    result = fit(_gru(), train, test, TrainConfig(epochs=6, lr=5.0, bptt=0, batch_size=4, device="cpu"),
                 valid=valid)
    assert [e["lr"] for e in result.history[1:]] == [5.0] * 6 and result.stopped_early is None
    assert any(b["valid"]["mse"] >= a["valid"]["mse"] for a, b in zip(result.history, result.history[1:]))


def test_min_delta_counts_small_improvements_as_none(data):
    """At a fixed rate training is the same whatever min_delta; only which epoch is best changes: the replay of the
    scores with the threshold picks it, and here it is not the epoch of the lowest score."""
    train, valid, test = data
    base = dict(epochs=12, lr=5.0, bptt=0, batch_size=4, device="cpu", restore_best=True)
    plain = fit(_gru(), train, test, TrainConfig(**base), valid=valid)
    scores = [e["valid"]["mse"] for e in plain.history]
    gains = [best - s for best, s in zip(np.minimum.accumulate(scores), scores[1:]) if s < best]
    assert len(gains) >= 2, "the run must improve more than once to test anything"
    cfg = TrainConfig(**base, min_delta=float(np.mean(sorted(gains)[:2])))  # above the smallest gain only
    model = _gru()
    thresholded = fit(model, train, test, cfg, valid=valid)
    untimed = lambda history: [{k: v for k, v in e.items() if k != "seconds"} for e in history]  # noqa: E731
    assert untimed(thresholded.history) == untimed(plain.history)
    _, best_epoch, _ = _replay(plain.history, cfg, "valid")
    assert thresholded.best_epoch == best_epoch != plain.best_epoch == scores.index(min(scores))
    assert evaluate(model, valid)["mse"] == pytest.approx(scores[best_epoch], rel=1e-9)


def test_monitor_picks_the_split_auto_is_valid_else_train(data):
    train, valid, test = data
    cfg = TrainConfig(epochs=6, **SCHEDULE)
    for split, kwargs, monitor in (("train", {}, "auto"), ("test", {"valid": valid}, "test")):
        result = fit(_gru(), train, test, TrainConfig(**{**asdict(cfg), "monitor": monitor}), **kwargs)
        rates, best_epoch, _ = _replay(result.history, cfg, split)
        assert [e["lr"] for e in result.history[1:]] == pytest.approx(rates[:len(result.history) - 1])
        assert result.best_epoch == best_epoch
    with pytest.raises(ValueError, match="train.monitor: 'valid', but the data have no validation split"):
        fit(_gru(), train, test, TrainConfig(epochs=1, monitor="valid", device="cpu"))


def test_restore_best_gives_the_best_epoch_and_a_stopped_run_stays_stopped(data, tmp_path):
    train, valid, test = data
    ckpt = tmp_path / "ck.pt"
    cfg = TrainConfig(epochs=15, restore_best=True, **SCHEDULE)
    model = _gru()
    result = fit(model, train, test, cfg, valid=valid, checkpoint_path=ckpt)
    last = result.history[-1]["epoch"]
    assert result.stopped_early and result.best_epoch < last
    best = result.history[result.best_epoch]
    assert evaluate(model, valid)["mse"] == pytest.approx(best["valid"]["mse"], rel=1e-9)
    ck = load_checkpoint(ckpt)
    assert ck["epoch"] == last and trained_epoch(ck) == result.best_epoch
    rebuilt = model_from_checkpoint(ck, str(ckpt))   # as pipeline.inference and the MLflow loader build it
    assert evaluate(rebuilt, test)["mse"] == pytest.approx(best["test"]["mse"], rel=1e-9)
    assert all(torch.equal(a, b) for a, b in zip(trained_weights(ck).values(), model.state_dict().values()))
    # more epochs do not restart a stopped run
    again = fit(_gru(), train, test, TrainConfig(**{**asdict(cfg), "epochs": 30}), valid=valid,
                checkpoint_path=ckpt)
    assert again.history == result.history and again.stopped_early == result.stopped_early


def test_resume_with_a_decayed_rate_equals_one_uninterrupted_run(data, tmp_path):
    train, valid, test = data
    cfg = TrainConfig(epochs=5, **{**SCHEDULE, "patience": 0})
    whole = _gru()
    straight = fit(whole, train, test, cfg, valid=valid)
    assert straight.history[3]["lr"] < cfg.lr, "the rate must have decayed before the break"
    ckpt = tmp_path / "ck.pt"
    first = _gru()
    fit(first, train, test, TrainConfig(**{**asdict(cfg), "epochs": 3}), valid=valid, checkpoint_path=ckpt)
    resumed = _gru()
    result = fit(resumed, train, test, cfg, valid=valid, checkpoint_path=ckpt)
    assert [e.get("lr") for e in result.history] == [e.get("lr") for e in straight.history]
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


NEW_KEYS = ("monitor", "lr_decay", "patience", "restore_best")


def test_a_checkpoint_from_before_the_schedule_keys_still_resumes(data, tmp_path):
    cfg = asdict(TrainConfig())
    old = {k: v for k, v in cfg.items() if k not in NEW_KEYS}
    check_resumable("old.pt", {"model_config": {}, "train_config": old}, {}, cfg)
    with pytest.raises(ValueError, match=r"train.lr_decay \(1.0 in the checkpoint, 0.5 now\)"):
        check_resumable("old.pt", {"model_config": {}, "train_config": old}, {}, {**cfg, "lr_decay": 0.5})
    # such a checkpoint picked its best epoch on test (no valid split); resumed, the best is today's, on train
    train, _, test = data
    ckpt = tmp_path / "old.pt"
    tcfg = TrainConfig(epochs=3, lr=5.0, bptt=0, batch_size=4, device="cpu")
    fit(_gru(), train, test, tcfg, checkpoint_path=ckpt)
    ck = load_checkpoint(ckpt)
    ck["train_config"] = {k: v for k, v in ck["train_config"].items() if k not in NEW_KEYS}
    ck["best_epoch"], ck["best_metric"] = 1, ck["history"][1]["test"]["mse"]   # not train's best (epoch 3)
    torch.save({k: v for k, v in ck.items() if k != "stopped_early"}, ckpt)
    result = fit(_gru(), train, test, TrainConfig(**{**asdict(tcfg), "epochs": 5}), checkpoint_path=ckpt)
    on_train = [e["train"]["mse"] for e in result.history]
    assert len(result.history) == 6 and result.best_epoch == on_train.index(min(on_train)) == 3
    assert result.best_metric == min(on_train)


@pytest.mark.parametrize("changes, message", [
    ({"lr_decay": 0.0}, r"ptb\.train\.lr_decay: expected a factor in \(0, 1\]"),
    ({"lr_decay": 1.5}, r"ptb\.train\.lr_decay: expected a factor in \(0, 1\]"),
    ({"patience": -1}, r"ptb\.train\.patience: expected >= 0"),
    ({"min_delta": -0.1}, r"ptb\.train\.min_delta: expected a finite number >= 0"),
    ({"monitor": "val"}, r"ptb\.train\.monitor: expected one of \['auto', 'valid', 'train', 'test'\]"),
    ({"monitor": "train", "eval_train": False}, r"ptb\.train\.monitor: 'train' needs eval_train: true"),
])
def test_bad_schedule_params_name_their_key(changes, message, defaults):
    p = copy.deepcopy(defaults)
    p["ptb"]["train"].update(changes)
    with pytest.raises(ParamsError, match=message):
        parse_params(p)


def test_monitoring_a_validation_split_a_dataset_lacks_is_refused(defaults):
    p = copy.deepcopy(defaults)
    p["ptb"]["train"]["monitor"] = "valid"          # PTB has one
    p["swimmer"]["train"]["overrides"] = {"psrnn": {"monitor": "valid", "patience": 2}}
    with pytest.raises(ParamsError, match=r"^swimmer\.train\.overrides\.psrnn\.monitor: 'valid', but swimmer has "
                                          "no validation split"):
        parse_params(p)
    p["swimmer"]["train"]["overrides"] = {"psrnn": {"monitor": "train", "patience": 2}}
    parsed = parse_params(p)
    assert parsed.dataset("ptb").train.monitor == "valid"
    assert parsed.dataset("swimmer").train_config("psrnn").patience == 2


def test_fit_model_takes_a_validation_split_and_reports_the_stop(data, tmp_path):
    train, valid, test = data
    fitted = fit_model(train, test, valid=valid, model="gru", state_dim=6, obs_dim=4, epochs=15, lr=5.0,
                       batch_size=4, device="cpu",
                       train_options={"lr_decay": 0.5, "patience": 2, "restore_best": True})
    assert fitted.extras["stopped_early"] and len(fitted.history) < 16
    assert all("valid" in e for e in fitted.history)
    best = min(range(len(fitted.history)), key=lambda e: fitted.history[e]["valid"]["mse"])
    assert fitted.extras["best_epoch"] == best
    assert math.isfinite(fitted.history[-1]["test"]["mse"])
    # the model holds the best epoch's weights, and says so, also after a save and load
    assert fitted.epoch == best < fitted.history[-1]["epoch"]
    assert fitted.evaluate(valid)["mse"] == pytest.approx(fitted.history[best]["valid"]["mse"], rel=1e-9)
    fitted.save(tmp_path / "m.pt")
    again = load_fitted(tmp_path / "m.pt")
    assert again.epoch == best
    assert again.evaluate(valid)["mse"] == pytest.approx(fitted.history[best]["valid"]["mse"], rel=1e-9)


def test_early_stopping_on_the_training_metric_is_noted(defaults):
    p = copy.deepcopy(defaults)
    p["swimmer"]["train"]["patience"] = 3
    p["ptb"]["train"]["patience"] = 3                                   # PTB has a validation split: no note
    p["hmm"]["train"]["overrides"] = {"psrnn": {"restore_best": True, "monitor": "train"}}   # said: no note
    parsed = parse_params(p)
    assert parsed.dataset("swimmer").schedule_notes() == [
        "swimmer.train: patience watches the training metric (swimmer has no validation split); monitor: train says "
        "so, monitor: test uses the test split"]
    assert parsed.dataset("ptb").schedule_notes() == [] and parsed.dataset("hmm").schedule_notes() == []
    # the test split driving a schedule is noted wherever it is set, with or without a validation split
    p["ptb"]["train"]["overrides"] = {"lstm": {"monitor": "test", "lr_decay": 0.5, "restore_best": True}}
    p["mocap"]["train"]["monitor"] = "test"                             # no schedule: nothing to note
    parsed = parse_params(p)
    assert parsed.dataset("ptb").schedule_notes() == [
        "ptb.train.overrides.lstm: monitor: test lets the test split drive lr_decay, patience and "
        "restore_best, so the test metrics of these runs are not held out"]
    assert parsed.dataset("mocap").schedule_notes() == []
    # auto with the train split unscored falls back to the test split where there is no validation split
    p["swimmer"]["train"]["eval_train"] = False
    p["ptb"]["train"]["eval_train"] = False                             # valid split: auto watches it, no note
    parsed = parse_params(p)
    assert parsed.dataset("swimmer").train_config("psrnn").monitored_split(False) == "test"
    assert parsed.dataset("swimmer").schedule_notes() == [
        "swimmer.train: monitor: auto with eval_train: false (swimmer has no validation split) lets the test split "
        "drive patience, so the test metrics of these runs are not held out"]
    assert parsed.dataset("ptb").schedule_notes() == [parsed.dataset("ptb").schedule_notes()[0]] and \
        "overrides.lstm: monitor: test" in parsed.dataset("ptb").schedule_notes()[0]


def test_check_notes_early_stopping_on_a_custom_file_without_a_validation_split(defaults, tmp_path, capsys):
    """A custom set's validation split is known only once its file is read (a split column, valid_fraction):
    `psrnn check` read it and still gave no note, as the params alone said nothing."""
    import shutil

    from pipeline import cli
    from pipeline.config import dump_yaml

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "examples", tmp_path / "examples")
    p = copy.deepcopy(defaults)
    p["datasets"] = ["custom"]
    p["custom"]["train"]["patience"] = 3
    (tmp_path / "params.yaml").write_text(dump_yaml(p))
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    out = capsys.readouterr().out
    assert "note: custom.train: patience watches the training metric (custom has no validation split)" in out, out
    assert parse_params(p).dataset("custom").schedule_notes() == []        # unknown from the params alone
    p["custom"]["source"]["valid_fraction"] = 0.2                         # known from them: no note either way
    assert parse_params(p).dataset("custom").schedule_notes(has_valid=False) == []
    (tmp_path / "params.yaml").write_text(dump_yaml(p))
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    assert "note: custom.train" not in capsys.readouterr().out


def test_synthetic_sets_draw_a_validation_split_after_train_and_test(defaults):
    from pipeline.data.synthetic import make_hmm_dataset

    base = dict(n_states=3, n_symbols=4, n_train=5, n_test=3, length=30, seed=2)
    plain, _ = make_hmm_dataset(**base)
    with_valid, _ = make_hmm_dataset(**base, n_valid=4)
    assert plain.valid == [] and len(with_valid.valid) == 4
    for a, b in ((plain.train, with_valid.train), (plain.test, with_valid.test)):
        assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert not any(np.array_equal(v, t) for v in with_valid.valid for t in with_valid.test)
    assert plain.meta["bayes_optimal"] == with_valid.meta["bayes_optimal"]
    lg_plain, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=4, n_test=2, length=20, seed=1)
    lg, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=4, n_test=2, length=20, seed=1, n_valid=2)
    assert len(lg.valid) == 2 and all(np.array_equal(x, y) for x, y in zip(lg.test, lg_plain.test))
    with pytest.raises(ValueError, match=r"n_valid=-1; expected an integer >= 0"):
        make_hmm_dataset(**base, n_valid=-1)

    p = copy.deepcopy(defaults)
    p["hmm"]["train"]["monitor"] = "valid"
    with pytest.raises(ParamsError, match=r"^hmm\.train\.monitor: 'valid', but hmm has no validation split; .*"
                                          r"\(or hmm\.source\.n_valid > 0\)"):
        parse_params(p)
    # an override that leaves monitor as train sets it: the key named is train's, which sets it
    p["hmm"]["train"]["overrides"] = {"psrnn": {"lr": 0.1}}
    with pytest.raises(ParamsError, match=r"^hmm\.train\.monitor: 'valid', but hmm has no validation split"):
        parse_params(p)
    del p["hmm"]["train"]["overrides"]
    p["hmm"]["source"]["n_valid"] = 10
    p["lgssm"]["train"]["patience"] = 2
    p["lgssm"]["source"]["n_valid"] = 5
    parsed = parse_params(p)
    assert parsed.dataset("hmm").train.monitor == "valid" and parsed.dataset("lgssm").schedule_notes() == []
    p["lgssm"]["source"]["n_valid"] = -1
    with pytest.raises(ParamsError, match=r"^lgssm\.source\.n_valid: expected an integer >= 0"):
        parse_params(p)


# ------------------------------------------------- the best-epoch bookkeeping across a resume (a mutation audit)

def test_a_schedule_resumed_after_its_best_epoch_equals_one_run(data, tmp_path):
    """Resume restores the best epoch, its metric and weights: without them a run with patience and restore_best
    stopped at another epoch, on another rate schedule, and returned the last weights."""
    train, valid, test = data
    cfg = TrainConfig(epochs=15, restore_best=True, **SCHEDULE)
    whole = _gru()
    straight = fit(whole, train, test, cfg, valid=valid)
    stop = straight.history[-1]["epoch"]
    k = straight.best_epoch + 1
    assert straight.stopped_early and straight.best_epoch > 0 and k < stop
    ck = tmp_path / "ck.pt"
    fit(_gru(), train, test, TrainConfig(**{**asdict(cfg), "epochs": k}), valid=valid, checkpoint_path=ck)
    resumed = _gru()
    again = fit(resumed, train, test, cfg, valid=valid, checkpoint_path=ck)
    assert (again.best_epoch, again.best_metric, again.stopped_early) == \
        (straight.best_epoch, straight.best_metric, straight.stopped_early)
    assert [e.get("lr") for e in again.history] == [e.get("lr") for e in straight.history]
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert trained_epoch(load_checkpoint(ck)) == straight.best_epoch


def test_a_best_epoch_chosen_again_on_resume_comes_with_its_own_weights(data, tmp_path):
    """eval_train switched off on resume moves the monitored split from train to test: the best epoch is chosen
    again, and the weights kept must be that epoch's, not the old best's."""
    train, _, test = data
    ck = tmp_path / "ck.pt"
    cfg = TrainConfig(epochs=6, lr=1.0, bptt=0, batch_size=4, device="cpu", eval_train=True, restore_best=True)
    first = fit(_gru(), train, test, cfg, checkpoint_path=ck)
    assert first.best_epoch != int(np.argmin([h["test"]["mse"] for h in first.history])), \
        "setup: the best epochs on train and on test must differ"
    model = _gru()
    fit(model, train, test, TrainConfig(**{**asdict(cfg), "eval_train": False, "epochs": 7}), checkpoint_path=ck)
    ck_now = load_checkpoint(ck)
    want = ck_now["history"][trained_epoch(ck_now)]["test"]["mse"]
    final = _gru()
    final.load_state_dict(trained_weights(ck_now))
    assert evaluate(final, test)["mse"] == pytest.approx(want, rel=1e-9)
    assert evaluate(model, test)["mse"] == pytest.approx(want, rel=1e-9)


def test_a_tie_is_no_improvement(data, monkeypatch):
    """'Not below the best by more than min_delta' (0): an epoch scoring exactly the best decays the rate and
    counts toward patience."""
    import pipeline.train as train_module

    monkeypatch.setattr(train_module, "evaluate", lambda *args, **kwargs: {"mse": 1.0})
    train, valid, test = data
    result = fit(_gru(), train, test, TrainConfig(epochs=6, **SCHEDULE), valid=valid)
    assert result.best_epoch == 0 and [e["lr"] for e in result.history[1:]] == [5.0, 2.5]
    assert result.stopped_early
