"""The straightforward, unbounded ``psrnn predict``: the "all in memory" baseline of ``bench_predict.py``.

:func:`pipeline.inference.predict_file` filters and writes a block of rows at a time, and since ``77eb1ea`` caps a
block at ``rows_within_budget`` rows (128 MiB of outputs: about 152,000 rows for PTB's 44 symbols) whatever
``block_rows`` asks, so it can no longer be made to hold every output of a long input. This module keeps the naive
method in ``benchmarks/``, as ``naive_two_stage.py`` does for the 2SR: read the whole input, filter every trajectory
keeping every output (``pipeline.train.predict``: steps × vocabulary float32 logits of the whole input), compute
every output column at once (a float64 log-softmax: the predicted symbol, its probability, the bits of the next
symbol; optionally every probability) and write them as one Parquet table. Memory grows with the input by the
outputs (about 1.1 kB a row for 44 symbols), which is what the streamed path avoids.

It writes the columns ``predict_file`` writes for a symbol input (``trajectory``, ``step``, ``predicted``,
``probability``, ``next_bits``, ``probabilities``; not ``next_step``, which :func:`compare_outputs` does not read),
for inputs of the layout ``bench_predict.py`` writes: a
``trajectory`` column whose rows of one trajectory are contiguous, a ``symbol`` column, no ``step`` column (the
step is the row's position in its trajectory) and no unknown symbol. :func:`compare_outputs` checks that two
output files hold the same predictions.

It is a library module: ``bench_predict.py`` runs it in its children (``python -m benchmarks.naive_predict`` only
says so).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

if __package__ in (None, ""):  # run or imported as a plain script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def naive_predict_file(model: Any, vocab: Sequence[str], input_path: str | Path, output_path: str | Path, *,
                       probabilities: bool = False) -> dict[str, Any]:
    """Write the one-step predictions of ``model`` (a discrete pipeline model over ``vocab``) on ``input_path`` to
    ``output_path`` as one Parquet table, every output of the whole input held in memory first; returns ``rows``,
    ``trajectories``, ``predicted_steps`` and ``metrics`` (``bpc``, ``accuracy``), as ``predict_file``'s summary."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch

    from pipeline.train import predict

    table = pq.read_table(input_path, columns=["trajectory", "symbol"])
    symbols = table.column("symbol")
    codes = pc.index_in(symbols, value_set=pa.array(list(vocab), type=symbols.type))
    if codes.null_count:
        raise ValueError(f"{input_path}: {codes.null_count} symbols are not in the vocabulary; the naive method "
                         "takes known symbols only")
    codes = codes.to_numpy().astype(np.int64)
    ids = table.column("trajectory").to_numpy()
    bounds = np.flatnonzero(ids[1:] != ids[:-1]) + 1   # where the next trajectory starts
    if len(np.unique(ids[np.concatenate([[0], bounds])])) != len(bounds) + 1:
        raise ValueError(f"{input_path}: a trajectory's rows are not contiguous; the naive method expects them so")
    encoded = np.split(codes, bounds)
    n = len(codes)
    model.eval()
    with torch.no_grad():
        out = np.concatenate(predict(model, encoded))     # (n, V): every output of the whole input
    starts = np.concatenate([[0], bounds])
    lengths = np.diff(np.concatenate([starts, [n]]))
    steps = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    scored = np.ones(n, dtype=bool)
    scored[np.concatenate([bounds - 1, [n - 1]])] = False   # a trajectory's last row has no next symbol
    target = np.zeros(n, dtype=np.int64)
    target[:-1] = codes[1:]
    target[~scored] = 0
    logp = torch.log_softmax(torch.as_tensor(out).double(), dim=-1)
    rows = torch.arange(n)
    best = logp.argmax(dim=-1)
    bits = (-logp[rows, torch.as_tensor(target)] / math.log(2)).numpy()
    columns = {"trajectory": table.column("trajectory").combine_chunks(), "step": pa.array(steps),
               "predicted": pa.array(np.asarray(vocab, dtype=object)[best.numpy()].tolist(), type=symbols.type),
               "probability": pa.array(logp[rows, best].exp().numpy()),
               "next_bits": pa.array(bits, mask=~scored)}
    if probabilities:
        probs = logp.exp().numpy().astype(np.float32)
        columns["probabilities"] = pa.FixedSizeListArray.from_arrays(pa.array(probs.ravel()), probs.shape[1])
    pq.write_table(pa.table(columns), output_path)
    n_scored = int(scored.sum())
    correct = int((best.numpy() == target)[scored].sum())
    return {"rows": n, "trajectories": len(encoded), "predicted_steps": n_scored,
            "metrics": {"bpc": float(bits[scored].sum()) / n_scored if n_scored else float("nan"),
                        "accuracy": correct / n_scored if n_scored else float("nan")}}


def compare_outputs(path_a: str | Path, path_b: str | Path) -> dict[str, Any]:
    """How far two prediction files are apart: their rows, whether trajectory and step agree row by row, the rows
    whose predicted symbol differs (a near-tie can flip when the filtering is batched differently) and the largest
    absolute difference of ``next_bits`` (None where either is null)."""
    import pyarrow.parquet as pq

    cols = ["trajectory", "step", "predicted", "next_bits"]
    a, b = (pq.read_table(p, columns=cols) for p in (path_a, path_b))
    out: dict[str, Any] = {"rows": [a.num_rows, b.num_rows]}
    if a.num_rows != b.num_rows:
        return {**out, "same_rows": False}
    same_rows = all(a.column(c).to_numpy().tolist() == b.column(c).to_numpy().tolist() for c in cols[:2])
    pa_, pb = (t.column("predicted").to_numpy(zero_copy_only=False) for t in (a, b))
    ba, bb = (t.column("next_bits").to_numpy(zero_copy_only=False).astype(np.float64) for t in (a, b))
    both = ~(np.isnan(ba) | np.isnan(bb))
    return {**out, "same_rows": same_rows and bool((np.isnan(ba) == np.isnan(bb)).all()),
            "predicted_mismatches": int((pa_ != pb).sum()),
            "max_next_bits_difference": float(np.abs(ba[both] - bb[both]).max()) if both.any() else 0.0}


#: what :func:`agree` tolerates: near-ties flipped (a share of the rows) and float rounding of the bits
MAX_MISMATCH_SHARE = 1e-4
MAX_BITS_DIFFERENCE = 1e-4


def agree(comparison: dict[str, Any]) -> bool:
    """Whether :func:`compare_outputs` found the same predictions, to float rounding."""
    rows = comparison["rows"][0]
    return (comparison.get("same_rows", False)
            and comparison["predicted_mismatches"] <= MAX_MISMATCH_SHARE * rows
            and comparison["max_next_bits_difference"] <= MAX_BITS_DIFFERENCE)


if __name__ == "__main__":
    print("benchmarks/naive_predict.py is a library module, not a script: bench_predict.py runs its "
          "naive_predict_file (every output of the whole input held in memory, then written) as the baseline of "
          "the streamed predict_file. Run: python -m benchmarks.bench_predict --help")
