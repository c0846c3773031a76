"""pipeline.api on bad input: fit_model checks every argument and trajectory before any 2SR work, and a fitted
model's predict / evaluate / forecast check theirs; each refusal is one ValueError naming the argument, the
trajectory index and what was expected (never an IndexError, a torch shape error, LinAlgError or a silent
truncation)."""

import re

import numpy as np
import pytest

import pipeline.api
import pipeline.train
from pipeline.api import fit_model, load_fitted
from pipeline.data.synthetic import make_hmm_dataset

from conftest import SMALL, refused

A_LIST = "expected a list of trajectories (arrays of shape (T,) or (T, m))"


@pytest.fixture(scope="module")
def discrete_fit(symbols):
    return fit_model(symbols.train, symbols.test, **SMALL)


@pytest.fixture(scope="module")
def continuous_fit(features):
    return fit_model(features.train, features.test, **SMALL)


# ------------------------------------------------------------------------------------ 1. one kind of trajectory

def test_integer_and_float_trajectories_are_not_mixed(no_work):
    """The floats were truncated to the integers and scored with accuracy 1.0."""
    ints, floats = np.array([0, 1, 2, 3] * 8), np.array([0.7, 1.9, 2.5, 3.99] * 8)
    refused("train[1]: continuous features (a float64 array of shape (32,)), but train[0] holds discrete symbols "
             "(an integer 1-D array); expected one kind in train, valid and test: integer 1-D arrays (symbols) or "
             "float arrays (features)", fit_model, [ints, floats], **SMALL)
    refused("train[1]: discrete symbols (an integer 1-D array), but train[0] holds continuous features (a float64 "
             "array of shape (32,)); expected one kind in train, valid and test: integer 1-D arrays (symbols) or "
             "float arrays (features) (measurements? pass kind='continuous')", fit_model, [floats, ints], **SMALL)
    refused("test[0]: continuous features (a float64 array of shape (32,)), but train[0] holds discrete symbols "
             "(an integer 1-D array); expected one kind in train, valid and test: integer 1-D arrays (symbols) or "
             "float arrays (features)", fit_model, [ints], [floats], **SMALL)
    refused("valid[0]: continuous features (a float64 array of shape (32, 1)), but train[0] holds discrete "
             "symbols (an integer 1-D array); expected one kind in train, valid and test: integer 1-D arrays "
             "(symbols) or float arrays (features)", fit_model, [ints], valid=[floats[:, None]], **SMALL)


def test_continuous_trajectories_have_one_width(features, no_work):
    wide = np.zeros((30, 3))
    refused("train[2]: 3 features per step (shape (30, 3)); expected 2, as train[0] has", fit_model,
             [features.train[0], features.train[1], wide], **SMALL)
    refused("test[1]: 3 features per step (shape (30, 3)); expected 2, as train[0] has", fit_model,
             features.train, [features.test[0], wide], **SMALL)
    refused("valid[0]: 1 feature per step (shape (30,)); expected 2, as train[0] has", fit_model,
             features.train, valid=[np.zeros(30)], **SMALL)


def test_one_feature_may_be_given_as_t_or_t_by_1(features):
    """(T,) and (T, 1) float arrays are the same width, and an integer (T, m) array is continuous too."""
    x = [t[:, 0] for t in features.train]
    fitted = fit_model(x[:3] + [t[:, None] for t in x[3:]], **{**SMALL, "epochs": 0})
    assert not fitted.model.config.discrete and fitted.model.config.input_dim == 1
    assert fitted.predict([x[0]])[0].shape == (40, 1)
    counts = [np.round(t * 10).astype(np.int64) for t in features.train]
    fitted = fit_model(counts, **{**SMALL, "epochs": 0})
    assert not fitted.model.config.discrete and fitted.model.config.input_dim == 2


# --------------------------------------------------------------------------------- 3. checked before any 2SR work

@pytest.mark.parametrize("train, message", [
    ([], f"train: empty; {A_LIST}, at least one"),
    ([np.zeros((30, 2, 2))], "train[0]: shape (30, 2, 2); expected an array of shape (T,) or (T, m), one row per "
                             "step"),
    ([np.zeros((30, 2)), np.zeros((0, 2))], "train[1]: an empty trajectory; expected at least one observation"),
    ([np.zeros((30, 0))], "train[0]: shape (30, 0); expected an array of shape (T,) or (T, m), one row per step"),
    ([3], "train[0]: the scalar 3; expected an array of shape (T,) or (T, m), one row per step"),
    ([np.array([1 + 2j, 3j])], "train[0]: an array of dtype complex128; expected integer symbols, float features "
                               "or strings (symbols)"),
    ([np.array(["a", None, "b"], dtype=object)], "train[0]: an array of dtype object (NoneType None at step 1); "
                                                 "expected integer symbols, float features or strings (one kind per "
                                                 "trajectory)"),
    ([np.array([["a", "b"], ["c", "d"]])], "train[0]: strings of shape (2, 2); expected a 1-D sequence of symbols, "
                                           "one per step"),
    ([np.ones((30, 2)), np.array([[1.0, 2.0], [np.nan, 0.0]])],
     "train[1]: nan at step 1, feature 0; expected finite values within float32 range (the models compute in "
     "float32)"),
    ([np.array([0.0, np.inf, 1.0])], "train[0]: inf at step 1, feature 0; expected finite values within float32 "
                                     "range (the models compute in float32)"),
    ([np.array([0.0, 1e39])], "train[0]: 1e+39 at step 1, feature 0; expected finite values within float32 range "
                              "(the models compute in float32)"),
    ([np.array([0, 1, -1, 2])], "train[0]: symbol -1 at step 2; expected integers from 0 to 2147483646 (indices "
                                "into a vocabulary: map other ids to 0 … V-1) (measurements? pass kind='continuous')"),
    ([np.array([0, 2 ** 40])], "train[0]: symbol 1099511627776 at step 1; expected integers from 0 to 2147483646 "
                               "(indices into a vocabulary: map other ids to 0 … V-1) (measurements? pass "
                               "kind='continuous')"),
    (np.zeros((30, 2)), f"train: one array of shape (30, 2); {A_LIST}, e.g. [array] for a single trajectory"),
    (np.array([0, 1, 2, 1, 0] * 6), f"train: one array of shape (30,); {A_LIST}, e.g. [array] for a single "
                                    "trajectory"),
    (np.zeros((4, 30, 2)), f"train: one array of shape (4, 30, 2); {A_LIST}, e.g. list(array) for 4 trajectories "
                           "of 30 steps"),
    ({"a": np.zeros(30)}, f"train: a dict; {A_LIST}"),
    ((t for t in [np.zeros(30)]), f"train: a generator; {A_LIST}"),
    ("0123", f"train: a str; {A_LIST}"),
    (None, f"train: a NoneType; {A_LIST}"),
])
def test_bad_training_data_is_refused_before_2sr(train, message, no_work):
    refused(message, fit_model, train, **SMALL)


