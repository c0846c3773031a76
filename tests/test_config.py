"""params.yaml validation: every mistake is one clear error naming the key."""

import copy
import re
from pathlib import Path

import pytest

from pipeline.config import ParamsError, Variant, check_windows, dump_yaml, load_params, parse_params, read_yaml

ROOT = Path(__file__).resolve().parents[1]


def test_default_and_tiny_params_are_valid(defaults):
    p = parse_params(defaults)
    assert p.dataset("ptb").ranks == [10, 20, 40, 60]
    assert p.dataset("ptb").layers == 2 and p.dataset("swimmer").layers == 2
    # the models of the paper on every dataset: PSRNN of 1 and 2 layers, factorized PSRNNs of several ranks, the
    # three RNN baselines, and the Kalman filter where the data are continuous
    for name in p.selected:
        dp = p.dataset(name)
        names = {v.name for v in dp.variants}
        assert {"psrnn", "psrnn_2layer", "lstm", "gru", "rnn"} <= names, name
        assert len(dp.ranks) >= 2, name
        assert ("kf" in names) == (not dp.discrete), name
    assert p.dataset("ptb").kf is None and p.dataset("swimmer").kf.state_dim == 20
    assert p.dataset("ptb").discrete and not p.dataset("swimmer").discrete
    load_params(ROOT / "tests" / "fixtures" / "tiny_params.yaml")


def test_cp_ranks_are_those_of_the_2sr_initialised_factorized_variants(defaults):
    """A factorized variant initialised at random draws its factors: the decompose stage computes no CP for it."""
    raw = copy.deepcopy(defaults)
    raw["hmm"]["variants"] = ["psrnn", "factorized_psrnn_r5", "factorized_psrnn_r5_random", "factorized_psrnn_r7_random",
                              "factorized_psrnn_r3"]
    assert parse_params(raw).dataset("hmm").ranks == [3, 5]
    raw["hmm"]["variants"] = ["psrnn", "factorized_psrnn_r7_random"]
    assert parse_params(raw).dataset("hmm").ranks == []


@pytest.mark.parametrize("mutate, key", [
    (lambda p: p["ptb"]["train"].update(lrr=1.0), r"ptb\.train\.lrr: unknown key"),
    (lambda p: p.update(swimer={}), r"swimer: unknown key"),
    (lambda p: p["ptb"]["train"].update(lr="fast"), r"ptb\.train\.lr: expected a number"),
    (lambda p: p["ptb"]["train"].update(epochs=1.5), r"ptb\.train\.epochs: expected an integer"),
    (lambda p: p["ptb"]["train"].update(lr=0), r"^ptb\.train\.lr: expected a finite number > 0, got 0\.0$"),
    (lambda p: p["ptb"].update(variants=["psrnn", "transformer"]), r"ptb\.variants: unknown model variant "
                                                                   r"'transformer'; expected psrnn,"),
    (lambda p: p["ptb"].update(variants=["factorized_psrnn_r0"]), r"^ptb\.variants: rank in 'factorized_psrnn_r0' "
                                                                  r"must be > 0$"),
    (lambda p: p["ptb"].update(variants=["psrnn", "kf"]), r"ptb\.variants: kf models continuous data only"),
    (lambda p: p["ptb"].update(kf={"state_dim": 4}), r"^ptb\.kf: a Kalman filter models continuous data only; "
                                                     r"expected null"),
    (lambda p: p["swimmer"].update(kf=None), r"^swimmer\.variants: kf needs a swimmer\.kf section .*kf: \{\}"),
    (lambda p: p["ptb"]["two_stage"].update(layers=1), r"^ptb\.variants: psrnn_2layer needs "
                                                       r"ptb\.two_stage\.layers >= 2, got 1"),
    (lambda p: p["custom"].update(two_stage=None), r"^custom\.two_stage: null; expected a mapping of the 2SR "
                                                   r"settings \(n_features, state_dim, obs_dim, past_window"),
    (lambda p: p["ptb"]["two_stage"].update(layers=0),
     r"^ptb\.two_stage\.layers: expected a positive integer, got an integer 0"),
    (lambda p: p["ptb"]["two_stage"].update(layer=2),
     r"^ptb\.two_stage\.layer: unknown key, did you mean 'layers'\? \(expected .*'layers'"),
    (lambda p: p["ptb"]["two_stage"].update(state_dim=3000), r"ptb\.two_stage.*state_dim=3000 exceeds n_features"),
    (lambda p: p["ptb"]["two_stage"].update(state_dim=0), r"^ptb\.two_stage\.state_dim: expected a positive "
                                                          r"integer, got an integer 0$"),
    (lambda p: p["swimmer"]["two_stage"].update(past_window=60, future_window=60),
     r"^swimmer\.two_stage\.past_window \+ swimmer\.two_stage\.future_window \+ 1 = 60 \+ 60 \+ 1 = 121 exceeds "
     r"the trajectory length \(swimmer\.source\.length = 100\)"),
    (lambda p: p["swimmer"]["source"].update(n_train=25), r"swimmer\.source\.n_train=25 leaves no test"),
    # a variant override's value that TrainConfig.validate refuses is named by its full key, once
    (lambda p: p["ptb"]["train"].update(overrides={"psrnn": {"patience": -1}}),
     r"^ptb\.train\.overrides\.psrnn\.patience: expected >= 0 \(0 = never stop early\), got -1$"),
    (lambda p: p["ptb"]["train"].update(overrides={"lstm": {"lr_decay": 2}}),
     r"^ptb\.train\.overrides\.lstm\.lr_decay: expected a factor in \(0, 1\]"),
    # ... and a rule across two keys, one of them from train, names the key where train sets it
    (lambda p: p["ptb"]["train"].update(monitor="train", overrides={"psrnn": {"eval_train": False}}),
     r"^ptb\.train\.overrides\.psrnn: ptb\.train\.monitor: 'train' needs eval_train: true"),
    # the counts of either Swimmer mode, with the defaults of the keys left out (preprocess named no key)
    (lambda p: p["swimmer"].update(source={"n_trajectories": 10}), r"^swimmer\.source\.n_train=20 \(the default\) "
     r"leaves no test trajectory out of n_trajectories=10; expected n_train < n_trajectories$"),
    (lambda p: p["swimmer"].update(source={"mode": "authors", "n_train": 25}), r"^swimmer\.source\.n_train=25 and "
     r"n_test=5 \(the default\): train and test come from the same file, whose 25 trajectories they would share; "
     r"expected n_train \+ n_test <= 25$"),
    (lambda p: p["swimmer"].update(source={"mode": "authors", "n_train": 25, "test_file": "./swimmers_trajs_0.0.mat"}),
     r"^swimmer\.source\.n_train=25 and n_test=5 \(the default\): train and test come from the same file"),
    (lambda p: p["swimmer"].update(source={"mode": "authors", "test_file": "swimmers_trajs_0.8.mat", "n_test": 26}),
     r"^swimmer\.source\.n_test=26: each of the authors' files holds 25 trajectories; expected at most 25$"),
    (lambda p: p["ptb"]["source"].update(unknown="ignore"), r"^ptb\.source\.unknown: expected one of 'drop', "
                                                            r"'map', 'error', got a string 'ignore'$"),
    (lambda p: p.update(seeds=[]), r"seeds: expected a non-empty list"),
    (lambda p: p.update(seeds=[0, 0]), r"seeds: duplicated"),
    (lambda p: p["tracking"].update(log_model="yes"), r"tracking\.log_model: expected true or false, got a string "
                                                      r"'yes' \(params\.yaml is read as YAML 1\.2"),
    (lambda p: p["ptb"]["train"].update(optimizer="rmsprop"), r"^ptb\.train\.optimizer: expected one of 'sgd', "
                                                              r"'adam', got a string 'rmsprop'$"),
    (lambda p: p["custom"]["source"].update(valid_fraction=1.0),
     r"^custom\.source\.valid_fraction: expected a finite number in \[0, 1\)"),
    (lambda p: p["custom"]["source"].update(valid_fraction=0.9),
     r"^custom\.source\.valid_fraction: 0\.9 \+ test_fraction 0\.2 leaves nothing to train on"),
])
def test_bad_params_name_the_key(defaults, mutate, key):
    raw = copy.deepcopy(defaults)
    mutate(raw)
    with pytest.raises(ParamsError, match=key):
        parse_params(raw)


def test_a_key_that_is_no_name_gets_no_guess(tmp_path):
    """did_you_mean took a dict key of 1 or None to difflib, which needs a sequence: fit_model(train_options={1: 2})
    and a report figure option of 1 raised TypeError instead of their one-line ValueError."""
    from pipeline.api import fit_model
    from pipeline.config import did_you_mean
    from pipeline.report import write_report

    assert did_you_mean(1, ["lr"]) == did_you_mean(None, ["lr"]) == did_you_mean(True, ["lr"]) == ""
    with pytest.raises(ValueError, match=r"^train_options: unknown key\(s\) \[1\]; expected some of "):
        fit_model([[0, 1, 0, 1, 1, 0]] * 4, train_options={1: 2})
    with pytest.raises(ValueError, match=r"^report: figures\.fig3a: unknown option\(s\) \[1\]; known: "):
        write_report(tmp_path, tmp_path / "reports", figures={"fig3a": {1: 2}})
    assert not (tmp_path / "reports").exists()   # refused before anything is written


def test_a_misspelt_key_names_the_key_it_is_closest_to(defaults):
    """Among the 20-odd keys of a list, the one a typo was meant to be: at the top level and in a section; a
    key close to none gets no guess ('train' at the top level is not 'tracking')."""
    for where, key, message in (
            ((), "datset", r"^datset: unknown key in params\.yaml, did you mean 'datasets'\? \(expected one of \["),
            ((), "train", r"^train: unknown key in params\.yaml \(expected one of \["),
            (("swimmer", "two_stage"), "stat_dim", r"^swimmer\.two_stage\.stat_dim: unknown key, did you mean "
                                                   r"'state_dim'\? \(expected one of \["),
            (("mocap", "train"), "epoch", r"^mocap\.train\.epoch: unknown key, did you mean 'epochs'\? ")):
        raw = copy.deepcopy(defaults)
        section = raw
        for name in where:
            section = section[name]
        section[key] = 1
        with pytest.raises(ParamsError, match=message):
            parse_params(raw)


