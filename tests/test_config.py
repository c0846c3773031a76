"""params.yaml validation: every mistake is one clear error naming the key."""

import copy
from pathlib import Path

import pytest
import yaml

from pipeline.config import ParamsError, Variant, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def defaults():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_default_and_tiny_params_are_valid(defaults):
    p = parse_params(defaults)
    assert p.dataset("ptb").ranks == [10, 20, 40, 60]
    assert p.dataset("ptb").max_layers == 2
    assert p.dataset("ptb").discrete and not p.dataset("swimmer").discrete
    load_params(ROOT / "tests" / "fixtures" / "tiny_params.yaml")


@pytest.mark.parametrize("mutate, key", [
    (lambda p: p["ptb"]["train"].update(lrr=1.0), r"ptb\.train\.lrr: unknown key"),
    (lambda p: p.update(swimer={}), r"swimer: unknown key"),
    (lambda p: p["ptb"]["train"].update(lr="fast"), r"ptb\.train\.lr: expected a number"),
    (lambda p: p["ptb"]["train"].update(epochs=1.5), r"ptb\.train\.epochs: expected an integer"),
    (lambda p: p["ptb"]["train"].update(lr=0), r"ptb\.train.*lr"),
    (lambda p: p["ptb"].update(variants=["psrnn", "transformer"]), r"ptb\.variants: unknown model variant"),
    (lambda p: p["ptb"].update(variants=["factorized_psrnn_r0"]), r"ptb\.variants: rank"),
    (lambda p: p["ptb"].update(variants=["psrnn", "kf"]), r"ptb\.variants: kf models continuous data only"),
    (lambda p: p["ptb"]["two_stage"].update(state_dim=3000), r"ptb\.two_stage.*state_dim=3000 exceeds n_features"),
    (lambda p: p["ptb"]["two_stage"].update(state_dim=0), r"ptb\.two_stage.*state_dim"),
    (lambda p: p["swimmer"]["two_stage"].update(past_window=60, future_window=60),
     r"swimmer\.two_stage: past_window \+ future_window \+ 1 = 121 is longer than the trajectories"),
    (lambda p: p["swimmer"]["source"].update(n_train=25), r"swimmer\.source\.n_train=25 leaves no test"),
    (lambda p: p["ptb"]["source"].update(unknown="ignore"), r"ptb\.source\.unknown"),
    (lambda p: p.update(seeds=[]), r"seeds: expected a non-empty list"),
    (lambda p: p.update(seeds=[0, 0]), r"seeds: duplicated"),
    (lambda p: p["tracking"].update(log_model="yes"), r"tracking\.log_model: expected bool"),
    (lambda p: p["ptb"]["train"].update(optimizer="rmsprop"), r"ptb\.train.*optimizer"),
])
def test_bad_params_name_the_key(defaults, mutate, key):
    raw = copy.deepcopy(defaults)
    mutate(raw)
    with pytest.raises(ParamsError, match=key):
        parse_params(raw)


def test_custom_section_needs_path_and_kind(defaults):
    raw = copy.deepcopy(defaults)
    raw["custom"] = {"source": {"kind": "continuous"}, "variants": ["psrnn"]}
    with pytest.raises(ParamsError, match=r"custom\.source\.path: required"):
        parse_params(raw)
    raw["custom"]["source"] = {"path": "x.parquet", "kind": "audio"}
    with pytest.raises(ParamsError, match=r"custom\.source\.kind"):
        parse_params(raw)


def test_variant_names():
    assert Variant.parse("psrnn_3layer").n_layers == 3
    v = Variant.parse("factorized_psrnn_r60")
    assert (v.family, v.rank, v.init) == ("factorized_psrnn", 60, "2sr")
    assert Variant.parse("psrnn_random").init == "random"
    assert Variant.parse("lstm").init == "xavier"


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ParamsError, match="params file not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "params.yaml"
    bad.write_text("ptb: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)


def test_cli_reports_one_line(tmp_path, capsys, defaults):
    from pipeline.cli import main

    raw = copy.deepcopy(defaults)
    raw["ptb"]["train"]["lrr"] = 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert main(["--root", str(tmp_path), "check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ptb.train.lrr: unknown key" in err[0]