def test_ragged_rows_are_refused_in_one_line(no_work):
    with pytest.raises(ValueError, match=r"^train\[0\]: not an array \([^\n]*\); expected an array of shape \(T,\) "
                                         r"or \(T, m\)$"):
        fit_model([[[1.0, 2.0], [3.0]]], **SMALL)
    ragged = [[0.1, 0.2], [0.3]] * 30
    with pytest.raises(ValueError) as numpy_err:
        np.asarray(ragged)
    whole = " ".join(str(numpy_err.value).split())
    assert len(whole) > 130, whole   # long enough to be cut
    with pytest.raises(ValueError) as err:   # numpy's long message is cut after a word, not inside one
        fit_model([ragged], **SMALL)
    inner = re.fullmatch(r"train\[0\]: not an array \((.*)\); expected an array of shape \(T,\) or \(T, m\)",
                         str(err.value)).group(1)
    assert inner.endswith(" ...") and 60 <= len(inner) - 4 <= 120, inner
    kept = inner[:-4]
    assert whole.startswith(kept) and whole[len(kept)] == " ", (kept, whole)


def test_a_dataframe_is_refused_in_one_line(no_work):
    pd = pytest.importorskip("pandas")
    refused(f"train: a DataFrame; {A_LIST}", fit_model, pd.DataFrame({"x": np.zeros(30)}), **SMALL)


def test_frame_columns_that_are_no_numbers_or_have_gaps_are_named(features, no_work):
    """A datetime or complex column beside the features, or a missing value (NaN, None, pandas' NA) in one: one
    line naming the trajectory, the column and the step (a datetime column stacked beside a float one failed deep
    in numpy, a TypeError; a gap was "nan at step 1, feature 0", naming no column)."""
    pd = pytest.importorskip("pandas")
    x = features.train[0]
    frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1]})
    bad_kind = "expected numbers (features) or symbols (integers or strings)"
    leave_out = "(train[0]'s columns are the model's features: leave this one out, e.g. frame.drop(columns=[{!r}]))"
    when = pd.date_range("2020-01-01", periods=len(x))
    refused(f"train[0]: column 't': values of dtype {np.asarray(when).dtype}; {bad_kind} {leave_out.format('t')}",
            fit_model, [frame.assign(t=when)], **SMALL)
    refused(f"train[0]: column 't': values of dtype timedelta64[ns]; {bad_kind} {leave_out.format('t')}",
            fit_model, [frame.assign(t=np.arange(len(x)).astype("timedelta64[ns]"))], **SMALL)
    refused(f"train[0]: column 'b': values of dtype complex128; {bad_kind} {leave_out.format('b')}",
            fit_model, [frame.assign(b=x[:, 1] + 1j)], **SMALL)
    refused(f"test[0]: column 'b': values of dtype complex128; {bad_kind}",   # only train[0]'s columns are features
            fit_model, [frame], [frame.assign(b=x[:, 1] + 1j)], **SMALL)
    infinite = frame.copy()
    infinite.loc[4, "b"] = -np.inf
    refused("test[0]: column 'b': -inf at step 4; expected finite values", fit_model, [frame], [infinite], **SMALL)
    gap = "expected a value at every step (fill or drop missing observations first)"
    holed = frame.copy()
    holed.loc[3, "b"] = np.nan
    refused(f"test[0]: column 'b': a missing value (nan) at step 3; {gap}", fit_model, [frame], [holed], **SMALL)
    nullable = frame.assign(n=pd.array([1, None] + [2] * (len(x) - 2), dtype="Int64"))
    refused(f"train[0]: column 'n': a missing value (nan) at step 1; {gap}", fit_model, [nullable], **SMALL)
    words = pd.DataFrame({"s": pd.Series(["a", "b", None] + ["a"] * 27, dtype=object)})
    refused(f"train[0]: column 's': a missing value (None) at step 2; {gap}", fit_model, [words], **SMALL)


def test_missing_values_of_every_kind_are_found():
    """first_missing: None, NaN (a Python float or a numpy scalar), pandas' NA and NaT, in object columns of
    strings, numbers or both, and in float columns; none in columns without."""
    pd = pytest.importorskip("pandas")
    from pipeline.api import first_missing

    for gap in (None, float("nan"), np.float32("nan"), np.float64("nan"), pd.NA, pd.NaT):
        for column in (["a", "b", gap, "c"], [1.0, 2.0, gap, 3.0], ["a", 1, gap, 2.5]):
            assert first_missing(np.array(column, dtype=object)) == 2, (gap, column)
    assert first_missing(np.array([1.0, 2.0, np.nan])) == 2
    for column in (np.array(["a", "b"], dtype=object), np.array([1, 2], dtype=object), np.array([1.0, 2.0]),
                   np.array(["None", "nan"], dtype=object)):   # the text 'nan' is a symbol, not a gap
        assert first_missing(column) is None


def test_a_fitted_model_names_frame_columns_that_are_no_numbers(features):
    pd = pytest.importorskip("pandas")
    x = features.train[0]
    frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1]})
    named = fit_model([frame], [frame], **{**SMALL, "epochs": 0})
    when = pd.date_range("2020-01-01", periods=len(x))
    refused(f"trajectories[1]: column 'a': values of dtype {np.asarray(when).dtype}; expected numbers (features) or "
            "symbols (integers or strings)", named.predict, [frame, frame.assign(a=when)])


def test_test_and_valid_sets_are_checked_too(features, no_work):
    refused("test[0]: shape (40, 2, 1); expected an array of shape (T,) or (T, m), one row per step", fit_model,
             features.train, [features.test[0][:, :, None]], **SMALL)
    refused(f"test: one array of shape (40, 2); {A_LIST}, e.g. [array] for a single trajectory", fit_model,
             features.train, features.test[0], **SMALL)
    refused("valid[1]: nan at step 0, feature 1; expected finite values within float32 range (the models "
             "compute in float32)", fit_model, features.train, valid=[features.test[0], np.array([[0.0, np.nan]])],
             **SMALL)


