"""Whole-sequence BPTT (``train.bptt: 0``, the continuous default) keeps the autograd graph of every training step
of an epoch: the trajectories are laid end to end into ``batch_size`` streams and back-propagated in one piece.
One 800,000-step recording took 19.1 GiB and 173 s for a single update, with nothing said. ``psrnn check`` and
``fit_model`` now warn above 2 GiB (naming the key and the remedy) and refuse what cannot fit in the machine's
memory. The Kalman filter's graph was put at ~2.5 KB a step and is ~70 KB (its recursion is ~25 torch
operations a time step in Python, each keeping an autograd node): a 320,000-step Swimmer recording needed ~23 GiB
unwarned; its estimate now has a term per time step and one per stream, and reads the filter's own state size."""

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pipeline.config
from pipeline.api import fit_model
from pipeline.batching import make_streams
from pipeline.config import (bptt_bytes, bptt_graph_steps, bptt_memory_message, bptt_memory_notes,
                             bptt_step_bytes, kf_shares_covariance, load_params)

from conftest import SMALL


def test_the_estimate_bounds_the_measured_points():
    """Peak RSS of one forward and backward over 40,000 steps on the CPU (float32), bytes a step: the estimate is
    an upper bound, within half again of it."""
    measured = [({}, 24_400), ({"n_features": 500}, 7_900), ({"n_features": 4000}, 48_500),
                ({"state_dim": 60, "n_features": 500}, 34_200), ({"n_layers": 2}, 42_300),
                ({"family": "factorized_psrnn", "rank": 40, "n_features": 500}, 6_480),
                ({"family": "lstm"}, 2_190), ({"family": "lstm", "state_dim": 100}, 6_890),
                ({"family": "gru", "state_dim": 100}, 7_300)]
    for changes, bytes_per_step in measured:
        a = {"family": "psrnn", "state_dim": 20, "obs_dim": 20, "n_features": 2000, "input_dim": 3, **changes}
        estimate = bptt_step_bytes(a.pop("family"), **a)
        assert bytes_per_step <= estimate <= 1.5 * bytes_per_step, (changes, estimate)


def test_the_kalman_filter_estimate_bounds_the_measured_points():
    """Peak RSS of one forward and backward of the filter (float32, n = state_dim, m = input_dim), bytes a time
    step of all the streams together: one stream (a covariance recursion of its own, and ~64 KB of autograd
    nodes whatever the sizes), 20 streams resetting together (one recursion shared), 20 that do not (one each)."""
    measured = [((1, 1, 1, True), 63_900), ((4, 2, 1, True), 65_900), ((20, 3, 1, True), 69_700),
                ((40, 6, 1, True), 81_700), ((60, 3, 1, True), 115_800), ((20, 30, 1, True), 83_700),
                ((60, 30, 1, True), 123_300), ((20, 3, 20, True), 72_700),
                ((4, 2, 20, False), 76_000), ((10, 10, 20, False), 146_300), ((20, 3, 20, False), 291_500),
                ((40, 6, 20, False), 1_123_900), ((60, 3, 20, False), 2_594_200), ((20, 30, 20, False), 717_600),
                ((60, 30, 20, False), 2_746_000)]
    for (n, m, streams, shared), bytes_per_time_step in measured:
        lengths = [1000] * streams if shared else [1000 + i for i in range(streams)]
        assert kf_shares_covariance(lengths, 20) is shared
        step, per_time = bptt_bytes("kf", lengths, 20, state_dim=n, obs_dim=20, n_features=2000, input_dim=m)
        estimate = streams * step + per_time
        assert bytes_per_time_step <= estimate <= 1.5 * bytes_per_time_step, (n, m, streams, shared, estimate)
    # the other models keep nothing a time step beyond their streams'
    assert bptt_bytes("gru", [1000, 1001], 20, state_dim=20, obs_dim=20, n_features=2000, input_dim=3)[1] == 0


