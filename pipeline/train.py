"""Refinement by backpropagation through time (Sec. 4.2), evaluation after every epoch, exact resume.

* Truncated BPTT over windows of ``bptt`` steps (35 for PTB), the state carried across windows and detached;
  ``bptt = 0`` back-propagates through whole sequences (the paper's choice for continuous data).
* SGD with the paper's learning rate 1 and gradient-norm clipping.
* Epoch 0 is the initialisation: it is evaluated before any update.
* After every epoch one checkpoint dict is written atomically (model, optimiser, configs, epoch, best metric,
  history, RNG states); :func:`fit` resumes from it and ends bitwise where an uninterrupted run ends, because
  the only randomness (the order of trajectories) is drawn from ``seed`` and the epoch number.
* A loss or gradient that is not finite (or a loss above ``train.max_loss``) stops training with
  :class:`TrainingDiverged`, naming the epoch and step; the last good checkpoint is kept untouched.
* A checkpoint is resumed only if its model and train configs match (:data:`RESUMABLE_CHANGES` may differ).
* Every epoch is scored on one split (``monitor``: valid when there is one, else train): the best epoch, and, when
  asked, a learning rate multiplied by ``lr_decay`` after each epoch that does not improve on the best (by more
  than ``min_delta``), a stop
  after ``patience`` such epochs in a row, and the best epoch's weights as the trained model (``restore_best``).
  The decayed rate lives in the optimiser state and a stop in the checkpoint, so both resume exactly.
* Subnormal floats are flushed to zero while :func:`fit`, :func:`evaluate` and :func:`predict` run (products of
  small gradients through long recurrences reach them, ~20x slower on CPU); the previous mode is restored after.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from pipeline.batching import make_streams
from pipeline.data.schema import unscorable
from pipeline.io import plain_values
from pipeline.metrics import MetricSums, masked_loss, primary_metric
from pipeline.messages import brief
from pipeline.models.common import SequenceModel, detach_state
from pipeline.progress import progress
from pipeline.train_config import DEVICE, TrainConfig, option_value

log = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN/Inf; the message names the epoch and step."""


def resolve_device(name: Any, option: str = "train.device=") -> torch.device:
    """The torch device of ``name``: auto (CUDA when present), cpu, cuda or cuda:<index>, one this machine has.
    Errors name ``option``: ``train.device=`` (params), ``device=`` (Python) or ``--device`` (command line)."""
    if not isinstance(name, str) or not DEVICE.fullmatch(name):
        raise ValueError(f"{option_value(option, name)}: expected auto, cpu, cuda or cuda:<index> (e.g. cuda:0)")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"{option_value(option, name)}: CUDA is not available on this machine; expected auto or cpu")
    index = int(name[5:]) if ":" in name else None
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        devices = f"{count} CUDA device{'' if count == 1 else 's'}"
        raise ValueError(f"{option_value(option, name)}: this machine has {devices} (cuda:0 to cuda:{count - 1}); "
                         "expected one of them, cuda, auto or cpu")
    # by index, not by name: DEVICE accepts cuda:01, which torch.device's parser refuses ("Invalid device string")
    return torch.device("cuda") if index is None else torch.device("cuda", index)


def flush_denormal_enabled() -> bool:
    """Whether subnormal floats are flushed to zero on this thread now.

    torch has a setter (``torch.set_flush_denormal``) but no getter, so this probes the mode: with
    flush-to-zero / denormals-are-zero set, multiplying the subnormal 2⁻¹⁰⁶⁰ by 1 gives 0."""
    return bool((torch.tensor(2.0 ** -1060, dtype=torch.float64) * 1.0) == 0)


@contextlib.contextmanager
def flush_denormal():
    """Flush subnormals to zero inside the block, and put back the mode found on entry."""
    previous = flush_denormal_enabled()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(previous)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


#: About how many bytes one block of evaluation may hold: the model's outputs for the block and the temporaries
#: :class:`MetricSums` makes of them (a masked copy, its float64 copy and float64 log-probabilities, so about
#: 2 x itemsize + 16 bytes per output element). The outputs of a whole test set are steps x trajectories x
#: vocabulary, which for a custom set of 63k symbols and 120k steps is tens of GB; blocks of this size keep
#: evaluation's memory flat (a float32 logits table of about 20 MiB per block) at no cost for small vocabularies,
#: where a block is still ``chunk`` steps of every trajectory.
EVAL_BLOCK_BYTES = 128 * 2 ** 20