@pytest.mark.parametrize("argument, message", [
    ({"rank": 2.5, "model": "factorized_psrnn"}, "rank=2.5: expected an integer from 1 to 2**31 - 1"),
    ({"model": "factorized_psrnn"}, "model='factorized_psrnn' needs rank= (the CP rank, a positive integer)"),
    ({"epochs": 1.5}, "epochs=1.5: expected an integer >= 0"),
    ({"epochs": -1}, "epochs=-1: expected an integer >= 0"),
    ({"n_layers": 1.5}, "n_layers=1.5: expected an integer from 1 to 2**31 - 1"),
    ({"state_dim": 0}, "state_dim=0: expected an integer from 1 to 2**31 - 1"),
    ({"obs_dim": True}, "obs_dim=True: expected an integer from 1 to 2**31 - 1"),
    ({"n_features": 2 ** 40}, "n_features=1099511627776: expected an integer from 1 to 2**31 - 1"),
    ({"horizon": "2"}, "horizon='2': expected an integer from 1 to 2**31 - 1"),
    ({"past_window": 0}, "past_window=0: expected an integer from 1 to 2**31 - 1"),
    ({"batch_size": 0}, "batch_size=0: expected an integer >= 1"),
    ({"bptt": 3.0}, "bptt=3.0: expected an integer >= 0"),
    ({"seed": -1}, "seed=-1: expected an integer with 0 <= seed < 2**32"),
    ({"seed": 2 ** 32}, "seed=4294967296: expected an integer with 0 <= seed < 2**32"),
    ({"lr": 0}, "lr=0: expected a finite number > 0"),
    ({"lr": float("nan")}, "lr=nan: expected a finite number > 0"),
    ({"clip": -1.0}, "clip=-1.0: expected a finite number >= 0"),
    ({"ridge": float("inf")}, "ridge=inf: expected a finite number >= 0"),
    ({"bias_scale": float("nan")}, "bias_scale=nan: expected a finite number (or None)"),
    ({"device": "gpu"}, "device='gpu': expected auto, cpu, cuda or cuda:<index> (e.g. cuda:0)"),
    ({"model": "transformer"}, "model='transformer': expected one of psrnn, factorized_psrnn, lstm, gru, rnn, kf"),
    ({"init": "zeros"}, "init='zeros': expected '2sr' or 'random'"),
    ({"init": "random", "model": "lstm"}, "init='random': applies to psrnn and factorized_psrnn; lstm is "
                                          "initialised by Xavier"),
    ({"model": "kf"}, "model='kf': the Kalman filter is for continuous data, and train holds discrete symbols "
                      "(integer 1-D arrays); expected psrnn, factorized_psrnn, lstm, gru or rnn for symbols"),
    ({"train_options": {"epochs": 2.5}}, "train_options['epochs']=2.5: expected an integer >= 0"),
    ({"train_options": {"patience": -1}}, "train_options['patience']=-1: expected an integer >= 0"),
    ({"train_options": {"monitor": "valid"}}, "train_options['monitor']: 'valid', but the data have no validation "
                                              "split; expected 'auto', 'train' or 'test'"),
    ({"train_options": ["adam"]}, "train_options: a list; expected a dict of TrainConfig fields"),
    ({"two_stage_options": {"past_window": 1.5}}, "two_stage_options['past_window']=1.5: expected an integer from "
                                                   "1 to 2**31 - 1"),
    ({"two_stage_options": {"oversample": -5}}, "two_stage_options['oversample']: expected an integer >= 0, got -5"),
])
def test_bad_arguments_are_refused_before_2sr(argument, message, symbols, no_work):
    refused(message, fit_model, symbols.train, symbols.test, **{**SMALL, **argument})


@pytest.mark.parametrize("seed, shown", [("a", "'a'"), (2.5, "2.5"), (-1, "-1"), (2 ** 32, "4294967296"),
                                         (True, "True")])
def test_the_2sr_seed_is_checked_like_the_training_seed(seed, shown, symbols, no_work):
    """two_stage_options['seed'] reached 2SR unchecked: "a" was a TypeError in pipeline.features, -1 numpy's bare
    "expected non-negative integer"."""
    refused(f"two_stage_options['seed']: expected an integer with 0 <= seed < 2**32, got {shown}", fit_model,
            symbols.train, two_stage_options={"seed": seed}, **SMALL)


@pytest.mark.parametrize("widths, shown", [([1, 2], "[1, 2]"), ("abc", "'abc'")])
def test_widths_that_are_no_mapping_are_named_before_the_length_check_reads_them(widths, shown, symbols, no_work):
    """The train-length check read widths.get(...) before TwoStageConfig.validate: an AttributeError."""
    refused(f"two_stage_options['widths']: expected a mapping of obs/past/future widths or None, got {shown}",
            fit_model, symbols.train, two_stage_options={"widths": widths}, **SMALL)