@pytest.mark.parametrize("where, key, message", [
    (("custom", "two_stage"), "horizon", "custom.two_stage.horizon: unknown key, did you mean 'future_window'? "
                                         "(fit_model's horizon) (expected one of ["),
    (("custom", "kf"), "horizon", "custom.kf.horizon: unknown key, did you mean 'future_window'? (fit_model's "
                                  "horizon) (expected one of ['future_window', 'past_window', 'ridge', 'state_dim'])"),
    (("custom", "train"), "horizon", "custom.train.horizon: unknown key; fit_model's horizon is set by "
                                     "two_stage.future_window (and kf.future_window) in params.yaml (expected one "
                                     "of ["),
    (("custom", "source"), "standardize", "custom.source.standardize: unknown key, did you mean 'normalize'? "
                                          "(fit_model's standardize) (expected one of ["),
    (("hmm", "model"), "bias_scale", "hmm.model.bias_scale: unknown key; fit_model's bias_scale is set by "
                                     "model.psrnn_bias_scale and model.factorized_bias_scale in params.yaml "
                                     "(expected one of ['factorized_bias_scale', 'psrnn_bias_scale'])"),
    (("ptb", "two_stage"), "n_layers", "ptb.two_stage.n_layers: unknown key; fit_model's n_layers is set by the "
                                       "variant's name, psrnn_<L>layer in variants, with two_stage.layers >= L in "
                                       "params.yaml (expected one of ["),
    (("swimmer", "train"), "seed", "swimmer.train.seed: unknown key; fit_model's seed is set by the top-level "
                                   "seeds list (one run per seed) in params.yaml (expected one of ["),
    (("lgssm",), "rank", "lgssm.rank: unknown key; fit_model's rank is set by the variant's name, "
                         "factorized_psrnn_r<rank> in variants in params.yaml (expected one of ["),
    # a source's seed draws its data (swimmer.source.seed): PTB's source has none, and no run seed is meant
    (("ptb", "source"), "seed", "ptb.source.seed: unknown key (expected one of ['lines', 'unknown', "
                                    "'vocab_from'])"),
])
def test_fit_model_argument_names_point_to_their_params_key(defaults, where, key, message):
    """A user of pipeline.api.fit_model writes its argument names; where params.yaml spells one otherwise (no typo
    away: did-you-mean finds nothing), the error names the key, or where params.yaml sets it."""
    raw = copy.deepcopy(defaults)
    section = raw
    for name in where:
        section = section[name]
    section[key] = 5
    assert _message(raw).startswith(message)


def test_custom_section_needs_path_and_kind(defaults):
    raw = copy.deepcopy(defaults)
    raw["custom"] = {"source": {"kind": "continuous"}, "variants": ["psrnn"]}
    with pytest.raises(ParamsError, match=r"custom\.source\.path: required"):
        parse_params(raw)
    raw["custom"]["source"] = {"path": "x.parquet", "kind": "audio"}
    with pytest.raises(ParamsError, match=r"custom\.source\.kind"):
        parse_params(raw)
    raw["custom"]["source"] = {"path": "x.parquet"}   # absent: said to be required, as path is, not "got null"
    assert _message(raw) == ("custom.source.kind: required ('discrete' for one column of symbols, 'continuous' "
                             "for numeric feature columns)")
    raw["custom"]["source"] = {"path": "x.parquet", "kind": None}   # written but empty: its value is named
    assert _message(raw) == "custom.source.kind: expected a string, got null"


