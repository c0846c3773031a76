"""RNN, GRU and LSTM baselines in the same encoder → recurrent → decoder shape as the PSRNN (Sec. 6).

Weights are Xavier-initialised and biases zero, as in the paper. The recurrent part is ``torch.nn.RNN/GRU/LSTM``
(cuDNN / MKL kernels). A window containing trajectory resets is run in segments between reset steps.

On the CPU the GRU and RNN loops run in :mod:`pipeline.native` instead, forward and backward: torch's CPU GRU
and Elman RNN step through ATen ops at 30–140k steps/s for hidden size 20 and train through the autograd of
~10 ops per step (its LSTM is a fused oneDNN loop, as fast as ours), and every epoch filters the 124k-character
PTB test sequence as one chain. The input projections and the weight gradients stay torch products; tests hold
outputs and gradients to ``torch.nn.GRU`` / ``torch.nn.RNN``'s.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from pipeline import native
from pipeline.models.common import ModelConfig, SequenceModel, apply_reset

_MODULES = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


class RecurrentBaseline(SequenceModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        c = config
        if c.model not in _MODULES:
            raise ValueError(f"RecurrentBaseline supports {tuple(_MODULES)}, got {c.model!r}")
        self.encoder: nn.Module = nn.Embedding(c.input_dim, c.obs_dim) if c.discrete else nn.Linear(c.input_dim,
                                                                                                     c.obs_dim)
        kwargs = {"nonlinearity": "tanh"} if c.model == "rnn" else {}
        self.rnn = _MODULES[c.model](c.obs_dim, c.state_dim, num_layers=c.n_layers, **kwargs)
        self.decoder = nn.Linear(c.state_dim, c.output_dim)
        self.is_lstm = c.model == "lstm"

    def xavier_init(self, seed: int) -> "RecurrentBaseline":
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    nn.init.xavier_uniform_(p, generator=g)
                else:
                    p.zero_()
        return self

    def init_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        p = next(self.parameters())
        h = torch.zeros(batch_size, self.config.n_layers, self.config.state_dim, dtype=p.dtype, device=p.device)
        return (h, h.clone()) if self.is_lstm else (h,)

    def _run(self, e: torch.Tensor, state: Sequence[torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        hx = tuple(s.transpose(0, 1).contiguous() for s in state)  # (layers, B, d)
        out, new = self.rnn(e, hx if self.is_lstm else hx[0])
        new_t = new if self.is_lstm else (new,)
        return out, tuple(s.transpose(0, 1) for s in new_t)

    def forward(self, x: torch.Tensor, state: Sequence[torch.Tensor], reset: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        e = self.encoder(x)
        # under CPU autocast the gate inputs' product comes out in bfloat16, which the C loop does not take
        if (not self.is_lstm and not torch.is_autocast_enabled("cpu")
                and native.usable(e, *state, *self.rnn.parameters())):
            out, state = self._native_forward(e, state, reset)
            return self.emit(out, x), state
        L = e.shape[0]
        cuts = [] if reset is None else torch.nonzero(reset.any(1)).flatten().tolist()
        bounds = sorted(set([0, *cuts, L]))
        outs = []
        state = tuple(state)
        for start, stop in zip(bounds[:-1], bounds[1:]):
            if reset is not None and start in cuts:
                zero = torch.zeros_like(state[0][0])
                state = tuple(apply_reset(s, zero, reset[start]) for s in state)
            out, state = self._run(e[start:stop], state)
            outs.append(out)
        return self.emit(self.decoder(torch.cat(outs, 0)), x), state

    def _native_forward(self, e: torch.Tensor, state: Sequence[torch.Tensor], reset: torch.Tensor | None
                        ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Layer by layer through :func:`pipeline.native.rnn_layer_forward`, with :class:`_NativeRecurrentLayer`'s
        backward when a gradient is wanted."""
        L, B = e.shape[:2]
        inp = e
        hs = []
        for layer in range(self.config.n_layers):
            w_ih, w_hh = getattr(self.rnn, f"weight_ih_l{layer}"), getattr(self.rnn, f"weight_hh_l{layer}")
            b_ih, b_hh = getattr(self.rnn, f"bias_ih_l{layer}"), getattr(self.rnn, f"bias_hh_l{layer}")
            gi = torch.addmm(b_ih, inp.reshape(L * B, -1), w_ih.T).reshape(L, B, -1)
            h0 = state[0][:, layer]
            if torch.is_grad_enabled() and any(t.requires_grad for t in (gi, w_hh, b_hh, h0)):
                inp = _NativeRecurrentLayer.apply(self.config.model, gi, w_hh, b_hh, h0, reset)
                h = inp[-1]
            else:
                inp, h, _ = native.rnn_layer_forward(self.config.model, gi, w_hh, b_hh, h0, reset)
            hs.append(h)
        return self.decoder(inp), (torch.stack(hs, 1),)


