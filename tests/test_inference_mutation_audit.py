"""The API, inference and CLI: what a mutation audit of ``api.py``, ``inference.py`` and ``cli.py`` found untested
(73 mutants, 17 survivors that changed behaviour): the vocabulary's stored order, sampled forecasts (the drawn
symbol fed back, its probability written, the seed's own stream), ids after a trajectory dropped whole, the
median spacing of single-row trajectories, named columns in the run's order, ``seed=`` reaching the baselines,
``bptt`` and ``bias_scale`` defaults, and the CLI passing its flags on (``--steps``, ``--sample-seed``,
``--unknown``, ``--block-rows``) and serving the trained checkpoint unless ``--initial``."""
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.api import fit_model
from pipeline.data.synthetic import make_hmm_dataset, make_lgssm_dataset
from pipeline.inference import TrainedRun, forecast_file, predict_file
from pipeline.train import predict

# the small models of the fixtures are bias-free and one of their training states flips: fit_model says so
pytestmark = pytest.mark.filterwarnings("ignore:fit_model. layer")


def _untrained_psrnn(ds):
    """The 2SR-initialised PSRNN of a small synthetic set, and its test trajectories."""
    fitted = fit_model(ds.train, ds.test, model="psrnn", state_dim=4, obs_dim=4, n_features=64, horizon=2,
                       epochs=0, device="cpu")
    return fitted.model, ds.test


@pytest.fixture(scope="module")
def dmodel():
    return _untrained_psrnn(make_hmm_dataset(n_states=3, n_symbols=4, n_train=10, n_test=3, length=40, seed=0)[0])


@pytest.fixture(scope="module")
def cmodel():
    return _untrained_psrnn(make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=6, n_test=3, length=40, seed=0)[0])


def _write(path, columns):
    pq.write_table(pa.table(columns), path)
    return path


def test_vocabulary_lookup_uses_the_stored_order_not_text_order(dmodel, tmp_path):
    """A custom dataset of integer symbols stores its vocabulary in numeric order (["9", "10", "11", "12"]), and
    PTB with unknown: map appends "<unk>" after the sorted characters: neither is sorted as text. Symbol i of the
    vocabulary must be model index i."""
    model, test = dmodel
    vocab = ["9", "10", "11", "12"]
    run = TrainedRun(model=model, dataset="d", variant="psrnn", seed=0, epoch=0, kind="discrete", vocab=vocab)
    assert run.encode(["9", "10", "11", "12", "9"]).tolist() == [0, 1, 2, 3, 0]
    syms = np.array([9, 10, 11, 12])[test[0]]
    src = _write(tmp_path / "in.parquet", {"trajectory": np.zeros(len(syms), dtype=np.int64), "symbol": syms})
    predict_file(run, src, tmp_path / "out.parquet")
    z = predict(model, [test[0]])[0]
    assert pq.read_table(tmp_path / "out.parquet").column("predicted").to_pylist() == \
        np.array([9, 10, 11, 12])[z.argmax(1)].tolist()


def test_sampled_forecast_file_probability_is_that_of_the_drawn_symbol(dmodel, tmp_path):
    """forecast --sample: `probability` is the predicted probability of the symbol written in `predicted` (the
    one drawn and fed back), not the largest probability."""
    model, test = dmodel
    vocab = ["10", "20", "30", "40"]
    run = TrainedRun(model=model, dataset="d", variant="psrnn", seed=0, epoch=0, kind="discrete", vocab=vocab)
    syms = np.array(vocab)[test[0]]
    src = _write(tmp_path / "in.parquet", {"trajectory": np.zeros(len(syms), dtype=np.int64), "symbol": syms})
    forecast_file(run, src, tmp_path / "fc.parquet", steps=40, sample=True, seed=5)
    out = pq.read_table(tmp_path / "fc.parquet")
    values, probs = run.forecast([syms], 40, sample=True, seed=5)[0]
    chosen = np.array([vocab.index(v) for v in values])
    assert out.column("predicted").to_pylist() == list(values)
    assert (chosen != probs.argmax(1)).any()   # some draw is not the most likely symbol
    np.testing.assert_allclose(out.column("probability").to_numpy(), probs[np.arange(40), chosen], rtol=1e-6)


