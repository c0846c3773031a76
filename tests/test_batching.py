"""pipeline.batching.make_streams: trajectories laid out as parallel BPTT streams with reset and target masks.

Every trajectory's values encode (trajectory, step) -- distinct symbol ranges for discrete data, a trajectory id
of a very different scale per trajectory for continuous data -- so each cell of the streams can be decoded back
to where it came from, and a target that crosses into the next trajectory, a missing reset, a target on a last
step or a transition seen twice (or never) is an exact failure, not a slightly different loss.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from pipeline.batching import make_streams

LENGTHS = [7, 3, 12, 5, 2, 9, 4]
# greedy placement: each trajectory to the currently shortest stream, ties to the lowest index (3 streams)
POSITIONS = [(0, 0), (1, 0), (2, 0), (1, 3), (0, 7), (1, 8), (0, 9)]
STREAM_LENGTH = 17  # stream 1 holds 3 + 5 + 9 steps


def _discrete_trajs(lengths=LENGTHS) -> list[np.ndarray]:
    """Trajectory k is the symbols 1000(k+1) + step: disjoint ranges, and 0 never occurs (it is the padding)."""
    return [np.arange(T, dtype=np.int64) + 1000 * (k + 1) for k, T in enumerate(lengths)]


def _continuous_trajs(lengths=LENGTHS) -> list[np.ndarray]:
    """Trajectory k: column 0 is 10**(k+1) (its id, scales from 10 to 10**7), column 1 the step + 0.5."""
    return [np.stack([np.full(T, 10.0 ** (k + 1)), np.arange(T) + 0.5], axis=1) for k, T in enumerate(lengths)]


def _decode_discrete(v: int) -> tuple[int, int] | None:
    return None if v == 0 else (v // 1000 - 1, v % 1000)


def _decode_continuous(v: np.ndarray) -> tuple[int, int] | None:
    if v[0] == 0.0:
        return None
    k = int(round(np.log10(v[0]))) - 1
    assert v[0] == 10.0 ** (k + 1), v
    return k, int(v[1] - 0.5)


def _check_layout(streams, lengths: list[int], decode) -> None:
    """Every masked (input, target) pair is (step s, step s+1) of one trajectory; resets exactly at the starts;
    no target on a last step or on padding; every step and every transition of every trajectory exactly once."""
    x, y = streams.x.numpy(), streams.y.numpy()
    mask, reset = streams.mask.numpy(), streams.reset.numpy()
    assert mask.dtype == bool and reset.dtype == bool
    L, B = mask.shape
    steps, transitions = Counter(), Counter()
    for t in range(L):
        for b in range(B):
            src = decode(x[t, b])
            if src is None:  # padding after the stream's last trajectory
                assert not mask[t, b] and not reset[t, b], (t, b)
                assert all(decode(x[u, b]) is None for u in range(t, L)), f"padding inside stream {b} at {t}"
                continue
            k, s = src
            steps[src] += 1
            assert reset[t, b] == (s == 0), f"reset[{t}, {b}] = {reset[t, b]} at step {s} of trajectory {k}"
            if s == 0 and t > 0:  # the previous trajectory of the stream ended right before
                prev = decode(x[t - 1, b])
                assert prev is not None and prev[0] != k and prev[1] == lengths[prev[0]] - 1, (t, b, prev)
            if s == lengths[k] - 1:
                assert not mask[t, b], f"last step of trajectory {k} has a target ({y[t, b]})"
                continue
            assert mask[t, b], f"step {s} of trajectory {k} (length {lengths[k]}) has no target"
            target = decode(y[t, b])
            assert target == (k, s + 1), f"input {(k, s)} has target {target}"
            transitions[src] += 1
    assert steps == Counter({(k, s): 1 for k, T in enumerate(lengths) for s in range(T)})
    assert transitions == Counter({(k, s): 1 for k, T in enumerate(lengths) for s in range(T - 1)})
    assert int(mask.sum()) == sum(T - 1 for T in lengths)
    assert int(reset.sum()) == len(lengths)


def test_discrete_streams_keep_trajectories_apart():
    trajs = _discrete_trajs()
    streams = make_streams(trajs, 3, discrete=True)
    assert streams.x.dtype == torch.int64 and streams.y.dtype == torch.int64
    assert tuple(streams.x.shape) == (STREAM_LENGTH, 3) and tuple(streams.y.shape) == (STREAM_LENGTH, 3)
    assert streams.positions == POSITIONS
    for traj, (b, start) in zip(trajs, POSITIONS):
        assert np.array_equal(streams.x[start:start + len(traj), b].numpy(), traj)
        assert np.array_equal(streams.y[start:start + len(traj) - 1, b].numpy(), traj[1:])
    # streams 0 and 1 hold three trajectories each: resets at their starts, nowhere else
    assert np.flatnonzero(streams.reset[:, 0].numpy()).tolist() == [0, 7, 9]
    assert np.flatnonzero(streams.reset[:, 1].numpy()).tolist() == [0, 3, 8]
    assert np.flatnonzero(streams.reset[:, 2].numpy()).tolist() == [0]
    # the steps without a target: the last of each trajectory and the padding
    assert np.flatnonzero(~streams.mask[:, 0].numpy()).tolist() == [6, 8, 12, 13, 14, 15, 16]
    assert np.flatnonzero(~streams.mask[:, 1].numpy()).tolist() == [2, 7, 16]
    assert np.flatnonzero(~streams.mask[:, 2].numpy()).tolist() == [11, 12, 13, 14, 15, 16]
    _check_layout(streams, LENGTHS, lambda v: _decode_discrete(int(v)))


@pytest.mark.parametrize("dtype, np_dtype", [(None, np.float32), (torch.float64, np.float64)])
def test_continuous_streams_keep_trajectories_apart(dtype, np_dtype):
    trajs = _continuous_trajs()
    streams = make_streams(trajs, 3, discrete=False, dtype=dtype)
    assert streams.x.numpy().dtype == np_dtype and streams.y.numpy().dtype == np_dtype
    assert tuple(streams.x.shape) == (STREAM_LENGTH, 3, 2)
    assert streams.positions == POSITIONS
    for traj, (b, start) in zip(trajs, POSITIONS):
        assert np.array_equal(streams.x[start:start + len(traj), b].numpy(), traj.astype(np_dtype))
        assert np.array_equal(streams.y[start:start + len(traj) - 1, b].numpy(), traj[1:].astype(np_dtype))
    _check_layout(streams, LENGTHS, _decode_continuous)


def test_one_dimensional_continuous_trajectories_become_one_feature():
    trajs = [np.arange(T, dtype=np.float64) + 100.0 * (k + 1) for k, T in enumerate(LENGTHS)]
    streams = make_streams(trajs, 3, discrete=False, dtype=torch.float64)
    assert tuple(streams.x.shape) == (STREAM_LENGTH, 3, 1)
    _check_layout(streams, LENGTHS, lambda v: None if v[0] == 0 else (int(v[0]) // 100 - 1, int(v[0]) % 100))


def test_order_places_the_trajectories_in_that_order():
    trajs = _discrete_trajs()
    order = np.array([6, 2, 0, 5, 1, 4, 3])
    streams = make_streams(trajs, 3, discrete=True, order=order)
    # lengths in this order: 4, 12, 7, 9, 3, 2, 5
    assert streams.positions == [(0, 0), (1, 0), (2, 0), (0, 4), (2, 7), (2, 10), (1, 12)]
    for i, (b, start) in zip(order, streams.positions):
        assert np.array_equal(streams.x[start:start + LENGTHS[i], b].numpy(), trajs[i])
    _check_layout(streams, LENGTHS, lambda v: _decode_discrete(int(v)))


@pytest.mark.parametrize("n_streams", [1, 2, 7, 50])
def test_any_number_of_streams_keeps_every_transition_once(n_streams):
    trajs = _discrete_trajs()
    streams = make_streams(trajs, n_streams, discrete=True)
    assert streams.batch_size == min(n_streams, len(trajs))
    if n_streams == 1:  # one stream: all trajectories back to back
        assert streams.length == sum(LENGTHS)
        assert np.array_equal(streams.x[:, 0].numpy(), np.concatenate(trajs))
    if n_streams >= len(trajs):  # a stream per trajectory
        assert streams.positions == [(k, 0) for k in range(len(trajs))] and streams.length == max(LENGTHS)
    _check_layout(streams, LENGTHS, lambda v: _decode_discrete(int(v)))


def test_a_single_trajectory_is_cut_into_contiguous_pieces():
    """One long trajectory (PTB) is cut into n_streams contiguous pieces whose lengths differ by at most one step
    (23 = 6 + 6 + 6 + 5: nothing dropped, unlike batchify); each piece starts with a reset and its last step has
    no target."""
    whole = np.arange(23, dtype=np.int64) + 1000
    streams = make_streams([whole], 4, discrete=True)
    assert tuple(streams.x.shape) == (6, 4) and streams.positions == [(b, 0) for b in range(4)]
    starts, sizes = [0, 6, 12, 18], [6, 6, 6, 5]
    for b in range(4):
        piece = whole[starts[b]:starts[b] + sizes[b]]
        assert np.array_equal(streams.x[:sizes[b], b].numpy(), piece)
        assert np.array_equal(streams.y[:sizes[b] - 1, b].numpy(), piece[1:])
        assert streams.mask[:, b].numpy().tolist() == [True] * (sizes[b] - 1) + [False] * (7 - sizes[b])
    assert streams.reset.numpy().tolist() == [[True] * 4] + [[False] * 4] * 5
    # too many streams for pieces of 2 steps: as many streams as pairs of steps
    short = make_streams([np.arange(5, dtype=np.int64) + 1000], 4, discrete=True)
    assert short.x.numpy().tolist() == [[1000, 1003], [1001, 1004], [1002, 0]]
    assert short.y.numpy()[:2].tolist() == [[1001, 1004], [1002, 0]]
    assert short.mask.numpy().tolist() == [[True, True], [True, False], [False, False]]
    assert short.reset.numpy().tolist() == [[True, True], [False, False], [False, False]]


@pytest.mark.parametrize("length, n_streams, min_piece, sizes", [
    (59, 20, None, [59]),            # whole-sequence BPTT: one stream, every transition scored
    (59, 20, 35, [59]),              # shorter than two windows: one piece
    (100, 20, 10, [10] * 10),        # a piece per window, not 20 pieces of 5
    (105, 4, 10, [27, 26, 26, 26]),  # long enough for every stream
    (120780, 20, 35, [6039] * 20),   # PTB's training characters: 20 equal pieces, as the reference code's
    (7, 20, 1, [3, 2, 2]),           # a window of 1 still leaves a transition per piece: at least 2 steps
])
def test_a_single_trajectory_is_cut_into_pieces_of_a_window_or_more(length, n_streams, min_piece, sizes):
    """Training passes bptt + 1 as ``min_piece`` (pipeline.train.fit): a single 59-step series at
    batch_size 20 was cut into 20 pieces of 2 steps, trained every target from the initial state and dropped the
    last 19 steps; with whole-sequence BPTT (``min_piece=None``) it stays whole."""
    whole = np.arange(length, dtype=np.int64)
    streams = make_streams([whole], n_streams, discrete=True, min_piece=min_piece)
    got = [int(n) for n in (streams.mask.sum(0) + 1)]
    assert got == sizes
    assert int(streams.mask.sum()) == length - len(sizes)   # only the pieces' last steps lack a target
    assert sorted(streams.x.numpy()[streams.mask.numpy() | _last_steps(streams)].tolist()) == list(range(length))


def _last_steps(streams):
    """(L, B) bool: the last real step of each stream (a single piece each, starting at step 0)."""
    last = np.zeros(tuple(streams.mask.shape), dtype=bool)
    for b, n in enumerate(streams.mask.sum(0).tolist()):
        last[n, b] = True
    return last


@pytest.mark.parametrize("bptt", [0, -1, 1, 4, 5, 17, 40])
def test_windows_cut_the_streams_into_consecutive_bptt_blocks(bptt):
    """Training takes ``streams.windows(bptt)`` (pipeline.train): consecutive blocks of bptt steps (the last may be
    shorter), all streams side by side; bptt <= 0 is one window of whole streams. Together they are the streams."""
    streams = make_streams(_discrete_trajs(), 3, discrete=True)
    windows = list(streams.windows(bptt))
    step = STREAM_LENGTH if bptt <= 0 else bptt
    expected = [min(step, STREAM_LENGTH - s) for s in range(0, STREAM_LENGTH, step)]
    assert [w[0].shape[0] for w in windows] == expected
    for i, part in enumerate(("x", "y", "mask", "reset")):
        assert all(w[i].shape[1:] == getattr(streams, part).shape[1:] for w in windows)
        assert torch.equal(torch.cat([w[i] for w in windows]), getattr(streams, part)), part


def test_to_keeps_the_layout_and_converts_floats_only():
    streams = make_streams(_continuous_trajs(), 3, discrete=False)
    moved = streams.to("cpu", torch.float64)
    assert moved.x.dtype == torch.float64 and torch.equal(moved.x, streams.x.double())
    assert torch.equal(moved.mask, streams.mask) and torch.equal(moved.reset, streams.reset)
    assert moved.positions == POSITIONS
    discrete = make_streams(_discrete_trajs(), 3, discrete=True).to("cpu", torch.float64)
    assert discrete.x.dtype == torch.int64  # symbols stay indices


def test_no_trajectories_is_an_error():
    with pytest.raises(ValueError, match="trajectories: empty"):
        make_streams([], 3, discrete=True)


@pytest.mark.parametrize("discrete", [True, False])
def test_the_loss_of_a_fully_scored_window_taken_whole_has_the_same_bits_and_gradients(discrete):
    """masked_loss(full=True) (the training loop's path for windows whose every step has a target: no boolean
    indexing, which waits for a CUDA device) gives the loss and gradients of the masked path bit for bit."""
    from pipeline.metrics import masked_loss

    g = torch.Generator().manual_seed(0)
    L, B, m = 7, 3, 5
    out = torch.randn(L, B, m, generator=g, dtype=torch.float32)
    y = torch.randint(0, m, (L, B), generator=g) if discrete else torch.randn(L, B, m, generator=g)
    mask = torch.ones(L, B, dtype=torch.bool)
    losses, grads = [], []
    for full in (False, True):
        x = out.clone().requires_grad_(True)
        loss = masked_loss(x, y, mask, discrete, full=full)
        loss.backward()
        losses.append(loss.detach())
        grads.append(x.grad)
    assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])
    mask[2, 1] = False   # a step without a target: the masked path differs, as it must
    assert not torch.equal(masked_loss(out, y, mask, discrete), losses[0])


def test_the_continuous_training_loss_is_the_mean_over_every_scored_element():
    """The MSE objective averages over steps and features alike (as the MSE metric does): summing the features
    and averaging over steps scales the gradients by the width, which no other test saw (a mutation survived)."""
    from pipeline.metrics import MetricSums, masked_loss

    g = torch.Generator().manual_seed(1)
    L, B, m = 6, 2, 3
    out = torch.randn(L, B, m, generator=g, dtype=torch.float64)
    y = torch.randn(L, B, m, generator=g, dtype=torch.float64)
    mask = torch.ones(L, B, dtype=torch.bool)
    mask[4, 1] = False
    want = ((out - y) ** 2)[mask].sum() / (int(mask.sum()) * m)
    assert torch.allclose(masked_loss(out, y, mask, False), want, rtol=1e-14, atol=0)
    sums = MetricSums(discrete=False)
    sums.add(out, y, mask)
    assert sums.result()["mse"] == pytest.approx(float(want), rel=1e-12)


@pytest.mark.parametrize("bptt", [0, 35])
def test_fit_trains_a_single_short_series_whole(bptt):
    """pipeline.train.fit on one 59-step series at the default batch_size 20: the same updates as batch_size 1 (one
    stream, every transition scored, the state filtered through the series), not those of 20 two-step pieces."""
    from pipeline.api import initialise_model
    from pipeline.models.common import ModelConfig
    from pipeline.train import fit
    from pipeline.train_config import TrainConfig

    series = [np.cumsum(np.random.default_rng(0).standard_normal((59, 2)), axis=0) * 0.1]
    weights = []
    for batch_size in (20, 1):
        model = initialise_model(ModelConfig(model="gru", discrete=False, input_dim=2, output_dim=2, state_dim=5,
                                             obs_dim=4, init="xavier"), seed=3)
        fit(model, series, series, TrainConfig(epochs=2, lr=0.1, bptt=bptt, batch_size=batch_size, device="cpu",
                                               eval_train=False))
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])