@torch.no_grad()
def evaluate(model: SequenceModel, trajectories: Sequence[np.ndarray], *, chunk: int = 2048,
             device: torch.device | None = None, block_bytes: int = EVAL_BLOCK_BYTES) -> dict[str, float]:
    """Filter every trajectory from the initial state to its end (one stream each, never reset mid-way; the
    state is carried from one block of steps to the next) and score every one-step prediction.

    The metrics are sums, accumulated block by block (at most ``chunk`` steps of as many trajectories as keep a
    block's outputs and metric temporaries near ``block_bytes``, see :data:`EVAL_BLOCK_BYTES`): memory does not
    grow with the number of steps or trajectories, and the numbers equal those of one block up to rounding (the
    order of the sums; in float32, products in a batch of another size may round differently)."""
    sums, _ = _filter(model, trajectories, chunk=chunk, device=device, keep_outputs=False,
                      block_bytes=block_bytes)
    return sums.result()


@torch.no_grad()
def predict(model: SequenceModel, trajectories: Sequence[np.ndarray], *, chunk: int = 2048,
            device: torch.device | None = None, block_bytes: int = EVAL_BLOCK_BYTES,
            reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> list[np.ndarray]:
    """One-step predictions per trajectory: row t is the output after consuming o_t (a prediction of o_{t+1});
    logits for discrete data. The returned arrays are the caller's size (steps x output_dim each); the filtering
    runs in blocks as :func:`evaluate`'s does.

    ``reduce``: keep ``reduce(outputs, targets)`` per block instead of the outputs, so that what is kept need not
    be steps x vocabulary (e.g. ``lambda out, y: out.argmax(-1)``): ``outputs`` is a block (steps, batch,
    output_dim), ``targets`` the observations that followed (steps, batch[, m]; 0 after a trajectory's last
    step, which has none), and the result must have the block's (steps, batch) as its first two dimensions."""
    _, outputs = _filter(model, trajectories, chunk=chunk, device=device, keep_outputs=True,
                         block_bytes=block_bytes, reduce=reduce)
    return outputs


@torch.no_grad()
def evaluate_and_predict(model: SequenceModel, trajectories: Sequence[np.ndarray], *, chunk: int = 2048,
                         device: torch.device | None = None, block_bytes: int = EVAL_BLOCK_BYTES,
                         reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                         ) -> tuple[dict[str, float], list[np.ndarray]]:
    """:func:`evaluate` and :func:`predict` from one filtering pass (``reduce`` as for :func:`predict`)."""
    sums, outputs = _filter(model, trajectories, chunk=chunk, device=device, keep_outputs=True,
                            block_bytes=block_bytes, reduce=reduce)
    return sums.result(), outputs


def check_scorable(name: str, trajectories: Sequence[np.ndarray]) -> None:
    """Refuse a split without a one-step prediction to score: empty, or every trajectory a single step (a
    prediction of o_{t+1} is scored against the next observation, which a one-step trajectory lacks). Its
    metrics would be NaN, which training would report as a diverged model, far from the cause."""
    if len(trajectories) == 0:
        raise ValueError(f"{name}: empty; expected a list of trajectories, at least one")
    which = unscorable([len(t) for t in trajectories])
    if which:
        raise ValueError(f"{name}: {which} a single step, so there is no one-step prediction to score; expected "
                         "trajectories of at least 2 steps (each prediction is scored against the next observation)")


def eval_block(n_trajectories: int, output_dim: int, itemsize: int, chunk: int, block_bytes: int
               ) -> tuple[int, int]:
    """(trajectories, steps) of one evaluation block: as many trajectories as fit ``block_bytes`` for one step
    (at least one), then as many steps as fit for them, at most ``chunk`` (``chunk <= 0``: no limit), at least
    one. A step of one trajectory costs about ``output_dim`` x (2 x ``itemsize`` + 16) bytes
    (:data:`EVAL_BLOCK_BYTES`)."""
    row = max(1, output_dim * (2 * itemsize + 16))
    group = max(1, min(n_trajectories, block_bytes // row))
    steps = max(1, block_bytes // (group * row))
    return group, steps if chunk <= 0 else min(chunk, steps)


def _filter(model: SequenceModel, trajectories: Sequence[np.ndarray], *, chunk: int, device, keep_outputs: bool,
            block_bytes: int, reduce=None):
    with flush_denormal():
        return _filter_streams(model, trajectories, chunk=chunk, device=device, keep_outputs=keep_outputs,
                               block_bytes=block_bytes, reduce=reduce)


def _filter_streams(model: SequenceModel, trajectories: Sequence[np.ndarray], *, chunk: int, device,
                    keep_outputs: bool, block_bytes: int, reduce=None):
    """Filter ``trajectories`` in blocks (:func:`eval_block`): consecutive groups of trajectories, one stream
    each, every group filtered from the initial state to the end of its longest trajectory with the state
    carried from one block of steps to the next. Each trajectory is filtered alone in its stream, so grouping
    and blocking change no trajectory's outputs beyond rounding (float64: ~1e-16; float32 products in a batch of
    another size may round differently) and the metrics only by the order of their sums."""
    if len(trajectories) == 0:
        raise ValueError("trajectories: empty; expected a list of trajectories, at least one")
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, (int, np.integer)) or block_bytes < 1:
        raise ValueError(f"block_bytes={brief(block_bytes)}: expected a positive integer (bytes)")
    param = next(model.parameters())
    device = device or param.device
    dtype = param.dtype
    discrete = model.config.discrete
    group, steps = eval_block(len(trajectories), model.config.output_dim, param.element_size(), chunk,
                              int(block_bytes))
    sums = MetricSums(discrete=discrete)
    outputs: list[Any] = [None] * len(trajectories) if keep_outputs else []
    was_training = model.training
    model.eval()
    try:
        for first in range(0, len(trajectories), group):
            part = trajectories[first:first + group]
            streams = make_streams(part, len(part), discrete=discrete, dtype=dtype).to(device, dtype)
            state = model.init_state(streams.batch_size)
            for start, (x, y, mask, reset) in zip(range(0, streams.length, steps), streams.windows(steps)):
                out, state = model(x, state, reset)
                sums.add(out, y, mask)
                if keep_outputs:
                    kept = (out if reduce is None else reduce(out, y)).cpu().numpy()
                    _scatter(kept, start, part, streams.positions, outputs, first)
    finally:
        model.train(was_training)
    return sums, outputs


def _scatter(block: np.ndarray, start: int, part: Sequence[np.ndarray], positions: list[tuple[int, int]],
             outputs: list[Any], first: int) -> None:
    """Copy the rows of ``block`` (steps ``start`` … of every stream) into the per-trajectory arrays
    ``outputs[first + k]`` (made at the first block that reaches trajectory k), so that no padded table of all
    steps is ever held."""
    end = start + len(block)
    for k, (traj, (b, pos)) in enumerate(zip(part, positions)):
        lo, hi = max(pos, start), min(pos + len(traj), end)
        if lo >= hi:
            continue
        if outputs[first + k] is None:
            outputs[first + k] = np.empty((len(traj), *block.shape[2:]), dtype=block.dtype)
        outputs[first + k][lo - pos:hi - pos] = block[lo - start:hi - start, b]


def _make_optimizer(model: SequenceModel, cfg: TrainConfig):
    """torch.optim's SGD / Adam updates from :mod:`pipeline.optim` (same numbers, without importing torch._dynamo)."""
    from pipeline.optim import SGD, Adam

    if cfg.optimizer == "adam":
        return Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


@dataclass
class FitResult:
    history: list[dict[str, Any]]
    best_metric: float
    best_epoch: int
    stopped_early: str | None = None


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    from pipeline.io import atomic_path

    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`fit` (plain tensors and dicts only: ``weights_only=True``).

    A file that is not one (truncated, overwritten, or holding pickled objects) raises a one-line ValueError.
    torch's own message is left out on purpose: it advises retrying with ``weights_only=False``, which would
    execute whatever the file's pickle contains."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    try:
        ck = torch.load(path, map_location=map_location, weights_only=True)
    except Exception:
        ck = None
    if not isinstance(ck, dict):
        raise ValueError(f"{path}: not a readable checkpoint; delete it and rerun refine to write it again")
    return ck


# Train-config keys a resumed run may change: more epochs extend training; the device moves it (the numbers then
# follow that device's arithmetic); eval_train only adds or drops the train evaluation; max_loss only moves the
# divergence threshold (raising it is how to resume a run stopped by it).
RESUMABLE_CHANGES = frozenset({"epochs", "device", "eval_train", "max_loss"})


def check_resumable(checkpoint_path: str | os.PathLike, ck: dict[str, Any], model_config: dict[str, Any],
                    train_config: dict[str, Any]) -> None:
    """Raise a one-line ValueError naming the keys in which checkpoint and run differ (except
    :data:`RESUMABLE_CHANGES`): resuming them would silently continue another run."""
    differing = []
    # a key a checkpoint lacks was added to TrainConfig after it was written: it trained with the default
    train_defaults = asdict(TrainConfig())
    for section, theirs, ours, free in (("model", ck.get("model_config"), model_config, frozenset()),
                                        ("train", ck.get("train_config"), train_config, RESUMABLE_CHANGES)):
        if not isinstance(theirs, dict):
            differing.append(f"{section} config missing")
            continue
        if section == "train":
            theirs = {**{k: v for k, v in train_defaults.items() if k in ours}, **theirs}
        for key in sorted(set(theirs) | set(ours)):
            if key in free:
                continue
            if key not in theirs or key not in ours or theirs[key] != ours[key]:
                differing.append(f"{section}.{key} ({theirs.get(key, '<absent>')!r} in the checkpoint, "
                                 f"{ours.get(key, '<absent>')!r} now)")
    if differing:
        raise ValueError(f"{checkpoint_path}: checkpoint of another configuration, not resumed: "
                         f"{'; '.join(differing)}. Delete it, or fit with resume=False to start over")


def _split_monitored_by(train_config: dict[str, Any], has_valid: bool) -> str | None:
    """The split a checkpoint's train config monitored (None where it cannot tell)."""
    try:
        return TrainConfig(monitor=train_config.get("monitor", "auto"),
                           eval_train=train_config.get("eval_train", TrainConfig.eval_train)
                           ).monitored_split(has_valid)
    except (TypeError, ValueError):
        return None


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "numpy_pos": int(np_state[2]), "python": repr(random.getstate())}


def _set_rng_state(state: dict[str, Any]) -> None:
    import ast

    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))
    py = ast.literal_eval(state["python"])
    random.setstate((py[0], tuple(py[1]), py[2]))