def test_a_trajectory_dropped_whole_does_not_shift_the_ids_of_the_next(dmodel, tmp_path):
    """unknown='drop' that leaves a trajectory with no row: the rows of the trajectories after it keep their own
    ids (in predict and forecast files)."""
    model, _ = dmodel
    run = TrainedRun(model=model, dataset="d", variant="psrnn", seed=0, epoch=0, kind="discrete",
                     vocab=["a", "b", "c", "d"])
    src = _write(tmp_path / "in.parquet", {"trajectory": [10, 10, 20, 20, 30, 30, 30],
                                          "symbol": ["a", "b", "zz", "zz", "c", "d", "a"]})
    s = predict_file(run, src, tmp_path / "p.parquet", unknown="drop")
    assert s["dropped"] == 2 and s["trajectories"] == 2
    assert pq.read_table(tmp_path / "p.parquet").column("trajectory").to_pylist() == [10, 10, 30, 30, 30]
    forecast_file(run, src, tmp_path / "f.parquet", steps=2, unknown="drop")
    out = pq.read_table(tmp_path / "f.parquet")
    assert out.column("trajectory").to_pylist() == [10, 10, 30, 30]
    assert out.column("step").to_pylist() == [2, 3, 3, 4]


def test_a_single_row_trajectory_takes_the_median_spacing_of_the_others(dmodel, tmp_path):
    """Spacings 2, 7 and 7 in the other trajectories: the median is 7 (not the smallest, first or mean)."""
    model, _ = dmodel
    run = TrainedRun(model=model, dataset="d", variant="psrnn", seed=0, epoch=0, kind="discrete",
                     vocab=["a", "b", "c", "d"])
    src = _write(tmp_path / "in.parquet", {
        "trajectory": ["p", "p", "p", "q", "q", "r", "r", "s"],
        "step": [0, 2, 4, 0, 7, 0, 7, 100],
        "symbol": ["a", "b", "c", "a", "b", "c", "d", "a"]})
    summary = forecast_file(run, src, tmp_path / "f.parquet", steps=2)
    assert summary["single_row"] == {"trajectories": 1, "spacing": 7, "measured_from": 3}
    assert pq.read_table(tmp_path / "f.parquet").column("step").to_pylist() == [6, 8, 14, 21, 14, 21, 107, 114]


def test_a_sampled_forecast_feeds_back_the_drawn_symbol(dmodel):
    """With sample=True the symbol drawn is the next observation: the distribution of step h + 1 is the one-step
    prediction after the trajectory grown by the symbols drawn so far (not by the most likely ones)."""
    model, test = dmodel
    vocab = ["10", "20", "30", "40"]
    run = TrainedRun(model=model, dataset="d", variant="psrnn", seed=0, epoch=0, kind="discrete", vocab=vocab)
    traj = list(np.array(vocab)[test[1]])
    values, probs = run.forecast([traj], 25, sample=True, seed=7)[0]
    assert any(vocab.index(v) != int(np.argmax(p)) for v, p in zip(values, probs))   # some draw is not greedy
    grown = list(traj)
    for h in range(25):
        np.testing.assert_allclose(probs[h], run.predict([grown])[0][-1], rtol=1e-5, atol=1e-7)
        grown.append(values[h])


def test_named_columns_are_read_in_the_runs_feature_order(cmodel):
    """Features ["z", "a"] (not in text order, as Swimmer's nose_angle, joint1_angle, ...): a dict or frame is
    read in the run's order, so it predicts what the plain (T, 2) array in that order predicts."""
    model, test = cmodel
    run = TrainedRun(model=model, dataset="c", variant="psrnn", seed=0, epoch=0, kind="continuous",
                     features=["z", "a"], mean=np.array([5.0, -1.0]), std=np.array([2.0, 0.5]))
    x = test[0] * run.std + run.mean
    want = run.predict([x])[0]
    got = run.predict([{"a": x[:, 1], "z": x[:, 0]}])[0]
    np.testing.assert_array_equal(got, want)
    # and by hand: the model on the standardised array, de-standardised
    z = predict(model, [(x - run.mean) / run.std])[0].astype(np.float64)
    np.testing.assert_allclose(want, z * run.std + run.mean, rtol=1e-6, atol=1e-9)


def test_fit_model_seed_sets_the_initial_weights_of_the_rnn_baselines(cmodel):
    """seed= reaches the initialisation: an epoch-0 GRU of fit_model(seed=3) is initialise_model(seed=3)'s, and
    differs from seed 0's."""
    import torch

    from pipeline.api import initialise_model

    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=4, n_test=2, length=20, seed=0)
    f3 = fit_model(ds.train, ds.test, model="gru", state_dim=4, obs_dim=4, epochs=0, device="cpu", seed=3)
    f0 = fit_model(ds.train, ds.test, model="gru", state_dim=4, obs_dim=4, epochs=0, device="cpu", seed=0)
    want = initialise_model(f3.model.config, seed=3).state_dict()
    for k, v in f3.model.state_dict().items():
        assert torch.equal(v, want[k]), k
    assert any(not torch.equal(v, f0.model.state_dict()[k]) for k, v in f3.model.state_dict().items())