@pytest.mark.parametrize("argument, message", [
    ({"two_stage_options": {"width_scale": 0}}, "two_stage_options['width_scale']: expected a finite number > 0, "
                                                "got 0"),
    ({"two_stage_options": {"widths": {"obs": 1e-100}}}, "two_stage_options['widths']['obs']: expected a finite "
                                                         "number >= 1e-30, got 1e-100"),
    ({"two_stage_options": {"past_dim": 50}, "n_features": 40}, "two_stage_options['past_dim']=50 exceeds "
                                                                "n_features=40: a projection cannot have more "
                                                                "directions than RFF features"),
    ({"obs_dim": 100, "n_features": 40}, "obs_dim=100 exceeds n_features=40: a projection cannot have more "
                                         "directions than RFF features"),
    ({"state_dim": 50, "n_features": 40}, "state_dim=50 exceeds n_features=40: a projection cannot have more "
                                          "directions than RFF features"),
    ({"train_options": {"optimizer": "adagrad"}}, "train_options['optimizer']: expected 'sgd' or 'adam', got "
                                                  "'adagrad'"),
    ({"train_options": {"monitor": "train", "eval_train": False}},
     "train_options['monitor']: 'train' needs train_options['eval_train']=True (the train split is scored only "
     "then)"),
    ({"train_options": {"lr_decay": 2.0}}, "train_options['lr_decay']=2.0: expected a factor in (0, 1] (1 = a fixed "
                                           "learning rate)"),
    ({"train_options": {"lr_decay": "a"}}, "train_options['lr_decay']='a': expected a factor in (0, 1] (1 = a fixed "
                                           "learning rate)"),
    ({"train_options": {"min_delta": "x"}}, "train_options['min_delta']='x': expected a finite number >= 0"),
    ({"train_options": {"device": "gpu"}}, "train_options['device']='gpu': expected auto, cpu, cuda or "
                                           "cuda:<index> (e.g. cuda:0)"),
])
def test_config_errors_name_the_fit_model_argument_not_the_params_key(argument, message, symbols, no_work):
    """TrainConfig / TwoStageConfig validation named params.yaml keys (train.lr_decay, two_stage.width_scale,
    two_stage.obs_dim) that a fit_model caller never wrote; lr_decay='a' and min_delta='x' were TypeErrors, and
    train_options['device'] was refused by fit only after the 2SR work."""
    refused(message, fit_model, symbols.train, **{**SMALL, **argument})


@pytest.mark.parametrize("argument, message", [
    ({"epochs": 2, "train_options": {"epochs": 3}},
     "epochs=2 and train_options['epochs']=3: two values for one setting; expected one of them (epochs= alone)"),
    ({"lr": 0.5, "train_options": {"lr": 0.01}},
     "lr=0.5 and train_options['lr']=0.01: two values for one setting; expected one of them (lr= alone)"),
])
def test_a_setting_given_twice_and_unlike_is_refused(argument, message, features, no_work):
    """fit_model(epochs=2, lr=0.5, train_options={"epochs": 3, "lr": 0.01}) trained 3 epochs at 0.01 without a
    word; train_options may set an argument that keeps its default, or repeat one's value."""
    refused(message, fit_model, features.train, **{**SMALL, **argument})


@pytest.mark.parametrize("options, message", [
    ({"lr": "x"}, "train_options['lr']='x': expected a finite number > 0"),   # a TypeError of TrainConfig's before
    ({"lr": float("nan")}, "train_options['lr']=nan: expected a finite number > 0"),
    ({"clip": "a"}, "train_options['clip']='a': expected a finite number >= 0"),
])
def test_a_bad_train_options_value_is_named_not_taken_for_a_second_setting(options, message, features, no_work):
    refused(message, fit_model, features.train, **{**SMALL, "lr": 0.3, "train_options": options})


def test_train_options_set_arguments_left_at_their_defaults(features):
    fitted = fit_model(features.train, **{**SMALL, "epochs": 5, "lr": 0.1, "train_options": {"epochs": 1, "lr": 0.1}})
    assert [h["epoch"] for h in fitted.history] == [0, 1]
    # lr=1.0 is the default, which cannot be told from no lr= at all: train_options' rate is the one trained at
    fitted = fit_model(features.train, **{**SMALL, "lr": 1.0, "train_options": {"lr": np.float64(0.5)}})
    assert fitted.extras["train_config"]["lr"] == 0.5


def test_kf_state_larger_than_its_windows_is_refused_before_2sr(features, no_work):
    refused("state_dim=5: the Kalman filter's state has at most future window × features = 2 × 2 dimensions; "
             "expected a smaller state_dim or a longer horizon", fit_model, features.train, model="kf",
             **{**SMALL, "state_dim": 5, "horizon": 2})


def test_the_kf_state_defaults_to_what_its_windows_allow(features):
    """state_dim left out: 20, which a Kalman filter of 2 features and horizon 1 cannot have (every default KF fit
    of a few features failed): its state is then as large as its future window allows, up to 20."""
    small = {k: v for k, v in SMALL.items() if k != "state_dim"}
    for horizon, d in ((1, 2), (3, 6), (12, 20)):
        fitted = fit_model(features.train, model="kf", **{**small, "horizon": horizon, "epochs": 0})
        assert fitted.model.config.state_dim == d
    assert fit_model(features.train, **{**small, "epochs": 0}).model.config.state_dim == 20   # the others: 20


@pytest.mark.parametrize("argument, message", [
    ({"model": "lstm", "ridge": 0.1}, "ridge=0.1: lstm is initialised by Xavier, not by 2SR; leave it out"),
    ({"model": "gru", "two_stage_options": {"width_scale": 0.5}},
     "two_stage_options: gru is initialised by Xavier, not by 2SR; leave it out"),
    ({"init": "random", "two_stage_options": {"obs_inverse": False}},
     "two_stage_options: psrnn is initialised at random (init='random'), not by 2SR; leave it out"),
    ({"model": "kf", "two_stage_options": {"width_scale": 0.5, "ridge": 0.1}},
     "two_stage_options: ['width_scale'] apply to the PSRNNs' 2SR on random features; the Kalman filter's linear "
     "2SR takes past_window, future_window and ridge"),
    ({"model": "kf", "ridge": -1.0}, "ridge=-1.0: expected a finite number >= 0"),
    ({"model": "kf", "two_stage_options": {"ridge": float("nan")}},
     "two_stage_options['ridge']=nan: expected a finite number >= 0"),
])
def test_2sr_settings_a_model_would_not_use_arerefused(argument, message, features, no_work):
    refused(message, fit_model, features.train, **{**SMALL, "state_dim": 2, **argument})


def test_the_kf_takes_its_ridge_from_fit_model(features, monkeypatch):
    """``ridge`` (or ``two_stage_options['ridge']``) reaches the Kalman filter's linear 2SR; ``None`` is its own
    default, 1e-3, not the PSRNNs' 1e-2 (the two are ratios of different scales)."""
    seen = []
    real = pipeline.api.linear_two_stage

    def spy(*args, **kwargs):
        seen.append(kwargs["ridge"])
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline.api, "linear_two_stage", spy)
    args = {**SMALL, "model": "kf", "state_dim": 2, "horizon": 2, "epochs": 0}
    fits = [fit_model(features.train, **args),
            fit_model(features.train, **args, ridge=0.5),
            fit_model(features.train, **args, ridge=0.5, two_stage_options={"ridge": 0.25})]
    assert seen == [1e-3, 0.5, 0.25]
    assert not np.allclose(fits[0].two_stage.A, fits[1].two_stage.A)