def _epoch_line(entry: dict[str, Any]) -> str:
    """An epoch's history entry for the log: each split's metrics, the learning rate and the time taken."""
    parts = [f"{split} " + ", ".join(f"{k} {v:.4g}" for k, v in entry[split].items() if isinstance(v, (int, float)))
             for split in ("train", "valid", "test") if isinstance(entry.get(split), dict)]
    if "lr" in entry:
        parts.append(f"lr {entry['lr']:.4g}")
    if "seconds" in entry:
        parts.append(f"{entry['seconds']:.1f} s")
    return "; ".join(parts)


def fit(
    model: SequenceModel,
    train: Sequence[np.ndarray],
    test: Sequence[np.ndarray],
    cfg: TrainConfig,
    *,
    valid: Sequence[np.ndarray] | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    resume: bool = True,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
) -> FitResult:
    """Refine ``model`` by BPTT on ``train``; evaluate on ``train``/``valid``/``test`` after every epoch.

    Each epoch is scored on the split :meth:`TrainConfig.monitored_split` names (``monitor: auto``: ``valid``
    when given, else ``train``; the test curves the paper reports stay held out): the best epoch, and with
    ``lr_decay`` / ``patience`` / ``restore_best`` the schedule, go by that score.

    Every split must have a step to score (:func:`check_scorable`): one whose trajectories are all a single step
    is refused up front, naming it, instead of being scored NaN every epoch (and the NaN test score of epoch 0
    reported as unusable weights).
    """
    cfg.validate()
    check_scorable("train", train)
    if valid:
        check_scorable("valid", valid)
    check_scorable("test", test)
    # Products of small gradients through long recurrences reach subnormal floats, which run ~20x slower on CPU.
    with flush_denormal():
        return _fit(model, train, test, cfg, valid=valid, checkpoint_path=checkpoint_path, resume=resume,
                    on_epoch=on_epoch)