@pytest.fixture(scope="module")
def text_fit():
    text = "the cat sat on the mat and the rat sat on the hat " * 3
    return fit_model([text, text[::-1]], model="psrnn", state_dim=4, obs_dim=4, n_features=64, horizon=2,
                     epochs=0, device="cpu")


def _softmax(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def test_a_string_models_forecast_is_the_vocabulary_symbol_of_each_prediction(text_fit):
    """Greedy forecast of a model fitted on strings: symbol h is vocab[argmax] of the one-step prediction after
    the text grown by the symbols before it."""
    vocab = text_fit.extras["vocab"]
    (forecast,) = text_fit.forecast(["the c"], 6)
    grown = "the c"
    for h in range(6):
        assert forecast[h] == vocab[int(np.argmax(text_fit.predict([grown])[0][-1]))], h
        grown += forecast[h]


def test_fitted_forecast_samples_from_the_seeds_own_stream(text_fit):
    """sample=True, seed=s: trajectory i's draws are the inverse CDF of SeedSequence(s, spawn_key=(i,))'s
    uniforms under the predicted distributions (computed here from predict on the grown text)."""
    vocab = text_fit.extras["vocab"]
    texts = ["the c", "on the m"]
    for seed in (0, 5):
        out = text_fit.forecast(texts, 12, sample=True, seed=seed)
        for i, (text, drawn) in enumerate(zip(texts, out)):
            u = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(i,))).random(12)
            grown = text
            for h in range(12):
                cdf = np.cumsum(_softmax(text_fit.predict([grown])[0][-1]))
                cdf /= cdf[-1]
                assert drawn[h] == vocab[min(int((cdf <= u[h]).sum()), len(vocab) - 1)], (seed, i, h)
                grown += drawn[h]


def test_continuous_bptt_defaults_to_whole_sequences():
    """bptt=None is 0 (whole sequences) for continuous data: the same training as bptt=0, not as bptt=35 (the
    discrete default), on trajectories longer than 35 steps."""
    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=4, n_test=2, length=80, seed=0)
    args = dict(model="gru", state_dim=4, obs_dim=4, epochs=1, lr=0.1, batch_size=2, device="cpu")
    default = fit_model(ds.train, ds.test, **args)
    whole = fit_model(ds.train, ds.test, bptt=0, **args)
    window = fit_model(ds.train, ds.test, bptt=35, **args)
    assert default.history[-1]["test"] == whole.history[-1]["test"]
    assert default.history[-1]["test"] != window.history[-1]["test"]


def test_the_history_scores_the_test_split_given():
    """history[e]["test"] are the metrics on test= (not on train): epoch 0 of an untrained fit is evaluate(test)."""
    ds, _ = make_hmm_dataset(n_states=3, n_symbols=4, n_train=10, n_test=3, length=40, seed=0)
    fitted = fit_model(ds.train, ds.test, model="psrnn", state_dim=4, obs_dim=4, n_features=64, horizon=2,
                       epochs=0, device="cpu")
    scores = fitted.evaluate(ds.test)
    assert fitted.history[-1]["test"] == pytest.approx({k: scores[k] for k in ("bpc", "accuracy")}, rel=1e-9)
    assert fitted.history[-1]["test"] != pytest.approx(fitted.evaluate(ds.train), rel=1e-6)


@pytest.fixture(scope="module")
def hmm_small():
    return make_hmm_dataset(n_states=3, n_symbols=4, n_train=10, n_test=3, length=40, seed=0)[0]


def test_factorized_psrnn_bias_defaults_to_0_1(hmm_small):
    """bias_scale=None is 0.1 for factorized_psrnn (README): the same fit as bias_scale=0.1, not as 0."""
    args = dict(model="factorized_psrnn", rank=4, state_dim=4, obs_dim=4, n_features=64, horizon=2, epochs=0,
                device="cpu")
    default = fit_model(hmm_small.train, hmm_small.test, **args)
    assert default.history[0]["test"] == fit_model(hmm_small.train, hmm_small.test, bias_scale=0.1, **args
                                                   ).history[0]["test"]
    assert default.history[0]["test"] != fit_model(hmm_small.train, hmm_small.test, bias_scale=0.0, **args
                                                   ).history[0]["test"]



# ------------------------------------------------------------------ psrnn predict / forecast (the CLI's arguments)

REPO = Path(__file__).resolve().parents[1]


