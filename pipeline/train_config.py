"""Training hyperparameters, importable without torch (params validation must not pay torch's import)."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from pipeline.messages import brief


MONITORS = ("auto", "valid", "train", "test")
#: the device names training and inference accept (``pipeline.train.resolve_device`` maps them to torch devices)
DEVICE = re.compile(r"auto|cpu|cuda(?::[0-9]+)?", re.ASCII)
#: seeds are in [0, 2³²): numpy, torch and gymnasium all take them
SEED_LIMIT = 2 ** 32


def check_seed(seed: object, option: str = "seed=") -> None:
    """A seed: an integer in [0, 2³²) (``SEED_LIMIT``), not a bool, a float or text; ``option`` names it in the
    error (:func:`option_value`)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{option_value(option, seed)}: expected an integer with 0 <= seed < 2**32")


def option_value(option: str, value: object) -> str:
    """How an error names an option and its value: ``--steps 0`` (command line) or ``steps=0`` (Python, params)."""
    if option.endswith("="):
        return f"{option}{brief(value)}"
    if isinstance(value, str):   # as typed on the command line: unquoted
        return f"{option} {value if len(value) <= 80 else value[:77] + '...'}"
    return f"{option} {brief(int(value) if isinstance(value, numbers.Integral) else value)}"


@dataclass
class TrainConfig:
    epochs: int = 10
    lr: float = 1.0
    optimizer: str = "sgd"        # "sgd" or "adam"
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip: float = 0.25            # max gradient 2-norm (0 = no clipping)
    bptt: int = 35                # truncated-BPTT horizon; 0 = whole sequence
    batch_size: int = 20          # parallel streams
    shuffle: bool = True          # reorder trajectories every epoch (seeded); a single trajectory is never shuffled
    device: str = "auto"          # "auto" (CUDA when present), "cpu", "cuda", "cuda:1", ...
    seed: int = 0
    eval_train: bool = True       # also evaluate on the training set after every epoch
    max_loss: float = 1e6         # a training loss above this counts as exploded
    # The schedule (all off by default: the paper trains at a fixed rate for a fixed number of epochs). Each
    # epoch is scored on the `monitor` split; an epoch "improves" when its primary metric (BPC or MSE) is below
    # the best so far by more than `min_delta`, epoch 0 (the initialisation) included.
    monitor: str = "auto"         # "auto" (valid when the data have it, else train), "valid", "train", "test"
    lr_decay: float = 1.0         # lr x this after every epoch that does not improve (0.25: word_language_model)
    patience: int = 0             # stop after this many epochs in a row without improvement; 0 = never stop
    restore_best: bool = False    # the trained model is the best epoch's weights, not the last epoch's
    min_delta: float = 0.0        # an improvement smaller than this (bits / MSE units) counts as none

    def validate(self) -> None:
        if self.epochs < 0:
            raise ValueError(f"train.epochs: expected >= 0, got {self.epochs}")
        if not self.lr > 0:
            raise ValueError(f"train.lr: expected > 0, got {self.lr}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"train.optimizer: expected 'sgd' or 'adam', got {self.optimizer!r}")
        if self.bptt < 0:
            raise ValueError(f"train.bptt: expected >= 0 (0 = whole sequence), got {self.bptt}")
        if self.batch_size < 1:
            raise ValueError(f"train.batch_size: expected >= 1, got {self.batch_size}")
        if self.clip < 0:
            raise ValueError(f"train.clip: expected >= 0, got {self.clip}")
        if self.monitor not in MONITORS:
            raise ValueError(f"train.monitor: expected one of {list(MONITORS)}, got {brief(self.monitor)}")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"train.lr_decay: expected a factor in (0, 1] (1 = a fixed learning rate), got "
                             f"{self.lr_decay}")
        if not (self.min_delta >= 0 and math.isfinite(self.min_delta)):
            raise ValueError(f"train.min_delta: expected a finite number >= 0 (in the monitored metric's units), "
                             f"got {self.min_delta}")
        if self.patience < 0:
            raise ValueError(f"train.patience: expected >= 0 (0 = never stop early), got {self.patience}")
        if self.monitor == "train" and not self.eval_train:
            raise ValueError("train.monitor: 'train' needs eval_train: true (the train split is scored only then)")
        # SGD adds weight_decay * w to the gradient: alone, a step scales w by 1 - lr * weight_decay (the heavy
        # ball's momentum widens the stable range to 2 (1 + momentum)); beyond it the weights grow without bound,
        # and clipping, applied before the decay, does not stop them
        bound = 2 * (1 + self.momentum)
        if self.optimizer == "sgd" and self.weight_decay > 0 and self.lr * self.weight_decay >= bound:
            raise ValueError(f"train.weight_decay: {self.weight_decay:g} x lr {self.lr:g} = "
                             f"{self.lr * self.weight_decay:g} is at or above 2 x (1 + momentum) = {bound:g}, where "
                             "every SGD step scales the weights by a factor of magnitude 1 or more and they grow "
                             f"without bound; expected lr x weight_decay below {bound:g} (weight decay is usually "
                             "1e-5 to 1e-3)")

    def monitored_split(self, has_valid: bool) -> str:
        """The split that scores epochs: ``monitor``, with "auto" resolved (valid, else train, else test)."""
        if self.monitor == "auto":
            return "valid" if has_valid else ("train" if self.eval_train else "test")
        if self.monitor == "valid" and not has_valid:
            raise ValueError("train.monitor: 'valid', but the data have no validation split; expected 'auto', "
                             "'train' or 'test'")
        return self.monitor

    @property
    def schedule_keys(self) -> list[str]:
        """The schedule keys set away from their defaults, through which the monitored metric changes training
        (lr decay, early stopping) or the model kept."""
        return [k for k, on in (("lr_decay", self.lr_decay != 1), ("patience", self.patience > 0),
                                ("restore_best", self.restore_best)) if on]

    @property
    def scheduled(self) -> bool:
        """Whether the monitored metric changes training or the model kept (any of :attr:`schedule_keys`)."""
        return bool(self.schedule_keys)
