"""pipeline.api beyond plain arrays, and what a fitted model keeps: arguments a model would ignore are refused,
saved files carry a digest and their dtype, frames and dicts are read by column name, strings are symbols,
``kind=`` says how to read numbers, a too-short train split is named before 2SR, a diverged fit keeps its
history, and a fit that ends worse than its 2SR initialisation says so. Every fit here is tiny (a few states,
0-2 epochs)."""

import math
import re
import warnings

import numpy as np
import pytest
import torch

import pipeline.api
import pipeline.train
from pipeline.api import FittedModel, fit_model, load_fitted, worse_by
from pipeline.train import TrainingDiverged

from conftest import SMALL, refused

ZERO = {**SMALL, "epochs": 0}


def _same(a, b):
    """Two lists of predictions, bit for bit."""
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b))


@pytest.fixture
def quiet():
    """No warnings shown from the tiny fits (lr=0.1 on 6 short trajectories may end worse than 2SR)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# --------------------------------------------------------------------------------- 1. arguments a model ignores

@pytest.mark.parametrize("argument, message", [
    ({"model": "kf", "n_layers": 3}, "n_layers=3: the Kalman filter has one state, no layers to stack; leave it out "
                                     "(psrnn, lstm, gru and rnn stack layers)"),
    ({"model": "lstm", "bias_scale": 0.1}, "bias_scale=0.1: the PSRNN bias is bias_scale × the mean unnormalised "
                                           "2SR update; lstm has no such bias, leave it out"),
    ({"model": "gru", "bias_scale": 0.0}, "bias_scale=0.0: the PSRNN bias is bias_scale × the mean unnormalised "
                                          "2SR update; gru has no such bias, leave it out"),
    ({"model": "kf", "bias_scale": 0.1}, "bias_scale=0.1: the PSRNN bias is bias_scale × the mean unnormalised "
                                         "2SR update; kf has no such bias, leave it out"),
    ({"init": "random", "bias_scale": 0.1}, "bias_scale=0.1: the PSRNN bias is bias_scale × the mean "
                                            "unnormalised 2SR update; psrnn init='random' sets its bias to zero, "
                                            "leave it out"),
    ({"model": "rnn", "decoder_input": "all"}, "decoder_input='all': the skip connections of a multilayer PSRNN; "
                                               "rnn's decoder reads its top layer, leave it out"),
    ({"model": "kf", "decoder_input": "all"}, "decoder_input='all': the skip connections of a multilayer PSRNN; kf's "
                                              "decoder reads its top layer, leave it out"),
    ({"decoder_input": "all"}, "decoder_input='all': reads every layer's state, and n_layers=1 has one layer (the "
                               "same as 'top'); expected n_layers >= 2, or leave it out"),
    ({"decoder_input": "bottom"}, "decoder_input='bottom': expected 'top' (the decoder reads the top layer's state) "
                                  "or 'all' (every layer's)"),
    ({"kind": "symbols"}, "kind='symbols': expected 'auto' (integer 1-D arrays and strings are symbols, the rest "
                          "features), 'discrete' or 'continuous'"),
])
def test_arguments_a_model_would_ignore_arerefused(argument, message, features, no_work):
    """fit_model(model='kf', n_layers=3) built a one-layer filter and recorded n_layers=3; bias_scale was recorded
    for models without that bias; decoder_input='all' meant 'top' for one layer."""
    refused(message, fit_model, features.train, **{**SMALL, "state_dim": 2, **argument})


def test_what_the_models_do_use_still_fits(symbols, features, quiet):
    """The RNN baselines stack layers (torch's num_layers); a two-layer PSRNN takes decoder_input='all'."""
    lstm = fit_model(symbols.train, model="lstm", n_layers=2, **ZERO)
    assert lstm.model.config.n_layers == 2 and lstm.model.rnn.num_layers == 2
    skip = fit_model(symbols.train, n_layers=2, decoder_input="all", **ZERO)
    assert skip.model.decoder.in_features == 2 * 3
    factorized = fit_model(symbols.train, model="factorized_psrnn", rank=4, bias_scale=0.2, **ZERO)
    # how far the CP start is from the 2SR tensor, per layer: the factors' own reconstruction, recomputed
    from pipeline.decompose import cp_decompose

    (error,) = factorized.extras["cp_relative_error"]
    W = factorized.two_stage.layers[0].W
    assert error == pytest.approx(cp_decompose(W, 4, seed=0).relative_error) and 0 <= error < 1
    assert skip.extras["cp_relative_error"] is None
    assert fit_model(features.train, model="kf", **{**ZERO, "state_dim": 2}).model.config.n_layers == 1


# ----------------------------------------------------------------------------- 2. and 3. the saved file

def test_a_damaged_file_never_loads_silently(symbols, tmp_path, quiet):
    """A byte flipped anywhere in a saved model either makes load_fitted raise a ValueError or changes nothing the
    model computes: without the digest, dozens of the offsets below loaded with other predictions."""
    fitted = fit_model(symbols.train, symbols.test, **{**SMALL, "n_features": 16})
    path = tmp_path / "m.pt"
    fitted.save(path)
    expected = fitted.predict(symbols.test)
    raw = path.read_bytes()
    damaged, n_refused, same = tmp_path / "damaged.pt", 0, 0
    for offset in range(0, len(raw), 7):
        flipped = bytearray(raw)
        flipped[offset] ^= 0xFF
        damaged.write_bytes(bytes(flipped))
        try:
            again = load_fitted(damaged)
        except ValueError as exc:
            assert str(exc).startswith(f"{damaged}: ") and "\n" not in str(exc)
            n_refused += 1
            continue
        assert _same(again.predict(symbols.test), expected), f"byte {offset} changed the predictions silently"
        same += 1
    assert n_refused > 50 and same > 0, (n_refused, same)

    # a number of the payload changed and the file written again whole: only the digest tells
    ck = torch.load(path, weights_only=True)
    key = next(iter(ck["model"]))
    ck["model"][key] = ck["model"][key].clone()
    ck["model"][key].view(-1)[0] += 1e-3
    torch.save(ck, damaged)
    refused(f"{damaged}: damaged: its contents do not match the digest written with it", load_fitted, damaged)
    ck = torch.load(path, weights_only=True)
    ck["history"][0]["test"]["bpc"] = 0.0
    torch.save(ck, damaged)
    refused(f"{damaged}: damaged: its contents do not match the digest written with it", load_fitted, damaged)


def test_files_of_format_v1_still_load(symbols, tmp_path, quiet):
    """v1 files (no digest, no dtype) load unverified, in their weights' dtype; a v1 label on a file with a
    digest is a v2 file whose label was damaged."""
    fitted = fit_model(symbols.train, symbols.test, **SMALL)
    fitted.save(tmp_path / "m.pt")
    ck = torch.load(tmp_path / "m.pt", weights_only=True)
    assert ck["format"] == "psrnn-pipeline fitted model v2" and ck["dtype"] == "float32"
    assert re.fullmatch(r"[0-9a-f]{64}", ck["digest"])
    ck["format"] = "psrnn-pipeline fitted model v1"
    torch.save(ck, tmp_path / "labelled.pt")
    refused(f"{tmp_path / 'labelled.pt'}: not a fitted model written by FittedModel.save (format "
             "'psrnn-pipeline fitted model v1', expected 'psrnn-pipeline fitted model v2')", load_fitted,
             tmp_path / "labelled.pt")
    del ck["digest"], ck["dtype"]
    torch.save(ck, tmp_path / "v1.pt")
    again = load_fitted(tmp_path / "v1.pt")
    assert _same(again.predict(symbols.test), fitted.predict(symbols.test)) and again.history == fitted.history


def test_a_training_checkpoint_says_how_to_load_its_run(symbols, tmp_path, quiet):
    """A run's checkpoint.pt given to load_fitted was refused as "format None, expected 'psrnn-pipeline fitted
    model v2'", not saying what the file is or what loads it: now it names the load_run call of that run."""
    from pipeline.train import TrainConfig, fit

    fitted = fit_model(symbols.train, symbols.test, **{**SMALL, "epochs": 0})
    run_dir = tmp_path / "my project" / "models" / "custom_events" / "psrnn" / "s3"
    fit(fitted.model, symbols.train, symbols.test, TrainConfig(epochs=1, bptt=5, batch_size=2),
        checkpoint_path=run_dir / "checkpoint.pt")
    root = tmp_path / "my project"
    refused(f"{run_dir / 'checkpoint.pt'}: a training checkpoint (pipeline.train.fit, the refine stage), not a model "
            f"file of FittedModel.save; load a trained run with pipeline.inference.load_run({str(root)!r}, "
            f"'custom_events', 'psrnn', 3) (or psrnn --root '{root}' predict custom_events psrnn 3 ...)",
            load_fitted, run_dir / "checkpoint.pt")
    (tmp_path / "elsewhere.pt").write_bytes((run_dir / "checkpoint.pt").read_bytes())
    refused(f"{tmp_path / 'elsewhere.pt'}: a training checkpoint (pipeline.train.fit, the refine stage), not a "
            "model file of FittedModel.save; load a trained run with pipeline.inference.load_run(root, dataset, "
            "variant, seed) (or psrnn predict)", load_fitted, tmp_path / "elsewhere.pt")


def test_saved_models_load_in_their_own_dtype(symbols, features, tmp_path, quiet):
    """A float32 model loaded under a float64 default was rebuilt in float64 (predictions ~1e-7 off), a float64
    one under float32 in float32: each now loads in its own dtype, bit for bit, and the default is left alone."""
    previous = torch.get_default_dtype()
    float32 = fit_model(symbols.train, symbols.test, **SMALL)
    float32.save(tmp_path / "f32.pt")
    try:
        torch.set_default_dtype(torch.float64)
        float64 = fit_model(features.train, features.test, **SMALL)
        assert next(float64.model.parameters()).dtype == torch.float64
        float64.save(tmp_path / "f64.pt")
        again = load_fitted(tmp_path / "f32.pt")
        assert torch.get_default_dtype() == torch.float64
        assert {p.dtype for p in again.model.parameters()} == {torch.float32}
        assert _same(again.predict(symbols.test), float32.predict(symbols.test))
        expected64 = float64.predict(features.test)
    finally:
        torch.set_default_dtype(previous)
    again = load_fitted(tmp_path / "f64.pt")
    assert torch.get_default_dtype() == previous
    assert {p.dtype for p in again.model.parameters()} == {torch.float64}
    assert _same(again.predict(features.test), expected64)


# ----------------------------------------------------------------------------------------- 4. named columns

def test_frames_are_read_by_column_name(features, tmp_path, quiet):
    """Fitted on frames [a, b], a frame [b, a] was read by position: other predictions, silently. Dicts of columns
    failed with a dtype-object error. Both are read by name now, extra columns ignored; plain arrays stay
    positional."""
    pd = pytest.importorskip("pandas")
    frames = [pd.DataFrame({"a": t[:, 0], "b": t[:, 1]}) for t in features.train]
    fitted = fit_model(frames, [pd.DataFrame({"b": t[:, 1], "a": t[:, 0], "c": 0.0}) for t in features.test],
                       **SMALL)
    assert fitted.extras["columns"] == ["a", "b"]
    reference = fit_model(features.train, features.test, **SMALL)
    assert [{**h, "seconds": 0} for h in fitted.history] == [{**h, "seconds": 0} for h in reference.history]
    plain = fitted.predict(features.test)
    swapped = [pd.DataFrame({"b": t[:, 1], "a": t[:, 0]}) for t in features.test]
    columns = [{"b": list(t[:, 1]), "extra": np.zeros(len(t)), "a": t[:, 0]} for t in features.test]
    for given in (swapped, columns):
        assert _same(fitted.predict(given), plain)
        assert fitted.evaluate(given) == fitted.evaluate(features.test)
        assert _same(fitted.forecast(given, 3), fitted.forecast(features.test, 3))
    fitted.save(tmp_path / "m.pt")
    assert _same(load_fitted(tmp_path / "m.pt").predict(swapped), plain)

    refused("trajectories[1]: no column 'a' (columns present: 'b', 'c'); expected the columns of the model: 'a', "
             "'b'", fitted.predict, [swapped[0], pd.DataFrame({"b": [1.0, 2.0], "c": [0.0, 0.0]})])
    refused("test[0]: no column 'b' (columns present: 'a'); expected the columns of train[0]: 'a', 'b'",
             fit_model, frames, [{"a": np.zeros(5)}], **SMALL)
    refused("train[1]: named columns 'a', 'b', but train[0] has no column names (plain arrays, read by position); "
             "expected an array with the columns in train[0]'s order, e.g. frame.to_numpy()", fit_model,
             [features.train[0], frames[1]], **SMALL)
    refused("trajectories[0]: named columns 'b', 'a', but the model has no column names (plain arrays, read by "
             "position); expected an array with the columns in the model's order, e.g. frame.to_numpy()",
             reference.predict, swapped)
    refused("trajectories[0]: columns of different lengths ('a' 2, 'b' 3); expected one value per step in each",
             fitted.predict, [{"a": [1.0, 2.0], "b": [1.0, 2.0, 3.0]}])


def test_a_column_of_symbols_is_a_trajectory_of_symbols(symbols, quiet):
    """One named column is a 1-D trajectory: integers (or strings) in it are symbols, read by name."""
    fitted = fit_model([{"symbol": t} for t in symbols.train], **ZERO)
    assert fitted.model.config.discrete and fitted.extras["columns"] == ["symbol"]
    assert _same(fitted.predict([{"other": t[::-1], "symbol": t} for t in symbols.test]),
                 fitted.predict(symbols.test))


def test_a_column_of_symbols_beside_others_is_named(symbols, no_work):
    """{"sym": strings, "other": ints} failed with "strings of shape (9, 2)", naming neither column; several
    columns with kind='discrete' with "shape (9, 2)"."""
    text = np.array(list("abcabcabc"))
    refused("train[0]: strings in column 'sym' of the 2 columns 'sym', 'other'; expected one column, the symbols "
            "(e.g. {'sym': ...}, or frame[['sym']]), or numeric feature columns only", fit_model,
            [{"sym": text, "other": np.arange(9)}], **SMALL)
    refused("test[0]: strings in column 'label' of the 2 columns 'x', 'label'; expected one column, the symbols "
            "(e.g. {'label': ...}, or frame[['label']]), or numeric feature columns only", fit_model,
            [{"x": np.zeros(9), "label": np.zeros(9)}], [{"x": np.zeros(9), "label": text}], **SMALL)
    refused("train[0]: 2 named columns 'sym', 'other'; kind='discrete' reads one column of symbols; expected only "
            "the symbol column, one of them (frame[[name]], or {name: values})", fit_model,
            [{"sym": symbols.train[0], "other": np.arange(40)}], kind="discrete", **SMALL)


def test_a_str_given_to_a_model_of_words_says_it_is_read_as_characters(quiet):
    """A model fitted on lists of word symbols, given "idle" (one symbol meant): it was refused as "symbol 'i' ...
    not in the model's vocabulary", with no word of why; now the error says a str is its characters."""
    rng = np.random.default_rng(0)
    words = np.array(["click", "idle", "scroll"])
    train = [list(words[rng.integers(0, 3, 40)]) for _ in range(4)]
    fitted = fit_model(train, **{**SMALL, "epochs": 0})
    for call in (fitted.predict, fitted.evaluate, lambda t: fitted.forecast(t, 2)):
        with pytest.raises(ValueError, match=r"^trajectories\[1\]: symbol 'i' at step 0 is not in the model's "
                                             r"vocabulary \('click', 'idle', 'scroll'\); expected symbols seen when "
                                             r"fitting \(in train, valid or test\); a str trajectory is read as its "
                                             r"characters, and this model's symbols are not all single characters: "
                                             r"pass a list of symbols, e.g. \['idle'\] for one$"):
            call([["idle", "click"], "idle"])
    # a model of characters reads a str as its characters, as documented: no hint there
    chars = fit_model(["abcabcabcabc" * 4] * 3, **{**SMALL, "epochs": 0})
    assert chars.predict(["abca"])[0].shape == (4, 3)
    with pytest.raises(ValueError, match=r"symbol 'z' at step 1 is not in the model's vocabulary \('a', 'b', 'c'\); "
                                         r"expected symbols seen when fitting \(in train, valid or test\)$"):
        chars.predict(["azb"])


def test_a_model_with_feature_columns_names_a_column_of_strings(features, quiet):
    fitted = fit_model([{"a": t[:, 0], "b": t[:, 1]} for t in features.train], **ZERO)
    refused("trajectories[0]: column 'b' holds strings; expected numbers in the model's feature columns 'a', 'b'",
            fitted.predict, [{"a": np.zeros(3), "b": np.array(["x", "y", "z"])}])


def test_boolean_arrays_are_symbols_as_inference_reads_them(quiet):
    """kind='auto' fitted a boolean array as a continuous 0/1 feature, while inference (TrainedRun, predict_file)
    reads a boolean column as the symbols False and True."""
    rng = np.random.default_rng(0)
    flags = [rng.random(40) < 0.3 for _ in range(4)]
    fitted = fit_model(flags, **ZERO)
    assert fitted.model.config.discrete and fitted.model.config.input_dim == 2
    as_ints = [f.astype(np.int64) for f in flags]
    assert [{**h, "seconds": 0} for h in fitted.history] == \
        [{**h, "seconds": 0} for h in fit_model(as_ints, **ZERO).history]
    assert _same(fitted.predict(flags[:1]), fitted.predict(as_ints[:1]))
    assert fitted.forecast(flags[:1], 3)[0].dtype == np.int64
    assert fit_model([np.array([True, False] * 20)], **ZERO).model.config.discrete
    assert not fit_model(flags, kind="continuous", **ZERO).model.config.discrete
    refused("train[1]: continuous features (a float64 array of shape (40,)), but train[0] holds discrete symbols (a "
            "boolean 1-D array); expected one kind in train, valid and test: integer 1-D arrays (symbols) or float "
            "arrays (features)", fit_model, [flags[0], np.zeros(40)], **SMALL)


# --------------------------------------------------------------------------------------------- 5. strings

def test_strings_are_symbols(tmp_path, quiet):
    """fit_model(["a text string"]) and lists or arrays of str failed (dtype <U1 / object): strings are symbols
    now, a str trajectory its characters, mapped by the sorted vocabulary of every split."""
    text = "the cat sat on the mat and the rat sat on the hat " * 3
    train = [text, list(text[::-1]), np.array(list(text[5:]))]
    test = [np.array(list("a bat sat"), dtype=object)]
    with pytest.warns(UserWarning, match=r"^test: symbol 'b' never seen in train; "):
        fitted = fit_model(train, test, **SMALL)
    vocab = sorted(set(text) | {"b"})
    assert fitted.extras["vocab"] == vocab and fitted.model.config.input_dim == len(vocab)
    assert fitted.model.config.discrete
    indices = [np.searchsorted(vocab, list("the rat"))]
    assert _same(fitted.predict(["the rat"]), fitted.predict([list("the rat")]))
    assert _same(fitted.predict(["the rat"]), pipeline.train.predict(fitted.model, indices))
    from pipeline.naive import naive_metrics

    naive = naive_metrics([np.searchsorted(vocab, list(t)) for t in train], indices, discrete=True,
                          vocab_size=len(vocab))   # train's frequencies (and of each symbol's successor), same steps
    unigram, bigram = naive["unigram"], naive["bigram"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # worse than a yardstick, or not: the numbers are the test
        assert fitted.evaluate(["the rat"]) == {**pipeline.train.evaluate(fitted.model, indices),
                                                "unigram_bpc": unigram["bpc"], "unigram_accuracy": unigram["accuracy"],
                                                "bigram_bpc": bigram["bpc"], "bigram_accuracy": bigram["accuracy"]}
    (forecast,) = fitted.forecast(["the c"], 4)
    assert forecast.dtype.kind == "U" and len(forecast) == 4 and set(forecast) <= set(vocab)
    fitted.save(tmp_path / "m.pt")
    again = load_fitted(tmp_path / "m.pt")
    assert again.extras["vocab"] == vocab and list(again.forecast(["the c"], 4)[0]) == list(forecast)
    assert again.extras["train_pairs"] == fitted.extras["train_pairs"]   # saved: the yardstick of a loaded model

    refused("trajectories[1]: symbol 'z' at step 2 is not in the model's vocabulary (' ', 'a', 'b', 'c', 'd', "
             "'e', 'h', 'm', 'n', 'o', ... (13 in all)); expected symbols seen when fitting (in train, valid or "
             "test)", fitted.predict, ["the", "a z"])
    refused("trajectories[0]: discrete symbols (an integer 1-D array), but the model was fitted on strings; "
             "expected strings of its vocabulary (' ', 'a', 'b', 'c', 'd', 'e', 'h', 'm', 'n', 'o', ... (13 in "
             "all))", fitted.evaluate, [np.array([0, 1, 2])])
    ints = fit_model([np.array([0, 1, 2, 1] * 5)], **ZERO)
    refused("trajectories[0]: strings (an array of dtype <U1); expected integer symbols (the model was fitted on "
             "integers, not strings)", ints.predict, ["ab"])


def test_strings_and_numbers_are_not_mixed(no_work):
    refused("train[1]: discrete symbols (an integer 1-D array), but train[0] holds strings (symbols); expected one "
             "kind of symbol in train, valid and test: strings (train[0]) or numbers (train[1]), not both (map one "
             "to the other first, e.g. [str(s) for s in t])", fit_model, ["abcabc", np.array([0, 1, 2, 0])],
             **SMALL)
    refused("test[0]: strings (symbols), but train[0] holds discrete symbols (an integer 1-D array); expected one "
             "kind of symbol in train, valid and test: strings (test[0]) or numbers (train[0]), not both (map one "
             "to the other first, e.g. [str(s) for s in t])", fit_model, [np.array([0, 1, 2, 0])], ["abc"],
             **SMALL)
    refused("train[1]: an array of dtype object (int 1 at step 1); expected integer symbols, float features or "
             "strings (one kind per trajectory)", fit_model, ["abcabc", np.array(["a", 1], dtype=object)],
             **SMALL)
    refused("train[0]: strings (an array of dtype <U1); kind='continuous' reads numbers; expected numeric arrays, "
             "or kind='auto' for symbols", fit_model, ["abcabc"], kind="continuous", **SMALL)


# ------------------------------------------------------------------------- 6. symbols seen only in valid/test

def test_symbols_never_seen_in_train_are_named_in_a_warning(symbols):
    """They still enlarge the vocabulary (symbols are indices 0 … V-1 of every split), but no longer silently."""
    train = [np.array([0, 1, 2, 1, 0] * 6)]
    with pytest.warns(UserWarning) as caught:
        fitted = fit_model(train, [np.array([0, 5, 1, 9])], valid=[np.array([3, 1, 0, 1])], **ZERO)
    (w,) = [w for w in caught if "never seen in train" in str(w.message)]
    assert str(w.message).startswith("valid and test: symbols 3, 5, 9 never seen in train; they are in the "
                                     "vocabulary (V = 10, from every split)") and w.filename == __file__
    assert fitted.model.config.input_dim == 10
    with pytest.warns(UserWarning, match=r"^test: symbols 'c', 'd', 'e', 'f', 'g' and 2 more never seen in train"):
        fit_model(["abab"], ["cdefghi"], **ZERO)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_model(symbols.train, symbols.test, **ZERO)   # every test symbol is in train: no warning


# ---------------------------------------------------------------------------------------- 7. kind=

def test_kind_says_how_to_read_numbers(features, no_work):
    """Integer measurements (counts, negative readings) were read as symbols: refused as symbols, or fitted as a
    discrete model. The symbol errors of kind='auto' now hint at kind='continuous'."""
    readings = [np.array([3, -2, 5, 0, -7, 1] * 5)]
    refused("train[0]: symbol -2 at step 1; expected integers from 0 to 2147483646 (indices into a vocabulary: map "
             "other ids to 0 … V-1) (measurements? pass kind='continuous')", fit_model, readings, **SMALL)
    refused("train[0]: symbol -2 at step 1; expected integers from 0 to 2147483646 (indices into a vocabulary: map "
             "other ids to 0 … V-1)", fit_model, readings, kind="discrete", **SMALL)
    refused("train[0]: 0.5 at step 1 is not an integer symbol; expected integer symbols (the model is discrete)",
             fit_model, [np.array([1.0, 0.5, 2.0])], kind="discrete", **SMALL)
    refused("train[0]: shape (40, 2); expected a 1-D array of symbols (the model is discrete)", fit_model,
             features.train, kind="discrete", **SMALL)


def test_kind_continuous_and_discrete_fit(symbols, quiet):
    readings = [np.array([3, -2, 5, 0, -7, 1] * 5), np.array([1, 2, 3, 2] * 6)]
    fitted = fit_model(readings, kind="continuous", **ZERO)
    assert not fitted.model.config.discrete and fitted.model.config.input_dim == 1
    assert fitted.predict(readings)[0].shape == (30, 1)
    as_floats = [t.astype(np.float64) for t in symbols.train]
    fitted = fit_model(as_floats, kind="discrete", **ZERO)
    assert fitted.model.config.discrete and fitted.model.config.input_dim == 4
    assert _same(fitted.predict(symbols.test), fit_model(symbols.train, **ZERO).predict(symbols.test))


# ----------------------------------------------------------------------------- 8. too short for the windows

def test_a_train_split_too_short_for_2sr_is_named_before_2sr(features, no_work):
    short = [t[:6] for t in features.train]
    refused("train: no trajectory is long enough for 2SR (one window): past_window 3 + horizon 3 + 1 = 7 steps, "
             "and the longest has 6; expected a trajectory of at least 7 steps, or a smaller past_window or horizon",
             fit_model, short, **{**SMALL, "horizon": 3, "past_window": 3})
    refused("train: no trajectory is long enough for 2SR (one window): past_window (= horizon) 3 + horizon 3 + 1 = "
             "7 steps, and the longest has 6; expected a trajectory of at least 7 steps, or a smaller past_window or "
             "horizon", fit_model, short, **{**SMALL, "horizon": 3})
    refused("train: no trajectory is long enough for the Kalman filter's linear 2SR (two consecutive windows): "
             "two_stage_options['past_window'] 2 + horizon 3 + 2 = 7 steps, and the longest has 6; expected a "
             "trajectory of at least 7 steps, or a smaller two_stage_options['past_window'] or horizon", fit_model,
             short, model="kf", two_stage_options={"past_window": 2}, **{**SMALL, "state_dim": 2, "horizon": 3})
    refused("train: no trajectory is long enough for 2SR (one window): past_window (= horizon) 2 + horizon 2 + 1 = "
             "5 steps, and the longest has 3; expected a trajectory of at least 5 steps, or a smaller past_window or "
             "horizon (train[0] has shape (3, 50): trajectories are (T, m), one row per step; transposed?)",
             fit_model, [np.random.default_rng(0).normal(size=(3, 50))], **{**SMALL, "horizon": 2})


def test_the_length_checks_are_2srs_own_conditions(features, quiet):
    """Each refusal is a case that fails inside 2SR too (past 2, future 3): no window in any trajectory
    (make_windows), a single window in all for the PSRNNs' 2SR (median kernel widths need two), no two
    consecutive windows for the KF's linear 2SR; the shortest data each allows fits."""
    from pipeline.features import make_windows
    from pipeline.two_stage import TwoStageConfig, linear_stage_one, multilayer_two_stage

    p, k, x = 2, 3, features.train[0]
    psrnn = {**ZERO, "state_dim": 2, "horizon": k, "past_window": p}
    kf = {**psrnn, "model": "kf"}
    fit_model([x[:p + k + 1], x[10:10 + p + k + 1]], **psrnn)   # one window each: two in all
    fit_model([x[:p + k + 2]], **psrnn)                          # two windows in one trajectory
    fit_model([x[:p + k + 2]], **kf)
    with pytest.raises(ValueError, match=r"^train: no trajectory is long enough for 2SR"):
        fit_model([x[:p + k]], **psrnn)
    with pytest.raises(ValueError, match="no trajectory is long enough"):
        make_windows([x[:p + k]], p, k, discrete=False)
    refused("train: one window for 2SR (past_window 2 + horizon 3 + 1 = 6 steps, in train[0] of 6); 2SR needs "
             "two (its kernel widths are median distances between windows): expected one more step or trajectory, "
             "or a smaller past_window or horizon", fit_model, [x[:p + k + 1], x[:4]], **psrnn)
    config = TwoStageConfig(state_dim=2, obs_dim=2, past_dim=2, n_features=32, past_window=p, future_window=k)
    with pytest.raises(ValueError, match="median pairwise distance needs at least 2 points"):
        multilayer_two_stage([x[:p + k + 1], x[:4]], config, discrete=False)
    with pytest.raises(ValueError, match=r"^train: no trajectory is long enough for the Kalman filter's"):
        fit_model([x[:p + k + 1], x[10:10 + p + k + 1]], **kf)
    with pytest.raises(ValueError, match="no two consecutive windows"):
        linear_stage_one([x[:p + k + 1], x[10:10 + p + k + 1]], state_dim=2, past_window=p, future_window=k,
                         ridge=1e-3)


# --------------------------------------------------------------------------------------- 9. training diverged

def test_a_diverged_fit_keeps_its_history_and_speaks_in_api_terms(features):
    """TrainingDiverged named params.yaml keys (train.max_loss, train.lr) and lost the epochs done."""
    with pytest.raises(TrainingDiverged) as caught:
        fit_model(features.train, features.test, train_options={"max_loss": 1e-6}, **SMALL)
    message = str(caught.value)
    assert message.startswith("training stopped at epoch 1, step 0: loss is ") and "train." not in message
    assert "above train_options['max_loss']=1e-06" in message and "raise train_options['max_loss']" in message
    assert "lower lr= (now 0.1) or clip= (now 0.25)" in message
    assert [h["epoch"] for h in caught.value.history] == [0] and caught.value.history[0]["test"]["mse"] > 0
    assert caught.value.model.config.model == "psrnn"


def test_every_divergence_message_is_translated():
    """The pipeline's messages (pipeline.train._diverged and the epoch-0 one) keep their params.yaml terms; the
    API's versions name fit_model's arguments only."""
    from pipeline.train import TrainConfig, _diverged

    cfg = TrainConfig(lr=0.5, clip=0.25)
    epoch0 = ("the initial model (epoch 0, before any update) gives a test mse of nan: its weights are not usable; "
              "check the settings that build them (model.*_bias_scale, two_stage, kf) and the data")
    for original in (_diverged(2, 5, "loss", math.nan, None, clip=0.25),
                     _diverged(2, 5, "gradient norm", math.inf, None, clip=0.0),
                     _diverged(2, 5, "loss", math.nan, None, clip=0.25, weight_decay=0.5),
                     _diverged(1, 0, "loss", 3e6, None, clip=0.25, advice="above train.max_loss=1e+06; if the data "
                               "are not normalised the loss may just be large: standardise them or raise "
                               "train.max_loss"),
                     epoch0):
        assert "train." in original or "model.*" in original
        translated = pipeline.api._divergence_in_api_terms(original, cfg)
        assert not re.search(r"train\.|model\.\*", translated), translated
        assert "lr=" in translated or "bias_scale=" in translated
    assert pipeline.api._divergence_in_api_terms(_diverged(2, 5, "gradient norm", math.inf, None, clip=0.0), cfg).endswith(
        "Lower lr= (now 0.5) or turn gradient-norm clipping on (clip=0.25, say).")


# ------------------------------------------------------------------------------- 10. worse than 2SR at the end

def test_worse_by_shows_a_run_just_past_the_threshold_as_past_it():
    """The refine note said '2.115 -> 2.335, 10% worse' of a run it named as more than 10% worse (10.4%)."""
    assert worse_by(2.115, 2.335) == "10.4% worse"
    assert worse_by(1.0, 1.15) == "15.0% worse" and worse_by(1.0, 1.25) == "25% worse"
    assert worse_by(1.0, 1.1996) == "20% worse" and worse_by(1.0, 1.1994) == "19.9% worse"   # not "20.0%"
    assert worse_by(0.01597, 0.08369) == "424% worse" and worse_by(-2.0, -1.0) == "50% worse"
    assert worse_by(0.0, 0.5) == "worse"


def test_a_fit_worse_than_its_2sr_start_warns(features, symbols):
    """SGD at lr=1 on a small set can end far worse than the 2SR initialisation; the returned (last) weights
    were silently the worse ones."""
    args = {**SMALL, "epochs": 2, "lr": 5.0, "batch_size": 2}
    with pytest.warns(UserWarning) as caught:
        fitted = fit_model(features.train, features.test, **args)
    (w,) = [w for w in caught if "worse than its 2SR initialisation" in str(w.message)]
    first, last = fitted.history[0]["train"]["mse"], fitted.history[-1]["train"]["mse"]
    assert str(w.message) == (f"fit_model: the returned model (epoch 2) scores train mse {last:.4g}, "
                              f"{worse_by(first, last)} than its 2SR initialisation (epoch 0: "
                              f"{first:.4g}); BPTT made it worse: try a lower lr= (now 5), or "
                              "train_options={'restore_best': True} with valid=... to keep the best epoch's weights")
    assert w.filename == __file__
    # with valid given, which then scores the epochs, the advice is restore_best alone
    with pytest.warns(UserWarning, match=r"scores valid mse .* or train_options=\{'restore_best': True\} to keep "
                                         r"the best epoch's weights$"):
        fit_model(features.train, features.test, valid=features.test, **args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # the best epoch's weights are returned (by the valid score; its train score is then no worse than the
        # start here): nothing worse to warn about
        kept = fit_model(features.train, features.test, valid=features.test,
                         train_options={"restore_best": True}, **args)
        valid = [h["valid"]["mse"] for h in kept.history]
        # not the last epoch, which the run above warned of
        assert kept.epoch == valid.index(min(valid)) < len(valid) - 1
        # an LSTM's epoch 0 is Xavier noise, not a model to compare with
        fit_model(features.train, features.test, model="lstm", **args)
        fit_model(features.train, features.test, init="random", **args)


# ---------------------------------------------------------------------------------------------- 11. docs

def test_the_docstrings_say_what_they_should():
    doc = fit_model.__doc__
    for name in ("state_dim", "obs_dim", "n_features", "n_layers", "init", "batch_size", "clip", "kind"):
        assert f"``{name}``" in doc, name
    assert "number of parallel streams" in doc and "0 = off" in doc
    assert FittedModel.__doc__ and "``extras``" in FittedModel.__doc__
    assert "float32" in FittedModel.predict.__doc__ and "(T, V) logits" in FittedModel.predict.__doc__
    assert "units of the given arrays" in " ".join(FittedModel.evaluate.__doc__.split())
    assert "strings for a model fitted on strings" in " ".join(FittedModel.forecast.__doc__.split())


# ------------------------------------------------------------------------------------- a second review's cases

def test_numpy_numbers_in_the_arguments_save_and_load(features, tmp_path, quiet):
    """lr=np.float64(0.1) reached the train config as a numpy scalar, which torch.load(weights_only=True)
    refuses: the file saved but did not load. Saved values are plain Python now; what cannot be is refused on
    saving, naming where it is."""
    f = fit_model(features.train, features.test, **{**SMALL, "state_dim": np.int64(3), "epochs": np.int64(1),
                                                    "lr": np.float64(0.1), "bias_scale": np.float64(0.1)},
                  two_stage_options={"width_scale": np.float64(1.0)})
    f.extras["mine"] = np.arange(3)
    f.save(tmp_path / "m.pt")
    again = load_fitted(tmp_path / "m.pt")
    assert _same(f.predict(features.test), again.predict(features.test))
    assert type(again.extras["train_config"]["lr"]) is float and again.extras["mine"] == [0, 1, 2]
    f.extras["where"] = tmp_path
    with pytest.raises(ValueError, match=r"^extras\['where'\]: a PosixPath \("):
        f.save(tmp_path / "other.pt")
    assert not (tmp_path / "other.pt").exists()


def test_a_list_mixing_strings_and_numbers_isrefused(no_work):
    """np.asarray(["a", 1, 2.5]) is the strings "a", "1", "2.5": such a list is read as the object array it is."""
    refused("train[0]: an array of dtype object (int 1 at step 1); expected integer symbols, float features or "
             "strings (one kind per trajectory)", fit_model, [["a", 1, "b", 2.5] * 3], **SMALL)


def test_column_names_alike_as_text_arerefused(features, no_work):
    x = features.train[0]
    refused("train[0]: columns named alike: '1' (names are compared as text); expected distinct column names",
             fit_model, [{1: x[:, 0], "1": x[:, 1]}], **SMALL)


def test_infer_kind_checks_kind_and_load_fitted_names_its_device_argument(tmp_path):
    refused("kind='Discrete': expected 'auto' (integer 1-D arrays and strings are symbols, the rest features), "
             "'discrete' or 'continuous'", pipeline.api.infer_kind, [np.array([0.0, 1.0])], kind="Discrete")
    with pytest.raises(ValueError, match=r"^device='cpu:0': "):
        f = FittedModel(model=pipeline.api.initialise_model(
            pipeline.api.ModelConfig(model="lstm", discrete=False, input_dim=1, output_dim=1, state_dim=2,
                                     obs_dim=2, init="xavier")), history=[])
        f.save(tmp_path / "m.pt")
        load_fitted(tmp_path / "m.pt", device="cpu:0")


def test_the_worse_than_2sr_warning_survives_a_perfect_epoch_0():
    """An epoch-0 BPC of exactly 0 (a single symbol) made the percentage divide by zero."""
    model = pipeline.api.initialise_model(pipeline.api.ModelConfig(model="lstm", discrete=True, input_dim=1,
                                                                   output_dim=1, state_dim=2, obs_dim=2,
                                                                   init="xavier"))
    f = FittedModel(model=model, history=[{"epoch": 0, "train": {"bpc": 0.0}}, {"epoch": 1, "train": {"bpc": 0.5}}],
                    extras={"train_config": {"lr": 1.0}})
    with pytest.warns(UserWarning, match=r"scores train bpc 0\.5, worse than its 2SR initialisation \(epoch 0: 0\)"):
        pipeline.api._warn_if_worse_than_2sr(f, "train")


def test_a_test_split_worse_than_its_2sr_start_is_said_even_when_train_improved():
    """A PSRNN without a bias whose state turned to its mirror image on a test trajectory kept improving on train
    (the monitored split) and went from 0.59 to 1.56 test BPC without a word: the test split is compared too, and
    a bias is suggested for a PSRNN; nothing is said when test held, or when no test set was given."""
    model = pipeline.api.initialise_model(pipeline.api.ModelConfig(model="psrnn", discrete=True, input_dim=5,
                                                                   output_dim=5, state_dim=3, obs_dim=3,
                                                                   init="random"))
    history = [{"epoch": 0, "train": {"bpc": 0.57}, "test": {"bpc": 0.589}},
               {"epoch": 3, "train": {"bpc": 0.563}, "test": {"bpc": 1.564}}]
    f = FittedModel(model=model, history=history, extras={"train_config": {"lr": 1e-3}})
    with pytest.warns(UserWarning) as caught:
        pipeline.api._warn_if_worse_than_2sr(f, "train")
    (w,) = caught
    assert str(w.message).startswith(
        "fit_model: the returned model (epoch 3) scores test bpc 1.564, 166% worse than its 2SR initialisation "
        "(epoch 0: 0.589), while train bpc went from 0.57 to 0.563: training fits data that the test trajectories do "
        "not follow (without a bias a PSRNN's state can turn to its mirror image on some trajectories: "
        "bias_scale=0.1 breaks the symmetry); evaluate them one by one"), str(w.message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline.api._warn_if_worse_than_2sr(f, "train", test_given=False)   # "test" was train itself
        held = [{**history[0]}, {**history[1], "test": {"bpc": 0.6}}]
        pipeline.api._warn_if_worse_than_2sr(FittedModel(model=model, history=held, extras=f.extras), "train")


def test_a_2sr_start_no_better_than_the_training_mean_is_said():
    """Sines fitted at ridge 1e-4 gave a 2SR start that predicts the training mean (test MSE 1.000 standardised,
    repeating the last value 0.06) with no warning; at the default ridge it predicts (0.016) and nothing is said."""
    rng = np.random.default_rng(0)
    series = []
    for _ in range(13):
        t, phase = np.arange(150), rng.uniform(0, 6)
        series.append(np.c_[1013 + 5 * np.sin(0.2 * t + phase),
                            20 + 0.01 * np.cos(0.2 * t + phase) + 0.001 * rng.standard_normal(150)])
    args = dict(horizon=5, epochs=0, standardize=True, state_dim=6, obs_dim=6, n_features=200)
    with pytest.warns(UserWarning, match=r"^fit_model: the 2SR initialisation scores train mse 0\.99\d+, hardly "
                                         r"better than predicting the training mean \(1\): it learnt next to no "
                                         r"dynamics; try another ridge= \(now 0\.0001: "):
        fit_model(series[:10], series[10:], ridge=1e-4, **args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = fit_model(series[:10], series[10:], **args)
    assert fitted.evaluate(series[10:])["mse"] < 0.05
    # a constant series: the training mean scores 0 and leaves nothing to learn, nor to warn about ("hardly better
    # than predicting the training mean (0)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_model([np.full(50, 3.0) for _ in range(3)], epochs=0, state_dim=2, obs_dim=2, n_features=20)


def test_the_kalman_filters_ridge_is_kept_with_the_fit(features):
    """The KF's linear 2SR has no two_stage_config; its ridge, which changes the model, was recorded nowhere."""
    kf = fit_model(features.train, model="kf", ridge=0.5, **{**ZERO, "state_dim": 2})
    assert kf.extras["kf_ridge"] == 0.5 and kf.extras["two_stage_config"] is None
    assert fit_model(features.train, model="kf", **{**ZERO, "state_dim": 2}).extras["kf_ridge"] == \
        pipeline.api._KF_RIDGE
    assert fit_model(features.train, **ZERO).extras["kf_ridge"] is None


def test_restore_best_on_the_training_data_is_said(symbols):
    """restore_best (or lr_decay, patience) without valid= watches train: the epoch kept is the one that fits
    train best; said, and not with valid= given."""
    opts = dict(state_dim=3, obs_dim=3, n_features=32, horizon=1, epochs=1, lr=0.1, device="cpu")
    with pytest.warns(UserWarning, match=r"^fit_model: train_options \['restore_best'\] watch the training data "
                                         r"\(no valid= given\): "):
        fit_model(symbols.train, symbols.test, train_options={"restore_best": True}, **opts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_model(symbols.train[:4], symbols.test, valid=symbols.train[4:], train_options={"restore_best": True},
                  **opts)
    assert not [w for w in caught if "watch the training data" in str(w.message)]
    # no valid= and no test=: the test entries, which eval_train=False leaves monitored, are train's
    for options, why in (({"eval_train": False}, "no valid= given"),
                         ({"monitor": "test"}, "train_options['monitor']='test'")):
        with pytest.warns(UserWarning, match=r"^fit_model: train_options \['restore_best'\] watch the training data "
                                             rf"\({re.escape(why)}, and without test= the test entries are train's\)"):
            fit_model(symbols.train, train_options={"restore_best": True, **options}, **opts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_model(symbols.train, symbols.test, train_options={"restore_best": True, "eval_train": False}, **opts)
    assert not [w for w in caught if "watch the training data" in str(w.message)]
    # valid= given, but monitor='train' chosen: said as such, not as a missing valid=
    with pytest.warns(UserWarning, match=r"^fit_model: train_options \['restore_best'\] watch the training data "
                                         r"\(train_options\['monitor'\]='train', although valid= is given\): .*leave "
                                         r"monitor out \(auto: valid\)"):
        fit_model(symbols.train[:4], symbols.test, valid=symbols.train[4:],
                  train_options={"restore_best": True, "monitor": "train"}, **opts)


# ------------------------------------------------------------------------------------------- standardize=True

def test_standardize_fits_as_on_standardised_data_and_answers_in_the_data_units(features, tmp_path):
    """standardize=True is the same fit as on data standardised by hand (identical history) with predict and
    forecast mapped back to the data's units, evaluate's mse standardised (as the pipeline reports it) beside
    mse_data_units; no warning for features in large and small units; the units survive save / load."""
    scale, shift = np.array([300.0, 0.002]), np.array([1013.0, -5.0])
    train = [x * scale + shift for x in features.train]
    test = [x * scale + shift for x in features.test]
    stacked = np.concatenate(train)
    mean, std = stacked.mean(axis=0), stacked.std(axis=0)
    by_hand = {"train": [(x - mean) / std for x in train], "test": [(x - mean) / std for x in test]}
    kw = {**SMALL, "epochs": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # a units warning would fail here
        warnings.filterwarnings("ignore", message="fit_model: (layer|the returned model)")
        fitted = fit_model(train, test, standardize=True, **kw)
        plain = fit_model(by_hand["train"], by_hand["test"], **kw)
    assert fitted.history == [{**h, "seconds": f["seconds"]} for h, f in zip(plain.history, fitted.history)]
    assert np.allclose(fitted.extras["standardize"]["mean"], mean) and \
        np.allclose(fitted.extras["standardize"]["std"], std) and plain.extras["standardize"] is None
    for ours, theirs in zip(fitted.predict(test), plain.predict(by_hand["test"])):
        assert ours.dtype == np.float64   # float32 would hold only multiples of 8 near 1e8
        np.testing.assert_array_equal(ours, theirs.astype(np.float64) * std + mean)
    for ours, theirs in zip(fitted.forecast(test, 3), plain.forecast(by_hand["test"], 3)):
        np.testing.assert_allclose(ours, theirs * std + mean, rtol=1e-9)
    scores = fitted.evaluate(test)
    assert {k: scores[k] for k in ("mse", "last_value_mse")} == plain.evaluate(by_hand["test"])
    errors = [((p[:-1].astype(np.float64) - x[1:]) * std) ** 2 for p, x in zip(plain.predict(by_hand["test"]),
                                                                               by_hand["test"])]
    assert scores["mse_data_units"] == pytest.approx(float(np.concatenate(errors).mean()), rel=1e-9)
    # inputs in other units (x 1000) are used, and said: the feature, how far out
    other = [x * np.array([1000.0, 1.0]) for x in test]
    for call in (fitted.predict, fitted.evaluate, lambda t: fitted.forecast(t, 2)):
        with pytest.warns(UserWarning, match=r"^trajectories: feature 0 reaches \S+ standard deviations from the "
                                             r"training mean: far outside the data the model was trained on"):
            call(other)
    fitted.save(tmp_path / "m.pt")
    assert _same(load_fitted(tmp_path / "m.pt").predict(test), fitted.predict(test))
    # a standardisation of another width (a file written by hand, its digest made to match) is refused
    from pipeline.api import _fitted_digest

    raw = torch.load(tmp_path / "m.pt", weights_only=True)
    raw["extras"]["standardize"]["std"] = [1.0]
    raw["digest"] = _fitted_digest(raw)
    torch.save(raw, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=r"odd\.pt: its standardisation \(extras\['standardize'\]\) does not fit the "
                                         r"model: expected a finite mean and a positive std for each of its 2 features$"):
        load_fitted(tmp_path / "odd.pt")


def test_standardize_gives_a_constant_feature_std_1_whatever_the_rounding_of_its_mean_leaves():
    """0.3 in every train row has a computed std of about 1e-16, not 0: divided by it, a later 0.3 + 1e-9 would
    be millions of stds away and swamp the other feature's predictions."""
    from pipeline.api import _standardisation

    train = [np.stack([np.sin(0.3 * np.arange(200) + i), np.full(200, 0.3)], axis=1) for i in range(5)]
    assert np.concatenate(train)[:, 1].std() != 0.0          # what made std == 0 miss it
    units = _standardisation(train)
    assert units["std"][1] == 1.0 and units["mean"][1] == pytest.approx(0.3, abs=1e-14)
    assert 0.5 < units["std"][0] < 1.0
    nearly = [np.stack([t[:, 0], t[:, 1] + 1e-9 * (np.arange(200) % 2)], axis=1) for t in train]
    assert _standardisation(nearly)["std"][1] == pytest.approx(5e-10)   # a feature that varies keeps its std


def test_standardize_is_for_continuous_data_and_a_boolean(symbols, features, no_work):
    refused("standardize=True: standardises continuous features, and train holds discrete symbols; leave it out",
            fit_model, symbols.train, standardize=True, **SMALL)
    refused("standardize='yes': expected True or False", fit_model, features.train, standardize="yes", **SMALL)


def test_inputs_far_from_an_unstandardised_training_set_are_said_too(features, tmp_path):
    """Only a model fitted with standardize=True warned about inputs far outside its training data: one fitted on
    the data as given took values of 1e30 and returned finite, meaningless predictions in silence. Train's mean
    and std are kept (extras['train_spread'], saved with the model) and measure new inputs the same way."""
    import warnings

    from pipeline.api import load_fitted

    fitted = fit_model(features.train, **ZERO)
    spread = fitted.extras["train_spread"]
    x = np.concatenate(features.train)
    np.testing.assert_allclose(spread["mean"], x.mean(axis=0))
    np.testing.assert_allclose(spread["std"], x.std(axis=0))
    far = [t.copy() for t in features.test]
    far[0][:, 1] *= 1e6
    path = tmp_path / "model.pt"
    fitted.save(path)
    for model in (fitted, load_fitted(path)):
        for call in (lambda: model.predict(far), lambda: model.evaluate(far), lambda: model.forecast(far, 2)):
            with pytest.warns(UserWarning, match=r"^trajectories: feature 1 reaches \S+ standard deviations from "
                                                 r"the training mean"):
                call()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model.predict(features.test)   # within the training range: nothing said
    assert fit_model(features.train, **ZERO, standardize=True).extras["train_spread"] is None   # its own units