def test_vocabulary_covers_every_split(symbols):
    """Symbols are indices 0 … V-1: one seen only in test is part of the vocabulary, not an IndexError."""
    test = [np.append(symbols.test[0], 5)]
    with pytest.warns(UserWarning, match=r"^test: symbol 5 never seen in train; it is in the vocabulary \(V = 6, "):
        fitted = fit_model(symbols.train, test, **{**SMALL, "epochs": 0})
    assert fitted.model.config.input_dim == 6
    assert fitted.predict(test)[0].shape == (41, 6)


# ------------------------------------------------------------------------ 2. a fitted model's predict / forecast

def test_discrete_model_refuses_non_integer_symbols(discrete_fit, symbols):
    """[0.9, 1.9, 2.9] was read as [0, 1, 2]; floats with integer values are those integers (documented)."""
    for call in (discrete_fit.predict, discrete_fit.evaluate, lambda t: discrete_fit.forecast(t, 2)):
        refused("trajectories[1]: 0.9 at step 0 is not an integer symbol; expected integer symbols (the model "
                 "is discrete)", call, [symbols.test[0], np.array([0.9, 1.9, 2.9])])
        refused("trajectories[0]: nan at step 1 is not an integer symbol; expected integer symbols (the model is "
                 "discrete)", call, [np.array([1.0, np.nan])])
        refused("trajectories[0]: symbol 4 at step 2; expected symbols 0 … 3, the model's vocabulary", call,
                 [np.array([0, 1, 4])])
        refused("trajectories[0]: symbol -1 at step 0; expected symbols 0 … 3, the model's vocabulary", call,
                 [np.array([-1, 1])])
        refused("trajectories[0]: shape (2, 2); expected a 1-D array of symbols (the model is discrete)", call,
                 [np.array([[0, 1], [1, 2]])])
        refused(f"trajectories: one array of shape (3,); {A_LIST}, e.g. [array] for a single trajectory", call,
                 np.array([0, 1, 2]))
    whole = np.array([0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(discrete_fit.predict([whole])[0], discrete_fit.predict([whole.astype(int)])[0])
    assert list(discrete_fit.forecast([whole], 3)[0]) == list(discrete_fit.forecast([whole.astype(int)], 3)[0])


def test_continuous_model_refuses_nan_inf_and_wrong_widths(continuous_fit, features):
    """NaN/Inf gave finite nonsense; a wrong width was a torch shape error."""
    good = features.test[0]
    nan = good.copy()
    nan[5, 1] = np.nan
    for call in (continuous_fit.predict, continuous_fit.evaluate, lambda t: continuous_fit.forecast(t, 2)):
        refused("trajectories[1]: nan at step 5, feature 1; expected finite values within float32 range (the "
                 "models compute in float32)", call, [good, nan])
        refused("trajectories[0]: -inf at step 0, feature 0; expected finite values within float32 range (the "
                 "models compute in float32)", call, [np.array([[-np.inf, 0.0]])])
        refused("trajectories[0]: 3 features per step (shape (3, 3)); expected 2, the model's input width", call,
                 [np.zeros((3, 3))])
        refused("trajectories[0]: 1 feature per step (shape (3,)); expected 2, the model's input width", call,
                 [np.zeros(3)])
        refused("trajectories[0]: an empty trajectory; expected at least one observation", call,
                 [np.zeros((0, 2))])
    refused("steps=0: expected a positive integer up to 1000000", continuous_fit.forecast, [good], 0)
    refused("seed=-1: expected an integer with 0 <= seed < 2**32", continuous_fit.forecast, [good], 2, seed=-1)
    # was silently ignored: a continuous forecast draws nothing (the CLI refuses forecast --sample there too)
    refused("sample=True: applies to discrete models only (it draws the symbols fed back from the predicted "
            "distributions), and this one is continuous; expected False", continuous_fit.forecast, [good], 2,
            sample=True)
    refused("sample='no': expected True or False", continuous_fit.forecast, [good], 2, sample="no")


def test_trained_run_forecast_encoded_checks_its_inputs(discrete_fit, continuous_fit):
    """The model-unit entry point of forecasts (FittedModel.forecast's) refuses what the model cannot read."""
    from pipeline.inference import TrainedRun

    run = TrainedRun(model=discrete_fit.model, dataset="", variant="psrnn", seed=0, epoch=1, kind="discrete")
    refused("encoded[0]: 0.9 at step 0 is not an integer symbol; expected integer symbols (the model is "
             "discrete)", run.forecast_encoded, [np.array([0.9, 1.9])], 2, sample=False, seed=0, device="cpu")
    c = continuous_fit.model.config
    run = TrainedRun(model=continuous_fit.model, dataset="", variant="psrnn", seed=0, epoch=1, kind="continuous",
                     mean=np.zeros(c.input_dim), std=np.ones(c.input_dim))
    refused("encoded[0]: nan at step 1, feature 0; expected finite values within float32 range (the models "
             "compute in float32)", run.forecast_encoded, [np.array([[0.0, 1.0], [np.nan, 1.0]])], 2,
             sample=False, seed=0, device="cpu")
    refused("encoded[0]: 3 features per step (shape (3, 3)); expected 2, the model's input width",
             run.forecast_encoded, [np.zeros((3, 3))], 2, sample=False, seed=0, device="cpu")


# ---------------------------------------------------------------------------------------- 4. misleading messages

def test_psrnn_init_other_than_2sr_or_random_is_named(symbols):
    from pipeline.api import initialise_model
    from pipeline.models.common import ModelConfig

    config = ModelConfig(model="psrnn", discrete=True, input_dim=4, output_dim=4, state_dim=3, obs_dim=3,
                         n_rff=32, init="zeros")
    refused("init='zeros': expected '2sr' or 'random' for psrnn", initialise_model, config)


def test_load_fitted_names_what_the_file_is_not(tmp_path, continuous_fit):
    """load_checkpoint's advice (delete it and rerun refine) is for the pipeline's files, not the user's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    expected = "expected a model file saved by FittedModel.save"
    pq.write_table(pa.table({"a": [1.0]}), tmp_path / "data.parquet")
    refused(f"{tmp_path / 'data.parquet'}: not a readable checkpoint; {expected}", load_fitted,
             tmp_path / "data.parquet")
    refused(f"{tmp_path}: a directory; {expected}", load_fitted, tmp_path)
    with pytest.raises(FileNotFoundError, match="^" + re.escape(f"{tmp_path / 'none.pt'}: file not found; "
                                                                f"{expected}") + "$"):
        load_fitted(tmp_path / "none.pt")
    continuous_fit.save(tmp_path / "m.pt")
    assert load_fitted(tmp_path / "m.pt").history == continuous_fit.history


# --------------------------------------------------------------------------------------- 5. no test set given

@pytest.mark.parametrize("test", [None, []])
def test_without_a_test_set_the_history_test_entries_are_the_training_metrics(test, features):
    fitted = fit_model(features.train, test, **SMALL)
    assert [h["test"] for h in fitted.history] == [h["train"] for h in fitted.history]
    assert fitted.history[-1]["test"]["mse"] == pytest.approx(fitted.evaluate(features.train)["mse"], rel=1e-9)
    steps = np.concatenate([t[1:] - t[:-1] for t in features.train])   # repeating o_t for o_{t+1}
    assert fitted.evaluate(features.train)["last_value_mse"] == pytest.approx(float((steps ** 2).mean()), rel=1e-12)


def test_a_tuple_of_lists_still_fits(symbols):
    """The checks refuse only what is wrong: a tuple of lists of ints is a sequence of integer trajectories."""
    fitted = fit_model(tuple(list(t) for t in symbols.train), **{**SMALL, "epochs": 0})
    assert fitted.model.config.discrete and fitted.model.config.input_dim == 4


# ------------------------------------------------------------------------------- 6. features in large units

def test_features_in_large_units_get_one_warning_naming_them(features, recwarn):
    """fit_model takes features as they are (the pipeline standardises them): a feature in large units (a pressure
    near 1013 hPa, a price in the thousands) is named in one UserWarning at the caller's line; standardised
    data, and symbols, give none."""
    fit_model(features.train, **{**SMALL, "epochs": 0})
    fit_model(make_hmm_dataset(n_states=2, n_symbols=3, n_train=3, n_test=1, length=20, seed=0)[0].train,
              **{**SMALL, "epochs": 0})
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
    wide = [np.c_[t[:, :1] + 1013.0, 50.0 * t[:, 1:]] for t in features.train]
    with pytest.warns(UserWarning) as caught:
        fit_model(wide, **{**SMALL, "epochs": 0})
    (w,) = [w for w in caught if "large units" in str(w.message)]
    text = str(w.message)
    assert text.startswith("train: feature 0 (mean 101") and ", feature 1 (mean " in text, text
    assert "subtract the training mean and divide by the std" in text and w.filename == __file__
    # named columns (frames, dicts of columns) are named by their names: a step counter kept as a feature shows
    named = [{"count": np.arange(len(t), dtype=np.float64) * 10.0, "x": t[:, 0]} for t in features.train]
    with pytest.warns(UserWarning) as caught:
        fit_model(named, **{**SMALL, "epochs": 0})
    (w,) = [w for w in caught if "large units" in str(w.message)]
    assert str(w.message).startswith("train: feature 'count' (mean "), str(w.message)
    tiny = [np.c_[t[:, :1] * 1e-3, t[:, 1:]] for t in features.train]   # a reading in kilo-units, say
    with pytest.warns(UserWarning) as caught:
        fit_model(tiny, **{**SMALL, "epochs": 0})
    (w,) = [w for w in caught if "small units" in str(w.message)]
    assert str(w.message).startswith("train: feature 0 (mean ") and "feature 1" not in str(w.message)
    assert "divide by the training std first" in str(w.message) and w.filename == __file__


def test_upper_layer_windows_are_checked_before_2sr(features, no_work):
    """The windows of layers 2 and up (two_stage_options upper_past_window / upper_future_window) are checked
    against the trajectories before any 2SR, naming the option (they failed after layer 1's regression, or deep
    in it: 'median pairwise distance needs at least 2 points'), and refused for a one-layer model, which reads
    none of them."""
    longest = max(len(t) for t in features.train)
    refused(f"train: fewer than two windows for the 2SR of layers 2 and up (two_stage_options['upper_past_window'] "
            f"{longest} + horizon 1 + 1 = {longest + 2} steps, and the longest trajectory, train[0], has {longest}); "
            "2SR needs two: expected longer trajectories or smaller upper windows",
            fit_model, features.train, **SMALL, n_layers=2, two_stage_options={"upper_past_window": longest})
    refused("two_stage_options['upper_future_window']: a setting of layers 2 and up, and n_layers=1 has one "
            "layer; expected n_layers >= 2, or leave it out",
            fit_model, features.train, **SMALL, two_stage_options={"upper_future_window": 1})


# ------------------------------------------------------------------- frames of the pipeline's long format

def test_the_id_columns_of_a_frame_are_never_features(features, symbols):
    """A frame per trajectory from a groupby of the pipeline's long format (trajectory, step, split beside the
    data) was read whole: trajectory and step became features. They are left out, as the pipeline does; a frame of
    id columns only is refused, naming them."""
    from pipeline.api import ID_COLUMNS
    from pipeline.data.custom import RESERVED

    assert ID_COLUMNS == RESERVED
    frames = [{"trajectory": np.full(len(t), k), "step": np.arange(len(t)) * 10, "split": np.full(len(t), "train"),
               "x": t[:, 0], "y": t[:, 1]} for k, t in enumerate(features.train)]
    fitted = fit_model(frames, **{**SMALL, "epochs": 0})
    assert fitted.extras["columns"] == ["x", "y"] and fitted.model.config.input_dim == 2
    plain = fit_model([t.copy() for t in features.train], **{**SMALL, "epochs": 0})
    assert np.array_equal(np.concatenate(fitted.predict(frames)), np.concatenate(plain.predict(features.train)))
    events = [{"trajectory": np.full(len(t), f"s{k}"), "event": np.array(["abcd"[i] for i in t])}
              for k, t in enumerate(symbols.train)]
    assert fit_model(events, **{**SMALL, "epochs": 0}).extras["vocab"] == ["a", "b", "c", "d"]
    refused("train[0]: only the id columns 'trajectory', 'step', which are never features; expected a symbol "
            "column or feature columns beside them", fit_model,
            [{"trajectory": np.zeros(5), "step": np.arange(5)}], **SMALL)


def test_a_frame_of_the_long_format_is_read_in_step_order_and_one_trajectory_at_a_time(features):
    """The pipeline reads a file's rows in step order; a frame from it was read in row order, so a shuffled frame
    trained on scrambled trajectories, and a whole file passed as [frame] on every trajectory run together. Now
    rows follow `step` (predictions too), and a frame of several trajectories or splits, or a repeated step, is
    refused naming the column."""
    frames = [{"trajectory": np.full(len(t), k), "step": np.arange(len(t)), "x": t[:, 0], "y": t[:, 1]}
              for k, t in enumerate(features.train)]
    rng = np.random.default_rng(0)
    shuffled = []
    for f in frames:
        rows = rng.permutation(len(f["x"]))
        shuffled.append({c: v[rows] for c, v in f.items()})
    plain = fit_model([t.copy() for t in features.train], **{**SMALL, "epochs": 0})
    fitted = fit_model(shuffled, **{**SMALL, "epochs": 0})
    assert fitted.history[0]["train"] == plain.history[0]["train"]
    assert all(np.array_equal(a, b) for a, b in zip(fitted.predict(shuffled), plain.predict(features.train)))
    whole = {c: np.concatenate([f[c] for f in frames]) for c in frames[0]}
    n = len(features.train)
    refused(f"train[0]: column 'trajectory' holds {n} values (0, 1, 2, ... ({n} in all)); expected one trajectory "
            "per element, e.g. [g for _, g in frame.groupby('trajectory')]", fit_model, [whole], **SMALL)
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: column 'trajectory' holds"):
        fitted.predict([whole])
    twice = {**frames[0], "step": np.arange(len(frames[0]["x"])) // 2}
    refused("train[1]: column 'step' repeats step 0; expected each step once in a trajectory (several "
            "trajectories in one frame? group by 'trajectory')", fit_model, [frames[1], twice], **SMALL)
    half = len(frames[0]["x"]) // 2
    mixed = {**frames[0], "split": np.array(["train"] * half + ["test"] * (len(frames[0]["x"]) - half))}
    refused("train[0]: column 'split' holds 2 values ('test', 'train'); expected the rows of one split per "
            "trajectory: group by both, e.g. [g for _, g in frame.groupby(['trajectory', 'split'])], and pass each "
            "split's as its own", fit_model, [mixed], **SMALL)
    refused("train[0]: column 'step' holds strings; expected numbers (the order of the rows in time)",
            fit_model, [{**frames[0], "step": np.array(["a"] * len(frames[0]["x"]))}], **SMALL)


def test_id_columns_in_a_frames_index_are_read_as_columns(features, symbols):
    """frame.set_index('step') moved step out of the columns and the index was ignored: shuffled rows were read in
    row order, and a whole file indexed by (trajectory, step) ran every trajectory together, both silently. Id
    columns in the index are read as the columns they were (fit_model, FittedModel, TrainedRun alike)."""
    import pandas as pd

    rng = np.random.default_rng(0)
    frames = [pd.DataFrame({"trajectory": k, "step": np.arange(len(t)), "x": t[:, 0], "y": t[:, 1]})
              for k, t in enumerate(features.train)]
    shuffled = [f.iloc[rng.permutation(len(f))].set_index("step") for f in frames]
    plain = fit_model([t.copy() for t in features.train], **{**SMALL, "epochs": 0})
    fitted = fit_model(shuffled, **{**SMALL, "epochs": 0})
    assert fitted.extras["columns"] == ["x", "y"]
    assert fitted.history[0]["train"] == plain.history[0]["train"]
    assert all(np.array_equal(a, b) for a, b in zip(fitted.predict(shuffled), plain.predict(features.train)))
    both = [f.iloc[::-1].set_index(["trajectory", "step"]) for f in frames]
    assert all(np.array_equal(a, b) for a, b in zip(fitted.predict(both), plain.predict(features.train)))
    whole = pd.concat(frames).set_index(["trajectory", "step"])
    n = len(features.train)
    refused(f"train[0]: column 'trajectory' holds {n} values (0, 1, 2, ... ({n} in all)); expected one trajectory "
            "per element, e.g. [g for _, g in frame.groupby('trajectory')]", fit_model, [whole], **SMALL)
    # an index of another name is no id column; a level also present as a column stays in the index
    renamed = [f.rename_axis("t") for f in shuffled]
    assert not all(np.array_equal(a, b) for a, b in zip(fitted.predict(renamed), plain.predict(features.train)))
    kept = [f.set_index("step", drop=False).iloc[::-1] for f in frames]
    assert all(np.array_equal(a, b) for a, b in zip(fitted.predict(kept), plain.predict(features.train)))
    # a run trained by the pipeline reads frames through TrainedRun._by_name: the same rule
    from pipeline.inference import TrainedRun

    run = TrainedRun.from_units(fitted.model, {"kind": "continuous", "features": ["x", "y"], "mean": [0.0, 0.0],
                                               "std": [1.0, 1.0]}, dataset="d", variant="psrnn", seed=0, epoch=0)
    assert all(np.array_equal(a, b) for a, b in zip(run.predict(shuffled), run.predict(features.train)))


def test_a_step_column_of_time_stamps_is_refused_as_such(features):
    """A frame whose `step` is a datetime (pd.to_datetime, as read from a CSV) was refused with the message for
    features: "values of dtype datetime64[us]; expected numbers (features) or symbols"; it says what `step` needs."""
    import pandas as pd

    t = features.train[0]
    frame = pd.DataFrame({"step": pd.Timestamp("2024-01-01") + pd.to_timedelta(np.arange(len(t)), unit="s"),
                          "x": t[:, 0], "y": t[:, 1]})
    expected = (r"column 'step' holds time stamps \(datetime64\[.s\]\); expected numbers \(the order of the "
                r"rows in time\): convert them, e.g. frame\['step'\] = frame\['step'\].astype\('int64'\), or "
                r"leave the column out to use the row order$")
    with pytest.raises(ValueError, match=r"^train\[0\]: " + expected):
        fit_model([frame], **SMALL)
    fitted = fit_model([frame.assign(step=np.arange(len(t)))], **{**SMALL, "epochs": 0})
    with pytest.raises(ValueError, match=r"^trajectories\[0\]: " + expected):
        fitted.predict([frame])
    with pytest.raises(ValueError, match=r"^train\[0\]: column 'step' holds time stamps \(timedelta64"):
        fit_model([{"step": np.arange(len(t)).astype("timedelta64[s]"), "x": t[:, 0], "y": t[:, 1]}], **SMALL)


def test_unsigned_steps_are_ordered_too(features):
    """np.diff wraps around for unsigned integers: steps [2, 0, 1] as uint32 (polars' row index) looked ordered."""
    from pipeline.api import step_order

    for dtype in (np.uint32, np.uint64, np.int64):
        steps = np.array([2, 0, 1], dtype=dtype)
        assert step_order("t", {"step": steps}, {"step": "step"}, 3).tolist() == [1, 2, 0]
    huge = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min])
    assert step_order("t", {"step": huge}, {"step": "step"}, 2).tolist() == [1, 0]


