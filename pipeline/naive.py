"""Predictors that learn nothing of the dynamics, scored on the steps the models are scored on: the yardstick a
model's one-step test metric has to beat.

The paper compares its models with each other only. On the continuous sets a model that merely copied its input
would be hard to beat: consecutive Mocap frames (120 Hz) are almost equal, and predicting ô_{t+1} = o_t scores a
test MSE about 40 times lower than the best model of the paper's setting (20 states for 51 features). The report
prints these numbers beside every table so that no curve is read without them.

* continuous: ``last_value`` (persistence, ô_{t+1} = o_t) and ``train_mean`` (ô_{t+1} = the mean of the training
  observations), MSE over the same steps and features as :class:`pipeline.metrics.MetricSums`;
* discrete: ``unigram``, the training symbol frequencies with add-½ smoothing (a symbol never seen in training
  costs finite bits): BPC, and the accuracy of always predicting the most frequent training symbol; ``bigram``,
  the training frequencies of the symbol after each symbol (within a trajectory), smoothed toward the unigram:
  P(b | a) = (C(a, b) + P_uni(b)) / (C(a) + 1), one pseudo-count spread as the unigram, so a context never seen in
  training predicts the unigram. It remembers one symbol and learns nothing else: a model of hidden state that
  does no better has learnt no more than the last observation tells (on PTB characters it is 3.3 bits, not 4.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: the names of the predictors, per kind, in the order the report shows them
NAIVE_PREDICTORS = {"continuous": ("last_value", "train_mean"), "discrete": ("unigram", "bigram")}
#: how the report names them
NAIVE_LABELS = {"last_value": "last value", "train_mean": "training mean", "unigram": "unigram", "bigram": "bigram"}


def naive_metrics(train: Sequence[np.ndarray], test: Sequence[np.ndarray], *, discrete: bool,
                  vocab_size: int | None = None) -> dict[str, dict[str, float]]:
    """``{predictor: {metric: value}}`` on the one-step targets o_{t+1}, t = 1 … T-1, of every ``test``
    trajectory (a trajectory of one step has none). Discrete trajectories are int symbols 0 … V-1 (``vocab_size``
    V, default 1 + the largest symbol of train and test); continuous ones are (T, m) or (T,) arrays. Empty when the
    test split has no step to score."""
    if not any(len(t) > 0 for t in train):
        raise ValueError("train: no observation; expected at least one training trajectory with a step")
    if not any(len(t) > 1 for t in test):
        return {}
    if discrete:
        syms = np.concatenate([np.asarray(t, dtype=np.int64).ravel() for t in train])
        targets = np.concatenate([np.asarray(t, dtype=np.int64).ravel()[1:] for t in test])
        V = vocab_size if vocab_size is not None else 1 + int(max(syms.max(), targets.max()))
        for name, s in (("train", syms), ("test", targets)):
            bad = (s < 0) | (s >= V)
            if bad.any():   # bincount would grow past V, or an index wrap round: a wrong number, silently
                raise ValueError(f"{name}: symbol {int(s[bad][0])}; expected symbols 0 … {V - 1}")
        counts = np.bincount(syms, minlength=V)
        return {"unigram": unigram_metrics(counts, targets), "bigram": bigram_metrics(counts, train, test)}

    mean = np.concatenate([_rows(t) for t in train]).mean(axis=0)
    return {"last_value": {"mse": last_value_mse(test)},
            "train_mean": {"mse": _scored_mse(test, lambda x: np.broadcast_to(mean, x[:-1].shape))}}


def unigram_counts(train: Sequence[np.ndarray], vocab_size: int) -> list[int]:
    """How often each symbol 0 … V-1 occurs in the ``train`` trajectories: what :func:`unigram_metrics` needs, kept
    with a trained run (its ``data_units``) so that new data are scored against the same yardstick."""
    syms = [np.asarray(t, dtype=np.int64).ravel() for t in train]
    return np.bincount(np.concatenate(syms) if syms else np.zeros(0, np.int64), minlength=vocab_size).tolist()


def unigram_probabilities(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """The unigram's distribution: the training ``counts`` with add-½ smoothing (a symbol never seen in training
    gets a finite cost)."""
    counts = np.asarray(counts, dtype=np.float64)
    return (counts + 0.5) / (counts.sum() + 0.5 * len(counts))


def unigram_metrics(counts: Sequence[int] | np.ndarray, targets: np.ndarray | None = None, *,
                    target_counts: Sequence[int] | np.ndarray | None = None) -> dict[str, float]:
    """The unigram predictor on the symbols ``targets`` (or on their histogram ``target_counts``, which a stream
    of blocks accumulates): the training frequencies ``counts`` with add-½ smoothing (a symbol never seen in
    training costs finite bits), ``bpc``, and ``accuracy``, that of always predicting the most frequent training
    symbol; NaN for no target."""
    counts = np.asarray(counts, dtype=np.float64)
    if target_counts is None:
        target_counts = np.bincount(np.asarray(targets, dtype=np.int64).ravel(), minlength=len(counts))
    hist = np.asarray(target_counts, dtype=np.float64)
    n = hist.sum()
    if n == 0:
        return {"bpc": float("nan"), "accuracy": float("nan")}
    p = unigram_probabilities(counts)
    return {"bpc": float((hist * -np.log2(p[:len(hist)])).sum() / n),
            "accuracy": float(hist[int(np.argmax(counts))] / n)}


def symbol_pairs(trajectories: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of every pair of consecutive symbols within a trajectory: the contexts and the symbols after them."""
    kept = [np.asarray(t, dtype=np.int64).ravel() for t in trajectories if len(t) > 1]
    if not kept:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([t[:-1] for t in kept]), np.concatenate([t[1:] for t in kept])


