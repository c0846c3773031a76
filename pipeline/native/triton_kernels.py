"""The PSRNN recurrence on CUDA: Triton kernels in which one program runs one chain through all L steps.

Why: on a GPU the recurrence q_{t+1} = n(G_t q_t + b) of a 20-dimensional state is a chain of tiny products, and
as torch ops each step costs about ten kernel launches of ~10 µs for well under 1 µs of arithmetic. Measured on
an H100 (benchmarks/README.md) the torch loop trained at 0.37x and filtered at 0.02x the speed of cuDNN's LSTM.
Here the whole loop is one launch: program c keeps its state in registers, reads G_t (or the symbol's matrix of
a (V, d, d) table) from memory once per step and writes q_{t+1}; the backward is one launch of the reversed loop.

This module imports triton and is imported only through :func:`pipeline.native.gpu_kernels`, when a CUDA tensor
needs it (torch's CUDA wheels bring triton). The arithmetic is that of ``recurrence_impl.h`` (the C kernels) and
of :class:`pipeline.models.psrnn._NormalizedRecurrence`, degenerate steps and resets included; tests run these
kernels in Triton's interpreter on the CPU against the torch path, and on a GPU against the CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pipeline.native import _index


@triton.jit
def _full_forward_kernel(G, IDX, BIAS, Q0, QINIT, RESET, INPUTS, OUT, NORMS, L, B, D, eps,
                         HAS_IDX: tl.constexpr, HAS_RESET: tl.constexpr, STORE_INPUTS: tl.constexpr,
                         BLOCK: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    vm = i < D
    tile = i[:, None] * D + i[None, :]
    tm = vm[:, None] & vm[None, :]
    bias = tl.load(BIAS + i, mask=vm, other=0.0)
    qinit = tl.load(QINIT + i, mask=vm, other=0.0)
    q = tl.load(Q0 + c * D + i, mask=vm, other=0.0)
    for t in range(L):
        tc = t * B + c
        if HAS_RESET:
            q = tl.where(tl.load(RESET + tc) != 0, qinit, q)
        if STORE_INPUTS:
            tl.store(INPUTS + tc * D + i, q, mask=vm)
        if HAS_IDX:
            base = tl.load(IDX + tc) * D * D
        else:
            base = tc * D * D
        g = tl.load(G + base + tile, mask=tm, other=0.0)
        z = tl.sum(g * q[None, :], axis=1) + bias
        n = tl.sqrt(tl.sum(z * z, axis=0))
        live = (n > eps) | (n != n)   # a NaN norm is live: NaN propagates, as through torch ops
        # a zero vector (degenerate parameters only) becomes q_init instead of 0/0
        q = tl.where(live, z * (1.0 / tl.where(live, n, 1.0)), qinit)
        tl.store(OUT + tc * D + i, q, mask=vm)
        tl.store(NORMS + tc, n)


@triton.jit
def _full_backward_kernel(G, IDX, OUT, NORMS, RESET, GRAD_OUT, GRAD_Z, G_Q0, G_INIT, L, B, D, eps,
                          HAS_IDX: tl.constexpr, HAS_RESET: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    vm = i < D
    tile = i[:, None] * D + i[None, :]
    tm = vm[:, None] & vm[None, :]
    gq = tl.zeros([BLOCK], dtype=GRAD_OUT.dtype.element_ty)     # the gradient reaching q_{t+1} from step t+1
    gi = tl.zeros([BLOCK], dtype=GRAD_OUT.dtype.element_ty)     # ... and q_init, from resets and degenerate steps
    for s in range(L):
        tc = (L - 1 - s) * B + c
        g = tl.load(GRAD_OUT + tc * D + i, mask=vm, other=0.0) + gq
        qn = tl.load(OUT + tc * D + i, mask=vm, other=0.0)
        n = tl.load(NORMS + tc)
        live = (n > eps) | (n != n)   # a NaN norm is live: NaN propagates, as through torch ops
        dot = tl.sum(qn * g, axis=0)
        gz = tl.where(live, (g - qn * dot) * (1.0 / tl.where(live, n, 1.0)), 0.0)
        gi = gi + tl.where(live, 0.0, g)
        tl.store(GRAD_Z + tc * D + i, gz, mask=vm)
        if HAS_IDX:
            base = tl.load(IDX + tc) * D * D
        else:
            base = tc * D * D
        gt = tl.load(G + base + tile, mask=tm, other=0.0)
        gq = tl.sum(gt * gz[:, None], axis=0)                   # G_tᵀ ∂z_t
        if HAS_RESET:
            r = tl.load(RESET + tc) != 0                          # q_t was q_init, not the previous output
            gi = tl.where(r, gi + gq, gi)
            gq = tl.where(r, 0.0, gq)
    tl.store(G_Q0 + c * D + i, gq, mask=vm)
    tl.store(G_INIT + c * D + i, gi, mask=vm)


def _reset_flags(reset: torch.Tensor | None) -> torch.Tensor | None:
    """``reset`` as bytes for the kernels. Unlike the C path's :func:`pipeline.native._reset_bytes`, a window
    without a reset is not looked for (``reset.any()`` would wait for the device at every call): its flags are
    all 0, and ``tl.where`` on them keeps every value as it is, so the results are the same bit for bit."""
    return None if reset is None else reset.to(torch.uint8).contiguous()


def _launch_options(d: int) -> dict:
    block = max(16, triton.next_power_of_2(d))
    return {"BLOCK": block, "num_warps": 1 if block <= 32 else 2 if block <= 64 else 8}


def full_forward(G: torch.Tensor, b: torch.Tensor, q0: torch.Tensor, q_init: torch.Tensor,
                 reset: torch.Tensor | None, eps: float, idx: torch.Tensor | None = None,
                 store_inputs: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """q_{t+1} = n(G_t q_t + b) for t = 0 … L-1, G_t = G[t] (L, B, d, d) or G[idx[t]] of a (V, d, d) table:
    returns (out, inputs, norms) of shapes (L, B, d), (L, B, d) (None unless ``store_inputs``), (L, B).
    The arguments and results of :func:`pipeline.native.full_forward`, symbol indices checked as there (the
    kernel reads the table unchecked)."""
    B, d = q0.shape
    L = idx.shape[0] if idx is not None else G.shape[0]
    G, b, q0, q_init = (t.detach().contiguous() for t in (G, b, q0, q_init))
    out = torch.empty((L, B, d), dtype=q0.dtype, device=q0.device)
    inputs = torch.empty_like(out) if store_inputs else out
    norms = torch.empty((L, B), dtype=q0.dtype, device=q0.device)
    if L == 0:
        return out, (inputs if store_inputs else None), norms
    r = _reset_flags(reset)
    ix = _index(idx, G.shape[0])
    # Triton launches on the *current* CUDA device and stream, whatever device the tensors are on: for a model on
    # cuda:1 while cuda:0 is current (train.device: cuda:1) the kernel ran on device 0, on a stream not ordered
    # with device 1's work. The guard makes the tensors' device current (a no-op for CPU tensors: interpreter).
    with torch.cuda.device_of(q0):
        _full_forward_kernel[(B,)](G, ix if ix is not None else G, b, q0, q_init, r if r is not None else q0,
                                   inputs, out, norms, L, B, d, float(eps), HAS_IDX=ix is not None,
                                   HAS_RESET=r is not None, STORE_INPUTS=store_inputs, **_launch_options(d))
    return out, (inputs if store_inputs else None), norms


def full_backward(G: torch.Tensor, inputs: torch.Tensor, out: torch.Tensor, norms: torch.Tensor,
                  reset: torch.Tensor | None, eps: float, grad_out: torch.Tensor, idx: torch.Tensor | None = None,
                  grad_G: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The reversed loop of :func:`full_forward`, as :func:`pipeline.native.full_backward`: returns (∂z (L, B, d),
    ∂G (the shape of G; None unless ``grad_G``), ∂q0 (B, d), ∂q_init per chain (B, d)). ∂G_t = ∂z_t q_tᵀ is one
    batched product after the loop, summed per symbol for a table by a product with the one-hot matrix
    (deterministic, unlike atomic adds)."""
    L, B, d = out.shape
    grad_z = torch.empty_like(out)
    g_q0 = torch.zeros((B, d), dtype=out.dtype, device=out.device)
    g_init = torch.zeros_like(g_q0)
    if L:
        r = _reset_flags(reset)
        ix = _index(idx, G.shape[0], check=False)
        G = G.detach().contiguous()
        with torch.cuda.device_of(out):   # as in full_forward: launch on the tensors' device
            _full_backward_kernel[(B,)](G, ix if ix is not None else G, out.contiguous(), norms.contiguous(),
                                        r if r is not None else out, grad_out.contiguous(), grad_z, g_q0, g_init,
                                        L, B, d, float(eps), HAS_IDX=ix is not None, HAS_RESET=r is not None,
                                        **_launch_options(d))
    gG = None
    if grad_G:
        outer = grad_z.unsqueeze(-1) * inputs.unsqueeze(-2)                         # (L, B, d, d)
        if idx is None:
            gG = outer
        else:
            one_hot = torch.nn.functional.one_hot(idx.reshape(-1), G.shape[0]).to(outer.dtype)
            gG = (one_hot.T @ outer.reshape(-1, d * d)).reshape(G.shape)
    return grad_z, gG, g_q0, g_init