def test_symbols_ending_in_a_nul_are_refused_not_merged(no_work):
    refused(r"train[0]: the symbol 'a\x00' at step 0 ends in a NUL character, which numpy's strings drop (it would "
            r"merge with the symbol without it); expected symbols without trailing '\x00'",
            fit_model, [["a\x00", "a", "b"] * 10], **SMALL)


def test_features_like_a_time_or_a_label_get_a_warning_naming_them(features, recwarn):
    """As the pipeline's custom source warns: a column increasing within every trajectory (a time stamp) or
    constant within each but not across them (a room number) is read as an observation to predict."""
    frames = [{"x": t[:, 0], "room": np.full(len(t), float(k % 3)), "t": 5.0 + 0.1 * np.arange(len(t))}
              for k, t in enumerate(features.train)]
    with pytest.warns(UserWarning) as caught:
        fit_model(frames, **{**SMALL, "epochs": 0})
    (w,) = [w for w in caught if "no measurement" in str(w.message)]
    assert str(w.message) == (
        "train: features that look like no measurement: feature 'room' (constant within each trajectory, like a "
        "label), feature 't' (increases within every trajectory, like a time); the model reads them as observations "
        "to predict: leave them out (frame.drop(columns=['room', 't'])) unless they are") and w.filename == __file__
    with pytest.warns(UserWarning, match=r"feature 1 \(constant within each trajectory, like a label\); .*leave "
                                         r"out the columns \[1\] unless"):
        fit_model([np.c_[t[:, :1], np.full(len(t), float(k))] for k, t in enumerate(features.train)],
                  **{**SMALL, "epochs": 0})
    recwarn.clear()
    fit_model(features.train, **{**SMALL, "epochs": 0})     # measurements: nothing to say
    assert not [w for w in recwarn if "no measurement" in str(w.message)]