class _NativeRecurrentLayer(torch.autograd.Function):
    """One GRU / RNN layer over a window in C, forward and backward: ``out = layer(gi, W_hh, b_hh, h0)`` with
    gi = x W_ihᵀ + b_ih formed (and differentiated) by torch. The backward's loop gives the gradients on gi, on
    gh_t = W_hh h_{t-1} + b_hh and on h0; dW_hh = Σ_t dgh_tᵀ h_{t-1} and db_hh = Σ_t dgh_t are one product each.
    A backward that must itself be differentiable (``create_graph=True``: a gradient penalty) recomputes the
    window with torch ops (:func:`_torch_layer`) and differentiates that instead: the C loop's gradients have no
    graph, and second-order gradients would silently lose their terms."""

    @staticmethod
    def forward(ctx, kind, gi, W_hh, b_hh, h0, reset):
        out, _, gates = native.rnn_layer_forward(kind, gi, W_hh, b_hh, h0, reset, keep_gates=True)
        ctx.kind = kind
        ctx.save_for_backward(gi, W_hh, b_hh, out, h0, gates, reset)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        gi, W_hh, b_hh, out, h0, gates, reset = ctx.saved_tensors
        wanted = ctx.needs_input_grad[1:5]
        if torch.is_grad_enabled():   # create_graph=True
            inputs = [t for t, w in zip((gi, W_hh, b_hh, h0), wanted) if w]
            with torch.enable_grad():
                found = iter(torch.autograd.grad(_torch_layer(ctx.kind, gi, W_hh, b_hh, h0, reset), inputs, grad_out,
                                                 create_graph=True, allow_unused=True))
            return None, *(next(found) if w else None for w in wanted), None
        grad_gi, grad_gh, grad_h0 = native.rnn_layer_backward(ctx.kind, W_hh, out, h0, gates, reset, grad_out)
        L, B, H = out.shape
        flat = grad_gh.reshape(L * B, -1)
        grad_W = None
        if wanted[1]:
            h_prev = torch.cat([h0.detach().unsqueeze(0), out[:-1]], 0)   # the state each step read
            if reset is not None:
                h_prev = h_prev.masked_fill(reset.unsqueeze(-1), 0.0)
            grad_W = flat.T @ h_prev.reshape(L * B, H)
        return None, grad_gi, grad_W, flat.sum(0) if wanted[2] else None, grad_h0, None


def _torch_layer(kind: str, gi: torch.Tensor, W_hh: torch.Tensor, b_hh: torch.Tensor, h0: torch.Tensor,
                 reset: torch.Tensor | None) -> torch.Tensor:
    """The layer of :class:`_NativeRecurrentLayer` in torch ops (torch.nn.GRU / RNN's equations): its outputs."""
    H = h0.shape[-1]
    h, outs = h0, []
    for t in range(gi.shape[0]):
        if reset is not None:
            h = h.masked_fill(reset[t].unsqueeze(-1), 0.0)
        gh = h @ W_hh.T + b_hh
        x = gi[t]
        if kind == "rnn":
            h = torch.tanh(x + gh)
        else:
            r = torch.sigmoid(x[:, :H] + gh[:, :H])
            z = torch.sigmoid(x[:, H:2 * H] + gh[:, H:2 * H])
            n = torch.tanh(x[:, 2 * H:] + r * gh[:, 2 * H:])
            h = (1 - z) * n + z * h
        outs.append(h)
    return torch.stack(outs)