def test_stream_layout_of_whole_sequence_bptt():
    assert bptt_graph_steps([800_000], 20) == (800_000, 1)       # one trajectory stays whole
    assert bptt_graph_steps([10] * 100, 20) == (50, 20)           # laid end to end into 20 streams
    assert bptt_graph_steps([10] * 30, 20) == (20, 20)            # ten streams hold two
    assert bptt_graph_steps([1000, 10, 10], 20) == (1000, 3)      # no shorter than the longest


def test_the_layout_bounds_make_streams_in_every_order():
    """Training shuffles the trajectories every epoch before laying them end to end: the stream length is a bound
    over orders (exact for one length), and the Kalman filter's streams are said to share their covariance
    recursion only where they reset together in every order."""
    rng = np.random.default_rng(0)
    cases = [[100] * 25, [100] * 40, [100] * 7, [50, 60, 70], [100, 7, 7, 7, 7, 300]] + \
        [list(rng.integers(5, 200, size=int(rng.integers(2, 60)))) for _ in range(20)]
    for lengths in cases:
        for batch in (1, 3, 20):
            length, streams = bptt_graph_steps(lengths, batch)
            shared = kf_shares_covariance(lengths, batch)
            longest_seen, always_together = 0, True
            for _ in range(8):
                order = rng.permutation(len(lengths))
                s = make_streams([np.zeros((n, 1)) for n in lengths], batch, discrete=False, order=order,
                                 min_piece=None)
                assert s.x.shape[1] == streams
                longest_seen = max(longest_seen, s.x.shape[0])
                always_together &= bool((s.reset.any(1) == s.reset.all(1)).all())
            assert longest_seen <= length, (lengths, batch)
            if len(set(lengths)) == 1:
                assert longest_seen == length and shared == always_together, (lengths, batch)
            elif shared:
                assert always_together, (lengths, batch)


def test_the_swimmer_recording_warns_about_the_kalman_filter(monkeypatch):
    """A 320,000-step recording in the default Swimmer section: the Kalman filter, whose graph was put at
    0.8 GiB (nothing said), is now the largest estimate; its size follows kf.state_dim, not two_stage's."""
    monkeypatch.setattr(pipeline.config, "physical_memory", lambda: 64 * 2 ** 30)
    dp = load_params(Path(__file__).resolve().parents[1] / "params.yaml").datasets["swimmer"]
    notes = bptt_memory_notes(dp, [320_000], 3, False, ["kf", "psrnn"])
    assert notes[0] == ("swimmer.train.bptt: 0 back-propagates through one stream of 320,000 steps per epoch "
                        "update (~23 GiB of autograd graph, ~76 KB a step); set swimmer.train.bptt (e.g. 100) to "
                        "truncate (kf)")
    assert "~8.2 GiB" in notes[1] and notes[1].endswith("(psrnn)")
    import dataclasses
    bigger_psrnn = dataclasses.replace(dp, two_stage=dataclasses.replace(dp.two_stage, state_dim=4))
    assert bptt_memory_notes(bigger_psrnn, [320_000], 3, False, ["kf"]) == notes[:1]
    bigger_kf = dataclasses.replace(dp, kf=dataclasses.replace(dp.kf, state_dim=30))
    assert "(~25 GiB of autograd graph, ~85 KB a step)" in bptt_memory_notes(bigger_kf, [320_000], 3, False,
                                                                              ["kf"])[0]
    # the same 320,000 steps as 25 trajectories into 20 streams: five streams hold two, so each runs its own
    # covariance recursion; four times as many steps in 20 equal trajectories share one, and take less
    warned = bptt_memory_notes(dp, [12_800] * 25, 3, False, ["kf"])
    assert "20 streams of 25,600 steps per epoch update (~9.2 GiB of autograd graph, ~19 KB a step)" in warned[0]
    warned = bptt_memory_notes(dp, [64_000] * 20, 3, False, ["kf"])
    assert "20 streams of 64,000 steps per epoch update (~5 GiB of autograd graph, ~4 KB a step)" in warned[0]
    assert bptt_memory_notes(dp, [16_000] * 20, 3, False, ["kf"]) == []   # 1.3 GiB


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
