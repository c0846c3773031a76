"""Probes from a mutation audit of optim.py, batching.py, decompose.py and cli.py's argument handling (111 mutants,
31 survivors, none in batching.py; these tests and the CLI ones at the end of test_inference_mutation_audit.py and
in test_inference.py kill every one that a user would see, but the SIGTERM exit code, which a slower test of
test_refine_seeds.py holds): each test fails on one (or more) hand-made mutants that the rest of the suite let
through."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import pytest

import pipeline.decompose as decompose
from pipeline.config import dump_yaml
from pipeline.decompose import cp_decompose


def _tensor(shape=(3, 4, 5), seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ---- decompose.py --------------------------------------------------------------------------------------------

def test_cp_rank_true_is_refused():
    """bool is an int subclass: rank=True must not pass as rank 1."""
    with pytest.raises(ValueError, match=r"^CP rank must be an integer >= 1, got True$"):
        cp_decompose(_tensor(), True)


def test_cp_of_a_matrix_is_refused_with_its_shape():
    with pytest.raises(ValueError, match=r"^CP decomposition needs a 3-mode tensor, got shape \(4, 5\)$"):
        cp_decompose(_tensor()[0], 2)


def test_cp_at_rank_equal_to_the_smallest_mode_starts_from_the_svd():
    """rank == min(W.shape) still takes the (deterministic) SVD start: the seed does not change a single bit."""
    W = _tensor()
    a, b = cp_decompose(W, 3, seed=0), cp_decompose(W, 3, seed=1)
    for x, y in ((a.A, b.A), (a.B, b.B), (a.C, b.C)):
        assert np.array_equal(x, y)


def test_cp_random_start_follows_the_seed():
    """Above the smallest mode the start is random, drawn from ``seed``: same seed same bits, another seed other
    factors (of the same quality)."""
    W = _tensor()
    a, a2, b = cp_decompose(W, 3, seed=0, init="random"), cp_decompose(W, 3, seed=0, init="random"), \
        cp_decompose(W, 3, seed=1, init="random")
    assert np.array_equal(a.A, a2.A) and np.array_equal(a.B, a2.B) and np.array_equal(a.C, a2.C)
    assert not np.allclose(a.A, b.A, rtol=0, atol=1e-9)


def _flaky_parafac(monkeypatch, fail):
    """Wrap decompose._parafac: ``fail(call_kwargs)`` returns 'linalg', 'nan' or None (run it as it is)."""
    real, calls = decompose._parafac, []

    def parafac(Wn, rank, **kw):
        calls.append((kw["init"], kw["l2_reg"]))
        what = fail(kw)
        if what == "linalg":
            raise np.linalg.LinAlgError("Singular matrix")
        weights, factors = real(Wn, rank, **kw)
        if what == "nan":
            factors = [np.full_like(f, np.nan) for f in factors]
        return weights, factors
    monkeypatch.setattr(decompose, "_parafac", parafac)
    return calls


def test_cp_non_finite_factors_are_retried_with_the_ridge(monkeypatch):
    W = _tensor()
    calls = _flaky_parafac(monkeypatch, lambda kw: "nan" if kw["l2_reg"] == 0 else None)
    f = cp_decompose(W, 2)
    assert calls == [("svd", 0.0), ("svd", decompose.RIDGE)]
    assert all(np.isfinite(x).all() for x in (f.A, f.B, f.C)) and np.isfinite(f.relative_error)


def test_cp_falls_back_to_a_random_start_when_the_svd_start_fails_with_the_ridge(monkeypatch):
    W = _tensor()
    calls = _flaky_parafac(monkeypatch, lambda kw: "linalg" if kw["init"] == "svd" else None)
    f = cp_decompose(W, 2)
    assert calls == [("svd", 0.0), ("svd", decompose.RIDGE), ("random", decompose.RIDGE)]
    assert np.isfinite(f.relative_error) and f.relative_error < 1


def test_cp_that_fails_every_attempt_names_the_largest_safe_rank(monkeypatch):
    _flaky_parafac(monkeypatch, lambda kw: "linalg")
    with pytest.raises(ValueError) as err:
        cp_decompose(_tensor(), 2)
    assert str(err.value) == (
        "CP rank 2 of a tensor of shape (3, 4, 5): ALS failed even with a ridge of 1e-12 (Singular matrix); "
        "expected a non-degenerate tensor: check the 2SR that made it (kernel widths, ridge), or use a rank at "
        "most 3")


# ---- cli.py ----------------------------------------------------------------------------------------------------

def _project(tmp_path, defaults):
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["hmm"]
    del raw["custom"]
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))


def test_cli_vv_counts_as_verbose_before_or_after_the_stage(defaults, tmp_path, monkeypatch):
    """-vv (repeated -v) is verbose wherever it is given: INFO logging, and after the stage name no usage error."""
    from pipeline import cli

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    _project(tmp_path, defaults)
    root_logger = logging.getLogger()
    for argv in (["-vv", "check"], ["check", "-vv"], ["check", "--verbose"]):
        monkeypatch.setattr(root_logger, "handlers", [])   # so that basicConfig applies (pytest adds handlers)
        monkeypatch.setattr(root_logger, "level", logging.WARNING)
        assert cli.main(["--root", str(tmp_path), *argv]) == 0
        assert root_logger.level == logging.INFO, argv


@pytest.mark.parametrize("value, level", [("1", logging.INFO), ("yes", logging.INFO), ("0", logging.WARNING),
                                          ("", logging.WARNING)])
def test_cli_psrnn_verbose_is_verbose_for_the_stages_dvc_runs(defaults, tmp_path, monkeypatch, value, level):
    """dvc.yaml's command lines cannot take -v: PSRNN_VERBOSE=1 dvc repro gives every stage INFO logging (a line
    per epoch), and the off values of PSRNN_DEBUG leave it off."""
    from pipeline import cli

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    monkeypatch.setenv("PSRNN_VERBOSE", value)
    _project(tmp_path, defaults)
    root_logger = logging.getLogger()
    monkeypatch.setattr(root_logger, "handlers", [])
    monkeypatch.setattr(root_logger, "level", logging.WARNING)
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
    assert root_logger.level == level


def test_cli_ctrl_c_is_exit_status_130(tmp_path, monkeypatch, capsys):
    from pipeline import cli, compare

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(compare, "resolve_summary", interrupted)
    assert cli.main(["--root", str(tmp_path), "compare"]) == 130
    assert capsys.readouterr().err == "psrnn compare: interrupted (Ctrl-C)\n"
    from pipeline.workflow import evaluate   # a stage that writes: its files are whole or absent

    monkeypatch.setattr(evaluate, "evaluate_dataset", interrupted)
    (tmp_path / "params.yaml").write_text((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    assert cli.main(["--root", str(tmp_path), "evaluate", "hmm"]) == 130
    assert capsys.readouterr().err == "psrnn evaluate: interrupted (Ctrl-C); no half-written file is left\n"


def test_cli_sigterm_on_a_command_that_writes_nothing_says_nothing_of_files(tmp_path, monkeypatch, capsys):
    import signal

    from pipeline import cli, compare

    def terminated(*args, **kwargs):
        raise cli.Terminated
    monkeypatch.setattr(compare, "resolve_summary", terminated)
    assert cli.main(["--root", str(tmp_path), "compare"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "psrnn compare: terminated (SIGTERM)\n"


@pytest.mark.parametrize("value", ["0", "false", "No", " "])
def test_cli_psrnn_debug_off_values_keep_the_one_line_error(tmp_path, monkeypatch, capsys, value):
    from pipeline import cli

    monkeypatch.setenv("PSRNN_DEBUG", value)
    assert cli.main(["--root", str(tmp_path), "check"]) == 1
    assert capsys.readouterr().err.startswith(f"psrnn check: error: {tmp_path / 'params.yaml'}: params file not found")


def test_cli_names_the_params_file_given_with_params(tmp_path, capsys):
    """With --params FILE, a missing file does not advise giving --params, and a seed not in the file's list names
    the file, not params.yaml."""
    import shutil

    from pipeline import cli

    missing = tmp_path / "k.yaml"
    assert cli.main(["--root", str(tmp_path), "--params", str(missing), "check"]) == 1
    assert capsys.readouterr().err == f"psrnn check: error: {missing}: params file not found (--params); expected an " \
                                      "existing file\n"
    shutil.copy(Path(__file__).resolve().parents[1] / "params.yaml", missing)
    assert cli.main(["--root", str(tmp_path), "--params", str(missing), "features", "hmm", "7"]) == 1
    assert capsys.readouterr().err == "psrnn features: error: seed 7 is not in k.yaml seeds [0, 1]\n"


def test_cli_one_line_of_a_key_error_is_its_message_unquoted():
    from pipeline.cli import one_line

    assert one_line(KeyError("no run  of hmm\n psrnn")) == "no run of hmm psrnn"


def test_cli_parquet_suffix_in_any_case_is_not_warned_about(tmp_path, capsys):
    import argparse

    from pipeline.cli import _check_inference_args

    for name, warned in (("out.PARQUET", False), ("out.parquet", False), ("out.csv", False), ("out.CSV", False),
                         ("out.txt", True)):   # .csv writes CSV; another suffix is written as Parquet, said
        args = argparse.Namespace(stage="predict", block_rows=65536, device="cpu", input="in.parquet",
                                  output=str(tmp_path / name))
        _check_inference_args(args, tmp_path)
        assert bool(capsys.readouterr().err) == warned, name


def test_cli_discrete_options_of_a_continuous_run_name_the_first_given():
    import argparse
    from types import SimpleNamespace

    from pipeline.cli import _discrete_options

    args = argparse.Namespace(symbol_column="sym", unknown="drop", probabilities=True, sample=False,
                              dataset="swimmer", variant="psrnn", run_seed=0)
    with pytest.raises(ValueError, match=r"^--symbol-column: applies to discrete runs only; swimmer psrnn seed 0 is "
                                         r"a continuous run \(features a, b\)$"):
        _discrete_options(args, SimpleNamespace(discrete=False, features=["a", "b"]))


# ---- optim.py --------------------------------------------------------------------------------------------------

def _one_param():
    import torch

    return [torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))]


def test_optim_zero_grad_sets_gradients_to_none_by_default():
    import torch

    from pipeline.optim import SGD

    ps = _one_param()
    opt = SGD(ps, lr=0.1)
    ps[0].grad = torch.ones(2, dtype=torch.float64)
    opt.zero_grad()
    assert ps[0].grad is None   # torch.optim's default (set_to_none=True)
    ps[0].grad = torch.ones(2, dtype=torch.float64)
    opt.zero_grad(set_to_none=False)
    assert ps[0].grad.tolist() == [0.0, 0.0]


def test_optim_load_state_dict_restores_the_saved_hyperparameters():
    """As torch.optim: the group's lr (and momentum ...) come from the loaded state dict, not the constructor."""
    import torch

    from pipeline.optim import SGD

    saved = SGD(_one_param(), lr=0.5, momentum=0.9).state_dict()
    ps = _one_param()
    opt = SGD(ps, lr=0.1, momentum=0.0)
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["lr"] == 0.5 and opt.param_groups[0]["momentum"] == 0.9
    ps[0].grad = torch.tensor([1.0, 1.0], dtype=torch.float64)
    opt.step()
    assert ps[0].detach().tolist() == [0.5, -2.5]


def test_cli_a_root_that_is_a_file_is_named_as_such(tmp_path, capsys):
    """--root /etc/passwd said "/etc/passwd/params.yaml: params file not found", not that the root is a file."""
    from pipeline import cli

    afile = tmp_path / "notes.txt"
    afile.write_text("x\n")
    assert cli.main(["--root", str(afile), "runs"]) == 1
    assert capsys.readouterr().err == (f"psrnn runs: error: {afile}: --root names a file; expected the project's "
                                       "folder (the one holding params.yaml and dvc.yaml)\n")
