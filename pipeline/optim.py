"""SGD and Adam with the update rules of ``torch.optim.SGD`` / ``torch.optim.Adam``, without ``torch.optim``.

Why not ``torch.optim``: every method of ``torch.optim.Optimizer`` (``zero_grad``, ``state_dict``,
``add_param_group``…) is wrapped by ``torch._disable_dynamo``, whose first call imports ``torch._dynamo`` and with
it sympy and the compiler stack: 2–3 s of CPU in every process that builds an optimiser. The pipeline trains one
model per DVC stage, i.e. one process each, and on the small datasets that import took as long as the training.
The arithmetic below is torch's single-tensor path, op for op (tests compare the parameters after several steps
with ``torch.optim``'s, and load its state dicts), and ``state_dict`` has torch's layout, so checkpoints written
with either resume with the other.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


class _Optimizer:
    defaults: dict[str, Any]

    def __init__(self, params: Iterable[torch.nn.Parameter], defaults: dict[str, Any]):
        params = [p for p in params]
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        self.defaults = dict(defaults)
        self.param_groups = [{**self.defaults, "params": params}]
        self.state: dict[torch.Tensor, dict[str, Any]] = {}

    def _params(self):
        for group in self.param_groups:
            for p in group["params"]:
                yield group, p

    def _gradients(self):
        """(group, parameter, gradient) for every parameter with a gradient, the gradient with the group's L2
        weight decay added (g = ∇ + weight_decay·p, as both torch optimisers do first)."""
        for group, p in self._params():
            if p.grad is None:
                continue
            grad = p.grad
            if group["weight_decay"] != 0:
                grad = grad.add(p, alpha=group["weight_decay"])
            yield group, p, grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self._params():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim.Optimizer.state_dict``'s layout: parameters replaced by their index in the groups."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(own["params"]) for g, own in zip(groups, self.param_groups)):
            raise ValueError("optimizer state dict does not match the model's parameter groups")
        by_index = {}
        for saved, own in zip(groups, self.param_groups):
            for i, p in zip(saved["params"], own["params"]):
                by_index[i] = p
            own.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {}
        for i, s in state_dict["state"].items():
            p = by_index[int(i)]
            # copies, as torch does: a loaded state must not alias the tensors of the dict it came from
            self.state[p] = {k: (v.detach().clone() if k == "step" else
                                 v.detach().to(device=p.device, dtype=p.dtype, copy=True))
                             if isinstance(v, torch.Tensor) else v for k, v in s.items()}


class SGD(_Optimizer):
    """p ← p − lr·g, with g = ∇ + weight_decay·p and, when momentum > 0, g ← buf = momentum·buf + g
    (dampening 0, no Nesterov: ``torch.optim.SGD``'s defaults)."""

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": 0.0, "weight_decay": weight_decay,
                                  "nesterov": False, "maximize": False, "foreach": None,
                                  "differentiable": False, "fused": None})

    @torch.no_grad()
    def step(self) -> None:
        for group, p, grad in self._gradients():
            if group["momentum"] != 0:
                state = self.state.setdefault(p, {})
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = torch.clone(grad).detach()
                else:
                    buf.mul_(group["momentum"]).add_(grad, alpha=1 - group["dampening"])
                grad = buf
            p.add_(grad, alpha=-group["lr"])


class Adam(_Optimizer):
    """Adam (Kingma & Ba) as ``torch.optim.Adam`` with amsgrad off: m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g²,
    p ← p − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε), with g = ∇ + weight_decay·p (L2, not decoupled)."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                                  "differentiable": False, "fused": None, "decoupled_weight_decay": False})

    @torch.no_grad()
    def step(self) -> None:
        for group, p, grad in self._gradients():
            beta1, beta2 = group["betas"]
            state = self.state.setdefault(p, {})
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = state["step"].item()
            bias_correction1 = 1 - beta1 ** step
            bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
            p.addcdiv_(exp_avg, denom, value=-group["lr"] / bias_correction1)
