"""Whole-sequence BPTT (``train.bptt: 0``, the continuous default) keeps the autograd graph of every training step
of an epoch: the trajectories are laid end to end into ``batch_size`` streams and back-propagated in one piece.
One 800,000-step recording took 19.1 GiB and 173 s for a single update, with nothing said. ``psrnn check`` and
``fit_model`` now warn above 2 GiB (naming the key and the remedy) and refuse what cannot fit in the machine's
memory."""

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pipeline.config
from pipeline.api import fit_model
from pipeline.config import bptt_graph_steps, bptt_memory_message, bptt_step_bytes

from conftest import SMALL


def test_the_estimate_bounds_the_measured_points():
    """Peak RSS of one forward and backward over 40,000 steps on the CPU (float32), bytes a step: the estimate is
    an upper bound, within half again of it."""
    measured = [({}, 24_400), ({"n_features": 500}, 7_900), ({"n_features": 4000}, 48_500),
                ({"state_dim": 60, "n_features": 500}, 34_200), ({"n_layers": 2}, 42_300),
                ({"family": "factorized_psrnn", "rank": 40, "n_features": 500}, 6_480),
                ({"family": "lstm"}, 2_190), ({"family": "lstm", "state_dim": 100}, 6_890)]
    for changes, bytes_per_step in measured:
        a = {"family": "psrnn", "state_dim": 20, "obs_dim": 20, "n_features": 2000, "input_dim": 3, **changes}
        estimate = bptt_step_bytes(a.pop("family"), **a)
        assert bytes_per_step <= estimate <= 1.5 * bytes_per_step, (changes, estimate)


def test_stream_layout_of_whole_sequence_bptt():
    assert bptt_graph_steps([800_000], 20) == (800_000, 1)       # one trajectory stays whole
    assert bptt_graph_steps([10] * 100, 20) == (50, 20)           # laid end to end into 20 streams
    assert bptt_graph_steps([1000, 10, 10], 20) == (1000, 3)      # no shorter than the longest


def test_the_audits_long_recording_is_warned_about(monkeypatch):
    monkeypatch.setattr(pipeline.config, "physical_memory", lambda: 64 * 2 ** 30)
    step = bptt_step_bytes("psrnn", state_dim=20, obs_dim=20, n_features=2000, input_dim=3)
    message, too_big = bptt_memory_message("custom.train.bptt", [800_000], 20, step)
    assert not too_big
    assert message == ("custom.train.bptt: 0 back-propagates through one stream of 800,000 steps per epoch update "
                       "(~21 GiB of autograd graph, ~28 KB a step); set custom.train.bptt (e.g. 100) to truncate")
    assert bptt_memory_message("custom.train.bptt", [50_000], 20, step) == (None, False)   # 1.3 GiB
    # more than the machine has: refused on the CPU, a warning on CUDA
    monkeypatch.setattr(pipeline.config, "physical_memory", lambda: 16 * 2 ** 30)
    message, too_big = bptt_memory_message("custom.train.bptt", [800_000], 20, step)
    assert too_big and "more than this machine's 16 GiB" in message
    assert bptt_memory_message("custom.train.bptt", [800_000], 20, step, on_cpu=False)[1] is False


def test_fit_model_warns_and_refuses(features, monkeypatch):
    monkeypatch.setattr(pipeline.config, "BPTT_MEMORY_WARN", 1000)   # the small set's graph is above it
    with pytest.warns(UserWarning, match=r"^fit_model: bptt: 0 \(the default for continuous data\) back-propagates "
                                         r"through 6 streams of 40 steps .*; set bptt \(e\.g\. 100\) to truncate$"):
        fit_model(features.train, features.test, **SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(UserWarning, match="back-propagates"):
            fit_model(features.train, features.test, **{**SMALL, "epochs": 1}, bptt=0)
    monkeypatch.setattr(pipeline.config, "physical_memory", lambda: 2000)

    def ran(*args, **kwargs):
        raise AssertionError("2SR ran before the refusal")

    monkeypatch.setattr(pipeline.api, "multilayer_two_stage", ran)
    with pytest.raises(ValueError, match=r"^train_options\['bptt'\]: 0 back-propagates .*more than this machine's "
                                         r"0 MiB\); set train_options\['bptt'\] \(e\.g\. 100\) to truncate$"):
        fit_model(features.train, features.test, **SMALL, train_options={"bptt": 0})
    with warnings.catch_warnings():   # truncated BPTT, or no training: nothing said
        warnings.simplefilter("error", UserWarning)
        for extra in ({"bptt": 10}, {"epochs": 0}):
            with pytest.raises(AssertionError, match="2SR ran"):
                fit_model(features.train, features.test, **{**SMALL, **extra})


def test_check_warns_about_a_long_recording(tmp_path: Path, capsys, monkeypatch):
    from pipeline import cli
    from pipeline.config import dump_yaml

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    n = 2000
    pd.DataFrame({"trajectory": 0, "step": np.arange(n), "a": np.sin(0.1 * np.arange(n)),
                  "b": np.cos(0.07 * np.arange(n)),
                  "split": ["train"] * (n - 200) + ["test"] * 200}).to_parquet(tmp_path / "long.parquet", index=False)
    section = {"source": {"path": "long.parquet", "kind": "continuous", "features": ["a", "b"]},
               "two_stage": {"n_features": 32, "state_dim": 4, "obs_dim": 2, "past_dim": 4},
               "kf": None, "variants": ["psrnn", "gru"],
               "train": {"bptt": 0, "overrides": {"gru": {"bptt": 50}}}}
    (tmp_path / "params.yaml").write_text(dump_yaml({"seeds": [0], "datasets": ["custom"], "custom": section}))
    monkeypatch.setattr(pipeline.config, "BPTT_MEMORY_WARN", 10_000)
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    err = capsys.readouterr().err.splitlines()
    warned = [line for line in err if "back-propagates" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: custom.train.bptt: 0 back-propagates through one "
                                                     "stream of ")
    assert warned[0].endswith("set custom.train.bptt (e.g. 100) to truncate (psrnn)")
    monkeypatch.setattr(pipeline.config, "physical_memory", lambda: 20_000)
    monkeypatch.setattr(pipeline.config, "trains_on_cpu", lambda device: True)
    assert cli.main(["--root", str(tmp_path), "check"]) == 1
    err = capsys.readouterr().err
    assert "psrnn check: error: " in err and "more than this machine's" in err
