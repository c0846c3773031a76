"""PSRNN and factorized PSRNN (Sec. 4.1 and 4.3), with the encoder and decoder of the reference code.

One layer updates its state by Eq. (5):

    q_{t+1} = (W ×₂ o_t ×₃ q_t + b) / ‖W ×₂ o_t ×₃ q_t + b‖₂,

W having shape (d, d_o, d) — W[i, j, k]: output state i, observation j, input state k. The factorized layer uses
the CP form W = Σ_r a_r ⊗ b_r ⊗ c_r (Sec. 3.3): q_{t+1} ∝ Aᵀ(B o_t ⊙ C q_t) + b (Eq. 8), A and C of shape (r, d),
B of shape (r, d_o). Layers stack: the states of layer l are the observations of layer l+1 (Sec. 4.1). Each layer's
observation enters through an encoder, the RFF map followed by the 2SR projection, o_t = U_oᵀ ω(x_t):
an embedding table for discrete symbols (exactly U_oᵀ ω(e_v) per symbol) and a trainable RFF layer for continuous
inputs. A linear decoder maps the top state to logits (discrete) or to the predicted next observation; with
``decoder_input="all"`` (variants ``psrnn_<L>layer_skip``) it reads the states of every layer, concatenated — skip
connections to the output as in Graves (2013), so that a deeper model's 2SR start fits the training data at
least as well as a shallower one's (its decoder regression sees a superset of the states). With ``delta``
(variants ``<name>_delta``, continuous data) it predicts the change instead, ô_{t+1} = o_t + decoder(q_{t+1}),
its 2SR start regressing o_{t+1} - o_t on the states (a residual output, as in Martinez et al. 2017 for motion).

Both cores reduce, for a known input sequence, to a normalised linear recurrence q_{t+1} = n(G_t q_t + b) with
per-step matrices G_t = W ×₂ o_t (or Aᵀ diag(B o_t) C), which are computed for the whole window in one batched
contraction before the (cheap) sequential part.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from pipeline import native
from pipeline.models.common import ModelConfig, SequenceModel


class EmbeddingEncoder(nn.Module):
    """Discrete observations: the RFF-and-projection of a one-hot vector is a lookup table (V, d_o)."""

    def __init__(self, vocab_size: int, out_dim: int):
        super().__init__()
        self.table = nn.Embedding(vocab_size, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table(x)


class _Cosine(torch.autograd.Function):
    """cos(h), whose backward is autograd's own ``grad * -sin(h)`` computed in one buffer: the same kernels on the
    same operands (negation is exact, IEEE products commute), so the same bits, without the two more (steps,
    n_features) temporaries of autograd's CosBackward, whose page faults took a third of the training time of a
    2-layer PSRNN on PTB (its 2nd layer encodes 2000 features per step)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        return h.cos()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (h,) = ctx.saved_tensors
        return h.sin().neg_().mul_(grad)