def _cli(capsys, root, *argv):
    from pipeline.cli import main

    status = main(["--params", str(REPO / "params.yaml"), "--root", str(root), *argv])
    captured = capsys.readouterr()
    return status, captured.out.strip(), captured.err.strip()


@pytest.fixture
def hmm_project(tmp_path, dmodel):
    """A project whose `hmm psrnn` seed 0 initial weights are dmodel's, vocabulary a b c d; an input in.parquet."""
    from pipeline.data.schema import SequenceDataset, write_dataset
    from pipeline.io import save_npz

    model, test = dmodel
    write_dataset(tmp_path / "data" / "prepared" / "hmm.parquet",
                  SequenceDataset(kind="discrete", train=test, test=test, vocab=["a", "b", "c", "d"], meta={}))
    save_npz(tmp_path / "artifacts" / "hmm" / "s0" / "init" / "psrnn.npz",
             {k: v.detach().numpy() for k, v in model.state_dict().items()},
             meta={"model_config": model.config.to_dict(), "seed": 0})
    syms = np.array(["a", "b", "c", "d"])
    _write(tmp_path / "in.parquet", {"trajectory": np.repeat([0, 1], [len(test[0]), len(test[1])]),
                                    "symbol": np.concatenate([syms[test[0]], syms[test[1]]])})
    return tmp_path, [list(syms[test[0]]), list(syms[test[1]])]


@pytest.mark.parametrize("seed_args, seed, other", [(["--sample-seed", "9"], 9, 0),
                                                     ([], 0, 1)])   # without --sample-seed: seed 0
def test_cli_forecast_passes_steps_and_sample_seed(capsys, hmm_project, seed_args, seed, other):
    from pipeline.inference import load_run

    root, trajs = hmm_project
    run = load_run(root, "hmm", "psrnn", 0, initial=True)
    out = root / "fc.parquet"
    status, _, err = _cli(capsys, root, "forecast", "hmm", "psrnn", "0", str(root / "in.parquet"), str(out),
                          "--initial", "--device", "cpu", "--steps", "15", "--sample", *seed_args)
    assert (status, err) == (0, "")
    table = pq.read_table(out)
    assert table.column("horizon").to_pylist() == list(range(1, 16)) * 2
    want = [v for values, _ in run.forecast(trajs, 15, sample=True, seed=seed) for v in values]
    assert table.column("predicted").to_pylist() == want
    assert want != [v for values, _ in run.forecast(trajs, 15, sample=True, seed=other) for v in values]


def test_cli_predict_refuses_unknown_symbols_unless_told(capsys, hmm_project):
    root, _ = hmm_project
    _write(root / "odd.parquet", {"trajectory": [0, 0, 0], "symbol": ["a", "zz", "b"]})
    status, _, err = _cli(capsys, root, "predict", "hmm", "psrnn", "0", str(root / "odd.parquet"),
                          str(root / "p.parquet"), "--initial", "--device", "cpu")
    assert status == 1 and "1 observation has a symbol not in the vocabulary of hmm: 'zz'" in err
    assert not (root / "p.parquet").exists()
    status, _, _ = _cli(capsys, root, "predict", "hmm", "psrnn", "0", str(root / "odd.parquet"),
                        str(root / "p.parquet"), "--initial", "--device", "cpu", "--unknown", "drop")
    assert status == 0 and pq.read_table(root / "p.parquet").num_rows == 2


def test_cli_predict_block_rows_and_summary_line(capsys, hmm_project):
    root, trajs = hmm_project
    out = root / "p.parquet"
    status, line, _ = _cli(capsys, root, "predict", "hmm", "psrnn", "0", str(root / "in.parquet"), str(out),
                           "--initial", "--device", "cpu", "--block-rows", "16")
    assert status == 0
    meta = pq.ParquetFile(out).metadata
    assert meta.num_rows == sum(map(len, trajs)) and meta.num_row_groups >= sum(map(len, trajs)) // 16
    assert all(meta.row_group(i).num_rows <= 16 for i in range(meta.num_row_groups))
    rows, scored = sum(map(len, trajs)), sum(len(t) - 1 for t in trajs)
    assert line.startswith(f"{out}: {rows} predictions for 2 trajectories (hmm psrnn seed 0, epoch 0); one-step bpc ")
    assert line.endswith(f" over {scored} steps")


