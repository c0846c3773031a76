"""Training hyperparameters, importable without torch (params validation must not pay torch's import)."""

from __future__ import annotations

from dataclasses import dataclass


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