def pair_counts(trajectories: Sequence[np.ndarray], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct pairs of consecutive symbols of ``trajectories`` as sorted codes a·V + b, and how often each
    occurs: what :class:`Bigram` needs of train, kept with a trained run (its ``data_units``, ``train_pairs``) so
    that new data are scored against the same yardstick. Never a V x V table: memory grows with the data, not
    with the square of the vocabulary."""
    a, b = symbol_pairs(trajectories)
    return np.unique(a * vocab_size + b, return_counts=True)


#: the most pairs of consecutive training symbols a run keeps for the bigram yardstick of new data (a vocabulary of
#: event ids could have millions: history.json and the MLflow run's data_units.json stay small)
MAX_KEPT_PAIRS = 2 ** 20


def kept_pairs(train: Sequence[np.ndarray], vocab_size: int) -> dict[str, list[int]] | None:
    """What a trained run (refine's ``data_units``) or a fitted model (its ``extras``) keeps of train for the
    bigram: ``{"codes": [...], "counts": [...]}`` of :func:`pair_counts`, or None over :data:`MAX_KEPT_PAIRS`."""
    codes, counts = pair_counts(train, vocab_size)
    return {"codes": codes.tolist(), "counts": counts.tolist()} if codes.size <= MAX_KEPT_PAIRS else None


@dataclass
class Bigram:
    """The bigram predictor (module docstring) from the training symbol ``counts`` (V of them) and the training
    pairs ``codes`` / ``code_counts`` (:func:`pair_counts`)."""
    counts: np.ndarray
    codes: np.ndarray
    code_counts: np.ndarray

    def __post_init__(self) -> None:
        V = len(self.counts)
        self.codes = np.asarray(self.codes, dtype=np.int64)
        self.code_counts = np.asarray(self.code_counts, dtype=np.float64)
        self.unigram = unigram_probabilities(self.counts)
        self.context_counts = np.bincount(self.codes // V, weights=self.code_counts, minlength=V)
        # the most probable next symbol after each context: the unigram's most frequent one unless a symbol seen
        # after it scores more (its count plus its unigram probability; an unseen one its unigram probability)
        self.best = np.full(V, int(np.argmax(self.unigram)), dtype=np.int64)
        if self.codes.size:
            ca, cb = self.codes // V, self.codes % V
            score = self.code_counts + self.unigram[cb]
            order = np.lexsort((-score, ca))             # per context, the highest score first
            top = order[np.r_[True, ca[order][1:] != ca[order][:-1]]]
            better = score[top] > self.unigram.max()
            self.best[ca[top][better]] = cb[top][better]

    def scores(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per pair (context a, next symbol b): -log2 P(b | a), and whether b is the most probable symbol after a."""
        V = len(self.counts)
        seen = np.zeros(len(a))   # C(a, b) of each pair
        if self.codes.size and len(a):
            wanted = a * V + b
            at = np.minimum(np.searchsorted(self.codes, wanted), self.codes.size - 1)
            seen = np.where(self.codes[at] == wanted, self.code_counts[at], 0.0)
        p = (seen + self.unigram[b]) / (self.context_counts[a] + 1.0)
        return -np.log2(p), self.best[a] == b

    def metrics(self, a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
        """``bpc`` and ``accuracy`` over the pairs (a, b), each counted ``weights`` times (default once); NaN for
        none."""
        w = np.ones(len(a)) if weights is None else np.asarray(weights, dtype=np.float64)
        if not w.sum():
            return {"bpc": float("nan"), "accuracy": float("nan")}
        bits, hits = self.scores(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        return {"bpc": float((w * bits).sum() / w.sum()), "accuracy": float((w * hits).sum() / w.sum())}


def bigram_metrics(counts: Sequence[int] | np.ndarray, train: Sequence[np.ndarray],
                   test: Sequence[np.ndarray]) -> dict[str, float]:
    """The bigram predictor (module docstring) on the one-step targets of ``test``: ``bpc``, and ``accuracy``, that
    of predicting the most probable next symbol. ``counts``: the training symbol counts (V of them); ``train`` and
    ``test``: int symbol trajectories. NaN for no target."""
    return Bigram(np.asarray(counts), *pair_counts(train, len(counts))).metrics(*symbol_pairs(test))


#: a 2SR-initialised model whose final metric is this much worse (relative) than its epoch-0 one is called out:
#: by fit_model's warning, refine's note and the report's line under a table
WORSE_THAN_START = 0.10


def worse_than_start(initial: float, final: float) -> bool:
    """Whether a final BPC / MSE is more than :data:`WORSE_THAN_START` worse than the epoch-0 one (both finite)."""
    return math.isfinite(initial) and math.isfinite(final) and final - initial > WORSE_THAN_START * abs(initial)


def last_value_mse(trajectories: Sequence[np.ndarray]) -> float:
    """The MSE of predicting o_{t+1} by o_t, over the steps and features of every trajectory of two steps or more
    (NaN when there is none): the ``last_value`` predictor alone, which ``evaluate`` of a trained model and
    ``psrnn predict`` report beside the model's MSE."""
    return _scored_mse(trajectories, lambda x: x[:-1])


def _rows(t: np.ndarray) -> np.ndarray:
    a = np.asarray(t, dtype=np.float64)
    return a[:, None] if a.ndim == 1 else a


def _scored_mse(trajectories: Sequence[np.ndarray], predict) -> float:
    """The mean squared error of ``predict(x)`` (rows 0 … T-2 of a (T, m) trajectory) against rows 1 … T-1."""
    total, count = 0.0, 0
    for t in trajectories:
        x = _rows(t)
        if len(x) < 2:
            continue
        total += float(((x[1:] - predict(x)) ** 2).sum())
        count += x[1:].size
    return total / count if count else float("nan")

