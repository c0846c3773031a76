"""The naive predictors (pipeline.naive): exact values on hand-made data, scored on exactly the steps the models are
scored on (the evaluation's streams and MetricSums), and shown by the report: a line under each table, a row in
summary.json, a line in the test-split figures."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.batching import make_streams
from pipeline.metrics import MetricSums
from pipeline.naive import naive_metrics


def test_continuous_values_by_hand() -> None:
    train = [np.array([[0.0, 1.0], [2.0, 3.0]]), np.array([[4.0, 5.0]])]      # mean (2, 3)
    test = [np.array([[1.0, 1.0], [2.0, 3.0], [2.0, 5.0]]), np.array([[7.0, 7.0]])]   # the second: no target
    out = naive_metrics(train, test, discrete=False)
    # targets (2, 3) and (2, 5); last values (1, 1) and (2, 3); 4 scored elements
    assert out["last_value"]["mse"] == pytest.approx((1 + 4 + 0 + 4) / 4, rel=1e-15)
    assert out["train_mean"]["mse"] == pytest.approx((0 + 0 + 0 + 4) / 4, rel=1e-15)
    assert naive_metrics(train, [np.array([[1.0, 2.0]])], discrete=False) == {}   # nothing to score
    assert naive_metrics([np.array([1.0, 3.0])], [np.array([1.0, 2.0])], discrete=False)["last_value"]["mse"] == 1.0
    with pytest.raises(ValueError, match=r"^train: no observation; expected at least one training trajectory"):
        naive_metrics([np.zeros((0, 2))], test, discrete=False)


def test_unigram_by_hand_with_add_half_smoothing() -> None:
    train = [np.array([0, 0, 0, 1])]                          # counts 3, 1, 0 of V = 3
    test = [np.array([1, 0, 2, 0])]                           # targets 0, 2, 0
    out = naive_metrics(train, test, discrete=True, vocab_size=3)["unigram"]
    p = np.array([3.5, 1.5, 0.5]) / 5.5
    assert out["bpc"] == pytest.approx(-np.mean(np.log2(p[[0, 2, 0]])), rel=1e-14)
    assert out["accuracy"] == pytest.approx(2 / 3)            # always "0", the most frequent training symbol
    assert math.isfinite(out["bpc"])                          # symbol 2 never seen in training
    for train_, test_, bad in (([np.array([0, 3])], test, "train: symbol 3"), (train, [np.array([0, -1])],
                                                                            "test: symbol -1")):
        with pytest.raises(ValueError, match=f"^{bad}; expected symbols 0 … 2$"):
            naive_metrics(train_, test_, discrete=True, vocab_size=3)


def test_bigram_by_hand_smoothed_toward_the_unigram() -> None:
    train = [np.array([0, 0, 0, 1]), np.array([2])]           # pairs (0, 0) twice and (0, 1); counts 3, 1, 1
    test = [np.array([1, 0, 2, 0]), np.array([1])]            # pairs (1, 0), (0, 2), (2, 0); the second: none
    out = naive_metrics(train, test, discrete=True, vocab_size=3)["bigram"]
    unigram = np.array([3.5, 1.5, 1.5]) / 6.5
    # P(b | a) = (C(a, b) + P_uni(b)) / (C(a) + 1): after 1 and 2, never contexts in training, the unigram
    p = [unigram[0], unigram[2] / (3 + 1), unigram[0]]
    assert out["bpc"] == pytest.approx(-np.mean(np.log2(p)), rel=1e-14)
    # after 0: 0 (seen twice); after 1 and 2: the most frequent symbol, 0; targets 0, 2, 0
    assert out["accuracy"] == pytest.approx(2 / 3)
    assert naive_metrics(train, [np.array([1])], discrete=True, vocab_size=3) == {}   # nothing to score


def test_bigram_approaches_the_entropy_rate_of_a_markov_chain() -> None:
    """On a first-order Markov chain the bigram is the Bayes-optimal predictor: with enough training pairs its BPC
    is the chain's entropy rate, and the unigram's is far above it."""
    rng = np.random.default_rng(3)
    V = 6
    P = rng.dirichlet(np.full(V, 0.3), size=V)

    def chain(n: int, T: int) -> list[np.ndarray]:
        out = []
        for _ in range(n):
            x = [int(rng.integers(V))]
            for _ in range(T - 1):
                x.append(int(rng.choice(V, p=P[x[-1]])))
            out.append(np.array(x))
        return out

    train, test = chain(40, 250), chain(40, 250)
    pi = np.linalg.matrix_power(P.T, 500)[:, 0]              # the stationary distribution
    rate = float(-(pi[:, None] * P * np.log2(P)).sum())
    out = naive_metrics(train, test, discrete=True, vocab_size=V)
    assert out["bigram"]["bpc"] == pytest.approx(rate, abs=0.03)
    assert out["unigram"]["bpc"] > rate + 0.3


@pytest.mark.parametrize("discrete", [False, True])
def test_scored_on_the_steps_the_models_are_scored_on(discrete: bool) -> None:
    """A 'model' whose outputs are the naive predictions, scored by the evaluation's own streams and MetricSums,
    gets the same numbers: no off-by-one between the yardstick and the models."""
    rng = np.random.default_rng(0)
    if discrete:
        train = [rng.integers(0, 5, size=n) for n in (30, 17)]
        test = [rng.integers(0, 5, size=n) for n in (25, 1, 9)]
    else:
        train = [rng.standard_normal((n, 3)) for n in (30, 17)]
        test = [rng.standard_normal((n, 3)) for n in (25, 1, 9)]
    naive = naive_metrics(train, test, discrete=discrete, vocab_size=5 if discrete else None)
    s = make_streams(test, len(test), discrete=discrete, dtype=torch.float64)
    sums = MetricSums(discrete)
    if discrete:
        counts = np.bincount(np.concatenate(train), minlength=5)
        logp = torch.tensor(np.log((counts + 0.5) / (counts.sum() + 2.5)))
        sums.add(logp.expand(*s.y.shape, 5), s.y, s.mask)
        got = sums.result()
        assert got["bpc"] == pytest.approx(naive["unigram"]["bpc"], rel=1e-12)
        assert got["accuracy"] == pytest.approx(naive["unigram"]["accuracy"], rel=1e-12)
        # the bigram: a 'model' whose logits after symbol a are log P(· | a), as a dense V x V table
        C = np.zeros((5, 5))
        for t in train:
            np.add.at(C, (t[:-1], t[1:]), 1)
        unigram = (counts + 0.5) / (counts.sum() + 2.5)
        table = torch.tensor(np.log((C + unigram) / (C.sum(axis=1, keepdims=True) + 1)))
        sums = MetricSums(discrete)
        sums.add(table[s.x.long()], s.y, s.mask)
        got = sums.result()
        assert got["bpc"] == pytest.approx(naive["bigram"]["bpc"], rel=1e-12)
        assert got["accuracy"] == pytest.approx(naive["bigram"]["accuracy"], rel=1e-12)
    else:
        sums.add(s.x, s.y, s.mask)                             # ô_{t+1} = o_t
        assert sums.result()["mse"] == pytest.approx(naive["last_value"]["mse"], rel=1e-12)
        mean = torch.tensor(np.concatenate(train).mean(axis=0))
        sums = MetricSums(False)
        sums.add(mean.expand_as(s.y), s.y, s.mask)
        assert sums.result()["mse"] == pytest.approx(naive["train_mean"]["mse"], rel=1e-12)


def _metrics_file(root: Path, dataset: str, variant: str, seed: int, kind: str, value: float,
                  naive: dict) -> None:
    key = "bpc" if kind == "discrete" else "mse"
    test = {key: value, **({"accuracy": 0.5} if kind == "discrete" else {})}
    p = root / "metrics" / dataset / f"{variant}_s{seed}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"dataset": dataset, "variant": variant, "family": variant, "seed": seed, "kind": kind,
                             "n_params": 10, "epochs": 1, "best_epoch": 1, "test": test, "initial_test": test,
                             "naive": naive}))
    rows = [{"epoch": i, f"test_{key}": value, f"train_{key}": value} for i in range(2)]
    p = root / "plots" / dataset / variant / f"s{seed}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rows))


def test_the_report_shows_them(tmp_path: Path) -> None:
    from pipeline.report import write_report

    root = tmp_path / "ws"
    for seed in (0, 1):
        _metrics_file(root, "mocap", "kf", seed, "continuous", 0.2,
                      {"last_value": {"mse": 0.004451}, "train_mean": {"mse": 1.908}})
        _metrics_file(root, "ptb", "lstm", seed, "discrete", 2.9, {"unigram": {"bpc": 4.4, "accuracy": 0.17},
                                                                   "bigram": {"bpc": 3.3, "accuracy": 0.31}})
    write_report(root, tmp_path / "out")
    text = (tmp_path / "out" / "results.md").read_text()
    assert ("Naive predictors (no state beyond the last observation), test MSE: last value 4.451e-03, training mean "
            "1.908") in text
    assert ("Naive predictors (no state beyond the last observation), test: unigram BPC 4.400 and accuracy 0.170; "
            "bigram BPC 3.300 and accuracy 0.310") in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["mocap"]["naive_last_value"] == {"test_mse": 0.004451}
    assert summary["mocap"]["naive_train_mean"] == {"test_mse": 1.908}
    assert summary["ptb"]["naive_unigram"] == {"test_bpc": 4.4, "test_accuracy": 0.17}
    assert summary["ptb"]["naive_bigram"] == {"test_bpc": 3.3, "test_accuracy": 0.31}
    assert summary["mocap"]["kf"]["test_mse"] == pytest.approx(0.2)


def test_the_test_split_panels_draw_them(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.report import _collect, _group, _plot_panel

    root = tmp_path / "ws"
    _metrics_file(root, "mocap", "kf", 0, "continuous", 0.2,
                  {"last_value": {"mse": 0.004451}, "train_mean": {"mse": 1.908}})
    by_variant = _group(_collect(root)[0])["mocap"]
    for split, expected in (("test", ["last value (0.004451)", "training mean (1.908)"]), ("train", [])):
        fig, ax = plt.subplots()
        _plot_panel(ax, by_variant, ["kf"], "mse", split=split, show_train=False, optimal=None, logy="auto")
        labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("kf")]
        assert labels == expected
        if split == "test":
            assert ax.get_yscale() == "log"                    # 0.0045 to 1.9: the auto rule picks log
        plt.close(fig)
