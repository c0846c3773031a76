"""Checks of the Triton kernels (pipeline/native/triton_kernels.py) in Triton's interpreter, against the torch
path (``_recurrence_forward`` / ``_NormalizedRecurrence``, itself held to the C kernels by test_native.py): outputs,
states, norms and every gradient, with resets and degenerate steps.

Not collected by a plain ``pytest`` run (the name does not start with ``test_``): the interpreter is chosen when a
kernel is defined, so tests/test_triton_kernels.py runs this file in a child process with ``TRITON_INTERPRET=1``.
"""

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run by tests/test_triton_kernels.py with TRITON_INTERPRET=1", allow_module_level=True)


def _problem(L=7, B=3, d=5, V=None, dtype=torch.float64, seed=0, resets=True):
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(((V,) if V else (L, B)) + (d, d), generator=g, dtype=dtype) / d ** 0.5
    b = torch.randn(d, generator=g, dtype=dtype)
    q = torch.nn.functional.normalize(torch.randn(B, d, generator=g, dtype=dtype), dim=1)
    q_init = torch.nn.functional.normalize(torch.randn(d, generator=g, dtype=dtype), dim=0)
    reset = torch.zeros(L, B, dtype=torch.bool)
    if resets:
        reset[0, B - 1] = True
        reset[L // 2, 0] = True
    idx = torch.randint(0, V, (L, B), generator=g) if V else None
    return G, b, q, q_init, reset, idx


class _TritonRecurrence:
    """``_CompiledRecurrence`` on the Triton kernels, called as the torch path's ``_NormalizedRecurrence`` is."""

    @staticmethod
    def apply(*args):
        from pipeline.models.psrnn import _CompiledRecurrence
        from pipeline.native import triton_kernels

        return _CompiledRecurrence.apply(triton_kernels, *args)


def _reference(G, b, q, q_init, reset, idx, eps=1e-12):
    from pipeline.models.psrnn import _recurrence_forward

    out, inputs, norms = _recurrence_forward(G[idx] if idx is not None else G, b, q, q_init, reset, eps)
    return out, inputs, norms.reshape(out.shape[:2])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("V", [None, 4])
@pytest.mark.parametrize("d", [1, 5, 20, 40])
def test_forward_equals_the_torch_loop(dtype, V, d):
    from pipeline.native import triton_kernels

    G, b, q, q_init, reset, idx = _problem(d=d, V=V, dtype=dtype, seed=d)
    out, inputs, norms = triton_kernels.full_forward(G, b, q, q_init, reset, 1e-12, idx=idx)
    ref = _reference(G, b, q, q_init, reset, idx)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    for name, a, r in zip(("out", "inputs", "norms"), (out, inputs, norms), ref):
        torch.testing.assert_close(a, r, **tol, msg=name)
    only_out, no_inputs, _ = triton_kernels.full_forward(G, b, q, q_init, reset, 1e-12, idx=idx, store_inputs=False)
    assert no_inputs is None
    torch.testing.assert_close(only_out, out, rtol=0, atol=0)


def test_degenerate_steps_fall_back_to_q_init():
    """A step whose G_t q_t + b is the zero vector gives q_init (and no gradient through z), as in C and torch."""
    from pipeline.models.psrnn import _NormalizedRecurrence
    from pipeline.native import triton_kernels

    G, b, q, q_init, reset, _ = _problem(L=6, B=2, d=4)
    b = torch.zeros_like(b)
    G[2, 1] = 0.0
    G[4, 0] = 0.0
    out, _, norms = triton_kernels.full_forward(G, b, q, q_init, reset, 1e-12)
    assert float(norms[2, 1]) == 0.0 and float(norms[4, 0]) == 0.0
    torch.testing.assert_close(out[2, 1], q_init, rtol=0, atol=0)
    torch.testing.assert_close(out[4, 0], q_init, rtol=0, atol=0)
    torch.testing.assert_close(out, _reference(G, b, q, q_init, reset, None)[0], rtol=1e-12, atol=1e-12)
    _compare_gradients(_TritonRecurrence, _NormalizedRecurrence, (G, b, q, q_init), reset, None)


def _compare_gradients(ours, reference, tensors, reset, idx, seed=1):
    g = torch.Generator().manual_seed(seed)
    L, B, d = reset.shape[0], tensors[2].shape[0], tensors[2].shape[1]
    weights = torch.randn(L, B, d, generator=g, dtype=tensors[0].dtype)
    grads = []
    for fn in (ours, reference):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        if fn is reference and idx is not None:
            out = fn.apply(leaves[0][idx], *leaves[1:], reset, 1e-12)
        else:
            out = fn.apply(*leaves, reset, 1e-12, *((idx,) if idx is not None else ()))
        (out * weights).sum().backward()
        grads.append([t.grad for t in leaves])
    for name, a, r in zip(("G", "b", "q", "q_init"), *grads):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12, msg=f"gradient of {name}")


@pytest.mark.parametrize("V", [None, 4])
@pytest.mark.parametrize("resets", [False, True])
def test_backward_equals_the_torch_backward(V, resets):
    from pipeline.models.psrnn import _NormalizedRecurrence

    G, b, q, q_init, reset, idx = _problem(L=9, B=3, d=6, V=V, resets=resets, seed=3)
    _compare_gradients(_TritonRecurrence, _NormalizedRecurrence, (G, b, q, q_init), reset, idx)


def test_gradcheck():
    G, b, q, q_init, reset, idx = _problem(L=4, B=2, d=3, V=3, seed=5)
    leaves = [t.clone().requires_grad_() for t in (G, b, q, q_init)]
    assert torch.autograd.gradcheck(lambda *x: _TritonRecurrence.apply(*x, reset, 1e-12, idx), leaves)
    G, b, q, q_init, reset, _ = _problem(L=4, B=2, d=3, seed=6)
    leaves = [t.clone().requires_grad_() for t in (G, b, q, q_init)]
    assert torch.autograd.gradcheck(lambda *x: _TritonRecurrence.apply(*x, reset, 1e-12), leaves)


def test_empty_window():
    from pipeline.native import triton_kernels

    G, b, q, q_init, _, _ = _problem(L=3, B=2, d=4)
    out, inputs, norms = triton_kernels.full_forward(G[:0], b, q, q_init, None, 1e-12)
    assert out.shape == (0, 2, 4) and inputs.shape == (0, 2, 4) and norms.shape == (0, 2)
    gz, gG, gq, gi = triton_kernels.full_backward(G[:0], inputs, out, norms, None, 1e-12, out)
    assert gz.shape == (0, 2, 4) and gG.shape == (0, 2, 4, 4) and not gq.any() and not gi.any()
