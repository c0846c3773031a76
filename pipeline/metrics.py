"""Metrics of one-step prediction (Sec. 6): bits per character and accuracy for discrete data, mean squared error
for continuous data. Accumulated as sums so that windows and batches of any size give the same number."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class MetricSums:
    discrete: bool
    loss_sum: float = 0.0     # nats (discrete) or squared error (continuous)
    correct: int = 0
    count: int = 0            # targets (discrete) or target elements (continuous)

    def add(self, outputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> None:
        with torch.no_grad():
            # a block whose every step is scored (all but a stream's last) is taken whole: the same elements in
            # the same order as the boolean indexing, without its copy
            if bool(mask.all()):
                out, tgt = outputs.flatten(0, mask.dim() - 1), targets.flatten(0, mask.dim() - 1)
            else:
                out, tgt = outputs[mask], targets[mask]
            if self.discrete:
                logp = torch.log_softmax(out.double(), dim=-1)
                self.loss_sum += float(-logp.gather(1, tgt[:, None]).sum())
                self.correct += int((logp.argmax(-1) == tgt).sum())
                self.count += int(tgt.numel())
            else:
                diff = (out - tgt).double()
                self.loss_sum += float((diff ** 2).sum())
                self.count += int(diff.numel())

    def result(self) -> dict[str, float]:
        if self.count == 0:
            return {"bpc": float("nan"), "accuracy": float("nan")} if self.discrete else {"mse": float("nan")}
        if self.discrete:
            return {"bpc": self.loss_sum / self.count / math.log(2), "accuracy": self.correct / self.count}
        return {"mse": self.loss_sum / self.count}


def masked_loss(outputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, discrete: bool,
                full: bool = False) -> torch.Tensor:
    """The training objective: mean cross-entropy in nats (discrete) or mean squared error (continuous) over the
    steps ``mask`` marks. ``full``: the caller knows every step is marked (most BPTT windows), and the outputs are
    taken whole: the same elements in the same order, so the same bits, without the boolean indexing that on CUDA
    waits for the device to count the marked steps."""
    out, tgt = (outputs.flatten(0, 1), targets.flatten(0, 1)) if full else (outputs[mask], targets[mask])
    if discrete:
        return torch.nn.functional.cross_entropy(out, tgt)
    return torch.mean((out - tgt) ** 2)


def primary_metric(discrete: bool) -> str:
    """The metric models are optimised and selected on: BPC or MSE (lower is better)."""
    return "bpc" if discrete else "mse"
