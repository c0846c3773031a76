"""Probes from a mutation audit of pipeline.compare, pipeline.naive and pipeline.metrics (79 mutants, 13
behavioural survivors): each pins a behaviour that a one-line mutant changed without any other test noticing."""

import math

import numpy as np
import pytest

from pipeline.compare import compare_summaries, format_comparison
from pipeline.naive import last_value_mse, naive_metrics


def _verdicts(result):
    return {(r.dataset, r.variant, r.key): r.verdict for r in result.rows}


def _one(ours, ref, key="test_bpc", **kw):
    return _verdicts(compare_summaries({"d": {"v": ours}}, {"d": {"v": ref}}, **kw))["d", "v", key]


def test_default_close_tolerance_is_1e_3():
    # the default rtol is CLOSE_RTOL = 1e-3: 9e-4 relative is close, 1.5e-3 relative differs (no std: no spread)
    assert _one({"test_bpc": 1.0009}, {"test_bpc": 1.0}) == "close"
    assert _one({"test_bpc": 1.0015}, {"test_bpc": 1.0}) == "differs"


def test_other_seeds_is_an_agreeing_verdict():
    """'other seeds' is no difference (AGREEING, docs): a comparison whose only non-same rows are of other seed
    counts agrees, built by hand and through compare_summaries (where the seed count stays 'other seeds' however
    loose the rtol: a loose one made the counts 2 and 3 'close', which took the row out of the one-seed note)."""
    from pipeline.compare import Comparison, SummaryComparison

    rows = [Comparison("d", "v", "test_bpc", 2.0, 2.0, "same"),
            Comparison("d", "v", "init_test_bpc", 1.0, 5.0, "other seeds")]
    assert SummaryComparison(rows, [], []).agrees
    result = compare_summaries({"d": {"v": {"seeds": 2, "init_test_bpc": 1.0}}},
                               {"d": {"v": {"seeds": 3, "init_test_bpc": 5.0}}}, rtol=0.5)
    assert [r.verdict for r in result.rows] == ["other seeds", "other seeds"] and result.agrees


def test_finite_counts_of_runs_with_other_seed_counts_are_other_seeds():
    # one seed (finite count 1) against two all-finite seeds (key absent: 2): a count over other seeds, not a
    # difference (the module docstring: "an epoch-0 metric (or a count of finite seeds)")
    v = _one({"seeds": 1, "test_bpc": 2.0, "test_bpc_finite": 1}, {"seeds": 2, "test_bpc": 2.0},
             key="test_bpc_finite")
    assert v == "other seeds"


def test_a_missing_seed_count_is_not_other_seeds():
    # only a row whose seed counts are both known and differ makes epoch-0 metrics incomparable
    assert _one({"init_test_bpc": 2.6}, {"seeds": 2, "init_test_bpc": 2.5}, key="init_test_bpc") == "differs"
    assert _one({"seeds": 2, "init_test_bpc": 2.6}, {"init_test_bpc": 2.5}, key="init_test_bpc") == "differs"


def test_a_number_null_on_both_sides_is_not_compared():
    result = compare_summaries({"d": {"v": {"test_bpc": 2.0, "optimal_bpc": None}}},
                               {"d": {"v": {"test_bpc": 2.0, "optimal_bpc": None}}})
    assert _verdicts(result) == {("d", "v", "test_bpc"): "same"} and result.agrees


def test_a_zero_reference_has_no_relative_difference_in_the_table():
    result = compare_summaries({"d": {"v": {"test_accuracy": 0.1}}}, {"d": {"v": {"test_accuracy": 0.0}}})
    row, = result.rows
    assert row.verdict == "differs" and row.relative is None
    lines = format_comparison(result, "a", "b").splitlines()
    assert lines[2].split() == ["d", "v", "test_accuracy", "0.1", "0", "-", "differs"]


def test_the_table_lists_a_row_in_key_order():
    # seeds and the final test metrics first, then the other numbers, the epoch-0 metrics last
    row = {"seeds": 2, "test_bpc": 2.0, "n_params": 5, "optimal_bpc": 1.8, "init_test_bpc": 2.5, "test_accuracy": 0.5}
    result = compare_summaries({"d": {"v": row}}, {"d": {"v": dict(row)}})
    assert [r.key for r in result.rows] == ["seeds", "test_accuracy", "test_bpc", "n_params", "optimal_bpc",
                                            "init_test_bpc"]


def test_numbers_and_stds_in_the_table_have_six_and_two_significant_digits():
    result = compare_summaries({"d": {"v": {"test_bpc": 2.12345678, "test_bpc_std": 0.0123456}}},
                               {"d": {"v": {"test_bpc": 3.0, "test_bpc_std": 0.0123456}}})
    cells = format_comparison(result, "a", "b").splitlines()[2].split()
    assert cells[3:9] == ["2.12346", "±", "0.012", "3", "±", "0.012"]


# ------------------------------------------------------------------------------------------------ pipeline.naive

def test_training_trajectories_of_one_step_or_none_still_give_a_mean():
    # "at least one training trajectory with a step": an empty trajectory beside others is allowed, and a single
    # observation is a step (the training mean needs no transition)
    test = [np.array([[1.0, 1.0], [2.0, 5.0]])]
    out = naive_metrics([np.zeros((0, 2)), np.array([[2.0, 3.0]])], test, discrete=False)
    assert out["train_mean"]["mse"] == (0.0 + 4.0) / 2
    out = naive_metrics([np.array([1]), np.array([], dtype=np.int64)], [np.array([0, 1])], discrete=True,
                        vocab_size=2)
    assert out["unigram"]["accuracy"] == 1.0


def test_last_value_mse_of_nothing_scored_is_nan():
    # documented: NaN when no trajectory has two steps (psrnn predict / evaluate print it beside the model's MSE)
    assert math.isnan(last_value_mse([np.zeros((1, 3)), np.zeros((0, 3))]))
    assert math.isnan(last_value_mse([]))


# ---------------------------------------------------------------------------------------------- pipeline.metrics

def test_the_discrete_training_loss_is_the_mean_cross_entropy_in_nats():
    """masked_loss (the objective SGD steps on) is in nats, over the marked steps: a loss in bits would scale
    every gradient by 1/ln 2, i.e. silently change the learning rate of every discrete model."""
    import torch

    from pipeline.metrics import MetricSums, masked_loss

    g = torch.Generator().manual_seed(2)
    out = torch.randn(5, 2, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (5, 2), generator=g)
    mask = torch.ones(5, 2, dtype=torch.bool)
    mask[3:, 1] = False
    want = -torch.log_softmax(out, -1).gather(-1, y[..., None])[..., 0][mask].mean()
    assert torch.allclose(masked_loss(out, y, mask, True), want, rtol=1e-13, atol=0)
    sums = MetricSums(discrete=True)
    sums.add(out, y, mask)
    assert sums.result()["bpc"] == pytest.approx(float(want) / math.log(2), rel=1e-12)
