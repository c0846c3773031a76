"""A trained model on new data in the original units: pipeline.inference (the `psrnn predict` command's core).

The pipeline side (load_run on a real `dvc repro` and the CLI) is in tests/test_pipeline_e2e.py."""

import dataclasses
import json
import math
import os
import re
import shutil
import stat
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.api import fit_model
from pipeline.data.synthetic import make_hmm_dataset, make_lgssm_dataset
from pipeline.inference import PREDICT_META_KEY, TrainedRun, forecast_file, load_run, predict_file
from pipeline.train import evaluate, predict

# the small models of the fixtures are bias-free and one of their training states flips: fit_model says so
pytestmark = pytest.mark.filterwarnings("ignore:fit_model. layer")


@pytest.fixture(scope="module")
def continuous_run():
    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=6, n_test=3, length=40, seed=0)
    fitted = fit_model(ds.train, ds.test, model="psrnn", state_dim=4, obs_dim=4, n_features=64, horizon=2,
                       epochs=1, lr=0.1, device="cpu")
    mean, std = np.array([10.0, -3.0]), np.array([2.0, 0.5])
    run = TrainedRun(model=fitted.model, dataset="lgssm", variant="psrnn", seed=0, epoch=1, kind="continuous",
                     features=["a", "b"], mean=mean, std=std)
    return run, ds.test


@pytest.fixture(scope="module")
def discrete_run():
    ds, _ = make_hmm_dataset(n_states=3, n_symbols=4, n_train=20, n_test=4, length=60, seed=0)
    fitted = fit_model(ds.train, ds.test, model="psrnn", state_dim=4, obs_dim=4, n_features=64, horizon=2,
                       epochs=1, lr=0.1, device="cpu")
    vocab = ["10", "20", "30", "40"]   # integer symbols, stored as text in a prepared dataset's vocabulary
    run = TrainedRun(model=fitted.model, dataset="hmm", variant="psrnn", seed=0, epoch=1, kind="discrete",
                     vocab=vocab)
    return run, ds.test


def _write(path, columns):
    pq.write_table(pa.table(columns), path)
    return path


def test_a_runs_frames_are_read_in_step_order_one_trajectory_each(continuous_run, discrete_run):
    """load_run(...).evaluate on a groupby of a shuffled file scored a scrambled trajectory (MSE 2.83 against
    0.024 sorted), and a whole file as one frame ran every trajectory together; predict_file sorts by step."""
    run, test = continuous_run
    data = [t * run.std + run.mean for t in test]
    rng = np.random.default_rng(1)
    frames, shuffled = [], []
    for k, x in enumerate(data):
        frame = {"trajectory": np.full(len(x), f"t{k}"), "step": 10 * np.arange(len(x)), "a": x[:, 0], "b": x[:, 1]}
        rows = rng.permutation(len(x))
        frames.append(frame)
        shuffled.append({c: v[rows] for c, v in frame.items()})
    assert run.evaluate(shuffled) == run.evaluate(frames) == run.evaluate(data)
    assert all(np.array_equal(p, q) for p, q in zip(run.predict(shuffled), run.predict(data)))
    whole = {c: np.concatenate([f[c] for f in frames]) for c in frames[0]}
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: column 'trajectory' holds 3 values \('t0', 't1', "
                                         r"'t2'\); expected one trajectory per element"):
        run.evaluate([whole])
    drun, dtest = discrete_run
    symbols = [np.array(drun.vocab)[t] for t in dtest]
    rows = rng.permutation(len(symbols[0]))
    frame = {"step": np.arange(len(symbols[0]))[rows], "symbol": symbols[0][rows]}
    assert drun.evaluate([frame]) == drun.evaluate([symbols[0]])
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: column 'step' repeats step 0; "):
        drun.predict([{"step": np.zeros(len(symbols[0]), dtype=int), "symbol": symbols[0]}])
    # a split column of new data is read across, as predict_file reads a file's
    half = len(symbols[0]) // 2
    split = np.array(["train"] * half + ["test"] * (len(symbols[0]) - half))
    assert drun.evaluate([{"split": split, "symbol": symbols[0]}]) == drun.evaluate([symbols[0]])


def test_continuous_predictions_are_in_data_units_and_match_the_model(continuous_run, tmp_path):
    run, test = continuous_run
    raw = [z * run.std + run.mean for z in test]
    # rows shuffled, string ids, steps with gaps and an extra column: order comes from (trajectory, step)
    ids = np.concatenate([np.full(len(t), f"walk-{i}") for i, t in enumerate(raw)])
    steps = np.concatenate([np.arange(len(t)) * 5 + 100 for t in raw])
    x = np.concatenate(raw)
    perm = np.random.default_rng(0).permutation(len(x))
    src = _write(tmp_path / "new.parquet", {"trajectory": ids[perm], "step": steps[perm], "b": x[perm, 1],
                                             "a": x[perm, 0], "note": np.zeros(len(x))[perm]})
    summary = predict_file(run, src, tmp_path / "out" / "pred.parquet")
    out = pq.read_table(tmp_path / "out" / "pred.parquet")
    assert out.column_names == ["trajectory", "step", "next_step", "predicted_a", "predicted_b"]
    assert out.column("trajectory").to_pylist() == ids.tolist() and out.column("step").to_pylist() == steps.tolist()
    # the step each row's prediction is of: the next row's, none after a trajectory's last row
    assert out.column("next_step").to_pylist() == [
        None if i == len(t) - 1 else 100 + 5 * (i + 1) for t in raw for i in range(len(t))]
    want = np.concatenate([o * run.std + run.mean for o in predict(run.model, test)])
    got = np.column_stack([out.column("predicted_a").to_numpy(), out.column("predicted_b").to_numpy()])
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # the pipeline's MSE (standardised units) and the same errors in the data's units
    assert summary["metrics"]["mse"] == pytest.approx(evaluate(run.model, test)["mse"], rel=1e-9)
    err = np.concatenate([(w[:-1] - t[1:]) ** 2 for w, t in zip(np.split(want, np.cumsum([len(t) for t in raw])[:-1]),
                                                                   raw)])
    assert summary["metrics"]["mse_data_units"] == pytest.approx(err.mean(), rel=1e-9)
    assert summary["predicted_steps"] == sum(len(t) - 1 for t in raw) and summary["rows"] == len(x)
    meta = json.loads(out.schema.metadata[PREDICT_META_KEY])
    assert meta["features"] == ["a", "b"] and meta["epoch"] == 1 and meta["input"] == "new.parquet"
    # the Python API gives the same numbers
    api = run.predict(raw)
    np.testing.assert_allclose(np.concatenate(api), want, rtol=1e-10)
    assert run.evaluate(raw)["mse_data_units"] == pytest.approx(err.mean(), rel=1e-9)
    # the yardstick beside them: repeating the last observation, standardised like mse, on the same steps (the
    # test split here, so pipeline.naive's number for it)
    from pipeline.naive import naive_metrics

    last = naive_metrics(test, test, discrete=False)["last_value"]["mse"]
    assert summary["metrics"]["last_value_mse"] == pytest.approx(last, rel=1e-9)
    assert run.evaluate(raw)["last_value_mse"] == pytest.approx(last, rel=1e-9)