class RFFEncoder(nn.Module):
    """Continuous observations: o = U_oᵀ sqrt(2/D) cos(Ωᵀx + β), with Ω, β and U_o all trainable."""

    def __init__(self, in_dim: int, n_features: int, out_dim: int):
        super().__init__()
        self.frequencies = nn.Parameter(torch.zeros(in_dim, n_features))
        self.offsets = nn.Parameter(torch.zeros(n_features))
        self.projection = nn.Parameter(torch.zeros(n_features, out_dim))
        self.scale = math.sqrt(2.0 / n_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The (steps, n_features) activations are the only large tensor: form it with one addmm, take the cosine
        # in place when no gradient needs it, and scale the small projection instead of it (half the memory
        # traffic of the plain expression; the 2nd layer of a 2-layer PSRNN filters 2000 features per step).
        flat = x.reshape(-1, x.shape[-1])
        h = torch.addmm(self.offsets, flat, self.frequencies)
        h = h.cos_() if not (torch.is_grad_enabled() and h.requires_grad) else _Cosine.apply(h)
        return (h @ (self.scale * self.projection)).reshape(*x.shape[:-1], self.projection.shape[1])


def normalized_recurrence(G: torch.Tensor, b: torch.Tensor, q: torch.Tensor, q_init: torch.Tensor,
                          reset: torch.Tensor | None = None, eps: float = 1e-12) -> torch.Tensor:
    """q_{t+1} = (G_t q_t + b)/‖G_t q_t + b‖ for t = 0 … L-1; returns the L new states, shape (L, B, d).

    ``reset[t, b]`` puts element b back to ``q_init`` before step t. A zero vector (possible only for
    degenerate parameters) is mapped to ``q_init`` instead of dividing by zero.

    On the CPU the loop runs in compiled C (:mod:`pipeline.native`) with a hand-written backward, on CUDA in
    Triton kernels (:mod:`pipeline.native.triton_kernels`), one launch each way (:class:`_CompiledRecurrence`):
    the recurrence is a chain of tiny products whose cost as torch ops is dispatch and launches, not arithmetic.
    Elsewhere (no C compiler, no triton, or a state larger than :data:`pipeline.native.GPU_MAX_DIM` on CUDA)
    :class:`_NormalizedRecurrence` runs the same backward as torch ops, and without gradients on the CPU the loop
    runs in numpy.
    """
    kernels = _compiled_kernels(G, b, q, q_init)
    if kernels is not None:
        if not torch.is_grad_enabled():
            return kernels.full_forward(G, b, q, q_init, reset, eps, store_inputs=False)[0]
        return _CompiledRecurrence.apply(kernels, G, b, q, q_init, reset, eps)
    if not torch.is_grad_enabled():
        if G.device.type == "cpu":
            return _normalized_recurrence_numpy(G, b, q, q_init, reset, eps)
        with torch.no_grad():
            return _recurrence_forward(G, b, q, q_init, reset, eps)[0]
    if reset is None:
        reset = torch.zeros(G.shape[:2], dtype=torch.bool, device=G.device)
    return _NormalizedRecurrence.apply(G, b, q, q_init, reset, eps)


def factorized_recurrence(A: torch.Tensor, u: torch.Tensor, C: torch.Tensor, b: torch.Tensor, q: torch.Tensor,
                          q_init: torch.Tensor, reset: torch.Tensor | None = None, eps: float = 1e-12,
                          symbols: torch.Tensor | None = None) -> torch.Tensor:
    """q_{t+1} = n(Aᵀ(u_t ⊙ C q_t) + b) with u_t = B o_t (Eq. 8), shape (L, B, d); resets as above.

    With ``symbols`` (L, B), u is a (V, r) table and u_t = u[symbols[t]] (discrete observations).
    The compiled path never forms the (L, B, d, d) step matrices G_t = Aᵀ diag(u_t) C: a step costs 2·r·d
    multiply-adds per chain, and the parameter gradients are two matrix products after the loop.
    """
    if native.usable(A, u, C, b, q, q_init):
        if not torch.is_grad_enabled():
            return native.factorized_forward(A, u, C, b, q, q_init, reset, eps, idx=symbols)[0]
        return _NativeFactorizedRecurrence.apply(A, u, C, b, q, q_init, reset, eps, symbols)
    if symbols is not None and native.gpu_usable(q.shape[-1], A, u, C, b, q, q_init):
        # on the GPU the (V, d, d) table of step matrices is one small einsum, indexed inside the kernel
        return symbol_recurrence(factorized_step_matrices(A, u.unsqueeze(0), C).squeeze(0), symbols, b, q, q_init,
                                 reset, eps)
    if symbols is not None:
        u = _take(u, symbols)
    return normalized_recurrence(factorized_step_matrices(A, u, C), b, q, q_init, reset, eps)


def _take(table: torch.Tensor, symbols: torch.Tensor) -> torch.Tensor:
    """``table[symbols]`` with a deterministic backward: advanced indexing sums its gradient by a parallel
    scatter on the CPU, whose float32 sums came out in another order from run to run (index_select's do not)."""
    return table.index_select(0, symbols.reshape(-1)).reshape(*symbols.shape, *table.shape[1:])


def _torch_recurrence(G: torch.Tensor, b: torch.Tensor, q: torch.Tensor, q_init: torch.Tensor,
                      reset: torch.Tensor | None, eps: float, symbols: torch.Tensor | None = None) -> torch.Tensor:
    """The full cell in plain torch ops (G_t = G[symbols[t]] with ``symbols``), differentiable to any order: what
    the autograd functions below differentiate when their backward must itself be differentiable
    (``create_graph=True``, e.g. a gradient penalty). Their hand-written backwards have no graph: second-order
    gradients through them were silently wrong (torch path) or refused (C)."""
    if symbols is not None:
        G = _take(G, symbols)
    return _recurrence_forward_careful(G, b, q, q_init, reset, eps)[0]


def _differentiable_backward(needs: Sequence[bool], recompute, inputs: tuple, grad_out: torch.Tensor) -> list:
    """The gradients of ``recompute(*inputs)`` (the cell in torch ops) on the ``inputs`` that ``needs`` one, with a
    graph (None for the others)."""
    wanted = [x is not None and need for x, need in zip(inputs, needs)]
    with torch.enable_grad():
        found = iter(torch.autograd.grad(recompute(*inputs), [x for x, w in zip(inputs, wanted) if w], grad_out,
                                         create_graph=True, allow_unused=True))
    return [next(found) if w else None for w in wanted]


def factorized_step_matrices(A: torch.Tensor, u: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """G_t = Aᵀ diag(u_t) C, i.e. W ×₂ o_t with W = Σ_r a_r ⊗ b_r ⊗ c_r and u_t = B o_t.

    (L, B, r) -> (L, B, d, d)."""
    return torch.einsum("ri,lbr,rk->lbik", A, u, C)


def symbol_recurrence(G_table: torch.Tensor, symbols: torch.Tensor, b: torch.Tensor, q: torch.Tensor,
                      q_init: torch.Tensor, reset: torch.Tensor | None = None, eps: float = 1e-12) -> torch.Tensor:
    """:func:`normalized_recurrence` for discrete observations, with G_t = G_table[symbols[t]].

    An embedded symbol o_t = U_oᵀ ω(e_v) takes one of V values, so W ×₂ o_t is one of V matrices: forming the
    (V, d, d) table costs V·d_o·d² multiply-adds instead of L·B·d_o·d² for the per-step matrices, and its
    gradient is summed per symbol inside the compiled backward.
    """
    kernels = _compiled_kernels(G_table, b, q, q_init)
    if kernels is not None:
        if not torch.is_grad_enabled():
            return kernels.full_forward(G_table, b, q, q_init, reset, eps, idx=symbols, store_inputs=False)[0]
        return _CompiledRecurrence.apply(kernels, G_table, b, q, q_init, reset, eps, symbols)
    return normalized_recurrence(_take(G_table, symbols), b, q, q_init, reset, eps)


def _compiled_kernels(G: torch.Tensor, b: torch.Tensor, q: torch.Tensor, q_init: torch.Tensor):
    """The module whose ``full_forward`` / ``full_backward`` run the full cell's loop for these tensors:
    :mod:`pipeline.native` (C) on the CPU, :mod:`pipeline.native.triton_kernels` on CUDA; None: torch ops."""
    if native.usable(G, b, q, q_init):
        return native
    if native.gpu_usable(q.shape[-1], G, b, q, q_init):
        return native.gpu_kernels()
    return None


class _CompiledRecurrence(torch.autograd.Function):
    """:func:`normalized_recurrence` (or :func:`symbol_recurrence`, given ``symbols``) in compiled kernels: the
    backward of :class:`_NormalizedRecurrence`. ``kernels`` is :mod:`pipeline.native` (C: ∂G_t = ∂z_t q_tᵀ formed
    in the same loop) or :mod:`pipeline.native.triton_kernels` (CUDA: one batched product after it); both take
    the same arguments and sum a symbol table's gradient per symbol. It is kept for the backward, which then runs
    on the kernels of the forward even if ``PSRNN_NATIVE`` / ``PSRNN_TRITON`` changed in between."""

    @staticmethod
    def forward(ctx, kernels, G, b, q, q_init, reset, eps, symbols=None):
        out, inputs, norms = kernels.full_forward(G, b, q, q_init, reset, eps, idx=symbols)
        ctx.save_for_backward(G, inputs, out, norms, reset, symbols, b, q, q_init)
        ctx.kernels, ctx.eps = kernels, eps
        return out

    @staticmethod
    def backward(ctx, grad_out):
        G, inputs, out, norms, reset, symbols, b, q, q_init = ctx.saved_tensors
        if torch.is_grad_enabled():   # create_graph=True: see _torch_recurrence
            def recompute(G, b, q, q_init):
                return _torch_recurrence(G, b, q, q_init, reset, ctx.eps, symbols)

            return None, *_differentiable_backward(ctx.needs_input_grad[1:5], recompute, (G, b, q, q_init),
                                                   grad_out), None, None, None
        grad_z, grad_G, g_q0, g_init = ctx.kernels.full_backward(G, inputs, out, norms, reset, ctx.eps, grad_out,
                                                                 idx=symbols, grad_G=ctx.needs_input_grad[1])
        return None, grad_G, grad_z.sum((0, 1)), g_q0, g_init.sum(0), None, None, None


class _NativeFactorizedRecurrence(torch.autograd.Function):
    """:func:`factorized_recurrence` in C. With s_t = C q_t, m_t = u_t ⊙ s_t, v_t = A ∂z_t and ∂z_t as for the full
    cell, the C backward forms ∂u_t = v_t ⊙ s_t (summed per symbol for a table) and w_t = v_t ⊙ u_t in its loop,
    and then

        ∂A = Σ_t m_t ∂z_tᵀ,   ∂C = Σ_t w_t q_tᵀ,   ∂b = Σ_t ∂z_t   (one matrix product each).
    """

    @staticmethod
    def forward(ctx, A, u, C, b, q, q_init, reset, eps, symbols=None):
        out, inputs, norms, cq, m = native.factorized_forward(A, u, C, b, q, q_init, reset, eps, keep=True,
                                                              idx=symbols)
        ctx.save_for_backward(A, u, C, inputs, cq, m, out, norms, reset, symbols, b, q, q_init)
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad_out):
        A, u, C, inputs, cq, m, out, norms, reset, symbols, b, q, q_init = ctx.saved_tensors
        if torch.is_grad_enabled():   # create_graph=True: see _torch_recurrence
            def recompute(A, u, C, b, q, q_init):
                steps = factorized_step_matrices(A, u if symbols is None else _take(u, symbols), C)
                return _torch_recurrence(steps, b, q, q_init, reset, ctx.eps)

            return (*_differentiable_backward(ctx.needs_input_grad[:6], recompute, (A, u, C, b, q, q_init), grad_out),
                    None, None, None)
        grad_z, grad_u, w, g_q0, g_init = native.factorized_backward(A, u, C, cq, out, norms, reset, ctx.eps,
                                                                     grad_out, idx=symbols)
        r, d = A.shape
        gz = grad_z.reshape(-1, d)
        grad_A = m.reshape(-1, r).T @ gz
        grad_C = w.reshape(-1, r).T @ inputs.reshape(-1, d)
        return grad_A, grad_u, grad_C, gz.sum(0), g_q0, g_init.sum(0), None, None, None


def _reset_steps(reset: torch.Tensor | None) -> list[int]:
    return [] if reset is None else torch.nonzero(reset.any(1)).flatten().tolist()


def _recurrence_forward(G, b, q, q_init, reset, eps):
    """The loop, in column form (B, d, 1) with one fused op per product; returns (outputs, inputs, norms)."""
    steps = set(_reset_steps(reset))
    Gs = G.unbind(0)
    bcol = b.reshape(1, -1, 1).expand(q.shape[0], -1, 1)
    qi = q_init.reshape(1, -1, 1).expand(q.shape[0], -1, 1)
    qc = q.unsqueeze(-1)
    inputs, outs, norms = [], [], []
    for t, Gt in enumerate(Gs):
        if t in steps:
            qc = torch.where(reset[t].reshape(-1, 1, 1), qi, qc)
        inputs.append(qc)
        z = torch.baddbmm(bcol, Gt, qc)
        n = torch.linalg.vector_norm(z, dim=1, keepdim=True)
        qc = z / n
        norms.append(n)
        outs.append(qc)
    norms_t = torch.stack(norms)
    out = torch.stack(outs).squeeze(-1)
    if bool((norms_t <= eps).any()):  # degenerate parameters: redo those steps with the q_init fallback
        return _recurrence_forward_careful(G, b, q, q_init, reset, eps)
    return out, torch.stack(inputs).squeeze(-1), norms_t.squeeze(-1)


def _recurrence_forward_careful(G, b, q, q_init, reset, eps):
    """The loop one step at a time, with the q_init fallback at degenerate steps; returns (outputs, inputs, norms).
    Its writes into the preallocated outputs are tracked by autograd to any order (:func:`_torch_recurrence`)."""
    L = G.shape[0]
    steps = set(_reset_steps(reset))
    inputs = torch.empty((L, *q.shape), dtype=G.dtype, device=G.device)
    out = torch.empty_like(inputs)
    norms = torch.empty((L, q.shape[0], 1), dtype=G.dtype, device=G.device)
    qi = q_init.expand_as(q)
    for t in range(L):
        if t in steps:
            q = torch.where(reset[t].unsqueeze(-1), qi, q)
        inputs[t] = q
        z = torch.bmm(G[t], q.unsqueeze(-1)).squeeze(-1) + b
        n = torch.linalg.vector_norm(z, dim=-1, keepdim=True)
        norms[t] = n
        q = torch.where(n <= eps, qi, z / n.clamp_min(eps))
        out[t] = q
    return out, inputs, norms


class _NormalizedRecurrence(torch.autograd.Function):
    """Forward: the recurrence. Backward, for t = L-1 … 0, with g the gradient reaching q_{t+1}:

        ∂z_t = (g − q_{t+1}(q_{t+1}·g)) / ‖z_t‖,   ∂G_t = ∂z_t q_tᵀ,   ∂b += ∂z_t,   g ← G_tᵀ ∂z_t (+ ∂ of q_t's use)

    and at a reset the gradient of the replaced rows goes to q_init instead of the previous state.
    """

    @staticmethod
    def forward(ctx, G, b, q, q_init, reset, eps):
        out, inputs, norms = _recurrence_forward(G, b, q, q_init, reset, eps)
        ctx.save_for_backward(G, inputs, out, norms, reset, b, q, q_init)
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad_out):
        G, inputs, out, norms, reset, b, q, q_init = ctx.saved_tensors
        if torch.is_grad_enabled():   # create_graph=True: see _torch_recurrence
            def recompute(G, b, q, q_init):
                return _torch_recurrence(G, b, q, q_init, reset, ctx.eps)

            return *_differentiable_backward(ctx.needs_input_grad[:4], recompute, (G, b, q, q_init), grad_out), \
                None, None
        L = G.shape[0]
        steps = set(_reset_steps(reset))
        alive = ~(norms <= ctx.eps)                                  # rows that were not replaced by q_init
        degenerate = not bool(alive.all())
        inv_n = (1.0 / norms.clamp_min(ctx.eps)).unsqueeze(-1)       # (L, B, 1, 1)
        GT = G.transpose(-1, -2).unbind(0)
        outs = out.unsqueeze(-1).unbind(0)                           # (B, d, 1) each
        gouts = grad_out.unsqueeze(-1).unbind(0)
        g_q = torch.zeros_like(outs[0])
        g_init = torch.zeros_like(outs[0])
        grads = [None] * L
        for t in range(L - 1, -1, -1):
            g = gouts[t] + g_q
            qn = outs[t]
            dot = torch.bmm(qn.transpose(1, 2), g)                  # (B, 1, 1): q_{t+1}·g
            gz = torch.addcmul(g, qn, dot, value=-1.0) * inv_n[t]
            if degenerate:
                a = alive[t].unsqueeze(-1)
                g_init = g_init + torch.where(a, torch.zeros_like(g), g)
                gz = torch.where(a, gz, torch.zeros_like(gz))
            grads[t] = gz
            g_q = torch.bmm(GT[t], gz)
            if t in steps:
                m = reset[t].reshape(-1, 1, 1)
                g_init = g_init + torch.where(m, g_q, torch.zeros_like(g_q))
                g_q = torch.where(m, torch.zeros_like(g_q), g_q)
        grad_z = torch.stack(grads).squeeze(-1)                     # (L, B, d)
        grad_G = grad_z.unsqueeze(-1) * inputs.unsqueeze(-2)       # ∂z_t q_tᵀ
        grad_b = grad_z.sum((0, 1))
        return grad_G, grad_b, g_q.squeeze(-1), g_init.squeeze(-1).sum(0), None, None