def test_variant_names():
    assert Variant.parse("psrnn_3layer").n_layers == 3
    v = Variant.parse("factorized_psrnn_r60")
    assert (v.family, v.rank, v.init) == ("factorized_psrnn", 60, "2sr")
    assert Variant.parse("psrnn_random").init == "random"
    assert Variant.parse("lstm").init == "xavier"
    v = Variant.parse("psrnn_2layer_skip")
    assert (v.family, v.n_layers, v.skip, v.init) == ("psrnn", 2, True, "2sr")
    assert not Variant.parse("psrnn_2layer").skip
    assert Variant.parse("psrnn_3layer_skip_random").init == "random"
    with pytest.raises(ParamsError, match=r"variants: 'psrnn_1layer_skip': _skip needs 2 or more layers"):
        Variant.parse("psrnn_1layer_skip")
    for bad in ("psrnn_skip", "psrnn_2layer_random_skip", "factorized_psrnn_r4_skip"):
        with pytest.raises(ParamsError, match="unknown model variant"):
            Variant.parse(bad)


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ParamsError, match="params file not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "params.yaml"
    bad.write_text("ptb: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)
    bad.write_text("seeds: [0]\ndatasets: [hmm]\nhmm: {train: {epochs: " + "9" * 5000 + "}}\n")
    with pytest.raises(ParamsError, match=rf"^{re.escape(str(bad))}: a number of thousands of digits at line 3; "):
        load_params(bad)
    bad.write_text("seeds: " + "[" * 5000 + "]" * 5000 + "\n")   # PyYAML recurses once per level
    with pytest.raises(ParamsError, match=rf"^{re.escape(str(bad))}: nested too deeply to read"):
        load_params(bad)


def test_cli_reports_one_line(tmp_path, capsys, defaults):
    from pipeline.cli import main

    raw = copy.deepcopy(defaults)
    raw["ptb"]["train"]["lrr"] = 1
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert main(["--root", str(tmp_path), "check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ptb.train.lrr: unknown key" in err[0]
    # the global options also count after the command's name, as -v and --debug do
    assert main(["check", "--root", str(tmp_path)]) == 1
    assert "ptb.train.lrr: unknown key" in capsys.readouterr().err
    raw["ptb"]["train"]["lrx"] = raw["ptb"]["train"].pop("lrr")
    other = tmp_path / "other.yaml"
    other.write_text(dump_yaml(raw))
    assert main(["--params", str(tmp_path / "params.yaml"), "check", "--root", str(tmp_path), "--params",
                 str(other)]) == 1   # the value after the command wins
    assert "ptb.train.lrx: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize("argv, line", [
    (["features", "ptb", "x"], "psrnn features: error: argument seed: invalid int value: 'x' (see psrnn features "
                               "--help)"),
    (["refine"], "psrnn refine: error: the following arguments are required: dataset (see psrnn refine --help)"),
    (["forecast", "ptb", "psrnn", "0", "in.parquet", "out.parquet", "--steps", "many"],
     "psrnn forecast: error: argument --steps: invalid int value: 'many' (see psrnn forecast --help)"),
    # a flag of another command (forecast's --sample) is named by the command it was given to
    (["predict", "custom", "psrnn", "0", "in.parquet", "out.parquet", "--sample"],
     "psrnn predict: error: unrecognized arguments: --sample (see psrnn predict --help)"),
    # no abbreviations: main looks --debug and --verbose up by their full spelling, so --debu would be dropped
    (["--debu", "check"], "psrnn check: error: unrecognized arguments: --debu (see psrnn check --help)"),
    (["--verb", "check"], "psrnn check: error: unrecognized arguments: --verb (see psrnn check --help)"),
])
def test_cli_usage_errors_are_one_line(argv, line, capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == line + "\n"


# ------------------------------------------------------------------------------- values, sections, typos


def _message(raw) -> str:
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def _custom(**source):
    return {"source": {"path": "x.parquet", "kind": "continuous", **source}, "variants": ["psrnn"]}


@pytest.mark.parametrize("mutate, key", [
    # values the code that reads them cannot use
    (lambda p: p["ptb"]["train"].update(device="gpu"), r"^ptb\.train\.device: expected 'auto', 'cpu', 'cuda'"),
    (lambda p: p["ptb"]["train"].update(device="cuda:x"), r"^ptb\.train\.device: "),
    (lambda p: p["ptb"]["two_stage"].update(feature_dtype="float16"), r"^ptb\.two_stage\.feature_dtype: expected one"),
    (lambda p: p["ptb"]["two_stage"].update(power_iterations=0), r"^ptb\.two_stage\.power_iterations: expected a "
                                                                 r"positive integer"),   # 0: a random subspace
    (lambda p: p["ptb"]["two_stage"].update(oversample=-1), r"^ptb\.two_stage\.oversample: expected an integer >= 0"),
    (lambda p: p["ptb"]["two_stage"].update(widths={"obs": "wide"}), r"^ptb\.two_stage\.widths\.obs: expected a "
                                                                     r"number"),
    (lambda p: p["ptb"]["two_stage"].update(widths={"obs": -1.0}), r"^ptb\.two_stage\.widths\.obs: expected a finite "
                                                                   r"number >= 1e-30, got -1\.0$"),
    (lambda p: p["ptb"]["two_stage"].update(widths=[2.0]), r"^ptb\.two_stage\.widths: expected a mapping"),
    (lambda p: p["ptb"]["two_stage"].update(width_scale=0), r"^ptb\.two_stage\.width_scale: expected a finite "
                                                            r"number > 0"),
    (lambda p: p["ptb"]["two_stage"].update(upper_past_window=0), r"^ptb\.two_stage\.upper_past_window: expected a "
                                                                  r"positive integer or null, got an integer 0$"),
    (lambda p: p["ptb"]["two_stage"].update(upper_future_window=True), r"^ptb\.two_stage\.upper_future_window: "
                                                                       r"expected an integer, got a boolean true$"),
    (lambda p: p["ptb"]["two_stage"].update(upper_future_window=1.5), r"^ptb\.two_stage\.upper_future_window: "
                                                                      r"expected an integer, got a number 1\.5$"),
    (lambda p: p["ptb"]["two_stage"].update(upper_obs_ridge=-0.1), r"^ptb\.two_stage\.upper_obs_ridge: expected a "
                                                                   r"finite number >= 0"),
    # the upper layers' windows must fit the trajectories as layer 1's do (hmm: length 200)
    (lambda p: p["hmm"]["two_stage"].update(upper_past_window=197), r"^hmm\.two_stage\.upper_past_window \+ "
                                                                    r"hmm\.two_stage\.future_window \+ 1 = 197 \+ 3 "
                                                                    r"\+ 1 = 201 exceeds the trajectory length "
                                                                    r"\(hmm\.source\.length = 200\); expected "
                                                                    r"upper_past_window \+ future_window <= 199$"),
    (lambda p: p.update(seeds=[-1]), r"^seeds: expected a non-empty list of integers in \[0, 2\*\*32\)"),
    (lambda p: p.update(seeds=[2 ** 64]), r"^seeds: expected a non-empty list of integers in \[0, 2\*\*32\), got a "
                                          r"list \[18446744073709551616\]$"),   # torch.manual_seed refuses it
    (lambda p: p.update(seeds=[10 ** 5000]), r"^seeds: expected .*, got a list \[\.\.\.\]$"),
    (lambda p: p["hmm"]["source"].update(seed=2 ** 32), r"^hmm\.source\.seed: expected an integer in \[0, 2\*\*32\)"),
    (lambda p: p["ptb"]["two_stage"].update(state_dim=10 ** 5000), r"^ptb\.two_stage\.state_dim: expected an integer "
                                                                   r"<= 2\*\*31 - 1, got an integer of about 5001 "
                                                                   r"digits$"),
    (lambda p: p["hmm"]["source"].update(n_train=10 ** 30), r"^hmm\.source\.n_train: expected an integer <= "
                                                            r"2\*\*31 - 1, got an integer 10{30}$"),   # printed whole
    (lambda p: p["hmm"]["two_stage"].update(power_iterations=101), r"^hmm\.two_stage\.power_iterations: expected an "
                                                                   r"integer <= 100, got an integer 101$"),
    (lambda p: p["hmm"]["two_stage"].update(n_features=2 ** 31), r"^hmm\.two_stage\.n_features: expected an integer "
                                                                 r"<= 2\*\*31 - 1, got an integer 2147483648$"),
    (lambda p: p["hmm"]["train"].update(lr=1.0e308), r"^hmm\.train\.lr: expected a finite number > 0 of magnitude at "
                                                     r"most 1e\+30, got 1e\+308$"),
    (lambda p: p["hmm"]["two_stage"].update(ridge=2.0e30), r"^hmm\.two_stage\.ridge: expected a finite number >= 0 "
                                                           r"of magnitude at most 1e\+30, got 2e\+30$"),
    (lambda p: p["tracking"].update(experiment_prefix="x" * 201), r"^tracking\.experiment_prefix: expected at most "
                                                                  r"200 characters, got 201$"),
    (lambda p: p["ptb"]["two_stage"].update(ridge=10 ** 400), r"^ptb\.two_stage\.ridge: expected a number within the "
                                                              r"float range, got an integer of about 401 digits$"),
    (lambda p: p["hmm"]["source"].update(stickiness=10 ** 400), r"^hmm\.source\.stickiness: expected a number within "
                                                                r"the float range"),
    (lambda p: p["ptb"]["train"].update(lr="1e-3"), r"^ptb\.train\.lr: expected a number, got a string '1e-3' \(a "
                                                    r"quoted number is text: remove the quotes\)$"),
    (lambda p: p["ptb"]["train"].update(lr="0.5"), r"^ptb\.train\.lr: expected a number, got a string '0\.5' \(a "
                                                   r"quoted number is text: remove the quotes\)$"),
    (lambda p: p["ptb"]["train"].update(lr="nan"), r"^ptb\.train\.lr: expected a number, got a string 'nan'$"),
    (lambda p: p["ptb"]["train"].update(device="cpu\n"), r"^ptb\.train\.device: expected 'auto'"),
    (lambda p: p["ptb"].update(variants=["psrnn", "lstm\n"]), r"^ptb\.variants: unknown model variant"),
    (lambda p: p["ptb"].update(variants=["factorized_psrnn_r\u0663"]), r"^ptb\.variants: unknown model variant"),
    (lambda p: p["ptb"].update(variants=["psrnn", "psrnn_1layer"]), r"^ptb\.variants: write 'psrnn_1layer' as "
                                                                    r"'psrnn' \(one name per model\)$"),
    (lambda p: p["ptb"].update(variants=["factorized_psrnn_r007"]), r"^ptb\.variants: write 'factorized_psrnn_r007' "
                                                                    r"as 'factorized_psrnn_r7'"),
    (lambda p: p["ptb"].update(variants=["psrnn_02layer_random"]), r"^ptb\.variants: write 'psrnn_02layer_random' "
                                                                   r"as 'psrnn_2layer_random'"),
    (lambda p: p["ptb"].update(variants=["psrnn_99999999999layer_random"]), r"^ptb\.variants: number of layers in "
                                                                            r"'psrnn_99999999999layer_random' must "
                                                                            r"be in 1\.\.64$"),
    (lambda p: p["ptb"]["two_stage"].update(layers=65), r"^ptb\.two_stage\.layers: expected at most 64"),
    (lambda p: p["ptb"]["two_stage"].update(widths={"obs": 1e-320}), r"^ptb\.two_stage\.widths\.obs: expected a "
                                                                     r"finite number >= 1e-30"),
    (lambda p: p["handwriting"]["source"].update(digits=[1, 1]), r"^handwriting\.source\.digits: duplicated \[1\]"),
    # the simulator's CEM refits on the best of its candidates: one is no choice
    (lambda p: p["swimmer"]["source"].update(mode="simulate", cem_population=1),
     r"^swimmer\.source\.cem_population: expected an integer >= 2 .*, got 1$"),
    (lambda p: p["custom"]["source"].update(kind="discrete", normalize=False, features=None),
     r"^custom\.source\.normalize: only used with kind 'continuous'"),
    # without `trials`, test trials are checked against prepare_mocap's defaults
    (lambda p: (p["mocap"]["source"].pop("trials"), p["mocap"]["source"].update(test_trials=["99_99"])),
     r"^mocap\.source\.test_trials: \['99_99'\] are not in the default trials \['07_01', .*\] \(no "
     r"mocap\.source\.trials\)$"),
    (lambda p: p["hmm"].update(variants=["factorized_psrnn_r601"]),
     r"^hmm\.variants: rank 601 of factorized_psrnn_r601 exceeds 10 × state_dim × obs_dim = 10 × 10 × 6 = 600; "
     r"expected a rank at most that$"),
    (lambda p: p["ptb"]["train"].update({None: 1}), r"^ptb\.train: the key null is not a name; expected one of "),
    (lambda p: p["ptb"]["train"].update({0: None}), r"^ptb\.train: the key an integer 0 is not a name \(a decimal "
                                                    r"comma, as in \{lr: 1,0\}, splits a flow mapping's entry in two: "
                                                    r"write 1\.0\); expected one of "),
    (lambda p: p["custom"]["source"].update(symbol_column="angle"), r"^custom\.source\.symbol_column: only used with "
                                                                    r"kind 'discrete'"),
    (lambda p: p["report"].update(figures={"fig4b": {"dataset": "nosuchds"}}),
     r"^report\.figures\.fig4b\.dataset: dataset 'nosuchds' has no section in params\.yaml; expected one of ptb, "),
    (lambda p: p["report"].update(figures={"fig4a": {"datasets": ["swimmer", "nosuchds"]}}),
     r"^report\.figures\.fig4a\.datasets: dataset 'nosuchds' has no section"),
    (lambda p: p["hmm"]["source"].update(seed=-3), r"^hmm\.source\.seed: expected an integer in \[0, 2\*\*32\), got an integer -3$"),
    (lambda p: p["lgssm"]["source"].update(process_noise=0), r"^lgssm\.source\.process_noise: expected a finite "
                                                             r"number > 0, got 0"),
    (lambda p: p["lgssm"]["source"].update(obs_noise=-0.1), r"^lgssm\.source\.obs_noise: "),
    (lambda p: p["lgssm"]["source"].update(obs_noise=float("nan")), r"^lgssm\.source\.obs_noise: "),
    (lambda p: p["ptb"]["source"].update(vocab_from="test"), r"^ptb\.source\.vocab_from: expected one of 'train', "
                                                             r"'all'"),
    (lambda p: p.update(custom=_custom(test_fraction=1.0)), r"^custom\.source\.test_fraction: expected a finite "
                                                            r"number in \(0, 1\), got 1\.0"),
    (lambda p: p.update(custom=_custom(test_fraction=0)), r"^custom\.source\.test_fraction: "),
    (lambda p: p["swimmer"]["kf"].update(state_dim=31), r"^swimmer\.kf\.state_dim: 31 exceeds swimmer\.kf\."
                                                        r"future_window x observation size = 10 x 3 = 30"),
    (lambda p: p["lgssm"]["kf"].update(state_dim=17), r"^lgssm\.kf\.state_dim: 17 exceeds .* = 8 x 2 = 16"),
    (lambda p: p["hmm"]["source"].update(stickiness=1.5), r"^hmm\.source\.stickiness: expected a finite number in "
                                                          r"\[0, 1\], got 1\.5"),
    (lambda p: p["hmm"]["source"].update(stickiness=-0.1), r"^hmm\.source\.stickiness: "),
    (lambda p: p["hmm"]["source"].update(n_symbols=1), r"^hmm\.source\.n_symbols: expected an integer >= 2"),
    (lambda p: p["ptb"]["train"].update(momentum=-0.5), r"^ptb\.train\.momentum: expected a finite number in "
                                                        r"\[0, 1\)"),
    (lambda p: p["ptb"]["train"].update(optimizer="adam", momentum=0.9), r"^ptb\.train\.momentum: only used by "
                                                                         r"optimizer 'sgd'"),
    # SGD's decay alone scales the weights by 1 - lr * weight_decay a step: at lr x wd >= 2 (1 + momentum) they grow
    (lambda p: p["ptb"]["train"].update(weight_decay=3), r"^ptb\.train\.weight_decay: 3 x lr 1 = 3 is at or above "
                                                         r"2 x \(1 \+ momentum\) = 2, where every SGD step"),
    (lambda p: p["ptb"]["train"].update(weight_decay=0.5, overrides={"lstm": {"lr": 5}}),
     r"^ptb\.train\.overrides\.lstm: ptb\.train\.weight_decay: 0\.5 x lr 5 = 2\.5 is at or above"),
    (lambda p: p["ptb"]["train"].update(weight_decay=-1e-4), r"^ptb\.train\.weight_decay: expected a finite "
                                                             r"number >= 0"),
    (lambda p: p["swimmer"]["kf"].update(ridge=-1), r"^swimmer\.kf\.ridge: expected a finite number >= 0"),
    (lambda p: p["ptb"]["two_stage"].update(obs_ridge=-1), r"^ptb\.two_stage\.obs_ridge: expected a finite "
                                                           r"number >= 0"),
    (lambda p: p["ptb"]["train"].update(max_loss=0), r"^ptb\.train\.max_loss: expected a number > 0"),
    (lambda p: p["ptb"]["train"].update(max_loss=float("nan")), r"^ptb\.train\.max_loss: "),
    (lambda p: p["ptb"]["train"].update(lr=float("inf")), r"^ptb\.train\.lr: expected a finite number > 0, got inf"),
    (lambda p: p["ptb"]["train"].update(lr=float("nan")), r"^ptb\.train\.lr: expected a finite number > 0, got nan"),
    (lambda p: p["ptb"]["train"].update(lr=-1), r"^ptb\.train\.lr: "),
    (lambda p: p["ptb"]["train"].update(clip=float("nan")), r"^ptb\.train\.clip: expected a finite number >= 0"),
    (lambda p: p["ptb"]["train"].update(clip=float("inf")), r"^ptb\.train\.clip: "),
    (lambda p: p["ptb"]["model"].update(psrnn_bias_scale=float("nan")), r"^ptb\.model\.psrnn_bias_scale: "),
    # the full key, once, and the right one
    (lambda p: p["hmm"]["two_stage"].update(decoder_ridge=-1), r"^hmm\.two_stage\.decoder_ridge: expected a finite "
                                                               r"number >= 0, got -1\.0$"),
    (lambda p: p["hmm"]["two_stage"].update(state_dim=1001), r"^hmm\.two_stage\.state_dim=1001 exceeds n_features"),
    # typos and unknown names run nothing
    (lambda p: p["hmm"]["two_stage"].update(widths={"ob": 1.0}), r"^hmm\.two_stage\.widths\.ob: unknown key, did "
                                                                 r"you mean 'obs'\? \(expected one of \['future', "
                                                                 r"'obs', 'past'\]\)"),
    # no allowed key close to it: no guess, the list alone
    (lambda p: p["hmm"]["two_stage"].update(widths={"sigma": 1.0}), r"^hmm\.two_stage\.widths\.sigma: unknown key "
                                                                    r"\(expected one of \['future', 'obs', 'past'\]\)"),
    (lambda p: p["report"].update(figure={"fig4b": {}}), r"^report\.figure: unknown key"),
    # figures of continuous data refuse a discrete dataset (an empty MSE panel, a trace of symbols)
    (lambda p: p["report"].update(figures={"fig4b": {"dataset": "hmm"}}), r"^report\.figures\.fig4b\.dataset: dataset 'hmm' "
                                                                          r"is discrete; this figure shows a feature "
                                                                          r"of continuous data \(expected one of "
                                                                          r"swimmer, mocap, handwriting, lgssm, custom"
                                                                          r"\)$"),
    (lambda p: p["report"].update(figures={"fig4a": {"datasets": ["swimmer", "ptb"]}}),
     r"^report\.figures\.fig4a\.datasets: dataset 'ptb' is discrete; this figure shows the MSE of continuous data"),
    (lambda p: p["report"].update(figures=[]), r"^report\.figures: expected a mapping of figure names"),
    (lambda p: p["report"].update(figures={"fig9z": {}}), r"^report\.figures\.fig9z: unknown figure"),
    (lambda p: p["report"].update(figures={"fig4a": {"variants": ["kf", "lstn"]}}),
     r"^report\.figures\.fig4a\.variants: unknown model variant 'lstn'; expected psrnn,"),
    (lambda p: p["report"].update(figures={"fig3a": ["gru", "factorized_psrnn_r060"]}),
     r"^report\.figures\.fig3a: write 'factorized_psrnn_r060' as 'factorized_psrnn_r60'"),
    (lambda p: p["report"].update(figures={"fig4b": {"feture": "x"}}), r"^report\.figures\.fig4b\.feture: "
                                                                       r"unknown key"),
    (lambda p: p["report"].update(figures={"fig4a": {"split": "tset"}}), r"^report\.figures\.fig4a\.split: "),
    # null is fig4b's default (chosen by dataset); the other figures have no such default
    (lambda p: p["report"].update(figures={"fig3a": {"variants": None}}),
     r"^report\.figures\.fig3a\.variants: expected a non-empty list of names, got null"),
    (lambda p: p["report"].update(figures={"fig3a": "lstm"}), r"^report\.figures\.fig3a: expected a mapping of "
                                                              r"options"),
    (lambda p: p["swimmer"]["source"].update(mode="authors"), r"^swimmer\.source\.n_trajectories: only used with "
                                                              r"mode 'simulate', not 'authors'; remove "
                                                              r"n_trajectories, length, seed$"),
    # malformed sections
    (lambda p: p.update(tracking=[1]), r"^tracking: expected a mapping .*, got a list \[1\]$"),
    (lambda p: p.update(tracking=True), r"^tracking: expected a mapping .*, got a boolean true$"),
    (lambda p: p.update(data=5), r"^data: expected a mapping with key mirror, got an integer 5$"),
    (lambda p: p.update(data="abc"), r"^data: expected a mapping with key mirror, got a string 'abc'$"),
    (lambda p: p.update(data=["mirror"]), r"^data: expected a mapping with key mirror, got a list \['mirror'\]$"),
    (lambda p: p["hmm"].update(variants=[["psrnn"]]), r"^hmm\.variants: expected a non-empty list of model variant "
                                                      r"names, got a list \[\['psrnn'\]\]$"),
    (lambda p: p["hmm"].update(variants="psrnn"), r"^hmm\.variants: expected a non-empty list"),
    (lambda p: p.update(report=[1]), r"^report: expected a mapping"),
    (lambda p: p["hmm"].update(source=[1]), r"^hmm\.source: expected a mapping, got a list"),
    (lambda p: p["hmm"].update(train=7), r"^hmm\.train: expected a mapping, got an integer 7"),
    (lambda p: p.update(hmm=None), r"^hmm: expected a mapping"),
])
def test_bad_values_and_sections_name_the_key(defaults, mutate, key):
    raw = copy.deepcopy(defaults)
    mutate(raw)
    msg = _message(raw)
    assert re.search(key, msg), msg
    first = msg.split(":")[0].split(" ")[0].split("=")[0]
    assert msg.count(first) == 1 or first in ("seeds",), f"key named more than once: {msg}"


def test_good_values_pass(defaults):
    raw = copy.deepcopy(defaults)
    raw["ptb"]["train"].update(device="cuda:1", momentum=0.9, weight_decay=1e-5, clip=0, max_loss=float("inf"))
    raw["ptb"]["two_stage"].update(widths={"obs": 2.0, "past": None}, feature_dtype="float64", power_iterations=1,
                                   oversample=0)
    raw["hmm"]["source"].update(stickiness=1, n_symbols=2)
    raw["report"]["figures"] = {"fig4b": {"feature": "joint1_angle", "seed": 0, "variants": None},   # the default
                                "fig3a": ["lstm", "gru"],
                                "fig3c": False, "per_dataset": {"enabled": False}, "fig4a": {"logy": True}}
    raw["custom"] = _custom(test_fraction=0.5, features=["a", "b"], seed=1)
    raw["tracking"] = None
    raw["data"] = None
    p = parse_params(raw)
    assert p.dataset("ptb").train.device == "cuda:1" and p.dataset("ptb").two_stage.widths["past"] is None


_LONG = "x" * 5000
_NINES = "9" * 5000


@pytest.mark.parametrize("mutate, message", [
    # a count without a ceiling (README: every count at most 2**31 - 1), in train and in an override
    (lambda p: p["ptb"]["train"].update(patience=10 ** 100),
     "ptb.train.patience: expected an integer <= 2**31 - 1, got an integer of about 101 digits"),
    (lambda p: p["ptb"]["train"].update(overrides={"psrnn": {"patience": 2 ** 31}}),
     "ptb.train.overrides.psrnn.patience: expected an integer <= 2**31 - 1, got an integer 2147483648"),
    # a rank or depth too long for int() (4300 digits): a ValueError that named no key
    (lambda p: p["ptb"].update(variants=["factorized_psrnn_r" + _NINES]),
     "ptb.variants: rank in 'factorized_psrnn_r" + "9" * 58 + "... is a number of 5000 digits; expected at most "
     "10 x state_dim x obs_dim"),
    (lambda p: p["hmm"].update(variants=["psrnn_" + _NINES + "layer_random"]),
     "hmm.variants: number of layers in 'psrnn_" + "9" * 70 + "... must be in 1..64"),
    (lambda p: p["hmm"].update(variants=["psrnn_" + "0" * 5000 + "2layer"]),
     "hmm.variants: write 'psrnn_" + "0" * 70 + "... as 'psrnn_2layer' (one name per model)"),
    # fig4b's seed picks the runs of one seed: one not in seeds leaves the figure out, with only a note
    (lambda p: p["report"].update(figures={"fig4b": {"seed": 7}}),
     "report.figures.fig4b.seed: expected one of seeds [0, 1] or null (the lowest), got an integer 7"),
    (lambda p: p["report"].update(figures={"fig4b": {"seed": 10 ** 5000}}),
     "report.figures.fig4b.seed: expected one of seeds [0, 1] or null (the lowest), got an integer of about 5001 "
     "digits"),
    (lambda p: p["report"].update(figures={"fig4b": {"trajectory": 10 ** 40}}),
     "report.figures.fig4b.trajectory: expected an integer <= 2**31 - 1, got an integer 1" + "0" * 40),
    (lambda p: p["report"].update(figures={"fig4b": {"trajectory": -1}}),   # a string is a custom file's own id
     "report.figures.fig4b.trajectory: expected a trajectory id of your file (a string), a non-negative integer or "
     "null, got an integer -1"),
    (lambda p: p["report"].update(figures={"fig4b": {"trajectory": ""}}),
     "report.figures.fig4b.trajectory: expected a trajectory id of your file, a non-negative integer or null, got "
     "''"),
    # a long text is shortened, so that what was expected survives the CLI's cut at 600 characters
    (lambda p: p["ptb"].update(variants=["psrnn", _LONG]),
     "ptb.variants: unknown model variant '" + "x" * 76 + "...; expected psrnn, psrnn_<L>layer, psrnn_<L>layer_skip, "
     "psrnn_random, psrnn_<L>layer_random, psrnn_<L>layer_skip_random, factorized_psrnn_r<rank>, "
     "factorized_psrnn_r<rank>_random, lstm, gru, rnn or kf; any but kf may end in _delta (continuous data)"),
    (lambda p: p["ptb"]["train"].update(device=_LONG),
     "ptb.train.device: expected 'auto', 'cpu', 'cuda' or 'cuda:<index>', got a string '" + "x" * 76 + "..."),
    (lambda p: p.update(datasets=["ptb", _LONG]),
     "datasets: unknown dataset '" + "x" * 76 + "...; expected some of ptb, swimmer, mocap, handwriting, hmm, lgssm, "
     "custom or custom_<name> (lower-case letters, digits, underscores)"),
])
def test_fuzzed_params_give_one_line_naming_the_key(defaults, mutate, message):
    """Found by fuzzing params.yaml: each was accepted, a ValueError naming no key, or a line of 5000 characters."""
    raw = copy.deepcopy(defaults)
    mutate(raw)
    assert _message(raw) == message


@pytest.mark.parametrize("option, message", [
    ({"oversample": -5}, "two_stage_options['oversample']: expected an integer >= 0, got -5"),
    ({"power_iterations": 0}, "two_stage_options['power_iterations']: expected a positive integer, got 0"),
    ({"power_iterations": 10 ** 100}, "two_stage_options['power_iterations']: expected an integer <= 100, got an integer of "
                                      "about 101 digits"),
    ({"chunk_size": 2 ** 40}, "two_stage_options['chunk_size']: expected an integer <= 2**31 - 1, got 1099511627776"),
    ({"decoder_ridge": -0.1}, "two_stage_options['decoder_ridge']: expected a finite number >= 0, got -0.1"),
    ({"obs_ridge": float("nan")}, "two_stage_options['obs_ridge']: expected a finite number >= 0, got nan"),
    ({"feature_dtype": "float16"}, "two_stage_options['feature_dtype']: expected 'float32' or 'float64', got 'float16'"),
    ({"width_scale": 0}, "two_stage_options['width_scale']: expected a finite number > 0, got 0"),
    ({"widths": {"obs": 1e-320}}, "two_stage_options['widths']['obs']: expected a finite number >= 1e-30, got 1e-320"),
    ({"widths": {"obs": 1e-100}}, "two_stage_options['widths']['obs']: expected a finite number >= 1e-30, got 1e-100"),
    ({"widths": {"pats": 1.0}}, "two_stage_options['widths']['pats']: unknown family; expected obs, past or future"),
    ({"obs_inverse": "yes"}, "two_stage_options['obs_inverse']: expected true or false, got 'yes'"),
    ({"ridge": 10 ** 400}, "two_stage_options['ridge']: expected a finite number >= 0, got an integer of about 401 digits"),
])
def test_library_two_stage_options_are_validated_like_params(option, message):
    """fit_model(two_stage_options=...) reaches TwoStageConfig without params.yaml validation: the library's own
    check names the option as given (an oversample of -5 was a reshape error deep in 2SR)."""
    import numpy as np

    from pipeline.api import fit_model

    rng = np.random.default_rng(0)
    with pytest.raises(ValueError) as info:
        fit_model([rng.integers(0, 3, 40) for _ in range(4)], n_features=50, state_dim=4, obs_dim=3, epochs=0,
                  two_stage_options=option)
    assert str(info.value) == message


def test_params_read_as_dvc_reads_them(tmp_path):
    """params.yaml is YAML 1.2, as DVC (ruamel.yaml) reads it, so a stage sees the values dvc.lock records: 1e-3 is
    a number (YAML 1.1 text), 010 is ten (1.1: eight), 1:30 is text (1.1: 90 in base 60), yes is text (1.1: true)."""
    from dvc.utils.serialize import parse_yaml

    path = tmp_path / "params.yaml"
    text = (ROOT / "params.yaml").read_text()
    line = "  train: {epochs: 10, lr: 1.0, optimizer: sgd, clip: 0.25, bptt: 35,"
    assert line in text
    path.write_text(text.replace(line, line.replace("epochs: 10, lr: 1.0", "epochs: 010, lr: 1e-3"), 1))
    params = load_params(path)
    assert params.dataset("ptb").train.lr == 0.001 and params.dataset("ptb").train.epochs == 10
    assert parse_yaml(path.read_text(), str(path))["ptb"]["train"] == {**parse_yaml(text, "")["ptb"]["train"],
                                                                        "epochs": 10, "lr": 0.001}
    path.write_text(text.replace("seeds: [0, 1]", "seeds: [1:30]", 1))
    with pytest.raises(ParamsError, match=r"^seeds: expected a non-empty list of integers in \[0, 2\*\*32\), got "
                                          r"a list \['1:30'\]$"):
        load_params(path)
    path.write_text(text.replace('"07_09"', "07_09", 1))
    with pytest.raises(ParamsError, match=r"^mocap\.source\.trials: expected a list of trial names, got an integer 709 "
                                          r"in a list .* \(a name of digits is a number in YAML: quote it, e\.g\. "
                                          r"\"07_09\"\)$"):
        load_params(path)
    path.write_text(text.replace("log_checkpoints: true", "log_checkpoints: yes", 1))
    with pytest.raises(ParamsError, match=r"^tracking\.log_checkpoints: expected true or false, got a string 'yes' "
                                          r"\(params\.yaml is read as YAML 1\.2, as DVC reads it: yes/no/on/off are "
                                          r"text; write true or false\)$"):
        load_params(path)


def test_dump_yaml_reads_back_equal_as_dvc_reads_it():
    """Every text a YAML 1.2 reader would take for something else comes out quoted; numbers, booleans and null
    keep their kind; key order is kept (dvc.yaml's stage order matters)."""
    from dvc.utils.serialize import parse_yaml

    data = {"z": ["07_09", "1e-3", "yes", "on", "1:30", "null", "~", "010", "0x1f", ".inf", "true", "2026-11-27"],
            "a": {"lr": 0.001, "tiny": 1e-300, "flag": True, "none": None, "n": 10 ** 20, "s": "${item}"}}
    for flow in (False, True):
        text = dump_yaml(data, flow_leaves=flow)
        assert read_yaml(text) == data and parse_yaml(text, "x.yaml") == data
        assert list(read_yaml(text)) == ["z", "a"]


def test_duplicate_yaml_keys(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "params.yaml").read_text().replace(
        "  train: {epochs: 10, lr: 1.0, optimizer: sgd, clip: 0.25, bptt: 35,",
        "  train: {epochs: 10, lr: 1.0, optimizer: sgd, clip: 0.25, lr: 0.1, bptt: 35,", 1))
    with pytest.raises(ParamsError, match=r"params\.yaml: duplicate key ptb\.train\.lr at line \d+, column \d+ "
                                          r"\(first at line \d+, column \d+\); expected each key once"):
        load_params(path)
    path.write_text("seeds: [0]\nseeds: [1]\nhmm: {variants: [psrnn]}\n")
    with pytest.raises(ParamsError, match=r"duplicate key seeds at line 2, column 1 \(first at line 1, column 1\)"):
        load_params(path)
    # a merge key (<<) overrides on purpose: not a duplicate
    path.write_text("seeds: [0]\nhmm:\n  source: &src {n_states: 3, length: 40}\n  variants: [psrnn]\n"
                    "  two_stage: {n_features: 64, state_dim: 5, obs_dim: 4, past_dim: 5}\n"
                    "lgssm:\n  source: {<<: *src, length: 50}\n  variants: [kf]\n  kf: {state_dim: 2}\n"
                    "  two_stage: {n_features: 64, state_dim: 5, obs_dim: 4, past_dim: 5}\n")
    with pytest.raises(ParamsError, match=r"^lgssm\.source\.n_states: unknown key"):  # parsed, then validated
        load_params(path)


# ----------------------------------------------------------------------------------------------- windows


def test_pre_data_window_check_uses_the_known_length(defaults):
    raw = copy.deepcopy(defaults)
    raw["hmm"]["two_stage"].update(past_window=100, future_window=99)  # 200 steps: exactly enough
    parse_params(raw)
    raw["hmm"]["two_stage"].update(future_window=100)
    assert "hmm.two_stage.past_window + hmm.two_stage.future_window + 1 = 100 + 100 + 1 = 201" in _message(raw)
    raw = copy.deepcopy(defaults)
    del raw["hmm"]["source"]["length"]  # the generator's default length (200) still bounds the windows
    raw["hmm"]["two_stage"].update(past_window=150, future_window=60)
    assert "(hmm.source.length = 200)" in _message(raw)
    raw = copy.deepcopy(defaults)
    raw["mocap"]["kf"].update(past_window=200, future_window=150)
    assert _message(raw).startswith("mocap.kf.past_window + mocap.kf.future_window + 1 = 200 + 150 + 1 = 351 "
                                    "exceeds the trajectory length (mocap.source.track_length = 300)")


@pytest.mark.parametrize("source, message", [
    ({"segment_length": 1}, "custom.source.segment_length: expected an integer >= 2 (a segment needs a step to "
                            "predict), or null to keep trajectories whole, got an integer 1"),
    ({"segment_length": -5}, "custom.source.segment_length: expected an integer >= 2 (a segment needs a step to "
                             "predict), or null to keep trajectories whole, got an integer -5"),
    ({"segment_length": 30, "min_length": 40}, "custom.source.segment_length: expected an integer >= 40 "
                                               "(custom.source.min_length = 40), or null to keep trajectories "
                                               "whole, got an integer 30"),
    ({"segment_length": 2.5}, "custom.source.segment_length: expected an integer or null, got a number 2.5"),
    ({"segment_length": "20"}, "custom.source.segment_length: expected an integer or null, got a string '20'"),
    ({"segment_length": True}, "custom.source.segment_length: expected an integer or null, got a boolean true"),
    # the shipped windows are 10 + 10: a segment needs 21 steps for 2SR, 22 for the Kalman filter's two windows
    ({"segment_length": 20}, "custom.two_stage.past_window + custom.two_stage.future_window + 1 = 10 + 10 + 1 = 21 "
                             "exceeds the trajectory length (custom.source.segment_length = 20); expected "
                             "past_window + future_window <= 19"),
    ({"segment_length": 21}, "custom.kf.past_window + custom.kf.future_window + 2 = 22 exceeds the trajectory "
                             "length (custom.source.segment_length = 21): the Kalman gain needs two consecutive "
                             "windows of one trajectory; expected past_window + future_window <= 19"),
])
def test_custom_segment_length_is_checked_against_the_windows(defaults, source, message):
    raw = copy.deepcopy(defaults)
    raw["custom"]["source"].update(source)
    assert _message(raw) == message


def test_custom_segment_length_long_enough_passes(defaults):
    raw = copy.deepcopy(defaults)
    for value in (22, None):
        raw["custom"]["source"]["segment_length"] = value
        assert parse_params(raw).dataset("custom").source["segment_length"] == value


def test_custom_unknown_is_checked(defaults):
    raw = copy.deepcopy(defaults)
    raw["custom"].update(source={"path": "x.parquet", "kind": "discrete"}, variants=["psrnn"], kf=None)
    for value in ("error", "drop", "map"):
        raw["custom"]["source"]["unknown"] = value
        assert parse_params(copy.deepcopy(raw)).dataset("custom").source["unknown"] == value
    raw["custom"]["source"]["unknown"] = "ignore"
    assert _message(raw) == "custom.source.unknown: expected one of 'error', 'drop', 'map', got a string 'ignore'"
    raw["custom"]["source"].update(kind="continuous", unknown="map")
    assert _message(raw) == ("custom.source.unknown: only used with kind 'discrete' (valid/test symbols not seen in "
                             "train); remove it")


def test_custom_unknown_is_named_by_its_key_in_the_error_and_passed_on(defaults, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.workflow.data import _load_custom

    pq.write_table(pa.table({"trajectory": [1] * 6 + [2] * 2, "split": ["train"] * 6 + ["test"] * 2,
                             "symbol": ["a", "b"] * 3 + ["a", "z"]}), tmp_path / "d.parquet")
    raw = copy.deepcopy(defaults)
    raw["custom"].update(source={"path": "d.parquet", "kind": "discrete"}, variants=["psrnn"], kf=None)
    with pytest.raises(ValueError, match=r"expected only train symbols, or custom\.source\.unknown 'drop' "):
        _load_custom(parse_params(copy.deepcopy(raw)).dataset("custom"), tmp_path)
    raw["custom"]["source"]["unknown"] = "map"
    assert _load_custom(parse_params(raw).dataset("custom"), tmp_path).vocab == ["a", "b", "<unk>"]


def test_check_windows_uses_the_shortest_training_trajectory(defaults):
    dp = parse_params(copy.deepcopy(defaults)).dataset("swimmer")  # two_stage and kf: 10 + 10 + 1 = 21 steps
    check_windows("swimmer", dp, [21, 500, 300])
    with pytest.raises(ParamsError) as err:
        check_windows("swimmer", dp, [300, 20, 500])  # the longest would pass; the shortest does not
    msg = str(err.value)
    assert msg.startswith("swimmer.two_stage.past_window + swimmer.two_stage.future_window + 1 = 10 + 10 + 1 = 21 "
                          "exceeds the shortest training trajectory (20 steps)"), msg
    dp.two_stage.past_window = 2
    with pytest.raises(ParamsError, match=r"^swimmer\.kf\.past_window \+ swimmer\.kf\.future_window \+ 1 = 10 \+ 10 "
                                          r"\+ 1 = 21 exceeds the shortest training trajectory \(20 steps\)"):
        check_windows("swimmer", dp, [300, 20, 500])
    dp.kf.past_window = 9
    check_windows("swimmer", dp, [300, 20, 500])
    # the Kalman gain needs two consecutive windows of one trajectory
    with pytest.raises(ParamsError, match=r"^swimmer\.kf\.past_window \+ swimmer\.kf\.future_window \+ 2 = 21 "
                                          r"exceeds the longest training trajectory \(20 steps\)"):
        check_windows("swimmer", dp, [20, 20])
    with pytest.raises(ParamsError, match=r"^swimmer\.source: the train split is empty"):
        check_windows("swimmer", dp, [])
    with pytest.raises(ParamsError, match=r"^swimmer\.kf\.state_dim: 20 exceeds swimmer\.kf\.future_window x "
                                          r"observation size = 10 x 1 = 10"):
        check_windows("swimmer", dp, [300], obs_dim=1)
    check_windows("swimmer", dp, [300], obs_dim=2)
    # enough windows: two for a 2SR (one gave "median pairwise distance needs at least 2 points" in features), and
    # kf.state_dim for the Kalman filter's (fewer failed on a reshape in the two_stage stage)
    dp.kf.past_window = dp.kf.future_window = 4
    with pytest.raises(ParamsError, match=r"^swimmer\.two_stage\.past_window \+ swimmer\.two_stage\.future_window = "
                                          r"2 \+ 10 leaves 1 window in the 1 training trajectory of 13 steps; a 2SR "
                                          r"needs two .*: expected smaller windows or more training data$"):
        check_windows("swimmer", dp, [13])
    check_windows("swimmer", dp, [14, 200])
    with pytest.raises(ParamsError, match=r"^swimmer\.kf\.state_dim: 20 exceeds the 6 windows that swimmer\.kf\."
                                          r"past_window \+ swimmer\.kf\.future_window = 4 \+ 4 leave in the 1 "
                                          r"training trajectory of 14 steps"):
        check_windows("swimmer", dp, [14])
    dp.kf.state_dim = 6
    check_windows("swimmer", dp, [14])


def test_check_windows_matches_make_windows():
    """The bound is what pipeline.features.make_windows needs: past + future + 1 steps give one window."""
    import numpy as np

    from pipeline.features import make_windows

    assert len(make_windows([np.zeros((7, 1))], 3, 3, discrete=False)) == 1
    with pytest.raises(ValueError):
        make_windows([np.zeros((6, 1))], 3, 3, discrete=False)


def test_generators_refuse_what_check_refuses():
    from pipeline.data.synthetic import make_hmm_dataset, make_lgssm_dataset

    with pytest.raises(ValueError, match=r"stickiness=1\.5; expected a number in \[0, 1\]"):
        make_hmm_dataset(stickiness=1.5)
    with pytest.raises(ValueError, match=r"n_symbols=1; expected an integer >= 2"):
        make_hmm_dataset(n_symbols=1)
    with pytest.raises(ValueError, match=r"process_noise=0; expected a finite number > 0"):
        make_lgssm_dataset(process_noise=0)
    with pytest.raises(ValueError, match=r"seed=-1"):
        make_lgssm_dataset(seed=-1)


# ------------------------------------------------------------------------------------------------- CLI


def _cli_with_failure(tmp_path, monkeypatch, exc, *extra):
    from pipeline import cli

    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())

    def boom(*args, **kwargs):
        raise exc

    monkeypatch.setattr(cli, "_dispatch", boom)
    return cli.main(["--root", str(tmp_path), *extra, "check"])


def test_cli_library_errors_are_one_line(tmp_path, capsys, monkeypatch):
    import zipfile

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    # MLflow's exception class, recognised by its module (the CLI must not import mlflow to know it)
    MlflowException = type("MlflowException", (Exception,), {"__module__": "mlflow.exceptions"})
    html = "API request to http://127.0.0.1:9/api/2.0/mlflow/experiments failed\n<html>\n<body>nope</body>\n</html>"
    assert _cli_with_failure(tmp_path, monkeypatch, MlflowException(html)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["psrnn check: error: MlflowException: API request to http://127.0.0.1:9/api/2.0/mlflow/experiments "
                   "failed <html> <body>nope</body> </html>"]
    assert _cli_with_failure(tmp_path, monkeypatch, zipfile.BadZipFile("Bad CRC-32 for file 'W.npy'")) == 1
    assert capsys.readouterr().err.strip().splitlines() == ["psrnn check: error: BadZipFile: Bad CRC-32 for file "
                                                            "'W.npy'"]
    assert _cli_with_failure(tmp_path, monkeypatch, EOFError()) == 1
    assert capsys.readouterr().err.strip() == "psrnn check: error: EOFError"
    assert _cli_with_failure(tmp_path, monkeypatch, ValueError("x" * 5000)) == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and len(line) < 700 and line.endswith("...")


def test_cli_bugs_and_debug_keep_the_traceback(tmp_path, monkeypatch):
    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    with pytest.raises(TypeError):  # a programming error is not dressed up as a one-line input error
        _cli_with_failure(tmp_path, monkeypatch, TypeError("unsupported operand"))
    with pytest.raises(ValueError, match="bad input"):
        _cli_with_failure(tmp_path, monkeypatch, ValueError("bad input"), "--debug")
    monkeypatch.setenv("PSRNN_DEBUG", "1")
    with pytest.raises(ValueError, match="bad input"):
        _cli_with_failure(tmp_path, monkeypatch, ValueError("bad input"))


def test_cli_debug_flag_after_the_stage_name(tmp_path, monkeypatch):
    """The stage scripts call main([stage, *argv]): --debug after the stage name counts too."""
    from pipeline import cli

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    monkeypatch.setattr(cli, "_dispatch", lambda *a, **k: (_ for _ in ()).throw(ValueError("late flag")))
    with pytest.raises(ValueError, match="late flag"):
        cli.main(["--root", str(tmp_path), "check", "--debug"])


def test_cli_does_not_import_mlflow():
    import subprocess
    import sys

    code = "import sys, pipeline.cli; print('mlflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_check_malformed_sections_one_line(tmp_path, capsys, defaults):
    from pipeline.cli import main

    for mutate in (lambda p: p.update(tracking=[1]), lambda p: p.update(data="abc"),
                   lambda p: p["hmm"].update(variants=[["psrnn"]]), lambda p: p.update(tracking=True)):
        raw = copy.deepcopy(defaults)
        mutate(raw)
        (tmp_path / "params.yaml").write_text(dump_yaml(raw))
        assert main(["--root", str(tmp_path), "check"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("psrnn check: error: ") and "expected" in err[0], err


# ------------------------------------------------------------------------------------- per-variant training


def test_train_overrides_apply_to_their_variant_only(defaults):
    raw = copy.deepcopy(defaults)
    raw["swimmer"]["train"]["overrides"] = {"kf": {"lr": 0.01}, "psrnn": {"lr": 0.1, "optimizer": "adam"}}
    dp = parse_params(raw).dataset("swimmer")
    assert dp.train_config("kf").lr == 0.01 and dp.train_config("kf").clip == dp.train.clip == 0.25
    assert (dp.train_config("psrnn").lr, dp.train_config("psrnn").optimizer) == (0.1, "adam")
    assert dp.train_config("lstm") == dp.train and dp.train.lr == 1.0


def test_a_shipped_override_outlives_a_trimmed_variant_list(defaults):
    """lgssm ships overrides for three variants: -S 'lgssm.variants=[psrnn]' was refused ('psrnn_2layer' is not
    in lgssm.variants). An override of a variant name not listed is checked and kept aside (psrnn check notes
    it); one that names no variant at all is still a typo, refused."""
    raw = copy.deepcopy(defaults)
    raw["lgssm"]["variants"] = ["psrnn", "lstm"]
    dp = parse_params(raw).dataset("lgssm")
    assert dp.unused_overrides == ["psrnn_2layer", "factorized_psrnn_r10"] and list(dp.train_overrides) == ["psrnn"]
    assert dp.train_config("psrnn").lr == 0.3 and dp.train_config("lstm").lr == 1.0
    assert dp.setting_key("psrnn", "lr") == "lgssm.train.overrides.psrnn.lr"
    assert dp.unused_spectral_work()[-2:] == [
        "lgssm.train.overrides.psrnn_2layer is set but psrnn_2layer is not in lgssm.variants: its settings are not "
        "used", "lgssm.train.overrides.factorized_psrnn_r10 is set but factorized_psrnn_r10 is not in "
        "lgssm.variants: its settings are not used"]
    raw["lgssm"]["train"]["overrides"]["gru"] = {"lr": -1}   # an unused override's values are checked all the same
    with pytest.raises(ParamsError, match=r"^lgssm\.train\.overrides\.gru\.lr: expected a finite number > 0"):
        parse_params(raw)
    raw["lgssm"]["train"]["overrides"] = {"psrnn_2layr": {"lr": 0.1}}
    with pytest.raises(ParamsError, match=r"^lgssm\.train\.overrides\.psrnn_2layr: 'psrnn_2layr' is no model variant "):
        parse_params(raw)


@pytest.mark.parametrize("overrides, key", [
    ({"kff": {"lr": 0.1}}, r"^swimmer\.train\.overrides\.kff: 'kff' is no model variant \(and not in "
                           r"swimmer\.variants \[.*\]\); expected one of them, or another variant name"),
    ({"kf": {"lrr": 0.1}}, r"^swimmer\.train\.overrides\.kf\.lrr: unknown key, did you mean 'lr'\? "
                           r"\(expected one of \[.*'lr'"),
    ({"kf": {"lr": -1}}, r"^swimmer\.train\.overrides\.kf\.lr: expected a finite number > 0, got -1"),
    ({"kf": {"seed": 3}}, r"^swimmer\.train\.overrides\.kf\.seed: unknown key"),
    ({"kf": {}}, r"^swimmer\.train\.overrides\.kf: empty; expected the train settings"),
    ({"kf": 0.1}, r"^swimmer\.train\.overrides\.kf: expected a mapping"),
    ([{"kf": {"lr": 0.1}}], r"^swimmer\.train\.overrides: expected a mapping"),
    ({"kf": {"optimizer": "adam"}}, r"^swimmer\.train\.overrides\.kf\.optimizer: adam has no momentum parameter, "
                                    r"but the train momentum is 0\.9"),
])
def test_bad_train_overrides_name_the_key(defaults, overrides, key):
    raw = copy.deepcopy(defaults)
    raw["swimmer"]["train"].update(momentum=0.9, overrides=overrides)
    with pytest.raises(ParamsError, match=key):
        parse_params(raw)


def test_check_notes_spectral_work_no_variant_uses(defaults, tmp_path, capsys, monkeypatch):
    from pipeline import cli

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    raw = copy.deepcopy(defaults)
    del raw["custom"]   # its file, the shipped example, is not in tmp_path (the test below reads it)
    raw["ptb"]["two_stage"]["layers"] = 3
    raw["mocap"]["variants"] = ["psrnn", "psrnn_2layer", "lstm"]  # its kf section stays
    raw["lgssm"]["two_stage"].update(layers=1, upper_future_window=1)
    raw["lgssm"]["variants"] = [v for v in raw["lgssm"]["variants"] if "layer" not in v]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(": valid (6 datasets: ptb, swimmer, mocap, handwriting, hmm, lgssm; 48 model variants, "
                           "seeds [0, 1])")
    assert out[1:] == [
        "note: ptb.two_stage.layers is 3 but the deepest 2SR-initialised PSRNN variant has 2 layer(s): the 2SR of "
        "the deeper layers is learned for nothing",
        "note: mocap.kf is set but no variant is kf: its linear 2SR is learned for nothing (mocap.kf: null skips it)",
        "note: lgssm.two_stage.upper_future_window is set but two_stage.layers is 1: only layers 2 and up read it",
        "note: lgssm.train.overrides.psrnn_2layer is set but psrnn_2layer is not in lgssm.variants: its settings are "
        "not used"]
    assert parse_params(copy.deepcopy(defaults)).dataset("ptb").unused_spectral_work() == []


def test_datasets_selects_what_is_trained_and_names_the_key(defaults):
    p = parse_params(copy.deepcopy(defaults))
    assert p.selected == ["ptb", "swimmer", "mocap", "handwriting", "hmm", "lgssm"]
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["hmm", "ptb"]
    assert parse_params(raw).selected == ["hmm", "ptb"]   # the order given; every section is still validated
    del raw["datasets"]
    del raw["lgssm"]
    assert parse_params(raw).selected == ["ptb", "swimmer", "mocap", "handwriting", "hmm", "custom"]   # absent:
    # every section
    for value, message in [
        (["ptb", "weather"], r"^datasets: unknown dataset 'weather'; expected some of ptb, swimmer, .*, custom or "
                              r"custom_<name>"),
        (["ptb", "custom"], r"^datasets: 'custom' has no section in params\.yaml; expected a custom: section"),
        (["ptb", "ptb"], r"^datasets: duplicated dataset in \['ptb', 'ptb'\]"),
        ([], r"^datasets: expected a non-empty list of dataset names, got "),
        ("ptb", r"^datasets: expected a non-empty list of dataset names, got a string 'ptb'"),
    ]:
        raw = copy.deepcopy(defaults)
        del raw["custom"]
        raw["datasets"] = value
        with pytest.raises(ParamsError, match=message):
            parse_params(raw)


def test_check_names_datasets_left_out_and_a_custom_dataset_without_its_stage(defaults, tmp_path, capsys,
                                                                              monkeypatch):
    """`psrnn check` reads the custom section's file (the shipped example), notes sections that `datasets` leaves
    out, requires `datasets` where dvc.yaml iterates over it, and refuses `custom` in `datasets` when dvc.yaml
    has lost its preprocess_custom stage (dvc repro would stop later on a missing file)."""
    import shutil

    from pipeline import cli

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    (tmp_path / "examples").mkdir()
    shutil.copy2(ROOT / "examples" / "custom_series.parquet", tmp_path / "examples")
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["hmm", "lgssm"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("custom: examples/custom_series.parquet: continuous, 2 features, 20 train / 5 test "
                      "trajectories, training lengths 120 to 120 steps")
    assert out[1].endswith(": valid (2 datasets: hmm, lgssm; 16 model variants, seeds [0, 1])")
    assert out[2:] == ["note: ptb, swimmer, mocap, handwriting, custom have sections but are not in datasets: not "
                       "trained or reported (a plain `dvc repro` still prepares their data where dvc.yaml has "
                       "their preprocess stage; `dvc repro report` does not)"]

    raw["datasets"] = ["hmm", "custom"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    dvc_yaml = (ROOT / "dvc.yaml").read_text()
    stages = read_yaml(dvc_yaml)
    del stages["stages"]["preprocess_custom"]
    (tmp_path / "dvc.yaml").write_text(dump_yaml(stages))
    assert cli.main(["--root", str(tmp_path), "check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"psrnn check: error: datasets: lists custom, but {tmp_path / 'dvc.yaml'} has no "
                   "preprocess_custom stage to prepare its file; expected the one dvc.yaml ships with (README, "
                   "'Adding your own dataset')"]
    (tmp_path / "dvc.yaml").write_text(dvc_yaml)   # as shipped
    del raw["datasets"]   # dvc.yaml iterates over it: required there, though the library defaults it
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"psrnn check: error: datasets: required, {tmp_path / 'dvc.yaml'} iterates over it; expected the datasets "
        "to run, e.g. datasets: [ptb, swimmer, mocap, handwriting, hmm, lgssm, custom]")
    raw["datasets"] = ["hmm", "custom"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].endswith(": valid (2 datasets: hmm, custom; 14 model variants, seeds [0, 1])")


@pytest.mark.parametrize("removed, selected, message", [
    ("seeds", None, "seeds: required, {dvc} iterates over it in stage features"),
    ("tracking", None, "tracking: required, {dvc} declares it as a param of stage refine@ptb"),
    ("report", None, "report: required, {dvc} declares it as a param of stage report"),
    ("mocap.source.trials", None, "mocap.source.trials: required, {dvc} declares it as a param of stage "
                                  "download_mocap"),
    ("ptb.model", None, "ptb.model: required, {dvc} declares it as a param of stage initialise@ptb-0"),
    ("ptb.kf", None, "ptb.kf: required, {dvc} declares it as a param of stage two_stage@ptb-0"),
    ("ptb.two_stage.past_window", ["hmm"], "ptb.two_stage.past_window: required, {dvc} declares it as a param of "
                                           "stage preprocess@ptb"),       # prepared whatever `datasets` says
    ("custom.model", ["hmm", "custom"], "custom.model: required, {dvc} declares it as a param of stage "
                                        "initialise@custom-0"),
    ("custom.model", ["hmm"], None),                    # no stage reads it when custom is not trained
    ("ptb.model", ["hmm"], None),
])
def test_check_wants_every_param_dvc_yaml_reads(defaults, tmp_path, capsys, monkeypatch, removed, selected,
                                                message):
    """Keys the library would default but dvc.yaml declares as params (or iterates over) are required: `dvc repro`
    stops on a missing one with a message naming only the stage; `psrnn check` names the key."""
    import shutil

    from pipeline import cli

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    (tmp_path / "examples").mkdir()
    shutil.copy2(ROOT / "examples" / "custom_series.parquet", tmp_path / "examples")
    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    raw = copy.deepcopy(defaults)
    if selected is not None:
        raw["datasets"] = selected
    *parents, last = removed.split(".")
    section = raw
    for part in parents:
        section = section[part]
    del section[last]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    # the check_params stage, which `dvc repro` runs first, stops on it as psrnn check does (DVC named the stage)
    for command in ("check", "check_params"):
        code = cli.main(["--root", str(tmp_path), command])
        err = capsys.readouterr().err.strip().splitlines()
        if message is None:
            assert code == 0 and err == []
        else:
            none = " (`kf: null` for no Kalman filter)" if removed.endswith(".kf") else ""
            assert code == 1 and err == [f"psrnn {command}: error: {message.format(dvc=tmp_path / 'dvc.yaml')}; "
                                         f"expected it in params.yaml{none} (the shipped params.yaml has every key "
                                         "dvc.yaml reads)"]
    assert (tmp_path / "artifacts" / "params_checked").is_file() == (message is None)


def test_the_check_params_stage_wants_each_custom_source_file(defaults, tmp_path, capsys, monkeypatch):
    """A typo in custom.source.path stopped `dvc repro` on the preprocess stage's missing dependency, in DVC's
    words, after check_params had passed; the stage names the key, as psrnn check does (without reading the file)."""
    import shutil

    from pipeline import cli

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    raw = copy.deepcopy(defaults)
    raw["custom"]["source"]["path"] = "data/lng.parquet"
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    # custom not in datasets: `dvc repro report` does not read its file
    assert cli.main(["--root", str(tmp_path), "check_params"]) == 0
    (tmp_path / "artifacts" / "params_checked").unlink()
    raw["datasets"] = ["hmm", "custom"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check_params"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"psrnn check_params: error: custom.source.path: data/lng.parquet: file not found (relative paths are read "
        f"from the project root {tmp_path})"]
    (tmp_path / "data" / "lng.parquet").mkdir(parents=True)
    assert cli.main(["--root", str(tmp_path), "check_params"]) == 1
    assert capsys.readouterr().err.strip().endswith(
        "custom.source.path: data/lng.parquet: is a directory; expected a single Parquet file (relative paths are "
        f"read from the project root {tmp_path})")
    assert not (tmp_path / "artifacts" / "params_checked").exists()
    (tmp_path / "data" / "lng.parquet").rmdir()
    shutil.copy2(ROOT / "examples" / "custom_series.parquet", tmp_path / "data" / "lng.parquet")
    assert cli.main(["--root", str(tmp_path), "check_params"]) == 0
    assert (tmp_path / "artifacts" / "params_checked").is_file()


@pytest.mark.parametrize("entry, files, message", [
    ({"params.yaml": ["hmm.nope"]}, {}, "hmm.nope: required, {dvc} declares it as a param of stage extra"),
    ({"params.yaml": ["hmm.train.lr"]}, {}, None),
    ({"extra.yaml": ["a.b"]}, {}, "extra.yaml: not found, {dvc} declares it as a params file of stage extra; "
                                  "expected that file (relative to {root})"),
    ({"extra.yaml": None}, {}, "extra.yaml: not found, {dvc} declares it as a params file of stage extra; "
                               "expected that file (relative to {root})"),
    ({"extra.yaml": ["a.c"]}, {"extra.yaml": "a: {b: 1}\n"},
     "a.c: required, {dvc} declares it as a param of stage extra in extra.yaml; expected it in {root}/extra.yaml"),
    ({"extra.json": ["a.b"]}, {"extra.json": '{"a": {"b": 1}}'}, None),
    ({"extra.yaml": ["a.b"]}, {"extra.yaml": "a: [1\n"}, "{root}/extra.yaml: cannot read it as a params file: "),
    ({"extra.toml": ["a.b"]}, {"extra.toml": "[a]\nb = 1\n"}, None),   # DVC's to read
])
def test_check_reads_params_entries_that_name_a_file(defaults, tmp_path, capsys, monkeypatch, entry, files,
                                                     message):
    """A stage of your own may declare `{file: [keys]}` params (DVC's long form): `psrnn check` looks the keys up
    in that file (params.yaml or YAML/JSON of your own) and wants the file to exist, as `dvc repro` will."""
    from pipeline import cli

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["hmm"]
    del raw["custom"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    dvc_yaml = {"stages": {"extra": {"cmd": "true", "params": [entry]}}}
    (tmp_path / "dvc.yaml").write_text(dump_yaml(dvc_yaml))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code = cli.main(["--root", str(tmp_path), "check"])
    err = capsys.readouterr().err.strip().splitlines()
    if message is None:
        assert code == 0 and err == []
    else:
        assert code == 1 and len(err) == 1
        assert err[0].startswith("psrnn check: error: " + message.format(dvc=tmp_path / "dvc.yaml", root=tmp_path))


def test_example_custom_file_is_what_its_script_writes(tmp_path):
    """examples/custom_series.parquet, the custom section's file as shipped, is reproducible from its script."""
    import importlib.util

    import pyarrow.parquet as pq

    spec = importlib.util.spec_from_file_location("custom_series", ROOT / "examples" / "custom_series.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.main(tmp_path / "series.parquet")
    assert pq.read_table(written).equals(pq.read_table(ROOT / "examples" / "custom_series.parquet"))


def test_verbose_and_debug_count_before_or_after_the_stage_name(defaults, tmp_path, monkeypatch):
    """`psrnn check -v` as well as `psrnn -v check` (the stage scripts put the stage name first)."""
    from pipeline import cli

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["hmm"]
    del raw["custom"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    for argv in (["-v", "check"], ["check", "-v"], ["check", "--verbose", "--debug"]):
        assert cli.main(["--root", str(tmp_path), *argv]) == 0
    parser = cli.build_parser()
    assert parser.parse_args(["predict", "hmm", "psrnn", "0", "in.parquet", "out.parquet"]).device == "auto"


def test_a_long_mistyped_override_or_monitor_is_shown_once_and_shortened(defaults):
    """Fuzz findings: a 5,000-character variant name under train.overrides, or monitor value, is not echoed in
    full (the CLI cuts an error at 600 characters, which dropped the 'expected' part)."""
    long = "psrnn_" + "x" * 5000
    raw = copy.deepcopy(defaults)
    raw["swimmer"]["train"]["overrides"] = {long: {"lr": 0.1}}
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    msg = str(err.value)
    assert msg.startswith("swimmer.train.overrides: 'psrnn_xxx") and \
        "is no model variant (and not in swimmer.variants" in msg, msg
    assert len(msg) < 600 and msg.endswith('; expected one of them, or another variant name (README, "Model '
                                           'variants")'), msg
    raw = copy.deepcopy(defaults)
    raw["swimmer"]["train"]["monitor"] = "v" * 5000
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    assert len(str(err.value)) < 300 and "expected one of ['auto'" in str(err.value), str(err.value)


@pytest.mark.parametrize("name, message", [
    ("custom", "custom: has its stage in dvc.yaml already (preprocess_custom); expected a custom_<name> section of "
               "your own"),
    ("foo", "foo: expected custom_<name> (lower-case letters, digits, underscores)"),
])
def test_custom_stage_refuses_names_it_cannot_copy_the_stage_for(defaults, name, message):
    from pipeline.cli import _custom_stage_text

    with pytest.raises(ValueError) as err:
        _custom_stage_text(ROOT, parse_params(defaults), name)
    assert str(err.value) == message