def _fit(model: SequenceModel, train: Sequence[np.ndarray], test: Sequence[np.ndarray], cfg: TrainConfig, *,
         valid: Sequence[np.ndarray] | None, checkpoint_path: str | os.PathLike | None, resume: bool,
         on_epoch: Callable[[dict[str, Any]], None] | None) -> FitResult:
    device = resolve_device(cfg.device)
    model.to(device)
    discrete = model.config.discrete
    dtype = next(model.parameters()).dtype
    metric = primary_metric(discrete)
    select_on = cfg.monitored_split(bool(valid))
    if select_on == "test" and cfg.scheduled and test is not train:   # fit_model(test=None) scores train as test
        log.warning("train.monitor: the test split drives the learning-rate decay, early stopping or "
                    "restore_best; the test metrics are then not held out")
    optimizer = _make_optimizer(model, cfg)
    history: list[dict[str, Any]] = []
    best_metric, best_epoch, start_epoch = math.inf, 0, 1
    best_state: dict[str, torch.Tensor] | None = None
    stopped: str | None = None

    if checkpoint_path is not None and resume and Path(checkpoint_path).exists():
        # read to the CPU: the RNG states must stay CPU tensors (torch.set_rng_state refuses a CUDA one), and
        # load_state_dict copies the weights and the optimiser state onto the model's device anyway
        ck = load_checkpoint(checkpoint_path)
        check_resumable(checkpoint_path, ck, model.config.to_dict(), asdict(cfg))
        if ck["epoch"] > cfg.epochs:   # it holds its last epoch only: "resuming" would return the longer run
            raise ValueError(f"{checkpoint_path}: trained to epoch {ck['epoch']}, beyond train.epochs={cfg.epochs}; "
                             f"not resumed: expected train.epochs >= {ck['epoch']}, or resume=False to start over")
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        history = list(ck["history"])
        best_metric, best_epoch = ck["best_metric"], ck["best_epoch"]
        best_state = ck.get("best_model")
        stopped = ck.get("stopped_early")
        written = ck.get("train_config") or {}
        if "monitor" not in written or _split_monitored_by(written, bool(valid)) != select_on:
            # written before `monitor` existed, when data without a valid split picked the best epoch on test, or
            # with another eval_train (a resumable change) that moved monitor "auto" between train and test: the
            # best on today's split, from the scores in the history (the weights only where it is the same epoch)
            scores = [(e[select_on][metric], e["epoch"]) for e in history
                      if isinstance(e.get(select_on), dict) and math.isfinite(e[select_on][metric])]
            if scores:
                best_metric, best_epoch = min(scores, key=lambda t: t[0])
            else:   # the split now watched was never scored: its watch starts after the checkpoint's epochs
                best_metric, best_epoch = math.inf, ck["epoch"]
            if best_epoch == ck["epoch"]:     # the checkpoint's own weights
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            elif best_epoch != ck["best_epoch"]:
                best_state = None
            if cfg.restore_best and (best_state is None or not scores):
                # restore_best would silently return the last epoch's weights under another epoch's name
                if "monitor" not in written:
                    why = (f"it predates train.monitor and chose its best epoch on test, while {select_on} is "
                           "watched now")
                else:
                    why = (f"train.eval_train={cfg.eval_train} (it was trained with "
                           f"{written.get('eval_train')!r}) moves the monitored split to {select_on}")
                kept = (f"whose best epoch ({best_epoch}) it kept no weights of" if scores else
                        "on which none of its epochs was scored")
                raise ValueError(f"{checkpoint_path}: not resumed under train.restore_best: {why}, {kept}; expected "
                                 "the train settings it was trained with, or delete it, or fit with resume=False to "
                                 "start over")
        start_epoch = ck["epoch"] + 1
        _set_rng_state(ck["rng"])
        log.info("resumed from %s at epoch %d", checkpoint_path, ck["epoch"])
    else:
        seed_everything(cfg.seed)

    def run_eval(epoch: int, seconds: float) -> dict[str, Any]:
        entry: dict[str, Any] = {"epoch": epoch, "seconds": seconds}
        if cfg.eval_train:
            entry["train"] = evaluate(model, train, device=device)
        if valid:
            entry["valid"] = evaluate(model, valid, device=device)
        entry["test"] = evaluate(model, test, device=device)
        return entry

    def checkpoint(epoch: int) -> None:
        if checkpoint_path is None:
            return
        save_checkpoint(checkpoint_path, {
            "model": model.state_dict(), "optimizer": plain_values(optimizer.state_dict(), "optimizer state"),
            # numpy scalars (lr=np.float64(0.5)) as Python numbers: weights_only=True refuses them on loading
            "model_config": plain_values(model.config.to_dict(), "model config"),
            "train_config": plain_values(asdict(cfg), "train config"), "epoch": epoch,
            "best_metric": best_metric, "best_epoch": best_epoch, "best_model": best_state,
            "stopped_early": stopped, "history": plain_values(history, "history"), "rng": _rng_state(),
        })

    def consider(entry: dict[str, Any]) -> bool:
        """Keep the epoch if it is the best so far; whether it is."""
        nonlocal best_metric, best_epoch, best_state
        value = entry[select_on][metric]
        if math.isfinite(value) and value < best_metric - cfg.min_delta:
            best_metric, best_epoch = value, entry["epoch"]
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return True
        return False

    if not history:
        entry = run_eval(0, 0.0)
        if not math.isfinite(entry["test"][metric]):   # SGD cannot repair it, and "lower the lr" would mislead
            raise TrainingDiverged(f"the initial model (epoch 0, before any update) gives a test {metric} of "
                                   f"{entry['test'][metric]}: its weights are not usable; check the settings that "
                                   "build them (model.*_bias_scale, two_stage, kf) and the data")
        history.append(entry)
        consider(entry)
        checkpoint(0)
        if on_epoch:
            on_epoch(entry)

    single = len(train) == 1
    for epoch in range(start_epoch, cfg.epochs + 1):
        if stopped:   # a run stopped early stays stopped, also when train.epochs is raised
            break
        lr = float(optimizer.param_groups[0]["lr"])
        t0 = time.perf_counter()
        order = None
        if cfg.shuffle and not single:
            order = np.random.default_rng([cfg.seed, epoch]).permutation(len(train))
        # one trajectory: cut into batch_size pieces of a window of targets or more (bptt + 1 steps), kept whole
        # for whole-sequence BPTT
        on_cpu = make_streams(train, cfg.batch_size, discrete=discrete, order=order, dtype=dtype,
                              min_piece=cfg.bptt + 1 if cfg.bptt > 0 else None)
        # which windows have a target, and which have nothing but, read on the CPU: a test of the device's mask
        # (or indexing by it) would wait for the device
        scored, full = zip(*[(bool(w[2].any()), bool(w[2].all())) for w in on_cpu.windows(cfg.bptt)]) \
            if on_cpu.length else ((), ())
        streams = on_cpu.to(device, dtype)
        model.train()
        state = model.init_state(streams.batch_size)
        n_windows = math.ceil(streams.length / (streams.length if cfg.bptt <= 0 else cfg.bptt))
        bar = progress(streams.windows(cfg.bptt), total=n_windows, desc=f"epoch {epoch}")
        for step, (x, y, mask, reset) in enumerate(bar):
            if not scored[step]:
                continue
            state = detach_state(state)
            out, state = model(x, state, reset)
            loss = masked_loss(out, y, mask, discrete, full=full[step])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip > 0:
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            else:
                gnorm = torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters() if p.grad is not None))
            # the loss and the gradient norm in one copy to the host: on CUDA each copy waits for the device (there
            # were three: the loss's finiteness, its value, the norm's finiteness). Checked in the same order as
            # before and before the update, so a stop leaves the weights of the last good step.
            loss_value, gnorm_value = torch.stack([loss.detach().double(), gnorm.detach().double()]).tolist()
            if not math.isfinite(loss_value):
                raise TrainingDiverged(_diverged(epoch, step, "loss", loss_value, checkpoint_path, clip=cfg.clip,
                                             weight_decay=cfg.weight_decay))
            if loss_value > cfg.max_loss:
                raise TrainingDiverged(_diverged(
                    epoch, step, "loss", loss_value, checkpoint_path, clip=cfg.clip, weight_decay=cfg.weight_decay,
                    advice=f"above train.max_loss={cfg.max_loss:g}; if the data are not normalised the loss may "
                           "just be large: standardise them or raise train.max_loss"))
            if not math.isfinite(gnorm_value):
                raise TrainingDiverged(_diverged(epoch, step, "gradient norm", gnorm_value, checkpoint_path,
                                                 clip=cfg.clip, weight_decay=cfg.weight_decay))
            optimizer.step()
        if device.type == "cuda":   # the epoch's time includes the updates still queued on the device
            torch.cuda.synchronize(device)
        entry = run_eval(epoch, time.perf_counter() - t0)
        entry["lr"] = lr
        test_value = entry["test"][metric]
        if not math.isfinite(test_value):
            raise TrainingDiverged(_diverged(epoch, None, f"test {metric}", test_value, checkpoint_path,
                                             clip=cfg.clip, weight_decay=cfg.weight_decay))
        history.append(entry)
        if not consider(entry):
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * cfg.lr_decay
            if cfg.patience and epoch - best_epoch >= cfg.patience:
                by = f" by more than {cfg.min_delta:g}" if cfg.min_delta else ""
                stopped = (f"{select_on} {metric} did not improve{by} for {cfg.patience} epochs (best "
                           f"{best_metric:.6g} at epoch {best_epoch}); stopped after epoch {epoch}")
        checkpoint(epoch)
        if on_epoch:
            on_epoch(entry)
        log.info("epoch %d: %s", epoch, _epoch_line(entry))
        if stopped:
            log.info("early stop: %s", stopped)
    if cfg.restore_best and best_state is not None:
        model.load_state_dict(best_state)
    return FitResult(history=history, best_metric=best_metric, best_epoch=best_epoch, stopped_early=stopped)