def _normalized_recurrence_numpy(G: torch.Tensor, b: torch.Tensor, q: torch.Tensor, q_init: torch.Tensor,
                                 reset: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The same recurrence without autograd: filtering a long test sequence is a sequential loop of tiny
    products, where numpy's per-call cost (~1 µs) beats torch's dispatcher (~10 µs) by an order of magnitude."""
    Gn = G.detach().numpy()
    bn = b.detach().numpy()
    qi = q_init.detach().numpy()
    qn = q.detach().numpy().copy()
    rn = None if reset is None else reset.numpy()
    reset_steps = set() if rn is None else set(np.flatnonzero(rn.any(1)).tolist())
    L, B, d = Gn.shape[0], Gn.shape[1], Gn.shape[2]
    out = np.empty((L, B, d), dtype=Gn.dtype)
    if B == 1:
        v = qn[0]
        for t in range(L):
            if t in reset_steps and rn[t, 0]:  # type: ignore[index]
                v = qi.copy()
            z = Gn[t, 0] @ v + bn
            nz = np.sqrt(z @ z)
            v = qi.copy() if nz <= eps else z / nz   # NaN propagates (nz > eps is false for NaN)
            out[t, 0] = v
        return torch.from_numpy(out)
    for t in range(L):
        if t in reset_steps:
            qn[rn[t]] = qi  # type: ignore[index]
        z = np.einsum("bik,bk->bi", Gn[t], qn) + bn
        nz = np.sqrt(np.einsum("bi,bi->b", z, z))[:, None]
        qn = np.where(nz <= eps, qi, z / np.maximum(nz, eps))
        out[t] = qn
    return torch.from_numpy(out)


class PSRNNLayer(nn.Module):
    """One full-tensor PSRNN layer (Eq. 5): parameters W (d, d_o, d), b (d) and the initial state q₁ (d)."""

    def __init__(self, state_dim: int, obs_dim: int):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(state_dim, obs_dim, state_dim))
        self.b = nn.Parameter(torch.zeros(state_dim))
        self.q1 = nn.Parameter(torch.full((state_dim,), 1.0 / math.sqrt(state_dim)))

    def step_matrices(self, o: torch.Tensor) -> torch.Tensor:
        """G_t = W ×₂ o_t for a whole window: (L, B, d_o) -> (L, B, d, d)."""
        return torch.einsum("ijk,lbj->lbik", self.W, o)

    def initial(self) -> torch.Tensor:
        return self.q1 / torch.linalg.vector_norm(self.q1).clamp_min(1e-12)

    def forward(self, o: torch.Tensor, q: torch.Tensor, reset: torch.Tensor | None = None) -> torch.Tensor:
        return normalized_recurrence(self.step_matrices(o), self.b, q, self.initial(), reset)

    def forward_symbols(self, table: torch.Tensor, x: torch.Tensor, q: torch.Tensor,
                        reset: torch.Tensor | None = None) -> torch.Tensor:
        """The same update for discrete inputs x (L, B) whose observations are rows of ``table`` (V, d_o)."""
        G_table = torch.einsum("ijk,vj->vik", self.W, table)
        return symbol_recurrence(G_table, x, self.b, q, self.initial(), reset)


class FactorizedPSRNNLayer(PSRNNLayer):
    """A factorized PSRNN layer (Eq. 8): q_{t+1} ∝ Aᵀ(B o_t ⊙ C q_t) + b, rank r."""

    def __init__(self, state_dim: int, obs_dim: int, rank: int):
        nn.Module.__init__(self)
        self.A = nn.Parameter(torch.zeros(rank, state_dim))
        self.B = nn.Parameter(torch.zeros(rank, obs_dim))
        self.C = nn.Parameter(torch.zeros(rank, state_dim))
        self.b = nn.Parameter(torch.zeros(state_dim))
        self.q1 = nn.Parameter(torch.full((state_dim,), 1.0 / math.sqrt(state_dim)))

    def step_matrices(self, o: torch.Tensor) -> torch.Tensor:
        """G_t = Aᵀ diag(B o_t) C, i.e. W ×₂ o_t with W = Σ_r a_r ⊗ b_r ⊗ c_r."""
        return factorized_step_matrices(self.A, o @ self.B.T, self.C)

    def forward(self, o: torch.Tensor, q: torch.Tensor, reset: torch.Tensor | None = None) -> torch.Tensor:
        return factorized_recurrence(self.A, o @ self.B.T, self.C, self.b, q, self.initial(), reset)

    def forward_symbols(self, table: torch.Tensor, x: torch.Tensor, q: torch.Tensor,
                        reset: torch.Tensor | None = None) -> torch.Tensor:
        """Discrete inputs: u_t = B o_t is one of V rows of ``table`` Bᵀ, indexed by symbol in the loop."""
        return factorized_recurrence(self.A, table @ self.B.T, self.C, self.b, q, self.initial(), reset,
                                     symbols=x)


class PSRNN(SequenceModel):
    """A stack of PSRNN layers (full or factorized) with per-layer encoders and a linear decoder.

    ``config.rank`` None gives full-tensor layers, an integer gives factorized layers of that rank.
    """

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        c = config
        self.encoders = nn.ModuleList()
        self.cores = nn.ModuleList()
        for level in range(c.n_layers):
            if level == 0 and c.discrete:
                self.encoders.append(EmbeddingEncoder(c.input_dim, c.obs_dim))
            else:
                in_dim = c.input_dim if level == 0 else c.state_dim
                self.encoders.append(RFFEncoder(in_dim, c.n_rff, c.obs_dim))
            if c.rank is None:
                self.cores.append(PSRNNLayer(c.state_dim, c.obs_dim))
            else:
                self.cores.append(FactorizedPSRNNLayer(c.state_dim, c.obs_dim, c.rank))
        # "all": skip connections from every layer to the output (Graves 2013), [q⁽¹⁾_t; …; q⁽ᴸ⁾_t] -> prediction
        self.decoder = nn.Linear(c.state_dim * (c.n_layers if c.decoder_input == "all" else 1), c.output_dim)

    def init_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return tuple(core.initial().detach().expand(batch_size, -1).clone() for core in self.cores)

    def forward(self, x: torch.Tensor, state: Sequence[torch.Tensor], reset: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        h, new_state = self.decoder_inputs(x, state, reset)
        return self.emit(self.decoder(h), x), new_state

    def layer_states(self, x: torch.Tensor, state: Sequence[torch.Tensor], reset: torch.Tensor | None = None
                     ) -> tuple[list[torch.Tensor], tuple[torch.Tensor, ...]]:
        """Every layer's states after each step, [(L, B, d)] × layers (layer l+1 reads layer l's), and the new
        state."""
        new_state, outputs = [], []
        h = x
        for encoder, core, q in zip(self.encoders, self.cores, state):
            if isinstance(encoder, EmbeddingEncoder):
                states = core.forward_symbols(encoder.table.weight, h, q, reset)
            else:
                states = core(encoder(h), q, reset)
            new_state.append(states[-1])
            outputs.append(states)
            h = states
        return outputs, tuple(new_state)

    def decoder_inputs(self, x: torch.Tensor, state: Sequence[torch.Tensor], reset: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """What the decoder reads after each step, (L, B, d) (the top layer's state q⁽ᴸ⁾_{t+1}, or with
        ``decoder_input="all"`` every layer's side by side, (L, B, L·d)), and the new state."""
        outputs, new_state = self.layer_states(x, state, reset)
        if self.config.decoder_input == "all" and len(outputs) > 1:
            return torch.cat(outputs, dim=-1), new_state
        return outputs[-1], new_state

    def filtered_layer_states(self, trajectories: Sequence[np.ndarray], *, chunk: int = 4096
                              ) -> list[list[np.ndarray]]:
        """Per trajectory, every layer's states at every step as float64 [(T, d)] × layers: the filter run from
        q₁ through the whole trajectory (blocks of ``chunk`` steps carry the state, so that no (T × n_rff)
        encoder output is ever held), on the model's device, without a graph."""
        return list(self._iter_layer_states(trajectories, chunk))

    def _iter_layer_states(self, trajectories: Sequence[np.ndarray], chunk: int = 4096):
        """:meth:`filtered_layer_states` one trajectory at a time."""
        p = next(self.parameters())
        with torch.no_grad():
            for traj in trajectories:
                a = np.asarray(traj)
                state = self.init_state(1)
                parts: list[list[np.ndarray]] = [[] for _ in self.cores]
                for s in range(0, len(a), chunk):
                    block = a[s:s + chunk]
                    x = (torch.as_tensor(block, dtype=torch.int64, device=p.device).reshape(len(block), 1)
                         if self.config.discrete else
                         torch.as_tensor(block.reshape(len(block), 1, -1), dtype=p.dtype, device=p.device))
                    outputs, state = self.layer_states(x, state)
                    for level, h in enumerate(outputs):
                        parts[level].append(h[:, 0].double().cpu().numpy())
                yield [np.concatenate(ps) if ps else np.zeros((0, self.config.state_dim)) for ps in parts]

    def filtered_decoder_inputs(self, trajectories: Sequence[np.ndarray], *, chunk: int = 4096
                                ) -> list[np.ndarray]:
        """Per trajectory, the decoder's inputs at every step as float64 (T, d) (see :meth:`decoder_inputs`), from
        :meth:`filtered_layer_states`."""
        every = self.config.decoder_input == "all" and len(self.cores) > 1
        return [np.concatenate(layers, axis=1) if every else layers[-1]
                for layers in self.filtered_layer_states(trajectories, chunk=chunk)]

    def far_side_trajectories(self, splits: Mapping[str, Sequence[np.ndarray]], reference: str = "train"
                              ) -> dict[str, list[int | None]]:
        """Per split and layer, how many of the split's trajectories keep that layer's state on the far side of
        the mean of the states filtered from ``splits[reference]`` (the training trajectories), q⁽ˡ⁾_t · m < 0
        with m the mean state's direction, for a run of at least a tenth of their steps (and two); None for a
        layer with a bias (b ≠ 0), whose update is not odd in q, or when the reference has no step.

        Without a bias the update of Eq. (5) is odd in q: q and −q filter alike, mirrored, so a near-zero update
        can leave the state on the far side, where it stays, and an affine decoder reads the mirror image wrong.
        On data whose states cluster on one side of their mean, as every shipped set's do, a count above zero is
        that failure (lgssm's 2-layer PSRNN without a bias: layer 1 on 3 of 40 training trajectories, layer 2 on
        2 of 10 test trajectories); a small bias (``model.psrnn_bias_scale``) breaks the symmetry. Two passes,
        one trajectory at a time: the mean, then the runs, so that no split's states are held at once."""
        biased = [bool((core.b.detach() != 0).any()) for core in self.cores]
        if all(biased):
            return {name: [None] * len(biased) for name in splits}
        sums, steps = [np.zeros(self.config.state_dim) for _ in biased], 0
        for layers in self._iter_layer_states(splits[reference]):
            for level, h in enumerate(layers):
                sums[level] += h.sum(axis=0)
            steps += len(layers[0])
        means = [m / float(np.linalg.norm(m)) if steps and np.linalg.norm(m) > 0 else None for m in sums]
        checked = [m is not None and not has_bias for m, has_bias in zip(means, biased)]
        out: dict[str, list[int | None]] = {}
        for name, trajectories in splits.items():
            counts = [0 if ok else None for ok in checked]
            for layers in self._iter_layer_states(trajectories):
                for level, ok in enumerate(checked):
                    if ok and _stays_far(layers[level] @ means[level] < 0):
                        counts[level] += 1
            out[name] = counts
        return out

    # ------------------------------------------------------------------ initialisation from 2SR / at random

    def load_two_stage(self, model, *, cp: Sequence[dict] | None = None, bias_scale: float = 0.0) -> "PSRNN":
        """Copy a :class:`pipeline.two_stage.TwoStageModel` into the parameters.

        ``cp`` gives, per layer, the CP factors {"A", "B", "C"} for factorized layers. The bias is
        ``bias_scale`` times the layer's mean unnormalised state (Sec. 4.3: "a small multiple of the mean state").
        """
        if len(model.layers) != len(self.cores):
            raise ValueError(f"2SR model has {len(model.layers)} layers, the network {len(self.cores)}")
        with torch.no_grad():
            for level, (layer, encoder, core) in enumerate(zip(model.layers, self.encoders, self.cores)):
                if isinstance(encoder, EmbeddingEncoder):
                    V = encoder.table.num_embeddings
                    encoder.table.weight.copy_(_t(layer.encode(np.arange(V))))
                else:
                    encoder.frequencies.copy_(_t(layer.maps.obs.frequencies))
                    encoder.offsets.copy_(_t(layer.maps.obs.offsets))
                    encoder.projection.copy_(_t(layer.U_obs))
                if isinstance(core, FactorizedPSRNNLayer):
                    if cp is None:
                        raise ValueError("factorized layers need CP factors (see pipeline.decompose)")
                    for name in ("A", "B", "C"):
                        getattr(core, name).copy_(_t(cp[level][name]))
                else:
                    core.W.copy_(_t(layer.W))
                core.b.copy_(_t(bias_scale * layer.mean_state))
                core.q1.copy_(_t(layer.q1))
            decoder = model.decoder_for(every_layer=self.config.decoder_input == "all", delta=self.config.delta)
            self.decoder.weight.copy_(_t(decoder.weight))
            self.decoder.bias.copy_(_t(decoder.bias))
        return self

    def random_init(self, seed: int) -> "PSRNN":
        """The ``random`` option: Gaussian tensors scaled to keep ‖W ×₂ o ×₃ q‖ of order 1, random encoders,
        Xavier decoder, zero bias — the baseline that shows what 2SR buys."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for encoder, core in zip(self.encoders, self.cores):
                if isinstance(encoder, EmbeddingEncoder):
                    encoder.table.weight.copy_(torch.randn(encoder.table.weight.shape, generator=g)
                                               / math.sqrt(encoder.table.embedding_dim))
                else:
                    in_dim = encoder.frequencies.shape[0]
                    encoder.frequencies.copy_(torch.randn(encoder.frequencies.shape, generator=g)
                                              / math.sqrt(in_dim))
                    encoder.offsets.copy_(torch.rand(encoder.offsets.shape, generator=g) * 2 * math.pi)
                    encoder.projection.copy_(torch.randn(encoder.projection.shape, generator=g)
                                             / math.sqrt(encoder.projection.shape[0] / 2))
                for name, p in core.named_parameters():
                    if name == "b":
                        p.zero_()
                    elif name == "q1":
                        p.copy_(torch.randn(p.shape, generator=g))
                    else:
                        fan = p.shape[1] if p.dim() == 2 else p.shape[1] * p.shape[2]
                        p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan))
            nn.init.xavier_uniform_(self.decoder.weight, generator=g)
            self.decoder.bias.zero_()
        return self


def _stays_far(far: np.ndarray) -> bool:
    """Whether a trajectory's far-side flags hold for a run of at least a tenth of its steps, and two: a state
    that flipped stays flipped (the trajectories of the shipped sets have none on the far side at all), while a
    step or two across, and back, is a near-zero update's noise."""
    longest = run = 0
    for flag in far:
        run = run + 1 if flag else 0
        longest = max(longest, run)
    return longest >= max(2, 0.1 * len(far))


def _t(x: np.ndarray) -> torch.Tensor:
    """``x`` as a float64 tensor, for ``Parameter.copy_``, which casts it to the parameter's own dtype: a float64
    model gets the 2SR's float64 values unrounded (a cast to the default dtype first rounded them to float32), and
    a float32 one the same float32 rounding as that cast."""
    return torch.as_tensor(np.asarray(x, dtype=np.float64))
