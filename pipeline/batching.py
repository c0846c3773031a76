"""Lay trajectories out as parallel streams for (truncated) BPTT.

Each of the B streams is a concatenation of whole trajectories; ``reset[t, b]`` marks the first step of a
trajectory, where the model restarts from its initial state, and ``mask[t, b]`` marks the steps that have a target
(o_{t+1} in the same trajectory). A single long trajectory (PTB) is cut into B contiguous pieces, as
``batchify`` does in word_language_model, but only into pieces of at least one BPTT window of targets
(``bptt`` + 1 steps): a single trajectory trained by whole-sequence BPTT (``bptt`` 0) stays whole, and a short
one is cut into fewer pieces (cutting a 59-step series into 20 pieces of 2 steps trained every target from the
initial state). Evaluation uses one stream per trajectory, so the state is filtered through the whole test
sequence and never reset per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch


@dataclass
class Streams:
    x: torch.Tensor        # (L, B) int64 or (L, B, m)
    y: torch.Tensor        # targets, same layout
    mask: torch.Tensor     # (L, B) bool: step has a target
    reset: torch.Tensor    # (L, B) bool: trajectory starts here
    positions: list[tuple[int, int]] = field(default_factory=list)  # (stream, start) of each placed trajectory

    @property
    def length(self) -> int:
        return self.x.shape[0]

    @property
    def batch_size(self) -> int:
        return self.x.shape[1]

    def windows(self, bptt: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        step = self.length if bptt <= 0 else bptt
        for s in range(0, self.length, step):
            yield self.x[s:s + step], self.y[s:s + step], self.mask[s:s + step], self.reset[s:s + step]

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "Streams":
        x, y = self.x.to(device), self.y.to(device)
        if dtype is not None and x.is_floating_point():
            x, y = x.to(dtype), y.to(dtype)
        return Streams(x=x, y=y, mask=self.mask.to(device), reset=self.reset.to(device), positions=self.positions)


_NUMPY_FLOATS = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16}


def make_streams(trajectories: Sequence[np.ndarray], n_streams: int, *, discrete: bool,
                 order: np.ndarray | None = None, dtype: torch.dtype | None = None,
                 min_piece: int | None = 2) -> Streams:
    """Arrange ``trajectories`` (in ``order``) into at most ``n_streams`` padded streams.

    A single trajectory is cut into at most ``n_streams`` contiguous pieces of at least ``min_piece`` steps each
    (training passes ``bptt + 1``: a window of targets), their lengths differing by at most one step so that no
    step is dropped; ``min_piece=None`` keeps it whole (whole-sequence BPTT).

    Continuous inputs are stored in ``dtype`` (default float32; pass the model's dtype, so that a float64 model
    sees its float64 data unrounded, and ``Streams.to(device, dtype)`` copies nothing). Discrete inputs are
    always int64."""
    if not trajectories:
        raise ValueError("trajectories: empty; expected a list of trajectories, at least one")
    trajs = [np.asarray(trajectories[i]) for i in (order if order is not None else range(len(trajectories)))]
    if len(trajs) == 1 and n_streams > 1 and min_piece is not None:
        whole = trajs[0]
        n_streams = max(1, min(n_streams, len(whole) // max(2, int(min_piece))))
        # the first len % n_streams pieces one step longer: nothing dropped (batchify drops the rest)
        sizes = np.full(n_streams, len(whole) // n_streams) + (np.arange(n_streams) < len(whole) % n_streams)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        trajs = [whole[bounds[i]:bounds[i + 1]] for i in range(n_streams)]
    n_streams = min(n_streams, len(trajs))
    buckets: list[list[np.ndarray]] = [[] for _ in range(n_streams)]
    lengths = np.zeros(n_streams, dtype=np.int64)
    positions = []
    for t in trajs:  # greedy: next trajectory to the currently shortest stream, ties to the lowest index
        b = int(np.argmin(lengths))
        positions.append((b, int(lengths[b])))
        buckets[b].append(t)
        lengths[b] += len(t)
    L = int(lengths.max())
    feat_shape = () if discrete else (trajs[0].reshape(len(trajs[0]), -1).shape[1],)
    # dtypes numpy lacks (bfloat16) are stored as float32 and converted by Streams.to(device, dtype)
    float_dtype = _NUMPY_FLOATS.get(dtype, np.float32)
    x = np.zeros((L, n_streams, *feat_shape), dtype=np.int64 if discrete else float_dtype)
    y = np.zeros_like(x)
    mask = np.zeros((L, n_streams), dtype=bool)
    reset = np.zeros((L, n_streams), dtype=bool)
    for b, bucket in enumerate(buckets):
        pos = 0
        for t in bucket:
            T = len(t)
            t = t if discrete else t.reshape(T, -1)
            x[pos:pos + T, b] = t
            y[pos:pos + T - 1, b] = t[1:]
            mask[pos:pos + T - 1, b] = True
            reset[pos, b] = True
            pos += T
    return Streams(x=torch.from_numpy(x), y=torch.from_numpy(y), mask=torch.from_numpy(mask),
                   reset=torch.from_numpy(reset), positions=positions)