def test_evaluate_from_python_warns_when_worse_than_the_naive_yardstick(continuous_run):
    """psrnn predict says on stderr that its predictions score worse than repeating the last observation; the
    Python evaluate returned the same numbers and said nothing, and a caller reading mse alone missed it."""
    run, test = continuous_run
    slow = [np.column_stack([np.linspace(10.0, 10.1, 50), np.linspace(-3.0, -3.02, 50)])]   # nearly constant
    with pytest.warns(UserWarning, match=r"^evaluate: the one-step predictions score mse [0-9.e-]+, worse than "
                                         r"repeating the last observation \([0-9.e-]+\)"):
        metrics = run.evaluate(slow)
    assert metrics["mse"] > metrics["last_value_mse"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        good = run.evaluate([z * run.std + run.mean for z in test])
    assert good["mse"] < good["last_value_mse"]


def test_continuous_input_errors_name_the_file_and_column(continuous_run, tmp_path):
    run, _ = continuous_run
    src = _write(tmp_path / "in.parquet", {"trajectory": [0, 0, 1], "a": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match=r"in\.parquet: missing column 'b' \(a feature the run was trained on\)"):
        predict_file(run, src, tmp_path / "out.parquet")
    src = _write(tmp_path / "in.parquet", {"trajectory": [0, 0, 1], "a": [1.0, np.nan, 3.0], "b": [0.0, 0.0, 0.0]})
    with pytest.raises(ValueError, match=r"in\.parquet: 1 row has NaN"):
        predict_file(run, src, tmp_path / "out.parquet")
    src = _write(tmp_path / "in.parquet", {"trajectory": [0, 0, 1], "a": [1.0, 2.0, 3.0], "b": [0.0, 0.0, 0.0]})
    with pytest.raises(ValueError, match="would overwrite the input"):
        predict_file(run, src, src)
    assert not (tmp_path / "out.parquet").exists()
    # a one-row trajectory is predicted (nothing to score); every row gets its prediction
    summary = predict_file(run, src, tmp_path / "out.parquet")
    assert summary["rows"] == 3 and summary["predicted_steps"] == 1


def test_discrete_predictions_bits_and_symbol_types(discrete_run, tmp_path):
    run, test = discrete_run
    symbols = np.array([10, 20, 30, 40])
    ids = np.concatenate([np.full(len(t), i) for i, t in enumerate(test)])
    src = _write(tmp_path / "in.parquet", {"trajectory": ids, "sym": symbols[np.concatenate(test)]})
    summary = predict_file(run, src, tmp_path / "pred.parquet", symbol_column="sym", probabilities=True)
    out = pq.read_table(tmp_path / "pred.parquet")
    assert out.schema.field("predicted").type == pa.int64()   # typed like the input column
    z = np.concatenate(predict(run.model, test)).astype(np.float64)
    e = np.exp(z - z.max(1, keepdims=True))
    probs = e / e.sum(1, keepdims=True)
    assert out.column("predicted").to_pylist() == symbols[probs.argmax(1)].tolist()
    np.testing.assert_allclose(np.array(out.column("probabilities").to_pylist()), probs, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.column("probability").to_numpy(), probs.max(1), rtol=1e-12)
    bits = out.column("next_bits")
    last = np.cumsum([len(t) for t in test]) - 1
    assert bits.null_count == len(test) and all(bits[int(i)].as_py() is None for i in last)
    assert out.column("next_step").to_pylist() == [None if i == len(t) - 1 else i + 1   # positions: no step column
                                                   for t in test for i in range(len(t))]
    # the mean of next_bits is the pipeline's BPC
    want = evaluate(run.model, test)
    assert np.nanmean(bits.to_numpy(zero_copy_only=False)) == pytest.approx(want["bpc"], rel=1e-9)
    assert summary["metrics"]["bpc"] == pytest.approx(want["bpc"], rel=1e-9)
    assert summary["metrics"]["accuracy"] == pytest.approx(want["accuracy"])
    assert json.loads(out.schema.metadata[PREDICT_META_KEY])["vocab"] == run.vocab
    assert "unigram_bpc" not in summary["metrics"]   # a run without its training counts: no yardstick
    # CSV: the same rows, but no list of probabilities per row (refused before the input is read)
    import pyarrow.csv as pacsv

    with pytest.raises(ValueError, match=r"pred\.csv: --probabilities \(probabilities=True\) writes a list of 4 "
                                         r"probabilities per row, "
                                         r"which CSV cannot hold; expected a \.parquet output for them$"):
        predict_file(run, src, tmp_path / "pred.csv", symbol_column="sym", probabilities=True)
    assert not (tmp_path / "pred.csv").exists()
    predict_file(run, src, tmp_path / "pred.csv", symbol_column="sym")
    csv = pacsv.read_csv(tmp_path / "pred.csv")
    assert csv.column("predicted").to_pylist() == out.column("predicted").to_pylist()
    assert csv.column("next_bits").null_count == len(test)


def _symbol_yardstick_case(discrete_run, tmp_path):
    """What the yardstick tests of a discrete run share: the training split the run's counts and pairs come from
    (the fixture's HMM data), its test trajectories as symbols, and the same as an input file for predict_file."""
    run, test = discrete_run
    ds, _ = make_hmm_dataset(n_states=3, n_symbols=4, n_train=20, n_test=4, length=60, seed=0)
    raw = [[run.vocab[i] for i in t] for t in test]
    ids = np.concatenate([np.full(len(t), i) for i, t in enumerate(test)])
    src = _write(tmp_path / "in.parquet", {"trajectory": ids, "symbol": np.array(run.vocab)[np.concatenate(test)]})
    return run, test, ds, raw, src


def test_a_discrete_run_with_its_training_counts_scores_the_unigram_yardstick(discrete_run, tmp_path):
    """As evaluate of a continuous run reports last_value_mse: a run that kept train's symbol counts (refine keeps
    them in data_units) reports unigram_bpc and unigram_accuracy, pipeline.naive's unigram on the same steps, from
    evaluate and from predict_file (whose blocks split the trajectories)."""
    import dataclasses

    from pipeline.naive import naive_metrics, unigram_counts

    run, test, ds, raw, src = _symbol_yardstick_case(discrete_run, tmp_path)
    counts = unigram_counts(ds.train, 4)
    units = {"kind": "discrete", "vocab": run.vocab, "train_counts": counts}
    with_counts = TrainedRun.from_units(run.model, units, dataset="hmm", variant="psrnn", seed=0, epoch=1)
    assert with_counts.train_counts == counts and sum(counts) == sum(len(t) for t in ds.train)
    want = naive_metrics(ds.train, test, discrete=True, vocab_size=4)["unigram"]
    scores = with_counts.evaluate(raw)
    assert (scores["unigram_bpc"], scores["unigram_accuracy"]) == pytest.approx((want["bpc"], want["accuracy"]),
                                                                               rel=1e-12)
    summary = predict_file(with_counts, src, tmp_path / "pred.parquet", block_rows=7)
    assert summary["metrics"]["unigram_bpc"] == pytest.approx(want["bpc"], rel=1e-12)
    assert summary["metrics"]["unigram_accuracy"] == pytest.approx(want["accuracy"], rel=1e-12)
    # counts that do not fit the vocabulary (a damaged file) are ignored, not trusted
    assert TrainedRun.from_units(run.model, {**units, "train_counts": counts[:3]}, dataset="hmm", variant="psrnn",
                                 seed=0, epoch=1).train_counts is None
    assert "unigram_bpc" not in dataclasses.replace(with_counts, train_counts=None).evaluate(raw)


def test_a_discrete_run_with_its_training_pairs_scores_the_bigram_yardstick(discrete_run, tmp_path):
    """The report's stronger yardstick for symbols, the bigram, on new data too: a run that kept train's pairs of
    consecutive symbols (refine keeps them in data_units) reports bigram_bpc and bigram_accuracy, pipeline.naive's
    bigram on the same steps, from evaluate and from predict_file, whose blocks split the trajectories; pairs that
    do not fit the vocabulary are ignored, and a run without them reports the unigram alone."""
    from pipeline.naive import naive_metrics, pair_counts, unigram_counts
    from pipeline.workflow.refine import units_to_keep

    run, test, ds, raw, src = _symbol_yardstick_case(discrete_run, tmp_path)
    codes, counts = pair_counts(ds.train, 4)
    units = {"kind": "discrete", "vocab": run.vocab, "train_counts": unigram_counts(ds.train, 4),
             "train_pairs": {"codes": codes.tolist(), "counts": counts.tolist()}}
    assert units_to_keep(ds)["train_pairs"] == units["train_pairs"]   # what refine keeps
    with_pairs = TrainedRun.from_units(run.model, units, dataset="hmm", variant="psrnn", seed=0, epoch=1)
    want = naive_metrics(ds.train, test, discrete=True, vocab_size=4)["bigram"]
    scores = with_pairs.evaluate(raw)
    assert (scores["bigram_bpc"], scores["bigram_accuracy"]) == pytest.approx((want["bpc"], want["accuracy"]),
                                                                             rel=1e-12)
    for block_rows in (7, 65536):
        summary = predict_file(with_pairs, src, tmp_path / "pred.parquet", block_rows=block_rows)
        assert summary["metrics"]["bigram_bpc"] == pytest.approx(want["bpc"], rel=1e-12)
        assert summary["metrics"]["bigram_accuracy"] == pytest.approx(want["accuracy"], rel=1e-12)
    for bad in ({"codes": codes.tolist()[::-1], "counts": counts.tolist()}, {"codes": [16], "counts": [1]},
                {"codes": codes.tolist(), "counts": counts.tolist()[:-1]}, "pairs", None):
        odd = TrainedRun.from_units(run.model, {**units, "train_pairs": bad}, dataset="hmm", variant="psrnn", seed=0,
                                    epoch=1)
        odd_scores = odd.evaluate(raw)
        assert odd.train_pairs is None and "bigram_bpc" not in odd_scores and "unigram_bpc" in odd_scores
    # predict's warning reads the better of the two yardsticks
    from pipeline.inference import worse_than_naive

    assert "than the training frequencies of each symbol's successor, the bigram (1.5)" in worse_than_naive(
        {"bpc": 1.7, "unigram_bpc": 2.0, "bigram_bpc": 1.5})
    assert worse_than_naive({"bpc": 1.4, "unigram_bpc": 2.0, "bigram_bpc": 1.5}) is None


def test_a_custom_runs_symbol_column_is_the_default_for_new_files(discrete_run, tmp_path):
    """A custom discrete file with its symbols in column `event` gives runs that read new files' `event` column
    (psrnn predict / forecast without --symbol-column); an explicit column still wins."""
    from dataclasses import replace

    from pipeline.data.custom import load_custom

    run, test = discrete_run
    rng = np.random.default_rng(0)
    train_file = _write(tmp_path / "sessions.parquet", {"trajectory": np.repeat(np.arange(6), 8),
                                                          "event": rng.choice([10, 20, 30, 40], 48)})
    units = load_custom(train_file, kind="discrete", symbol_column="event", test_fraction=0.34).units()
    assert units["symbol_column"] == "event"
    assert make_hmm_dataset(n_states=2, n_symbols=3, n_train=2, n_test=1, length=5, seed=0)[0].units()[
        "symbol_column"] == "symbol"
    own = TrainedRun.from_units(run.model, {**units, "vocab": run.vocab}, dataset="custom_events", variant="psrnn",
                                seed=0, epoch=1)
    assert own.symbol_column == "event"
    src = _write(tmp_path / "in.parquet", {"trajectory": [0] * 5, "event": [10, 20, 30, 40, 10]})
    assert predict_file(own, src, tmp_path / "p.parquet")["rows"] == 5
    assert forecast_file(own, src, tmp_path / "f.parquet", steps=2)["rows"] == 2
    with pytest.raises(ValueError, match=r"in\.parquet: missing column 'symbol'"):
        predict_file(own, src, tmp_path / "p.parquet", symbol_column="symbol")
    with pytest.raises(ValueError, match=r"in\.parquet: missing column 'event'"):
        predict_file(replace(own, symbol_column="event"), _write(tmp_path / "in.parquet", {
            "trajectory": [0] * 3, "symbol": [10, 20, 30]}), tmp_path / "p.parquet")


def test_discrete_unknown_symbols_error_drop_or_map(discrete_run, tmp_path):
    run, test = discrete_run
    seq = ["10", "20", "99", "30", "40", "99"]
    src = _write(tmp_path / "in.parquet", {"trajectory": [7] * 6, "symbol": seq})
    with pytest.raises(ValueError, match=r"in\.parquet: column 'symbol': 2 observations have symbols not in the "
                                         r"vocabulary of hmm: '99'; use unknown 'drop' \(psrnn predict / forecast: "
                                         r"--unknown drop\)$"):
        predict_file(run, src, tmp_path / "out.parquet")
    with pytest.raises(ValueError, match="has no '<unk>' symbol"):
        predict_file(run, src, tmp_path / "out.parquet", unknown="map")
    summary = predict_file(run, src, tmp_path / "out.parquet", unknown="drop")
    out = pq.read_table(tmp_path / "out.parquet")
    assert summary["dropped"] == 2 and out.column("step").to_pylist() == [0, 1, 3, 4] and summary["emptied"] == []
    # a trajectory of nothing but unknown symbols is left out whole, and named: the count of trajectories hid it
    both = _write(tmp_path / "both.parquet", {"trajectory": [7] * 6 + [8] * 2, "symbol": seq + ["99", "98"]})
    for write in (predict_file, lambda *a, **k: forecast_file(*a, steps=2, **k)):
        summary = write(run, both, tmp_path / "out.parquet", unknown="drop")
        assert (summary["dropped"], summary["emptied"], summary["trajectories"]) == (4, [8], 1)
        assert json.loads(json.dumps(summary["emptied"])) == [8]   # plain ints, for --json readers
    assert out.schema.field("predicted").type == pa.string()   # typed like the input column
    kept = run.predict([np.array(["10", "20", "30", "40"])])[0]
    np.testing.assert_allclose(out.column("probability").to_numpy(), kept.max(1), rtol=1e-12)
    mapped = TrainedRun(model=run.model, dataset="x", variant="psrnn", seed=0, epoch=1, kind="discrete",
                        vocab=["10", "20", "30", "<unk>"])
    assert mapped.encode(["10", "99", "30"], unknown="map").tolist() == [0, 3, 2]


def test_symbols_none_of_which_is_in_the_vocabulary_are_said_to_be_so(discrete_run, tmp_path):
    """Integer codes given to a run trained on other symbols (or another column): every observation is unknown,
    and dropping them would leave nothing, so the error shows the vocabulary expected, not only 'use drop'."""
    run, _ = discrete_run
    src = _write(tmp_path / "codes.parquet", {"trajectory": [1] * 4, "symbol": [0, 1, 2, 3]})
    with pytest.raises(ValueError, match=r"codes\.parquet: column 'symbol': 4 observations have symbols not in the "
                                         r"vocabulary of hmm: '0', '1', '2', '3'; use unknown 'drop' .*; but no "
                                         r"observation is in the vocabulary \('10', '20', '30', '40'; compared as "
                                         r"text\): expected the symbols the run was trained on"):
        predict_file(run, src, tmp_path / "out.parquet")
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: .* but no observation is in the vocabulary"):
        run.predict([np.array(["a", "b"])])
    # some symbols known: the plain advice alone, as before
    with pytest.raises(ValueError, match=r"vocabulary of hmm: '99'; use unknown 'drop' \(psrnn predict / forecast: "
                                         r"--unknown drop\)$"):
        run.predict([np.array(["10", "99"])])


def test_load_run_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_run(tmp_path, "swimmer", "psrnn", 0)
    assert str(err.value) == (f"no run of swimmer psrnn seed 0 in {tmp_path}: "
                              f"{tmp_path / 'data' / 'prepared' / 'swimmer.parquet'}: prepared dataset not found (is "
                              "'swimmer' a dataset of this project, listed in params.yaml datasets, and has `dvc "
                              "repro` run?)")


def test_cli_says_when_the_dataset_of_a_missing_run_is_not_trained_by_dvc_repro(capsys, tmp_path):
    """A run not found of a dataset that params.yaml's datasets leaves out: `dvc repro` trains none of its runs,
    which "has `dvc repro` run?" alone did not say (it has)."""
    for stage, extra in (("predict", []), ("forecast", ["--steps", "2"])):
        status, err = _cli(capsys, tmp_path, stage, "custom", "psrnn", "0", "in.parquet", "out.parquet", *extra)
        assert status == 1 and err.startswith(f"psrnn {stage}: error: no run of custom psrnn seed 0 in "), err
        assert err.endswith("; custom has a section but is not in params.yaml's datasets, so `dvc repro` trains none "
                            "of its runs (datasets: ptb, swimmer, mocap, handwriting, hmm, lgssm)"), err
        status, err = _cli(capsys, tmp_path, stage, "custom_mine", "psrnn", "0", "in.parquet", "out.parquet", *extra)
        assert status == 1 and err.endswith("; custom_mine has no section in params.yaml, so `dvc repro` trains none "
                                            "of its runs (datasets: ptb, swimmer, mocap, handwriting, hmm, lgssm)")
        status, err = _cli(capsys, tmp_path, stage, "hmm", "psrnn", "0", "in.parquet", "out.parquet", *extra)
        assert status == 1 and err.endswith("listed in params.yaml datasets, and has `dvc repro` run?)"), err


def test_dataset_units_cover_every_feature(continuous_run):
    from pipeline.data.schema import SequenceDataset

    ds = SequenceDataset(kind="continuous", train=[np.zeros((3, 3))], test=[np.zeros((3, 3))],
                         features=["x", "y", "pen_up"],
                         meta={"normalization": {"mean": [1.0, 2.0], "std": [3.0, 4.0], "columns": ["x", "y"]}})
    units = ds.units()
    assert units == {"kind": "continuous", "features": ["x", "y", "pen_up"], "mean": [1.0, 2.0, 0.0],
                     "std": [3.0, 4.0, 1.0]}
    run = TrainedRun.from_units(continuous_run[0].model, {**units, "features": ["a", "b", "c"]}, dataset="d",
                                variant="psrnn", seed=0, epoch=3)
    assert run.std.tolist() == [3.0, 4.0, 1.0] and run.epoch == 3 and not run.discrete
    assert SequenceDataset(kind="discrete", train=[np.array([0, 1])], test=[np.array([1, 0])], vocab=["a", "b"],
                           meta={}).units() == {"kind": "discrete", "vocab": ["a", "b"], "symbol_column": "symbol"}


def test_forecast_feeds_each_prediction_back_as_the_next_observation(continuous_run, discrete_run, tmp_path):
    run, test = continuous_run
    raw = [z * run.std + run.mean for z in test]
    fc = run.forecast(raw, 3)
    for traj, (values, probs) in zip(raw, fc):
        assert values.shape == (3, 2) and probs is None
        grown = traj
        for h in range(3):   # h + 1 steps ahead = the one-step prediction after the trajectory and h forecasts
            np.testing.assert_allclose(values[h], run.predict([grown])[0][-1], rtol=1e-5, atol=1e-6)
            grown = np.vstack([grown, values[h]])

    drun, dtest = discrete_run
    symbols = [np.array(drun.vocab, dtype=object)[t] for t in dtest]
    for traj, (values, probs) in zip(symbols, drun.forecast(symbols, 4)):
        grown = list(traj)
        for h in range(4):
            want = drun.predict([np.array(grown, dtype=object)])[0][-1]
            np.testing.assert_allclose(probs[h], want, rtol=1e-5, atol=1e-7)
            assert values[h] == drun.vocab[int(np.argmax(want))]   # greedy: the most likely symbol is fed back
            grown.append(values[h])
    # sampled: reproducible by seed, drawn from the predicted distributions
    a = drun.forecast(symbols[:1], 40, sample=True, seed=1)[0]
    b = drun.forecast(symbols[:1], 40, sample=True, seed=1)[0]
    c = drun.forecast(symbols[:1], 40, sample=True, seed=2)[0]
    assert list(a[0]) == list(b[0]) and list(a[0]) != list(c[0])
    chosen = np.array([drun.vocab.index(v) for v in a[0]])
    assert (a[1][np.arange(40), chosen] > 0).all()
    with pytest.raises(ValueError, match="steps=0: expected a positive integer"):
        drun.forecast(symbols, 0)


def test_forecast_file_rows_continue_each_trajectory(discrete_run, tmp_path):
    from pipeline.inference import forecast_file

    run, test = discrete_run
    src = _write(tmp_path / "in.parquet", {"trajectory": ["x"] * 5 + ["y"] * 3, "step": [3, 4, 5, 6, 9, 0, 1, 2],
                                          "symbol": [10, 20, 30, 40, 10, 20, 20, 30]})
    summary = forecast_file(run, src, tmp_path / "fc.parquet", steps=4, probabilities=True)
    out = pq.read_table(tmp_path / "fc.parquet")
    assert summary["rows"] == 8 and out.num_rows == 8
    assert out.column("trajectory").to_pylist() == ["x"] * 4 + ["y"] * 4
    assert out.column("horizon").to_pylist() == [1, 2, 3, 4] * 2
    assert out.column("step").to_pylist() == [10, 11, 12, 13, 3, 4, 5, 6]
    assert out.schema.field("predicted").type == pa.int64()
    fc = run.forecast([np.array(["10", "20", "30", "40", "10"], dtype=object)], 4)[0]
    assert out.column("predicted").to_pylist()[:4] == [int(v) for v in fc[0]]
    # from Python too, the forecast is typed like the symbols given: text for text, int64 for integers
    assert all(isinstance(v, str) for v in fc[0])
    ints = run.forecast([np.array([10, 20, 30, 40, 10])], 4)[0]
    assert ints[0].dtype == np.int64 and ints[0].tolist() == [int(v) for v in fc[0]]
    np.testing.assert_array_equal(ints[1], fc[1])
    np.testing.assert_allclose(np.array(out.column("probabilities").to_pylist())[:4], fc[1], rtol=1e-6)
    assert json.loads(out.schema.metadata[PREDICT_META_KEY])["forecast"]["steps"] == 4
    # forecasts continue a trajectory at its own step spacing (the median difference of its steps)
    src = _write(tmp_path / "in.parquet", {"trajectory": ["x"] * 4 + ["y"], "step": [100, 105, 110, 115, 7],
                                          "symbol": [10, 20, 30, 40, 10]})
    summary = forecast_file(run, src, tmp_path / "fc.parquet", steps=3)
    # a single-row trajectory has no spacing of its own: it takes the others' median (it took 1: 1 µs for a
    # file of microsecond time stamps), and the summary says so
    assert pq.read_table(tmp_path / "fc.parquet").column("step").to_pylist() == [120, 125, 130, 12, 17, 22]
    assert summary["single_row"] == {"trajectories": 1, "spacing": 5, "measured_from": 1}
    src = _write(tmp_path / "in.parquet", {"trajectory": ["x", "y"], "step": [100, 7], "symbol": [10, 10]})
    summary = forecast_file(run, src, tmp_path / "fc.parquet", steps=2)
    assert pq.read_table(tmp_path / "fc.parquet").column("step").to_pylist() == [101, 102, 8, 9]
    assert summary["single_row"] == {"trajectories": 2, "spacing": 1, "measured_from": 0}
    src = _write(tmp_path / "in.parquet", {"trajectory": ["x"] * 4 + ["y"] * 3 + ["z"] * 2,
                                          "step": [0, 2, 4, 6, 0, 3, 6, 0, 10], "symbol": [10] * 9})
    assert "single_row" not in forecast_file(run, src, tmp_path / "fc.parquet", steps=1)


def test_scored_forecasts_hold_out_the_last_steps_and_beat_or_not_the_last_value(continuous_run, discrete_run,
                                                                                  tmp_path, capsys):
    """The README says to score forecasts against repeating the last value before trusting them; --score does it:
    the last --steps rows of each trajectory are held out, forecast from the rows before, and scored, in the
    report's units and the data's, per horizon, beside the last value repeated."""
    from pipeline import cli
    from pipeline.inference import _forecasts_worse, forecast_file

    run, test = continuous_run
    raw = [z * run.std + run.mean for z in test]
    raw.append(raw[0][:3])                             # three rows: none before the three held out
    ids = np.concatenate([np.full(len(t), i) for i, t in enumerate(raw)])
    steps = np.concatenate([np.arange(len(t)) * 5 + 100 for t in raw])
    x = np.concatenate(raw)
    src = _write(tmp_path / "in.parquet", {"trajectory": ids, "step": steps, "a": x[:, 0], "b": x[:, 1]})
    summary = forecast_file(run, src, tmp_path / "fc.parquet", steps=3, score=True)
    out = pq.read_table(tmp_path / "fc.parquet")
    assert out.column_names == ["trajectory", "horizon", "step", "predicted_a", "predicted_b", "observed_a",
                                "observed_b"]
    assert summary["trajectories"] == len(test) and summary["too_short"] == [len(test)]
    assert out.num_rows == 3 * len(test)
    # the held-out rows, each at its own step, with the values given
    assert out.column("step").to_pylist() == [100 + 5 * i for t in test for i in range(len(t) - 3, len(t))]
    held = np.concatenate([t[-3:] for t in raw[:-1]])
    np.testing.assert_allclose(np.column_stack([out.column("observed_a"), out.column("observed_b")]), held,
                               rtol=1e-12)
    # the forecasts are those of the rows before: forecast_file without --score on the cut trajectories
    want = np.stack([f for f, _ in run.forecast([t[:-3] for t in raw[:-1]], 3)])   # (B, 3, 2), data units
    got = np.column_stack([out.column("predicted_a"), out.column("predicted_b")]).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    truth = np.stack([t[-3:] for t in test])           # model units
    err = ((want - run.mean) / run.std - truth) ** 2
    last = (np.stack([t[-4] for t in test])[:, None] - truth) ** 2
    m = summary["metrics"]
    assert m["mse"] == pytest.approx(err.mean(), rel=1e-9)
    assert m["mse_data_units"] == pytest.approx(((want - np.stack([t[-3:] for t in raw[:-1]])) ** 2).mean(), rel=1e-9)
    assert m["last_value_mse"] == pytest.approx(last.mean(), rel=1e-9)
    assert m["mse_by_horizon"] == pytest.approx(err.mean(axis=(0, 2)).tolist(), rel=1e-9)
    assert m["last_value_mse_by_horizon"] == pytest.approx(last.mean(axis=(0, 2)).tolist(), rel=1e-9)
    # standardised data: the training mean is 0 in model units, a yardstick as in the report
    assert m["train_mean_mse"] == pytest.approx((truth ** 2).mean(), rel=1e-9)
    # psrnn forecast --score prints the scores on its line, and a note on the trajectories left out
    project = tmp_path / "project"
    _project(project, run, test)
    capsys.readouterr()
    assert cli.main(["--params", str(REPO / "params.yaml"), "--root", str(project), "forecast", "lgssm", "psrnn",
                     "0", str(src), str(tmp_path / "fc2.parquet"), "--steps", "3", "--score", "--initial"]) == 0
    printed = capsys.readouterr()
    initial = forecast_file(load_run(project, "lgssm", "psrnn", 0, initial=True), src, tmp_path / "fc3.parquet",
                            steps=3, score=True)["metrics"]
    h = initial["mse_by_horizon"]
    assert printed.out == (f"{tmp_path / 'fc2.parquet'}: 3-step forecasts of the held-out last steps of {len(test)} "
                           f"trajectories (lgssm psrnn seed 0, epoch 0); scored: mse {initial['mse']:.4g} (data units "
                           f"{initial['mse_data_units']:.4g}) against the last value repeated "
                           f"{initial['last_value_mse']:.4g}, the training mean {initial['train_mean_mse']:.4g}; by "
                           f"horizon 1 {h[0]:.4g}, 2 {h[1]:.4g}, 3 {h[2]:.4g}\n")
    assert f"note: 1 trajectory of 3 rows or fewer left out ({len(test)}): nothing before the held-out rows" \
        in printed.err
    # too few rows everywhere: refused, nothing written
    short = _write(tmp_path / "short.parquet", {"trajectory": [0, 0, 1], "a": [1.0, 2.0, 3.0], "b": [0.0] * 3})
    with pytest.raises(ValueError, match=r"short\.parquet: scoring 3-step forecasts holds out the last 3 rows of "
                                         r"each trajectory and forecasts them from the rows before, and the longest "
                                         r"has 2; expected fewer --steps \(at most 1\) or longer trajectories$"):
        forecast_file(run, short, tmp_path / "none.parquet", steps=3, score=True)
    assert not (tmp_path / "none.parquet").exists()
    # symbols: the accuracy of the symbols fed back, against the last symbol repeated
    drun, dtest = discrete_run
    dsrc = _write(tmp_path / "sym.parquet", {"trajectory": np.concatenate([np.full(len(t), i)
                                                                          for i, t in enumerate(dtest)]),
                                             "symbol": np.array([10, 20, 30, 40])[np.concatenate(dtest)]})
    dsum = forecast_file(drun, dsrc, tmp_path / "dfc.parquet", steps=4, score=True)
    dout = pq.read_table(tmp_path / "dfc.parquet")
    assert dout.column_names == ["trajectory", "horizon", "step", "predicted", "probability", "observed"]
    symbols = np.array([10, 20, 30, 40])
    forecast = np.searchsorted(symbols, np.stack([f for f, _ in drun.forecast([symbols[t[:-4]] for t in dtest], 4)]))
    truth = np.stack([t[-4:] for t in dtest])
    assert dout.column("observed").to_pylist() == np.array([10, 20, 30, 40])[truth].ravel().tolist()
    assert dsum["metrics"] == {"accuracy": pytest.approx((forecast == truth).mean()),
                               "last_value_accuracy": pytest.approx(
                                   (np.stack([t[-5] for t in dtest])[:, None] == truth).mean()),
                               "accuracy_by_horizon": pytest.approx((forecast == truth).mean(axis=0).tolist())}
    # a run that kept its training counts: the most frequent training symbol, forecast at every step, too
    counted = dataclasses.replace(drun, train_counts=[1, 9, 2, 3])
    dsum = forecast_file(counted, dsrc, tmp_path / "dfc.parquet", steps=4, score=True)
    assert dsum["metrics"]["unigram_accuracy"] == pytest.approx((truth == 1).mean())
    # worse than the last value: said (psrnn forecast writes it as a warning)
    assert _forecasts_worse({"mse": 2.0, "last_value_mse": 1.0}).startswith(
        "the forecasts score mse 2, worse than repeating the last observation before them (1): errors compound")
    assert _forecasts_worse({"mse": 0.5, "last_value_mse": 1.0}) is None
    assert _forecasts_worse({"mse": 0.5, "last_value_mse": 0.0}) is None      # a series standing still
    assert _forecasts_worse({"accuracy": 0.2, "last_value_accuracy": 0.3}) is not None
    assert _forecasts_worse({"accuracy": 0.3, "last_value_accuracy": 0.3}) is None
    # the best of the yardsticks: beating the last value is not enough where the training mean does better
    assert "worse than forecasting the training mean (0.9)" in _forecasts_worse(
        {"mse": 1.5, "last_value_mse": 1.75, "train_mean_mse": 0.9})
    assert "worse than forecasting the most frequent training symbol (0.18)" in _forecasts_worse(
        {"accuracy": 0.13, "last_value_accuracy": 0.06, "unigram_accuracy": 0.18})
    # single rows: no --steps scores them
    ones = _write(tmp_path / "ones.parquet", {"trajectory": [0, 1], "a": [1.0, 2.0], "b": [0.0, 0.0]})
    with pytest.raises(ValueError, match=r"holds out the last row of each trajectory and forecasts it from the rows "
                                         r"before, and the longest has 1; expected trajectories of at least 2 rows$"):
        forecast_file(run, ones, tmp_path / "none.parquet", steps=1, score=True)


def test_forecasts_that_keep_no_distributions_keep_the_chosen_probabilities(discrete_run, tmp_path):
    """A forecast whose caller keeps only the symbols (FittedModel.forecast) or their probabilities
    (forecast_file without probabilities) holds steps floats per trajectory, not steps x V; the same numbers."""
    from pipeline.inference import forecast_file

    run, test = discrete_run
    encoded = [np.asarray(t) for t in test[:3]]
    for sample in (False, True):
        whole = run.forecast_encoded(encoded, 6, sample=sample, seed=4, device="cpu")
        lean = run.forecast_encoded(encoded, 6, sample=sample, seed=4, device="cpu", distributions=False)
        for (values, probs), (lean_values, chosen) in zip(whole, lean):
            assert probs.shape == (6, len(run.vocab)) and chosen.shape == (6,)
            np.testing.assert_array_equal(lean_values, values)
            np.testing.assert_array_equal(chosen, probs[np.arange(6), values])
    src = _write(tmp_path / "in.parquet", {"trajectory": ["x"] * 5 + ["y"] * 3, "step": [3, 4, 5, 6, 9, 0, 1, 2],
                                          "symbol": [10, 20, 30, 40, 10, 20, 20, 30]})
    forecast_file(run, src, tmp_path / "all.parquet", steps=4, probabilities=True)
    forecast_file(run, src, tmp_path / "lean.parquet", steps=4)
    full, lean = pq.read_table(tmp_path / "all.parquet"), pq.read_table(tmp_path / "lean.parquet")
    assert "probabilities" not in lean.column_names
    for column in ("predicted", "probability"):
        assert lean.column(column).to_pylist() == full.column(column).to_pylist()


def test_fit_model_result_forecasts_in_its_own_units():
    ds, _ = make_hmm_dataset(n_states=3, n_symbols=4, n_train=10, n_test=2, length=50, seed=1)
    fitted = fit_model(ds.train, ds.test, model="psrnn", state_dim=4, obs_dim=4, n_features=64, horizon=2,
                       epochs=1, lr=0.1, device="cpu")
    symbols = fitted.forecast(ds.test, 3)
    assert [s.dtype for s in symbols] == [np.int64, np.int64] and all(len(s) == 3 for s in symbols)
    for traj, s in zip(ds.test, symbols):
        assert s[0] == int(np.argmax(fitted.predict([traj])[0][-1]))
        assert s[1] == int(np.argmax(fitted.predict([np.append(traj, s[0])])[0][-1]))
    assert fitted.model.training   # left as it was


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_predictions_streamed_in_small_blocks_equal_one_block(kind, discrete_run, continuous_run, tmp_path):
    """predict_file filters and writes ``block_rows`` rows at a time: a trajectory longer than a block carries
    its state from block to block, short ones are filtered side by side; the file and the metrics are those of
    one block holding everything, in row groups of at most ``block_rows`` rows."""
    run, test = discrete_run if kind == "discrete" else continuous_run
    long = np.concatenate([test[0], test[1], test[2]])
    trajs = [test[0][:5], long, test[1][:1], test[2][:9], test[2][10:17], test[0][:3], test[1][:12]]
    ids = np.concatenate([np.full(len(t), i) for i, t in enumerate(trajs)])
    if kind == "discrete":
        cols = {"trajectory": ids, "symbol": np.array(run.vocab)[np.concatenate(trajs)]}
    else:
        x = np.concatenate(trajs) * run.std + run.mean
        cols = {"trajectory": ids, "a": x[:, 0], "b": x[:, 1]}
    src = _write(tmp_path / "in.parquet", cols)
    opts = {"probabilities": True} if kind == "discrete" else {}
    whole = predict_file(run, src, tmp_path / "whole.parquet", block_rows=10_000, **opts)
    small = predict_file(run, src, tmp_path / "small.parquet", block_rows=16, **opts)
    a, b = pq.read_table(tmp_path / "whole.parquet"), pq.read_table(tmp_path / "small.parquet")
    groups = pq.ParquetFile(tmp_path / "small.parquet").metadata
    assert groups.num_row_groups > 4
    assert all(groups.row_group(i).num_rows <= 16 for i in range(groups.num_row_groups))
    assert a.column_names == b.column_names and a.num_rows == b.num_rows == len(ids)
    for name in a.column_names:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        if name in ("trajectory", "step", "predicted"):
            assert x == y, name
        else:   # batching short trajectories differently may move the last float32 bit
            np.testing.assert_allclose(np.array(x, dtype=np.float64), np.array(y, dtype=np.float64),
                                       rtol=1e-5, atol=1e-7, err_msg=name)
    assert whole.keys() == small.keys() and whole["metrics"].keys() == small["metrics"].keys()
    for key, value in whole["metrics"].items():
        assert small["metrics"][key] == pytest.approx(value, rel=1e-6), key
    # and the one-block file is the pipeline's filter of every trajectory at once
    want = evaluate(run.model, [run.encode(t if kind == "continuous" else np.array(run.vocab)[t])
                                for t in (trajs if kind == "discrete" else [t * run.std + run.mean for t in trajs])])
    key = "bpc" if kind == "discrete" else "mse"
    assert whole["metrics"][key] == pytest.approx(want[key], rel=1e-9)
    assert json.loads(b.schema.metadata[PREDICT_META_KEY])["metrics"] == small["metrics"]
    with pytest.raises(ValueError, match="block_rows=0: expected a positive integer"):
        predict_file(run, src, tmp_path / "x.parquet", block_rows=0)


def test_cli_block_rows_default_is_the_library_default(capsys):
    from pipeline.cli import build_parser, main
    from pipeline.inference import DEFAULT_BLOCK_ROWS

    args = build_parser().parse_args(["predict", "ptb", "psrnn", "0", "in.parquet", "out.parquet"])
    assert args.block_rows == DEFAULT_BLOCK_ROWS
    assert main(["predict", "ptb", "psrnn", "0", "in.parquet", "out.parquet", "--block-rows", "0"]) == 1
    assert capsys.readouterr().err.strip() == \
        "psrnn predict: error: --block-rows 0: expected a positive integer up to 2**31 - 1 (2147483647)"


def test_forecast_of_many_trajectories_equals_each_alone(discrete_run, continuous_run):
    """Trajectories are filtered side by side in groups of equal length: each still ends at its own last step."""
    run, test = discrete_run
    symbols = np.array(run.vocab, dtype=object)
    trajs = [symbols[t] for t in (test[0][:5], test[1], test[2][:5], test[3][:17], test[0][:1], test[1][:17])]
    together = run.forecast(trajs, 3)
    for traj, (values, probs) in zip(trajs, together):
        alone_values, alone_probs = run.forecast([traj], 3)[0]
        assert list(values) == list(alone_values)
        np.testing.assert_allclose(probs, alone_probs, rtol=1e-5, atol=1e-7)
    crun, ctest = continuous_run
    raw = [z * crun.std + crun.mean for z in (ctest[0][:9], ctest[1], ctest[2][:9], ctest[0][3:4])]
    for traj, (values, _) in zip(raw, crun.forecast(raw, 4)):
        np.testing.assert_allclose(values, crun.forecast([traj], 4)[0][0], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------- refusals before any work (psrnn predict/forecast)

REPO = Path(__file__).resolve().parents[1]


def test_predictions_worse_than_a_predictor_of_no_dynamics_are_said(continuous_run, discrete_run, tmp_path,
                                                                     capsys):
    """A run given data sampled at another rate (steps 2 apart for a run trained on steps 10 apart) predicted ten
    times worse than repeating the last value, and predict printed both numbers without a word."""
    from pipeline.inference import worse_than_naive

    assert worse_than_naive({"mse": 0.13, "last_value_mse": 0.013}) == (
        "the one-step predictions score mse 0.13, worse than repeating the last observation (0.013): a model that "
        "learnt less than that (does it beat it on its test set? psrnn runs, results.md), or data unlike the "
        "training data (sampled at another rate?)")
    assert worse_than_naive({"bpc": 2.5, "unigram_bpc": 2.0, "accuracy": 0.1}).startswith(
        "the one-step predictions score bpc 2.5, worse than the training symbol frequencies, the unigram (2): ")
    for fine in ({"mse": 0.01, "last_value_mse": 0.013}, {"bpc": 1.0, "unigram_bpc": 2.0},
                 {"mse": 0.5, "last_value_mse": 0.0},   # a series that stands still: nothing to beat
                 {"mse": float("nan"), "last_value_mse": 0.0}, {"bpc": 1.0}):
        assert worse_than_naive(fine) is None
    run, test = continuous_run
    _project(tmp_path, run, test)
    # a slow drift: repeating the last value is nearly exact, and this model (trained on faster dynamics) is not
    t = np.arange(30) / 30.0
    still = _write(tmp_path / "still.parquet", {"trajectory": np.zeros(30, dtype=int),
                                                 "a": run.mean[0] + run.std[0] * (1 + 0.01 * t),
                                                 "b": run.mean[1] - run.std[1] * (1 + 0.01 * t)})
    summary = predict_file(run, still, tmp_path / "p.parquet")
    assert 0 < summary["metrics"]["last_value_mse"] < summary["metrics"]["mse"]
    assert summary["worse_than_naive"] == worse_than_naive(summary["metrics"])
    status, err = _cli(capsys, tmp_path, "predict", "lgssm", "psrnn", "0", str(still), str(tmp_path / "o.parquet"),
                       "--initial")
    assert status == 0 and f"psrnn predict: warning: {still}: the one-step predictions score mse " in err, err


def _cli(capsys, root, *argv):
    """``psrnn <argv>`` against the project at ``root`` (the repository's params.yaml): (exit status, stderr)."""
    from pipeline.cli import main

    status = main(["--params", str(REPO / "params.yaml"), "--root", str(root), *argv])
    return status, capsys.readouterr().err.strip()


def _project(root, run, test):
    """A project at ``root`` with the continuous ``run`` as ``lgssm psrnn`` seed 0 (prepared data, initial weights)
    and the input file ``in.parquet`` in the run's units; returns the input."""
    from pipeline.data.schema import SequenceDataset, write_dataset
    from pipeline.io import save_npz

    norm = {"mean": run.mean.tolist(), "std": run.std.tolist(), "columns": run.features}
    write_dataset(root / "data" / "prepared" / "lgssm.parquet",
                  SequenceDataset(kind="continuous", train=test, test=test, features=run.features,
                                  meta={"normalization": norm}))
    save_npz(root / "artifacts" / "lgssm" / "s0" / "init" / "psrnn.npz",
             {k: v.detach().numpy() for k, v in run.model.state_dict().items()},
             meta={"model_config": run.model.config.to_dict(), "seed": 0})
    x = np.concatenate(test[:2]) * run.std + run.mean
    return _write(root / "in.parquet", {"trajectory": np.repeat([0, 1], [len(test[0]), len(test[1])]),
                                        "a": x[:, 0], "b": x[:, 1]})


def test_outputs_that_are_not_regular_files_are_refused_before_any_work(capsys, tmp_path):
    """C1, C3: the rename onto the output would replace a symlink or special file itself; a directory or a parent
    that is a file fails only after the computation. Refused first: the project here has no run at all."""
    import os

    target = tmp_path / "target.parquet"
    target.write_bytes(b"keep")
    (tmp_path / "link.parquet").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    expected = "expected a regular file to replace or a new path (the output is written to a temporary file and " \
               "renamed onto it)"
    for name, what in (("link.parquet", "a symbolic link"), ("fifo", "a FIFO (named pipe)"),
                       ("folder", "a directory")):
        out = tmp_path / name
        for stage, extra in (("predict", []), ("forecast", ["--steps", "2"])):
            assert _cli(capsys, tmp_path, stage, "lgssm", "psrnn", "0", "in.parquet", str(out), *extra) == \
                (1, f"psrnn {stage}: error: {out}: the output is {what}; {expected}")
    assert (tmp_path / "link.parquet").is_symlink() and target.read_bytes() == b"keep"
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode) and os.listdir(tmp_path / "folder") == []
    out = tmp_path / "target.parquet" / "sub" / "out.parquet"
    assert _cli(capsys, tmp_path, "predict", "lgssm", "psrnn", "0", "in.parquet", str(out)) == \
        (1, f"psrnn predict: error: {out}: the output's parent {target} is not a directory; expected an output "
            "path in a directory (missing directories are created)")
    # '-' is no standard input or output here: a file named - was written, or read (./- is one)
    for stage, extra in (("predict", []), ("forecast", ["--steps", "2"])):
        for args, name in ((["in.parquet", "-"], "output"), (["-", "out.parquet"], "input")):
            assert _cli(capsys, tmp_path, stage, "lgssm", "psrnn", "0", *args, *extra) == \
                (1, f"psrnn {stage}: error: {name} -: {stage} reads and writes Parquet or CSV files, not standard "
                    "input or output; expected a path (./- for a file named -)")
    # the library refuses them too
    with pytest.raises(ValueError, match="the output is a symbolic link"):
        predict_file(None, tmp_path / "in.parquet", tmp_path / "link.parquet")
    assert sorted(os.listdir(tmp_path)) == ["fifo", "folder", "link.parquet", "target.parquet"]   # no temp files


def test_outputs_that_would_replace_the_projects_own_files_are_refused(capsys, tmp_path, continuous_run):
    """`psrnn predict hmm psrnn 0 new.parquet models/hmm/psrnn/s0/checkpoint.pt` replaced the model it predicted
    with, and `data/prepared/<ds>.parquet` the dataset: refused, naming the folder, and the files are kept."""
    run, test = continuous_run
    _project(tmp_path, run, test)
    ckpt = tmp_path / "models" / "lgssm" / "psrnn" / "s0" / "checkpoint.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"model")
    prepared = tmp_path / "data" / "prepared" / "lgssm.parquet"
    before = prepared.read_bytes()
    expected = ("which the pipeline writes or reads; expected a path outside its folders data/raw/, data/prepared/, "
                "artifacts/, models/, metrics/, plots/, predictions/, reports/, mlruns/, .dvc/, .git/ and other than "
                "params.yaml, dvc.yaml, dvc.lock, mlflow.db")
    for out, folder in ((ckpt, "models"), (prepared, "data/prepared")):
        for stage, extra in (("predict", []), ("forecast", ["--steps", "2"])):
            assert _cli(capsys, tmp_path, stage, "lgssm", "psrnn", "0", str(tmp_path / "in.parquet"), str(out),
                        "--initial", "--device", "cpu", *extra) == \
                (1, f"psrnn {stage}: error: {out}: the output is inside the {folder}/ folder of the project "
                    f"{tmp_path.resolve()}, {expected}")
    assert ckpt.read_bytes() == b"model" and prepared.read_bytes() == before
    # the library refuses them too: load_run's run knows its project
    loaded = load_run(tmp_path, "lgssm", "psrnn", 0, initial=True)
    assert loaded.root == tmp_path.resolve()
    with pytest.raises(ValueError, match=r"the output is inside the models/ folder of the project"):
        predict_file(loaded, tmp_path / "in.parquet", ckpt)
    assert ckpt.read_bytes() == b"model"
    summary = predict_file(loaded, tmp_path / "in.parquet", tmp_path / "mine" / "out.parquet")
    assert summary["rows"] == len(test[0]) + len(test[1])


def test_device_steps_and_seed_errors_name_the_option(capsys, tmp_path, continuous_run):
    """C4, C5, C7: checked before loading the run; the errors name the flag (the argument name in Python)."""
    import torch

    expected = "expected auto, cpu, cuda or cuda:<index> (e.g. cuda:0)"
    for device in ("gpu", "meta", "cuda:", "cuda:-1", "cuda:\u0663", "cpu:0", "CPU"):
        assert _cli(capsys, tmp_path, "predict", "lgssm", "psrnn", "0", "in.parquet", "out.parquet",
                    "--device", device) == (1, f"psrnn predict: error: --device {device}: {expected}")
    status, err = _cli(capsys, tmp_path, "forecast", "lgssm", "psrnn", "0", "in.parquet", "out.parquet",
                       "--steps", "1", "--device", "cuda:4096")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        assert (status, err) == (1, f"psrnn forecast: error: --device cuda:4096: this machine has {n} CUDA "
                                    f"device{'' if n == 1 else 's'} (cuda:0 to cuda:{n - 1}); expected one of "
                                    "them, cuda, auto or cpu")
    else:
        assert (status, err) == (1, "psrnn forecast: error: --device cuda:4096: CUDA is not available on this "
                                    "machine; expected auto or cpu")
    for flag, value, want in (("--steps", "0", "expected a positive integer up to 1000000"),
                              ("--steps", "1000000000000", "expected a positive integer up to 1000000"),
                              ("--sample-seed", "-1", "expected an integer with 0 <= seed < 2**32"),
                              ("--sample-seed", str(2 ** 32), "expected an integer with 0 <= seed < 2**32")):
        argv = ["--steps", "3", flag, value] if flag != "--steps" else [flag, value]
        argv = [*argv, "--sample"] if flag == "--sample-seed" else argv
        assert _cli(capsys, tmp_path, "forecast", "lgssm", "psrnn", "0", "in.parquet", "out.parquet", *argv) == \
            (1, f"psrnn forecast: error: {flag} {value}: {want}")
    # a seed without --sample would be silently unused: the greedy forecast draws nothing
    assert _cli(capsys, tmp_path, "forecast", "hmm", "psrnn", "0", "in.parquet", "out.parquet", "--steps", "3",
                "--sample-seed", "3") == \
        (1, "psrnn forecast: error: --sample-seed 3: only used with --sample (the default forecast feeds back the "
            "most likely symbol and draws nothing)")
    run, test = continuous_run
    with pytest.raises(ValueError, match=r"^steps=1000001: expected a positive integer up to 1000000$"):
        run.forecast(test[:1], 1_000_001)
    with pytest.raises(ValueError, match=r"^seed=-1: expected an integer with 0 <= seed < 2\*\*32$"):
        run.forecast(test[:1], 2, seed=-1)
    with pytest.raises(ValueError, match=r"^device='gpu': expected auto, cpu"):
        run.predict(test[:1], device="gpu")


def test_discrete_options_are_refused_for_a_continuous_run(capsys, tmp_path, continuous_run):
    """C6: given for a continuous run they would be ignored; their defaults are not 'given'."""
    run, test = continuous_run
    _project(tmp_path, run, test)
    run_text = "lgssm psrnn seed 0 is a continuous run (features a, b)"
    for stage, option in (("predict", ["--symbol-column", "symbol"]), ("predict", ["--unknown", "error"]),
                          ("predict", ["--probabilities"]), ("forecast", ["--unknown", "drop"]),
                          ("forecast", ["--sample"]), ("forecast", ["--probabilities"])):
        extra = ["--steps", "2"] if stage == "forecast" else []
        assert _cli(capsys, tmp_path, stage, "lgssm", "psrnn", "0", "in.parquet", "out.parquet", "--initial",
                    *option, *extra) == \
            (1, f"psrnn {stage}: error: {option[0]}: applies to discrete runs only; {run_text}")
    assert not (tmp_path / "out.parquet").exists()
    status, _ = _cli(capsys, tmp_path, "predict", "lgssm", "psrnn", "0", str(tmp_path / "in.parquet"),
                     str(tmp_path / "out.parquet"), "--initial", "--device", "cpu")
    assert status == 0 and pq.read_table(tmp_path / "out.parquet").num_rows == len(test[0]) + len(test[1])


def test_load_run_names_the_variants_a_dataset_has(tmp_path, continuous_run):
    run, test = continuous_run
    _project(tmp_path, run, test)
    with pytest.raises(FileNotFoundError, match=r"^no run of lgssm lstm seed 0 in .+: no variant 'lstm' of lgssm with "
                                                r"seed 0 \(have psrnn; `psrnn runs lgssm` lists the runs; looked for "
                                                r"its initial weights .+init/lstm\.npz\)$"):
        load_run(tmp_path, "lgssm", "lstm", 0, initial=True)
    # a seed that was not run: the seeds that were (it said 'have none: has `dvc repro` run?')
    with pytest.raises(FileNotFoundError, match=r"no variant 'psrnn' of lgssm with seed 1 \(no variant of seed 1; "
                                                r"psrnn has seed 0; `psrnn runs lgssm` lists the runs; looked for "
                                                r"its initial weights .+\)$"):
        load_run(tmp_path, "lgssm", "psrnn", 1, initial=True)
    (tmp_path / "artifacts" / "lgssm" / "s0" / "init" / "psrnn.npz").rename(tmp_path / "psrnn.npz")
    for seed in (3, 12):
        target = tmp_path / "artifacts" / "lgssm" / f"s{seed}" / "init" / "psrnn.npz"
        target.parent.mkdir(parents=True)
        shutil.copy(tmp_path / "psrnn.npz", target)
    with pytest.raises(FileNotFoundError, match=r"with seed 1 \(no variant of seed 1; psrnn has seeds 3, 12; "
                                                r"`psrnn runs lgssm` lists the runs; looked for .+\)$"):
        load_run(tmp_path, "lgssm", "psrnn", 1, initial=True)
    for odd in ("s01", "s\u00b2", "sx", "s-1", "s"):   # folders artifact_dir never names: not seeds (s01 read as 1)
        target = tmp_path / "artifacts" / "lgssm" / odd / "init" / "psrnn.npz"
        target.parent.mkdir(parents=True)
        shutil.copy(tmp_path / "psrnn.npz", target)
    with pytest.raises(FileNotFoundError, match=r"with seed 1 \(no variant of seed 1; psrnn has seeds 3, 12; "
                                                r"`psrnn runs lgssm` lists the runs; looked for .+\)$"):
        load_run(tmp_path, "lgssm", "psrnn", 1, initial=True)
    shutil.rmtree(tmp_path / "artifacts")
    with pytest.raises(FileNotFoundError, match=r"with seed 1 \(have none: has `dvc repro` run\?; `psrnn runs lgssm` lists "
                                                r"the runs; looked for .+\)$"):
        load_run(tmp_path, "lgssm", "psrnn", 1, initial=True)


def test_load_run_refuses_another_variants_weights(tmp_path, continuous_run):
    """C9: an initial-weights file or checkpoint of another model (copied over the variant's) is not run under
    the variant's name."""
    import torch

    from pipeline.io import save_npz

    run, test = continuous_run
    _project(tmp_path, run, test)
    init = tmp_path / "artifacts" / "lgssm" / "s0" / "init"
    assert load_run(tmp_path, "lgssm", "psrnn", 0, initial=True).variant == "psrnn"
    for variant in ("kf", "psrnn_2layer", "psrnn_random", "factorized_psrnn_r3", "psrnn_delta"):
        shutil.copy(init / "psrnn.npz", init / f"{variant}.npz")
        with pytest.raises(ValueError) as err:
            load_run(tmp_path, "lgssm", variant, 0, initial=True)
        assert str(err.value) == (f"{init / variant}.npz: holds a psrnn model, not the {variant} model of variant "
                                  f"{variant!r}; expected the {variant} file (another variant's file copied over "
                                  "it? rerun the pipeline's initialise / refine stages)")
    config = run.model.config.to_dict()
    save_npz(init / "psrnn.npz", {}, meta={"model_config": {**config, "model": "kf"}})   # kf.npz copied over it
    with pytest.raises(ValueError, match=r"psrnn\.npz: holds a kf model, not the psrnn model of variant 'psrnn'"):
        load_run(tmp_path, "lgssm", "psrnn", 0, initial=True)
    # a checkpoint of another model
    shutil.copy(init / "psrnn_2layer.npz", init / "psrnn.npz")   # the psrnn weights again
    ckpt = tmp_path / "models" / "lgssm" / "psrnn" / "s0" / "checkpoint.pt"
    ckpt.parent.mkdir(parents=True)
    (ckpt.parent / "done").touch()
    torch.save({"model_config": {**config, "model": "factorized_psrnn", "rank": 3}, "model": run.model.state_dict(),
                "epoch": 1}, ckpt)
    with pytest.raises(ValueError, match=r"checkpoint\.pt: holds a factorized_psrnn_r3 model, not the psrnn model "
                                         r"of variant 'psrnn'"):
        load_run(tmp_path, "lgssm", "psrnn", 0)
    torch.save({"model_config": config, "model": run.model.state_dict(), "epoch": 1}, ckpt)
    assert load_run(tmp_path, "lgssm", "psrnn", 0).epoch == 1
    # the plain model's checkpoint under a _delta variant (whose init file is right) would shift every prediction by
    # the input
    save_npz(init / "psrnn_delta.npz", {k: v.numpy() for k, v in run.model.state_dict().items()},
             meta={"model_config": {**config, "delta": True}})
    delta_ckpt = tmp_path / "models" / "lgssm" / "psrnn_delta" / "s0" / "checkpoint.pt"
    delta_ckpt.parent.mkdir(parents=True)
    (delta_ckpt.parent / "done").touch()
    shutil.copy(ckpt, delta_ckpt)
    with pytest.raises(ValueError, match=r"checkpoint\.pt: holds a psrnn model, not the psrnn_delta model of variant "
                                         r"'psrnn_delta'"):
        load_run(tmp_path, "lgssm", "psrnn_delta", 0)
    torch.save({"model_config": {**config, "delta": True}, "model": run.model.state_dict(), "epoch": 1}, delta_ckpt)
    assert load_run(tmp_path, "lgssm", "psrnn_delta", 0).model.config.delta


def test_inputs_that_overflow_when_standardised_are_refused(continuous_run, tmp_path):
    """C2: 1e308 is finite, and so is (1e308 - 10) / 2 in float64, but not in the float32 the model runs in."""
    import warnings

    run, _ = continuous_run
    src = _write(tmp_path / "in.parquet", {"trajectory": ["u", "u", "v", "v"], "step": [1, 0, 0, 1],
                                           "a": [1.0, 2.0, 3.0, 1e308], "b": [0.0, 0.0, 0.0, -1e39]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no numpy RuntimeWarning on the way
        with pytest.raises(ValueError) as err:
            predict_file(run, src, tmp_path / "out.parquet")
    assert str(err.value) == (f"{src}: feature column 'a' overflows when standardised (values too far from the "
                              "train mean/std of lgssm for float32; first: row 3, trajectory 'v'); expected values "
                              "of a representable spread")
    assert not (tmp_path / "out.parquet").exists()
    with pytest.raises(ValueError,
                       match=r"^trajectories\[0\]: feature 'b' overflows when standardised \(first at row 1 of the "):
        run.predict([np.array([[1.0, 0.0], [1.0, -1e38 * 4]])])


def test_out_of_memory_is_one_line():
    """M: numpy's 'Unable to allocate' (a MemoryError) is the sizes' fault, not a bug: one line, no traceback."""
    from pipeline.cli import expected_failure, one_line

    exc = MemoryError("Unable to allocate 21.8 TiB for an array with shape (3000000, 1000000) and data type "
                      "float64")
    advice = ("expected sizes in params.yaml (n_features, state_dim, lengths ...) that fit this machine's memory "
              "(psrnn predict / forecast: a smaller --block-rows, --steps or input)")
    assert expected_failure(exc) and expected_failure(MemoryError())
    assert one_line(exc) == ("out of memory: Unable to allocate 21.8 TiB for an array with shape (3000000, 1000000) "
                             f"and data type float64; {advice}")
    assert one_line(MemoryError()) == f"out of memory; {advice}"
    import torch   # a CUDA out-of-memory is torch's RuntimeError subclass: the same advice

    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    assert expected_failure(cuda) and one_line(cuda) == ("out of memory: CUDA out of memory. Tried to allocate "
                                                         f"20.00 GiB; {advice}")


def test_out_of_memory_in_a_stage_names_the_keys_that_size_it(tmp_path):
    """A stage that runs out of memory names the keys of its dataset's section that size it, with their values
    (preprocess: the source's sizes), not the generic list; run under an address-space limit, as a machine with
    less memory than the params ask for would be."""
    import resource
    import subprocess
    import sys

    import yaml

    root = Path(__file__).resolve().parents[1]
    text = (root / "params.yaml").read_text()
    shipped = re.search(r"\nlgssm:\n  source: \{[^}]*length: (\d+)", text)
    start, end = shipped.span(1)   # 2 x 40 x 2e9 floats: far beyond 3 GiB
    (tmp_path / "params.yaml").write_text(text[:start] + "2000000000" + text[end:])
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert params["lgssm"]["source"]["length"] == 2_000_000_000

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2 ** 30, 3 * 2 ** 30))

    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "--root", str(tmp_path), "preprocess", "lgssm"],
                          capture_output=True, text=True, preexec_fn=limit, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 1, done.stderr
    source = params["lgssm"]["source"]
    assert re.fullmatch(r"psrnn preprocess: error: out of memory: Unable to allocate [^;\n]+; expected sizes that fit "
                        r"this machine's memory: " + re.escape(", ".join(
                            f"lgssm.source.{k} = {source[k]}"
                            for k in ("length", "n_train", "n_test", "state_dim", "obs_dim"))) + "\n",
                        done.stderr), done.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*.parquet"))
    # refine's sizes: the model's and the batch, a variant's own batch size too
    from pipeline.cli import _size_keys
    from pipeline.config import load_params

    raw = load_params(root / "params.yaml")
    raw.raw["lgssm"]["train"]["overrides"] = {"lstm": {"batch_size": 64, "lr": 0.1}}
    assert _size_keys(raw, "refine", "lgssm") == (
        "lgssm.two_stage.n_features = 1000, lgssm.two_stage.state_dim = 10, lgssm.two_stage.obs_dim = 10, "
        "lgssm.two_stage.layers = 2, lgssm.train.batch_size = 20, lgssm.train.bptt = 0, "
        "lgssm.train.overrides.lstm.batch_size = 64")
    assert _size_keys(raw, "check", "lgssm") == "" and _size_keys(raw, "refine", "nosuch") == ""


# ------------------------------------------------------------------------------ input checks (audit of the API)

def test_trained_run_errors_name_the_trajectory(discrete_run, continuous_run):
    """Discrete symbols are compared as text (documented): 0.9 or 10.0 is an unknown symbol, never truncated to a
    vocabulary entry; a 2-D array or a lone string is refused, not flattened; continuous NaN names its trajectory."""
    run, _ = discrete_run
    for call in (run.predict, run.evaluate, lambda t: run.forecast(t, 2)):
        with pytest.raises(ValueError, match=r"^trajectories\[1\]: 3 observations have symbols not in the vocabulary "
                                             r"of hmm: '10\.9', '20\.0', '30\.5'; use unknown 'drop'"):
            call([["10", "20"], np.array([10.9, 20.0, 30.5])])
        # integer symbols written as floats (a column with a gap, as pandas reads it): said as such
        with pytest.raises(ValueError, match=r"^trajectories\[0\]: 2 observations have symbols not in the vocabulary "
                                             r"of hmm: '10\.0', '20\.0'; they are the vocabulary's integer symbols "
                                             r"written as floats \('10\.0' for '10'\): expected integers \(cast the "
                                             r"symbol column to int\)$"):
            call([np.array([10.0, 20.0])])
        with pytest.raises(ValueError, match=r"^trajectories\[0\]: shape \(2, 2\); expected a 1-D sequence of "
                                             r"symbols \(a str is one symbol of this model's vocabulary, whose "
                                             r"symbols are not all single characters: list\(text\) for its "
                                             r"characters\)$"):
            call([np.array([["10", "20"], ["30", "40"]])])
        with pytest.raises(ValueError, match=r"^trajectories\[0\]: the single value '1020'; expected a 1-D sequence "
                                             r"of symbols \(a str is one symbol of this model's vocabulary"):
            call(["1020"])   # symbols '10' ... '40': one str is one symbol, so it is refused, not split
    # a vocabulary of single characters (PTB's): a str is read as its characters, as fit_model reads it
    chars = dataclasses.replace(run, vocab=["a", "b", "c", "d"])
    assert np.array_equal(chars.predict(["abca"])[0], run.predict([["10", "20", "30", "10"]])[0])
    assert chars.evaluate(["abcadd"]) == run.evaluate([["10", "20", "30", "10", "40", "40"]])
    for call in (run.predict, run.evaluate, lambda t: run.forecast(t, 2)):
        with pytest.raises(ValueError, match=r"^trajectories: one array of shape \(2,\); expected a list of "
                                             r"trajectories"):
            call(np.array(["10", "20"]))
        with pytest.raises(ValueError, match=r"^trajectories\[0\]: no observation left \(empty, or every symbol "
                                             r"dropped as unknown\); expected at least one$"):
            run.predict([["99"]], unknown="drop")
    crun, test = continuous_run
    raw = [z * crun.std + crun.mean for z in test]
    bad = raw[1].copy()
    bad[3, 0] = np.nan
    for call in (crun.predict, crun.evaluate, lambda t: crun.forecast(t, 2)):
        with pytest.raises(ValueError, match=r"^trajectories\[1\]: feature 'a' is nan at row 3 of the trajectory; "
                                             r"expected finite values \(fill or drop missing observations first\)$"):
            call([raw[0], bad])
        with pytest.raises(ValueError, match=r"^trajectories\[0\]: expected trajectories of shape \(T, 2\) \(features "
                                             r"\['a', 'b'\]\), got \(4, 3\)$"):
            call([np.zeros((4, 3))])
        with pytest.raises(ValueError, match=r"^trajectories: empty; expected a list of trajectories, at least one$"):
            call([])


def test_unsigned_symbols_beyond_int64_stay_uint64(discrete_run, tmp_path):
    """A uint64 symbol column with 2**63 trained fine, then predict / forecast overflowed converting to int64."""
    from pipeline.inference import forecast_file

    run, _ = discrete_run
    big = [0, 1, 2 ** 63, 2 ** 64 - 1]
    wide = TrainedRun(model=run.model, dataset="u", variant="psrnn", seed=0, epoch=1, kind="discrete",
                      vocab=[str(v) for v in big])
    seq = np.array([0, 2 ** 63, 1, 2 ** 64 - 1, 2 ** 63], dtype=np.uint64)
    # trajectory ids beyond int64 too: they overflowed in predict / forecast (and smaller uint64 ids came back int64)
    ids = pa.array([2 ** 63 + 5] * 5, pa.uint64())
    src = _write(tmp_path / "in.parquet", {"trajectory": ids, "symbol": pa.array(seq, pa.uint64())})
    predict_file(wide, src, tmp_path / "pred.parquet")
    out = pq.read_table(tmp_path / "pred.parquet")
    assert out.schema.field("predicted").type == pa.uint64()
    assert out.schema.field("trajectory").type == pa.uint64() and out.column("trajectory").to_pylist() == ids.to_pylist()
    probs = wide.predict([seq])[0]
    assert out.column("predicted").to_pylist() == [big[i] for i in probs.argmax(1)]
    forecast_file(wide, src, tmp_path / "fc.parquet", steps=3)
    fc = pq.read_table(tmp_path / "fc.parquet")
    assert fc.schema.field("predicted").type == pa.uint64()
    assert fc.schema.field("trajectory").type == pa.uint64() and set(fc.column("trajectory").to_pylist()) == {2 ** 63 + 5}
    assert fc.column("predicted").to_pylist() == [int(v) for v in wide.forecast([seq], 3)[0][0]]
    # symbols that fit int64 keep the int64 column
    small = _write(tmp_path / "small.parquet", {"trajectory": [0] * 3, "symbol": pa.array([10, 20, 30], pa.uint64())})
    predict_file(run, small, tmp_path / "pred.parquet")
    assert pq.read_table(tmp_path / "pred.parquet").schema.field("predicted").type == pa.int64()


def test_block_rows_is_bounded(capsys, tmp_path, continuous_run):
    """A huge --block-rows ended in pyarrow's OverflowError; predict_file bounds it, the CLI prints its line."""
    from pipeline.inference import MAX_BLOCK_ROWS

    run, test = continuous_run
    src = _project(tmp_path, run, test)
    assert MAX_BLOCK_ROWS == 2 ** 31 - 1
    for value in (2 ** 31, 99999999999999999999, 10 ** 5000):
        shown = "an integer of about 5001 digits" if value == 10 ** 5000 else str(value)
        with pytest.raises(ValueError, match=rf"^block_rows={shown}: expected a positive integer up to 2\*\*31 - 1 "
                                             rf"\(2147483647\)$"):
            predict_file(run, src, tmp_path / "out.parquet", block_rows=value)
    assert _cli(capsys, tmp_path, "predict", "lgssm", "psrnn", "0", "in.parquet", "out.parquet", "--initial",
                "--block-rows", "99999999999999999999") == \
        (1, "psrnn predict: error: --block-rows 99999999999999999999: expected a positive integer up to "
            "2**31 - 1 (2147483647)")
    assert not (tmp_path / "out.parquet").exists()
    assert predict_file(run, src, tmp_path / "out.parquet", block_rows=MAX_BLOCK_ROWS)["rows"] == \
        len(test[0]) + len(test[1])


def test_forecast_steps_beyond_int64_are_refused(capsys, tmp_path, continuous_run, discrete_run):
    """Nanosecond time stamps a day apart, 120000 steps on: the step column wrapped to negative values."""
    from pipeline.inference import forecast_file

    run, test = continuous_run
    _project(tmp_path, run, test)
    t0, day = 1_700_000_000_000_000_000, 86_400_000_000_000
    x = test[0][:3] * run.std + run.mean
    src = _write(tmp_path / "in.parquet", {"trajectory": ["s"] * 3, "step": [t0, t0 + day, t0 + 2 * day],
                                           "a": x[:, 0], "b": x[:, 1]})
    message = (f"{src}: trajectory 's': last step {t0 + 2 * day} + 120000 steps × spacing {day} is beyond the "
               "int64 step column (2**63 - 1); expected fewer steps or smaller step values")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        forecast_file(run, src, tmp_path / "fc.parquet", steps=120_000)
    assert _cli(capsys, tmp_path, "forecast", "lgssm", "psrnn", "0", str(src), "fc.parquet", "--initial",
                "--steps", "120000") == (1, f"psrnn forecast: error: {message}")
    assert not (tmp_path / "fc.parquet").exists()
    # within range the steps are exact (no float rounding of 1.7e18)
    forecast_file(run, src, tmp_path / "fc.parquet", steps=3)
    assert pq.read_table(tmp_path / "fc.parquet").column("step").to_pylist() == [t0 + k * day for k in (3, 4, 5)]
    # steps 2**63 apart: their differences wrap in int64 too; the spacing is still the exact median
    drun, _ = discrete_run
    src = _write(tmp_path / "far.parquet", {"trajectory": [0] * 3, "step": [-2 ** 63, 0, 2 ** 63 - 1],
                                            "symbol": [10, 20, 30]})
    with pytest.raises(ValueError, match=r"trajectory 0: last step 9223372036854775807 \+ 1 steps × spacing "
                                         r"9223372036854775808 is beyond the int64 step column"):
        forecast_file(drun, src, tmp_path / "far_fc.parquet", steps=1)


def test_a_large_vocabulary_is_predicted_in_blocks_within_the_byte_budget(discrete_run, tmp_path, monkeypatch):
    """A block's outputs are bounded in bytes, not only in rows (a 63k-symbol vocabulary held 16 GB of logits in
    one 65,536-row block): with a budget of a few rows per block, predict writes the same rows in row groups of
    that size, and forecast and evaluate give the same numbers."""
    import pipeline.train
    from pipeline.inference import forecast_file, rows_within_budget

    run, test = discrete_run
    ids = np.concatenate([np.full(len(t), i) for i, t in enumerate(test)])
    src = _write(tmp_path / "in.parquet", {"trajectory": ids,
                                           "symbol": np.array(run.vocab)[np.concatenate(test)]})
    free = predict_file(run, src, tmp_path / "free.parquet", probabilities=True)
    want = pq.read_table(tmp_path / "free.parquet")
    ahead = forecast_file(run, src, tmp_path / "free_f.parquet", steps=3)
    metrics = run.evaluate([np.array(run.vocab)[t] for t in test])
    monkeypatch.setattr(pipeline.train, "EVAL_BLOCK_BYTES", 7 * 20 * 4)   # 7 rows of 4 outputs
    assert rows_within_budget(run.model) == 7
    tight = predict_file(run, src, tmp_path / "tight.parquet", probabilities=True)
    got = pq.read_table(tmp_path / "tight.parquet")
    assert pq.ParquetFile(tmp_path / "tight.parquet").metadata.row_group(0).num_rows == 7
    assert got.to_pydict() == want.to_pydict() and tight["metrics"] == pytest.approx(free["metrics"], rel=1e-12)
    forecast_file(run, src, tmp_path / "tight_f.parquet", steps=3)
    assert pq.read_table(tmp_path / "tight_f.parquet").to_pydict() == \
        pq.read_table(tmp_path / "free_f.parquet").to_pydict() and ahead["trajectories"] == len(test)
    assert run.evaluate([np.array(run.vocab)[t] for t in test]) == pytest.approx(metrics, rel=1e-12)


def test_trajectories_with_named_columns_are_read_by_name(continuous_run, discrete_run):
    """A DataFrame (or a dict of columns) is read by column name, in the run's order, other columns ignored: the
    same predictions as the plain array; a plain array in another column order cannot be told apart, a frame
    can. A missing column is refused naming it."""
    import pandas as pd

    run, test = continuous_run
    raw = test[0] * run.std + run.mean
    want = run.predict([raw])[0]
    frame = pd.DataFrame({"b": raw[:, 1], "note": "x", "a": raw[:, 0]})
    np.testing.assert_array_equal(run.predict([frame])[0], want)
    np.testing.assert_array_equal(run.predict([{"a": raw[:, 0], "b": raw[:, 1]}])[0], want)
    np.testing.assert_array_equal(run.predict([{"a": raw[:, :1], "b": raw[:, 1:]}])[0], want)   # (T, 1) columns
    assert run.evaluate([frame]) == run.evaluate([raw])
    with pytest.raises(ValueError, match=re.escape("trajectories[1]: no column 'a' (columns present: ['b', 'note']);"
                                                   " expected the features the run was trained on, ['a', 'b']")):
        run.predict([frame, frame.drop(columns="a")])
    drun, dtest = discrete_run
    symbols = [drun.vocab[i] for i in dtest[0]]
    np.testing.assert_array_equal(drun.predict([pd.DataFrame({"t": 0, "symbol": symbols})])[0],
                                  drun.predict([symbols])[0])
    with pytest.raises(ValueError, match=re.escape("trajectories[0]: no column 'symbol' (columns present: ['sym']); "
                                                   "expected the symbol column 'symbol'")):
        drun.predict([{"sym": symbols}])
    # columns that are no numbers, and gaps, are named: a datetime column stacked beside a float one failed deep in
    # numpy, and None or NaN among symbols were the symbols 'None' and 'nan' (dropped by unknown='drop')
    when = pd.date_range("2020-01-01", periods=len(raw))
    with pytest.raises(ValueError, match=re.escape(f"trajectories[0]: column 'b': values of dtype "
                                                   f"{np.asarray(when).dtype}; expected numbers (features) or ")):
        run.predict([frame.assign(b=when)])
    with pytest.raises(ValueError, match=re.escape("trajectories[0]: column 'a': a missing value (nan) at step 2; "
                                                   "expected a value at every step (fill or drop missing")):
        run.predict([frame.assign(a=[1.0, 2.0, None] + [3.0] * (len(raw) - 3))])
    # a ragged column of a dict is named, as fit_model's inputs are (numpy's "inhomogeneous shape" said nothing of it)
    with pytest.raises(ValueError, match=re.escape("trajectories[0]: column 'a' is not an array (")):
        run.predict([{"a": [[1.0, 2.0], [3.0]], "b": raw[:2, 1]}])
    for gap in (None, np.nan, pd.NA):
        holed = pd.Series(symbols[:2] + [gap] + symbols[3:], dtype=object)
        for unknown in ("error", "drop", "map"):
            with pytest.raises(ValueError, match=re.escape(f"trajectories[0]: a missing value ({gap}) at row 2 of "
                                                           "the trajectory; expected a symbol at every step")):
                drun.predict([holed], unknown=unknown)
        with pytest.raises(ValueError, match=re.escape(f"trajectories[0]: a missing value ({gap}) at row 2")):
            drun.predict([pd.DataFrame({"symbol": holed})], unknown="drop")


def test_sample_and_unknown_are_checked_up_front(discrete_run, continuous_run, tmp_path):
    """sample="no" sampled (a truthy string); sample=True on a continuous run was silently ignored, where the CLI
    refuses forecast --sample; unknown="bogus" passed on a continuous run, which looks no symbol up."""
    from pipeline.inference import forecast_file

    drun, dtest = discrete_run
    symbols = [np.array(drun.vocab, dtype=object)[t] for t in dtest]
    crun, ctest = continuous_run
    raw = [z * crun.std + crun.mean for z in ctest]
    not_bool = "^" + re.escape("sample='no': expected True or False") + "$"
    continuous = "^" + re.escape("sample=True: applies to discrete models only (it draws the symbols fed back from "
                                 "the predicted distributions), and this one is continuous; expected False") + "$"
    bogus = "^" + re.escape("unknown='bogus': expected one of ('error', 'drop', 'map')") + "$"
    with pytest.raises(ValueError, match=not_bool):
        drun.forecast(symbols, 2, sample="no")
    with pytest.raises(ValueError, match=not_bool):
        drun.forecast_encoded(dtest, 2, sample="no", seed=0, device="cpu")
    with pytest.raises(ValueError, match=continuous):
        crun.forecast(raw, 2, sample=True)
    with pytest.raises(ValueError, match=continuous):
        crun.forecast_encoded(ctest, 2, sample=True, seed=0, device="cpu")
    for call in (crun.predict, crun.evaluate, lambda t, **kw: crun.forecast(t, 2, **kw)):
        with pytest.raises(ValueError, match=bogus):
            call(raw, unknown="bogus")
    src = _write(tmp_path / "in.parquet", {"trajectory": [0, 0, 0], "a": [1.0, 2.0, 3.0], "b": [0.0, 1.0, 0.0]})
    with pytest.raises(ValueError, match=continuous):
        forecast_file(crun, src, tmp_path / "fc.parquet", steps=2, sample=True)
    with pytest.raises(ValueError, match=bogus):
        forecast_file(crun, src, tmp_path / "fc.parquet", steps=2, unknown="bogus")
    with pytest.raises(ValueError, match=bogus):
        predict_file(crun, src, tmp_path / "p.parquet", unknown="bogus")
    dsrc = _write(tmp_path / "d.parquet", {"trajectory": [0, 0, 0], "symbol": ["10", "20", "30"]})
    with pytest.raises(ValueError, match=not_bool):
        forecast_file(drun, dsrc, tmp_path / "fc.parquet", steps=2, sample="no")
    assert not (tmp_path / "fc.parquet").exists() and not (tmp_path / "p.parquet").exists()


def test_evaluate_refuses_trajectories_without_a_step_to_score(discrete_run, continuous_run):
    """TrainedRun.evaluate gave NaN metrics for single steps, as FittedModel.evaluate no longer does."""
    drun, _ = discrete_run
    crun, ctest = continuous_run
    single = ("trajectories: its one trajectory is a single step, so there is no one-step prediction to score; "
              "expected trajectories of at least 2 steps (each prediction is scored against the next observation)")
    with pytest.raises(ValueError, match="^" + re.escape(single) + "$"):
        drun.evaluate([["10"]])
    with pytest.raises(ValueError, match="^" + re.escape(single) + "$"):
        crun.evaluate([ctest[0][:1] * crun.std + crun.mean])
    with pytest.raises(ValueError, match="^" + re.escape(
            "trajectories: all 2 of its trajectories are a single step, so there is no one-step prediction to score; "
            "expected trajectories of at least 2 steps (each prediction is scored against the next observation) "
            "(counted after unknown='drop' left out the symbols not in the vocabulary)") + "$"):
        drun.evaluate([["10", "99"], ["99", "99", "20"]], unknown="drop")
    metrics = drun.evaluate([["10"], ["10", "99", "20"]], unknown="drop")   # one step to score is enough
    assert all(math.isfinite(v) for v in metrics.values())


def test_sampled_forecasts_depend_on_the_seed_and_the_trajectorys_index_alone(discrete_run, tmp_path):
    """One uniform per step was drawn across the batch: a trajectory's samples changed with the other
    trajectories of the call. Each trajectory now has its own stream, SeedSequence(seed, spawn_key=(index,))."""
    from pipeline.inference import forecast_file

    run, test = discrete_run
    symbols = [np.array(run.vocab, dtype=object)[t] for t in test]
    batched = run.forecast(symbols[:3], 30, sample=True, seed=3)
    alone = run.forecast(symbols[:1], 30, sample=True, seed=3)[0]
    assert list(batched[0][0]) == list(alone[0])
    np.testing.assert_allclose(batched[0][1], alone[1], rtol=1e-5, atol=1e-7)
    # the other trajectories change nothing of trajectory 1's draws, only its index and the seed do
    other_first = run.forecast([symbols[3], symbols[1]], 30, sample=True, seed=3)[1]
    assert list(other_first[0]) == list(batched[1][0])
    assert list(run.forecast(symbols[:3], 30, sample=True, seed=3)[2][0]) == list(batched[2][0])
    assert list(run.forecast(symbols[:1], 30, sample=True, seed=4)[0][0]) != list(alone[0])
    # the documented stream: the draws are the inverse CDF of trajectory 1's own uniforms
    u = np.random.default_rng(np.random.SeedSequence(3, spawn_key=(1,))).random(30)
    values, probs = batched[1]
    cdf = np.cumsum(probs, axis=1)
    cdf /= cdf[:, -1:]
    want = np.minimum((cdf <= u[:, None]).sum(axis=1), len(run.vocab) - 1)
    assert list(values) == [run.vocab[i] for i in want]
    # forecast_file draws alike, by the trajectory's position in id order
    src = _write(tmp_path / "in.parquet", {"trajectory": np.repeat([0, 1], [len(test[0]), len(test[1])]),
                                          "symbol": np.concatenate([symbols[0], symbols[1]]).astype(str)})
    forecast_file(run, src, tmp_path / "fc.parquet", steps=30, sample=True, seed=3)
    assert pq.read_table(tmp_path / "fc.parquet").column("predicted").to_pylist()[:30] == list(alone[0])


@pytest.mark.parametrize("uri, problem", [
    ("sqllite:///x.db", "unknown scheme 'sqllite' (a misspelled sqlite://?)"),
    ("htp://localhost:5000", "unknown scheme 'htp' (a misspelled http://?)"),
    ("s3://bucket/mlruns", "unknown scheme 's3'"),
    ("postgresql+a+b://h/db", "the driver of scheme 'postgresql+a+b' is not a SQLAlchemy driver name"),
])
def test_load_mlflow_run_refuses_a_scheme_mlflow_does_not_track_to(uri, problem, tmp_path, monkeypatch):
    """uri_problem passed any URI with "://": a misspelled scheme got MLflow's multi-line exception."""
    from pipeline.inference import load_mlflow_run
    from pipeline.tracking import TrackingError, check_tracking_uri, uri_problem

    expected = ("expected a URI MLflow tracks to: http(s)://host:port, sqlite:///path, postgresql://, "
                "mysql:// or mssql:// (also with a driver, e.g. postgresql+psycopg2://), or databricks")
    with pytest.raises(ValueError, match="^" + re.escape(f"{uri} (tracking_uri): {problem}; {expected}") + "$"):
        load_mlflow_run("0123456789abcdef0123456789abcdef", tracking_uri=uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(TrackingError, match="^" + re.escape(f"MLFLOW_TRACKING_URI={uri}: {problem}; {expected}")):
        check_tracking_uri(uri)
    for good in ("postgresql+psycopg2://user@host/db", "mysql+pymysql://host/db", "mssql://host/db", "HTTPS://host",
                 f"sqlite:///{tmp_path / 'mlflow.db'}", f"file://{tmp_path}", "databricks://profile"):
        assert uri_problem(good) is None, good


def test_predict_and_forecast_warn_when_the_run_is_not_current(capsys, tmp_path, continuous_run):
    """evaluate refuses a finished run whose params, data, initial weights or training code are not the current
    ones; predict and forecast use it (an older model may be what is wanted) but said nothing: now one warning line
    on stderr, and none for a current run or for --initial weights."""
    import torch

    from pipeline.config import load_params
    from pipeline.workflow.refine import run_fingerprints

    run, test = continuous_run
    src = str(_project(tmp_path, run, test))
    mdir = tmp_path / "models" / "lgssm" / "psrnn" / "s0"
    mdir.mkdir(parents=True)
    torch.save({"model_config": run.model.config.to_dict(), "model": run.model.state_dict(), "epoch": 1},
               mdir / "checkpoint.pt")
    (mdir / "done").write_text("trained-with-other-params\n")
    (mdir / "history.json").write_text(json.dumps({"data_units": {"kind": "continuous", "features": run.features,
                                                                  "mean": run.mean.tolist(),
                                                                  "std": run.std.tolist()}}))
    stale = (f"warning: {mdir}: trained with other params, data, initial weights or training code than the current "
             f"ones; run refine first (psrnn --root {tmp_path} --params {REPO / 'params.yaml'} refine lgssm psrnn 0); "
             "using it as it is")
    out = str(tmp_path / "out.parquet")
    for stage, extra in (("predict", []), ("forecast", ["--steps", "2"])):
        status, err = _cli(capsys, tmp_path, stage, "lgssm", "psrnn", "0", src, out, *extra)
        assert (status, err) == (0, f"psrnn {stage}: {stale}")
        status, err = _cli(capsys, tmp_path, stage, "lgssm", "psrnn", "0", src, out, "--initial", *extra)
        assert (status, err) == (0, "")
    (mdir / "history.json").unlink()   # a run trained before runs kept their units: the prepared file's are used
    assert _cli(capsys, tmp_path, "predict", "lgssm", "psrnn", "0", src, out) == (
        0, f"psrnn predict: {stale}, in the units of the current prepared data (the run predates runs that keep "
           "their own)")
    (mdir / "done").write_text(run_fingerprints(load_params(REPO / "params.yaml"), tmp_path, "lgssm", "psrnn", 0)[0])
    assert _cli(capsys, tmp_path, "predict", "lgssm", "psrnn", "0", src, out) == (0, "")
    txt = tmp_path / "out.txt"   # a name of another format: written as Parquet, said, not silently ignored
    assert _cli(capsys, tmp_path, "predict", "lgssm", "psrnn", "0", src, str(txt)) == (
        0, f"psrnn predict: warning: {txt}: written as Parquet (pyarrow), whatever its name ends with (.txt); "
           "expected a name ending in .parquet (or .csv for CSV)")
    assert pq.read_table(txt).num_rows == len(test[0]) + len(test[1])
    # a .csv name writes CSV: the same rows and columns as the Parquet output, for predict and forecast
    import pyarrow.csv as pacsv

    for stage, extra, parquet in (("predict", [], out), ("forecast", ["--steps", "3"], str(tmp_path / "f.parquet"))):
        csv = tmp_path / f"{stage}.csv"
        assert _cli(capsys, tmp_path, stage, "lgssm", "psrnn", "0", src, str(csv), *extra) == (0, "")
        assert _cli(capsys, tmp_path, stage, "lgssm", "psrnn", "0", src, parquet, *extra) == (0, "")
        got, want = pacsv.read_csv(csv), pq.read_table(parquet)
        assert got.column_names == want.column_names and got.num_rows == want.num_rows
        for name in want.column_names:
            assert np.allclose(got.column(name).to_numpy(), want.column(name).to_numpy(), rtol=1e-15,
                               equal_nan=True), name   # next_step is null on each trajectory's last row
    # what the comparison reads is gone (the prepared data; the run keeps its own units): said, and the run used
    (mdir / "history.json").write_text(json.dumps({"data_units": {"kind": "continuous", "features": run.features,
                                                                  "mean": run.mean.tolist(),
                                                                  "std": run.std.tolist()}}))
    (tmp_path / "data" / "prepared" / "lgssm.parquet").unlink()
    status, err = _cli(capsys, tmp_path, "predict", "lgssm", "psrnn", "0", src, out)
    assert status == 0 and err.startswith("psrnn predict: warning: could not compare the run with the current "
                                          "params and data (") and err.endswith("); using it as it is"), err
    assert "lgssm.parquet" in err and pq.read_table(out).num_rows == len(test[0]) + len(test[1])


def test_a_trained_run_keeps_the_units_it_was_trained_in(tmp_path, continuous_run):
    """load_run took the mean/std (or vocabulary) of the prepared file as it is now: preparing the data again
    (another split) without retraining standardised new inputs differently from training, silently. A trained
    run's history.json now holds its units; the initial weights, and runs without them, use the prepared file's."""
    import torch

    from pipeline.io import write_json

    run, test = continuous_run
    _project(tmp_path, run, test)
    mdir = tmp_path / "models" / "lgssm" / "psrnn" / "s0"
    mdir.mkdir(parents=True)
    torch.save({"model_config": run.model.config.to_dict(), "model": run.model.state_dict(), "epoch": 1},
               mdir / "checkpoint.pt")
    (mdir / "done").write_text("fingerprint\n")
    units = {"kind": "continuous", "features": ["a", "b"], "mean": run.mean.tolist(), "std": run.std.tolist()}
    write_json(mdir / "history.json", {"data_units": units, "history": []})
    # the data prepared again: other means and spreads
    from pipeline.data.schema import SequenceDataset, write_dataset

    write_dataset(tmp_path / "data" / "prepared" / "lgssm.parquet",
                  SequenceDataset(kind="continuous", train=test, test=test, features=["a", "b"],
                                  meta={"normalization": {"mean": [0.0, 1.0], "std": [3.0, 3.0],
                                                          "columns": ["a", "b"]}}))
    raw = [z * run.std + run.mean for z in test]
    loaded = load_run(tmp_path, "lgssm", "psrnn", 0)
    np.testing.assert_array_equal(loaded.mean, run.mean)
    np.testing.assert_array_equal(loaded.std, run.std)
    for a, b in zip(loaded.predict(raw), run.predict(raw)):
        np.testing.assert_array_equal(a, b)
    assert list(load_run(tmp_path, "lgssm", "psrnn", 0, initial=True).mean) == [0.0, 1.0]
    (tmp_path / "data" / "prepared" / "lgssm.parquet").unlink()   # a trained run needs no prepared file
    assert load_run(tmp_path, "lgssm", "psrnn", 0).epoch == 1
    write_json(mdir / "history.json", {"history": []})             # trained before runs kept their units
    with pytest.raises(FileNotFoundError, match="prepared dataset not found"):
        load_run(tmp_path, "lgssm", "psrnn", 0)
    # a damaged history.json is one line naming it, not an AttributeError or a bare KeyError
    damaged = f"{mdir / 'history.json'}: damaged: expected a JSON object whose data_units has kind 'discrete' with "
    for content in ("[]", '"x"', '{"data_units": {}}', json.dumps({"data_units": {**units, "std": [1.0]}}),
                    json.dumps({"data_units": {"kind": "discrete", "vocab": []}}),
                    json.dumps({"data_units": {"kind": "discrete", "vocab": [1, 2]}}),
                    json.dumps({"data_units": {**units, "mean": ["a", "b"]}}),
                    json.dumps({"data_units": {**units, "std": [1.0, 0.0]}}),
                    json.dumps({"data_units": {**units, "mean": [1.0, True]}}),
                    json.dumps({"data_units": {**units, "features": ["a", 2]}})):
        (mdir / "history.json").write_text(content)
        with pytest.raises(ValueError) as err:
            load_run(tmp_path, "lgssm", "psrnn", 0)
        assert str(err.value).startswith(damaged), str(err.value)
    (mdir / "history.json").write_text('{"data_units": ')
    with pytest.raises(ValueError, match=r"history\.json"):
        load_run(tmp_path, "lgssm", "psrnn", 0)
    # well formed but another model's units: one line naming the file, not a failed matrix product later
    write_json(mdir / "history.json", {"data_units": {**units, "features": ["a"], "mean": [0.0], "std": [1.0]},
                                       "history": []})
    with pytest.raises(ValueError, match=r"history\.json: 1 features, but the model takes 2"):
        load_run(tmp_path, "lgssm", "psrnn", 0)


def test_cli_counts_dropped_rows_in_the_singular_and_plural():
    from pipeline.cli import _dropped

    assert (_dropped(0), _dropped(1), _dropped(3)) == ("", ", 1 unknown-symbol row dropped",
                                                       ", 3 unknown-symbol rows dropped")
    assert _dropped(2, [8]) == ", 2 unknown-symbol rows dropped (trajectory 8 left out: every symbol unknown)"
    assert _dropped(9, list("abcdefgh")) == (", 9 unknown-symbol rows dropped (trajectories a, b, c, d, e, f and 2 "
                                             "more left out: every symbol unknown)")


def test_cli_version_is_the_packages(capsys):
    """`psrnn --version` said 'the following arguments are required: stage'; it prints the version that
    pyproject.toml gives the package."""
    import tomllib

    from pipeline.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"psrnn {version}\n"


@pytest.mark.filterwarnings("ignore:trajectories. feature 'a' reaches")   # warned far out, then refused
def test_inputs_that_overflow_the_float32_arithmetic_are_refused_not_predicted_nan(continuous_run, tmp_path):
    """A feature at ~1e38 (within float32, so the input check lets it through) overflows the RFF encoder's Ωᵀx:
    cos(inf) is NaN and so is every later prediction. predict_file wrote those NaNs and psrnn predict reported
    success with the NaN metrics left out; now every path refuses at the first non-finite output, naming the
    trajectory and the row (the file's step), and predict_file and forecast_file leave no output."""
    from pipeline.inference import forecast_file

    run, test = continuous_run
    raw = test[0] * run.std + run.mean
    far = raw.copy()
    far[:, 0] = (test[0][:, 0] * 1.5e38) * run.std[0] + run.mean[0]   # ~1.5e38 standard deviations out
    assert np.all(np.abs((far - run.mean) / run.std) < np.finfo(np.float32).max)
    assert np.isnan(predict(run.model, [(far - run.mean) / run.std])[0]).any()   # what the model gives
    out = r"the inputs up to there reach \S+ standard deviations from the training mean: too far out for the " \
          r"model's float32 arithmetic\); expected inputs on the scale of the training data$"
    with pytest.raises(ValueError, match=r"^trajectories\[1\]: the model's prediction is not finite at row \d+ \(" + out):
        run.predict([raw, far])
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: the model's prediction is not finite at row \d+ \(" + out):
        run.evaluate([far, raw])
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: the model's forecast is not finite at horizon 1 \("):
        run.forecast([far], 2)
    steps = np.arange(len(far)) * 5 + 100
    src = _write(tmp_path / "far.parquet", {"trajectory": np.full(len(far), "walk"), "step": steps,
                                            "a": far[:, 0], "b": far[:, 1]})
    with pytest.raises(ValueError, match=r"far\.parquet: trajectory 'walk': the model's prediction is not finite at "
                                         r"step (\d+) \("):
        predict_file(run, src, tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"far\.parquet: trajectory 'walk': the model's forecast is not finite"):
        forecast_file(run, src, tmp_path / "f.parquet", steps=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["far.parquet"]
    # a fitted model likewise, in the units it was fitted on
    fitted = fit_model(test, model="psrnn", state_dim=4, obs_dim=4, n_features=64, horizon=2, epochs=0)
    z = (far - run.mean) / run.std
    assert np.isnan(predict(fitted.model, [z])[0]).any()
    fitted_out = r"\(the inputs up to there reach \S+ in absolute value, in the units fitted on: too far out"
    far_said = r"^trajectories: feature 0 reaches \S+ standard deviations from the training mean"   # before it fails
    for call in (fitted.predict, fitted.evaluate):
        with pytest.raises(ValueError, match=r"^trajectories\[1\]: the model's prediction is not finite at row \d+ "
                                             + fitted_out), pytest.warns(UserWarning, match=far_said):
            call([test[0], z])
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: the model's forecast is not finite at horizon 1"), \
            pytest.warns(UserWarning, match=far_said):
        fitted.forecast([z], 3)


@pytest.mark.filterwarnings("ignore:trajectories. feature 'a' reaches")
def test_a_refused_output_names_an_integer_trajectory_id_as_the_file_writes_it(continuous_run, tmp_path):
    """predict_file and forecast_file named the trajectory of a non-finite output by the repr of the numpy id,
    'trajectory np.int64(7)', where every other message (and the output's column) says 7."""
    run, test = continuous_run
    far = test[0] * run.std + run.mean
    far[:, 0] = (test[0][:, 0] * 1.5e38) * run.std[0] + run.mean[0]   # overflows the RFF encoder: NaN outputs
    src = _write(tmp_path / "far.parquet", {"trajectory": np.full(len(far), 7, dtype=np.int64),
                                            "a": far[:, 0], "b": far[:, 1]})
    with pytest.raises(ValueError, match=r"far\.parquet: trajectory 7: the model's prediction is not finite"):
        predict_file(run, src, tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"far\.parquet: trajectory 7: the model's forecast is not finite"):
        forecast_file(run, src, tmp_path / "f.parquet", steps=2)


def test_a_reserved_column_named_as_the_symbol_column_is_refused_naming_the_file_and_the_flag(discrete_run,
                                                                                              tmp_path):
    run, test = discrete_run
    src = _write(tmp_path / "in.parquet", {"trajectory": np.zeros(len(test[0]), dtype=np.int64),
                                           "symbol": np.array(run.vocab)[test[0]]})
    with pytest.raises(ValueError, match="^" + re.escape(
            f"{src}: the symbol column 'trajectory' is one of the reserved columns ['trajectory', 'step', 'split']; "
            "expected the column of symbols: name it with --symbol-column NAME (symbol_column= in Python)") + "$"):
        predict_file(run, src, tmp_path / "out.parquet", symbol_column="trajectory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


def test_a_diverging_forecast_is_named_as_the_models_not_blamed_on_ordinary_inputs(continuous_run):
    """A recurrence made unstable (the KF's A tripled) diverges as its own predictions are fed back: the error says
    so and how many steps stay finite, and does not blame inputs of ordinary size (FAR_OUT)."""
    import torch

    from pipeline.inference import FAR_OUT

    _, test = continuous_run
    fitted = fit_model(test, model="kf", state_dim=2, horizon=3, epochs=0, device="cpu")
    with torch.no_grad():
        fitted.model.A.mul_(3)
    assert np.abs(np.concatenate(test)).max() < FAR_OUT
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: the model's forecast is not finite at horizon (\d+): "
                                         r"fed its own predictions, it diverges \(an unstable recurrence\), from "
                                         r"inputs of ordinary size; expected at most (\d+) steps") as err:
        fitted.forecast(test, 400)
    horizon, steps = (int(g) for g in re.search(r"horizon (\d+).*at most (\d+)", str(err.value)).groups())
    assert steps == horizon - 1 and np.isfinite(np.stack(fitted.forecast(test[:1], steps))).all()


def test_a_discrete_forecast_of_logits_that_are_not_finite_is_refused_not_symbol_0(discrete_run, tmp_path):
    """A discrete model whose weights are not finite gives NaN logits; predict refused them, but a forecast took
    the argmax of NaN distributions, symbol 0, fed it back and wrote it with probability NaN (and --score scored
    it). Every forecast path now refuses it as a continuous forecast's is, naming the trajectory, leaving no
    output."""
    import copy

    import torch

    run, test = discrete_run
    broken = dataclasses.replace(run, model=copy.deepcopy(run.model))
    with torch.no_grad():
        next(broken.model.parameters()).fill_(float("nan"))
    symbols = [np.array(run.vocab)[t] for t in test]
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: the model's prediction is not finite at row 0"):
        broken.predict(symbols[:1])
    said = r"the model's forecast is not finite at horizon 1, from inputs of ordinary size"
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: " + said):
        broken.forecast(symbols[:2], 3)
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: " + said):
        broken.forecast(symbols[:1], 3, sample=True)
    n = [len(t) for t in symbols]
    src = _write(tmp_path / "in.parquet", {"trajectory": np.repeat(np.arange(len(n)), n),
                                           "symbol": np.concatenate(symbols)})
    for score in (False, True):
        with pytest.raises(ValueError, match=r"in\.parquet: trajectory 0: " + said):
            forecast_file(broken, src, tmp_path / "f.parquet", steps=3, score=score)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]
    assert all(np.isfinite(p).all() for _, p in run.forecast(symbols, 3))   # the fixture's own run is untouched


def test_inputs_far_outside_the_training_data_are_used_but_said(continuous_run, tmp_path, capsys):
    """A feature in other units (x 100, some hundred training standard deviations out) gives predictions all the
    same, which are extrapolations: TrainedRun warns naming the feature, predict_file records it in its summary
    and psrnn predict / forecast say it on stderr; inputs within FAR_FROM_TRAINING say nothing."""
    import warnings

    from pipeline.inference import FAR_FROM_TRAINING, far_from_training, forecast_file

    run, test = continuous_run
    raw = [z * run.std + run.mean for z in test]
    assert far_from_training(test, run.features) is None and np.abs(np.concatenate(test)).max() < FAR_FROM_TRAINING
    far = [r.copy() for r in raw]
    far[1][:, 1] *= 100   # feature 'b' in other units
    said = r"feature 'b' reaches \S+ standard deviations from the training mean: far outside the data the model " \
           r"was trained on \(other units\?\), where its predictions are extrapolations"
    for call in (lambda: run.predict(far), lambda: run.evaluate(far), lambda: run.forecast(far, 2)):
        with pytest.warns(UserWarning, match="^trajectories: " + said + "$"):
            call()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run.predict(raw)   # within the training range: no warning
    src = _project(tmp_path, run, test)   # the run's own test split, in a project
    moved = _write(tmp_path / "far.parquet", {"trajectory": np.repeat(np.arange(len(far)), [len(f) for f in far]),
                                              "a": np.concatenate(far)[:, 0], "b": np.concatenate(far)[:, 1]})
    summary = predict_file(run, moved, tmp_path / "p.parquet")
    assert re.fullmatch(said, summary["far_from_training"])
    assert "far_from_training" not in predict_file(run, src, tmp_path / "p0.parquet")
    assert re.fullmatch(said, forecast_file(run, moved, tmp_path / "f.parquet", steps=2)["far_from_training"])
    for stage, extra in (("predict", []), ("forecast", ["--steps", "2"])):
        status, err = _cli(capsys, tmp_path, stage, "lgssm", "psrnn", "0", str(moved), str(tmp_path / "o.parquet"),
                           "--initial", *extra)
        assert status == 0 and re.search(rf"psrnn {stage}: warning: {re.escape(str(moved))}: " + said, err), err


def test_a_damaged_checkpoint_of_a_finished_run_names_the_refine_that_trains_it_again(tmp_path):
    """predict and evaluate said "delete it and rerun refine" where `psrnn runs` said refine trains it again:
    refine does (a damaged run is trained again), so the command is named, not a deletion."""
    from pipeline.workflow.evaluate import load_finished

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError) as err:
        load_finished(path, "hmm", "psrnn", 1)
    assert str(err.value) == (f"{path}: not a readable checkpoint; refine trains the run again (psrnn refine hmm "
                              "psrnn 1)")


def test_the_file_functions_refuse_discrete_options_for_a_continuous_run(continuous_run, tmp_path):
    """predict_file(probabilities=True) on a continuous run wrote a file without probabilities, and symbol_column
    and unknown='drop' were ignored, where psrnn predict and forecast refuse --probabilities, --symbol-column and
    --unknown; their defaults (also given explicitly) pass."""
    from pipeline.inference import forecast_file, predict_file

    crun, _ = continuous_run
    src = _write(tmp_path / "in.parquet", {"trajectory": [0, 0, 0, 0], "a": [1.0, 2.0, 3.0, 4.0],
                                           "b": [0.0, 1.0, 0.0, 1.0]})
    out = tmp_path / "out.parquet"
    for option, shown in ((dict(probabilities=True), "probabilities=True"),
                          (dict(symbol_column="a"), "symbol_column='a'"),
                          (dict(unknown="drop"), "unknown='drop'")):
        expected = "^" + re.escape(f"{shown}: applies to discrete runs only, and this one is continuous; expected "
                                   "the default (leave it out)") + "$"
        with pytest.raises(ValueError, match=expected):
            predict_file(crun, src, out, **option)
        with pytest.raises(ValueError, match=expected):
            forecast_file(crun, src, out, steps=1, **option)
        assert not out.exists()
    predict_file(crun, src, out, probabilities=False, symbol_column=None, unknown="error")
    assert pq.read_table(out).num_rows == 4
    forecast_file(crun, src, out, steps=2, probabilities=False)
    assert pq.read_table(out).num_rows == 2


def test_a_sampled_forecasts_draws_do_not_depend_on_the_trajectories_left_out(discrete_run, tmp_path):
    """With --score (or --unknown drop), a trajectory too short to score (or emptied) was left out before the draws,
    so every later trajectory took the stream of the one before it: its draws changed with what came earlier in
    the file. Each trajectory draws from the stream of its position among the file's trajectories."""
    from pipeline.inference import forecast_file

    drun, dtest = discrete_run
    symbols = [np.array(drun.vocab, dtype=object)[t] for t in dtest[:3]]

    def frame(first):
        pieces = [first, symbols[1][:30], symbols[2][:30]]
        return {"trajectory": np.repeat([0, 1, 2], [len(p) for p in pieces]),
                "symbol": np.concatenate(pieces).astype(str)}

    def draws(columns, **options):
        out = tmp_path / "fc.parquet"
        forecast_file(drun, _write(tmp_path / "in.parquet", columns), out, steps=5, sample=True, seed=7, **options)
        table = pq.read_table(out).to_pandas()
        return {t: list(g["predicted"]) for t, g in table.groupby("trajectory")}

    whole = draws(frame(symbols[0][:30]), score=True)
    short = draws(frame(symbols[0][:3]), score=True)        # trajectory 0 is left out: too short to score
    assert set(short) == {1, 2} and all(short[t] == whole[t] for t in (1, 2))
    unknown = np.array(["99", "98"], dtype=object)          # trajectory 0 is left out: every symbol dropped
    assert draws(frame(unknown), unknown="drop").items() >= {t: draws(frame(symbols[0][:30]))[t]
                                                              for t in (1, 2)}.items()


def test_standardised_check_runs_in_blocks(monkeypatch):
    """_check_standardised standardises the file's rows a block at a time: its temporaries (~3 copies of the
    features) are a block's, not the file's (3.2M rows x 20 features: psrnn predict's peak 1017 -> 659 MiB over
    the model), and the error names the same first row and column wherever the blocks fall."""
    import tracemalloc
    from types import SimpleNamespace

    import pipeline.inference as inference

    run = SimpleNamespace(mean=np.array([1.0, 2.0, 3.0]), std=np.array([2.0, 0.5, 1.0]), features=["a", "b", "c"],
                          dataset="d")
    n = 1_000_000
    values = np.random.default_rng(0).standard_normal((n, 3))
    rows = SimpleNamespace(values=values, ids=np.array(["u", "v"]), groups=[np.arange(n // 2), np.arange(n // 2, n)])
    tracemalloc.start()
    try:
        inference._check_standardised(run, Path("f.parquet"), rows)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * values.nbytes, peak / values.nbytes   # was ~2x (whole-file temporaries)
    values[150_001, 2] = 1e308
    values[150_002, 0] = -1e308
    values[900_000, 1] = np.inf
    for block in (7, 1 << 16, n):
        monkeypatch.setattr(inference, "_CHECK_BLOCK_ROWS", block)
        with pytest.raises(ValueError, match=r"feature column 'c' overflows .* first: row 150001, trajectory 'u'\)"):
            inference._check_standardised(run, Path("f.parquet"), rows)