def test_cli_predict_uses_the_trained_checkpoint_unless_initial(capsys, hmm_project, dmodel):
    """Without --initial, psrnn predict serves the finished run's checkpoint (here weights other than the initial
    ones), with --initial the epoch-0 weights."""
    import copy
    import json

    import torch

    root, trajs = hmm_project
    model, test = dmodel
    trained = copy.deepcopy(model)
    with torch.no_grad():
        trained.decoder.weight.add_(torch.linspace(-1, 1, trained.decoder.weight.numel()).reshape(
            trained.decoder.weight.shape))
    mdir = root / "models" / "hmm" / "psrnn" / "s0"
    mdir.mkdir(parents=True)
    torch.save({"model_config": trained.config.to_dict(), "model": trained.state_dict(), "epoch": 4},
               mdir / "checkpoint.pt")
    (mdir / "done").write_text("fingerprint\n")
    (mdir / "history.json").write_text(json.dumps({"data_units": {"kind": "discrete", "vocab": ["a", "b", "c", "d"],
                                                                 "symbol_column": "symbol"}}))
    for flags, net, epoch in (([], trained, 4), (["--initial"], model, 0)):
        out = root / "p.parquet"
        status, line, _ = _cli(capsys, root, "predict", "hmm", "psrnn", "0", str(root / "in.parquet"), str(out),
                               "--device", "cpu", *flags)
        assert status == 0 and f"(hmm psrnn seed 0, epoch {epoch})" in line
        z = np.concatenate(predict(net, [test[0], test[1]])).astype(np.float64)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        np.testing.assert_allclose(pq.read_table(out).column("probability").to_numpy(), p.max(1), rtol=1e-6)


def test_stage_seeds_must_be_listed_and_evaluate_takes_a_variant_alone(capsys, tmp_path):
    assert _cli(capsys, tmp_path, "features", "hmm", "7") == \
        (1, "", "psrnn features: error: seed 7 is not in params.yaml seeds [0, 1]")
    # a variant alone is every seed's run of it, as with refine: here the first one has not run
    assert _cli(capsys, tmp_path, "evaluate", "hmm", "psrnn") == \
        (1, "", f"psrnn evaluate: error: {tmp_path / 'data' / 'prepared' / 'hmm.parquet'}: prepared dataset not found")


def test_cli_predict_summary_says_one_trajectory(capsys, hmm_project):
    root, _ = hmm_project
    _write(root / "one.parquet", {"trajectory": [0, 0, 0], "symbol": ["a", "b", "c"]})
    status, out, _ = _cli(capsys, root, "predict", "hmm", "psrnn", "0", str(root / "one.parquet"),
                          str(root / "p1.parquet"), "--initial", "--device", "cpu")
    assert status == 0 and f"{root / 'p1.parquet'}: 3 predictions for 1 trajectory (hmm psrnn seed 0" in out
    status, out, _ = _cli(capsys, root, "forecast", "hmm", "psrnn", "0", str(root / "one.parquet"),
                          str(root / "f1.parquet"), "--initial", "--device", "cpu", "--steps", "2")
    assert status == 0 and f"{root / 'f1.parquet'}: 2-step forecasts of 1 trajectory (hmm psrnn seed 0" in out


def test_cli_predict_of_single_rows_scores_nothing_and_forecast_notes_their_spacing(capsys, hmm_project):
    """Trajectories of one row each: no prediction has a next observation to be scored against (NaN metrics are
    not printed as numbers), and their forecasts continue at a spacing no trajectory could measure."""
    root, _ = hmm_project
    _write(root / "rows.parquet", {"trajectory": [0, 1, 2], "step": [5, 9, 40], "symbol": ["a", "b", "a"]})
    status, out, _ = _cli(capsys, root, "predict", "hmm", "psrnn", "0", str(root / "rows.parquet"),
                          str(root / "p.parquet"), "--initial", "--device", "cpu")
    assert status == 0 and out.strip().endswith(
        "(hmm psrnn seed 0, epoch 0); nothing scored (no trajectory has a next observation to compare a prediction "
        "with)") and "nan" not in out
    status, _, err = _cli(capsys, root, "forecast", "hmm", "psrnn", "0", str(root / "rows.parquet"),
                          str(root / "f.parquet"), "--initial", "--device", "cpu", "--steps", "2")
    assert status == 0 and err == ("note: 3 single-row trajectories, whose step spacing is unknown, continued at "
                                   "spacing 1 (no trajectory has two rows to measure it from)")
    _write(root / "mixed.parquet", {"trajectory": [0, 0, 0, 1], "step": [0, 3, 6, 2], "symbol": ["a", "b", "a", "b"]})
    status, _, err = _cli(capsys, root, "forecast", "hmm", "psrnn", "0", str(root / "mixed.parquet"),
                          str(root / "f2.parquet"), "--initial", "--device", "cpu", "--steps", "2")
    assert status == 0 and err == ("note: 1 single-row trajectory, whose step spacing is unknown, continued at "
                                   "spacing 3 (the median of the other trajectories')")