def test_numpy_integers_and_torch_devices_are_taken_as_what_they_stand_for(symbols):
    """A seed from ``np.arange`` (random.seed refuses numpy integers) and a ``torch.device`` fit as the int and the
    device string would: the same model, not a TypeError after the 2SR work."""
    torch = pytest.importorskip("torch")
    plain = fit_model(symbols.train[:4], symbols.test[:2], **{**SMALL, "seed": 3})
    numpy = fit_model(symbols.train[:4], symbols.test[:2],
                      **{**SMALL, "seed": np.arange(5)[3], "device": torch.device("cpu"),
                         "train_options": {"seed": np.int32(3)}})
    def scores(history):   # the seconds an epoch took aside
        return [{k: v for k, v in h.items() if k != "seconds"} for h in history]

    assert scores(numpy.history) == scores(plain.history)
    for a, b in zip(plain.model.state_dict().values(), numpy.model.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore::UserWarning")   # this small a fit's notes
def test_fitting_leaves_the_callers_random_generators_as_they_were(symbols):
    """Training seeds Python's, numpy's and torch's global generators; fit_model gives the caller's back, so that a
    caller drawing numbers between fits does not draw the same ones after every fit (it did)."""
    import random

    torch = pytest.importorskip("torch")
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    fit_model(symbols.train[:4], symbols.test[:2], **{**SMALL, "seed": 0})
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    with pytest.raises(ValueError):   # refused before any work: nothing drawn, nothing seeded either
        fit_model(symbols.train[:4], **{**SMALL, "seed": -1})
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_training_trajectories_too_short_for_a_window_are_named(no_work):
    """2SR skips a trajectory shorter than past + future + 1 steps: with 8 to 15 steps and horizon 5, 37% of the
    training trajectories were left out of it unsaid (the pipeline refuses them)."""
    rng = np.random.default_rng(0)
    train = [rng.normal(size=(n, 2)) for n in [8, 9, 10, 11, 12, 15] * 3]
    with pytest.warns(UserWarning, match=re.escape(
            "fit_model: 9 of 18 training trajectories are shorter than past_window (= horizon) 5 + horizon 5 + 1 = "
            "11 steps and hold no 2SR window: left out of 2SR (BPTT trains on them); expected a smaller past_window "
            "or horizon, or drop the trajectories shorter than 11 steps")):
        with pytest.raises(AssertionError, match="2SR or training ran"):
            fit_model(train, **{**SMALL, "horizon": 5})
    import warnings

    with warnings.catch_warnings():   # all long enough: nothing said
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(AssertionError, match="2SR or training ran"):
            fit_model(train, **{**SMALL, "horizon": 3})


def test_standardize_names_constant_and_boolean_columns(no_work):
    """The pipeline's preprocess warns about both; fit_model(standardize=True) gave a constant column std 1 and
    read a boolean one as 0/1 without a word."""
    import pandas as pd

    rng = np.random.default_rng(0)
    frames = [pd.DataFrame({"sig": rng.normal(size=30), "const": 3.0, "flag": rng.normal(size=30) > 0})
              for _ in range(4)]
    with pytest.warns(UserWarning) as record:
        with pytest.raises(AssertionError, match="2SR or training ran"):
            fit_model(frames, **SMALL, standardize=True)
    said = [str(w.message) for w in record]
    assert "fit_model: constant feature columns ['const'] in train: std set to 1" in said
    assert "fit_model: boolean feature columns ['flag'] are read as 0/1" in said
    plain = [rng.normal(size=(30, 2)) for _ in range(4)]
    import warnings

    with warnings.catch_warnings():   # nothing constant or boolean: nothing said
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(AssertionError, match="2SR or training ran"):
            fit_model(plain, **SMALL, standardize=True)