def _keeps_best(ck: dict[str, Any]) -> bool:
    return bool((ck.get("train_config") or {}).get("restore_best")) and ck.get("best_model") is not None


def trained_weights(ck: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights a checkpoint of :func:`fit` gives as the trained model: its last epoch's, or with
    ``restore_best`` its best epoch's (the last epoch's stay in ``model``, from which training resumes)."""
    return ck["best_model"] if _keeps_best(ck) else ck["model"]


def trained_epoch(ck: dict[str, Any]) -> int:
    """The epoch of :func:`trained_weights`."""
    return int(ck["best_epoch"] if _keeps_best(ck) else ck["epoch"])


#: the train settings the messages of :func:`_diverged` name (as ``train.<key>``), which the Python API and refine
#: rewrite in their own terms
DIVERGENCE_KEYS = ("lr", "clip", "max_loss", "weight_decay")


def _diverged(epoch: int, step: int, what: str, value: float, checkpoint_path, *, clip: float,
              weight_decay: float = 0.0, advice: str | None = None) -> str:
    """The one-line message of a stop, ending in the remedy; with clipping off, lowering train.clip is none; with
    weight decay on, lowering it is one (it is added after clipping, so clipping does not bound it).
    ``advice``: what to try first, before the remedy."""
    kept = f"; the last good checkpoint {checkpoint_path} is kept" if checkpoint_path else ""
    remedy = ("lower train.lr or train.clip" if clip > 0 else
              "lower train.lr or turn gradient-norm clipping on (train.clip > 0, e.g. 0.25)")
    if weight_decay > 0:
        remedy += " or train.weight_decay (not bounded by clipping)"
    # step None: the epoch's evaluation, after its last update (steps count from 0: n_windows named none)
    where = f"epoch {epoch}, step {step}" if step is not None else f"the end of epoch {epoch}, after its last update"
    if advice is not None:
        return f"training stopped at {where}: {what} is {value:g}, {advice}, else {remedy}{kept}."
    return f"training diverged at {where}: {what} is {value}{kept}. {remedy[0].upper()}{remedy[1:]}."
