"""The compiled recurrence (pipeline.native) computes what the pure-torch path computes: states, gradients, resets,
degenerate steps, symbol tables; models train the same with either; the library builds and can be turned off."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline import native
from pipeline.models.psrnn import factorized_recurrence, normalized_recurrence, symbol_recurrence

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path is the only path")

L, B, D, R, V = 9, 4, 5, 3, 6


def _case(dtype, degenerate=False):
    g = torch.Generator().manual_seed(3)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    c = {"G": rnd(L, B, D, D), "table": rnd(V, D, D), "symbols": torch.randint(0, V, (L, B), generator=g),
         "A": rnd(R, D), "u": rnd(L, B, R), "utable": rnd(V, R), "C": rnd(R, D), "b": rnd(D),
         "q": torch.nn.functional.normalize(rnd(B, D), dim=-1), "qi": torch.nn.functional.normalize(rnd(D), dim=0)}
    reset = torch.zeros(L, B, dtype=torch.bool)
    reset[2, 1] = reset[6, :] = True
    c["reset"] = reset
    if degenerate:  # step 4 of chain 2 maps every state to z = 0: the state falls back to q_init
        c["b"] = torch.zeros(D, dtype=dtype)
        c["G"][4, 2] = 0.0
        c["u"][4, 2] = 0.0
        c["table"][5] = 0.0
        c["utable"][5] = 0.0
        c["symbols"][4, 2] = 5
    return c


CORES = {
    "full": (normalized_recurrence, ("G", "b", "q", "qi")),
    "symbols": (lambda table, b, q, qi, reset, symbols: symbol_recurrence(table, symbols, b, q, qi, reset),
                ("table", "b", "q", "qi")),
    "factorized": (factorized_recurrence, ("A", "u", "C", "b", "q", "qi")),
    "factorized_symbols": (lambda A, u, C, b, q, qi, reset, symbols: factorized_recurrence(A, u, C, b, q, qi, reset,
                                                                                           symbols=symbols),
                           ("A", "utable", "C", "b", "q", "qi")),
}


def _run(core, case, monkeypatch, use_native):
    monkeypatch.setenv("PSRNN_NATIVE", "1" if use_native else "0")
    fn, names = CORES[core]
    leaves = [case[n].clone().requires_grad_() for n in names]
    extra = {"symbols": case["symbols"]} if core.endswith("symbols") else {}
    out = fn(*leaves, case["reset"], **extra)
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * w).sum().backward()
    with torch.no_grad():
        out_nograd = fn(*[t.detach() for t in leaves], case["reset"], **extra)
    return out.detach(), out_nograd, [t.grad for t in leaves]


@pytest.mark.parametrize("core", sorted(CORES))
@pytest.mark.parametrize("degenerate", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_native_matches_torch_path(core, degenerate, dtype, tol, monkeypatch):
    case = _case(dtype, degenerate)
    fast = _run(core, case, monkeypatch, True)
    slow = _run(core, case, monkeypatch, False)
    torch.testing.assert_close(fast[0], slow[0], atol=tol, rtol=tol)
    torch.testing.assert_close(fast[1], slow[1], atol=tol, rtol=tol)   # the no-grad loop too
    torch.testing.assert_close(fast[1], fast[0], atol=tol, rtol=tol)
    for a, b in zip(fast[2], slow[2]):
        torch.testing.assert_close(a, b, atol=tol * 10, rtol=tol * 10)
    assert torch.allclose(fast[0].norm(dim=-1), torch.ones((), dtype=dtype), atol=tol)
    if degenerate:
        torch.testing.assert_close(fast[0][4, 2], case["qi"])


@pytest.mark.parametrize("core", sorted(CORES))
def test_native_gradcheck(core, monkeypatch):
    monkeypatch.setenv("PSRNN_NATIVE", "1")
    case = _case(torch.float64)
    fn, names = CORES[core]
    extra = {"symbols": case["symbols"]} if core.endswith("symbols") else {}
    leaves = tuple(case[n].clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(lambda *xs: fn(*xs, case["reset"], **extra), leaves, eps=1e-6, atol=1e-7)


def test_symbol_table_equals_per_step_matrices(monkeypatch):
    """One (V, d, d) table indexed by symbol is exactly the per-step G_t = table[x_t]."""
    case = _case(torch.float64)
    a = symbol_recurrence(case["table"], case["symbols"], case["b"], case["q"], case["qi"], case["reset"])
    b = normalized_recurrence(case["table"][case["symbols"]], case["b"], case["q"], case["qi"], case["reset"])
    torch.testing.assert_close(a, b, atol=1e-13, rtol=1e-13)
    fa = factorized_recurrence(case["A"], case["utable"], case["C"], case["b"], case["q"], case["qi"],
                               case["reset"], symbols=case["symbols"])
    fb = factorized_recurrence(case["A"], case["utable"][case["symbols"]], case["C"], case["b"], case["q"],
                               case["qi"], case["reset"])
    torch.testing.assert_close(fa, fb, atol=1e-13, rtol=1e-13)
    with pytest.raises(IndexError, match="symbol index out of range"):
        symbol_recurrence(case["table"], case["symbols"] + V, case["b"], case["q"], case["qi"])
    with pytest.raises(IndexError, match="symbol index out of range"):
        factorized_recurrence(case["A"], case["utable"], case["C"], case["b"], case["q"], case["qi"],
                              symbols=case["symbols"] - V)


@pytest.mark.parametrize("model,rank", [("psrnn", None), ("factorized_psrnn", 3)])
def test_training_is_the_same_with_and_without_native(model, rank, monkeypatch):
    """Three SGD steps of a discrete PSRNN (embedding, symbol tables, decoder) in float64 give the same parameters."""
    from pipeline.api import initialise_model
    from pipeline.metrics import masked_loss
    from pipeline.models.common import ModelConfig, detach_state

    torch.set_default_dtype(torch.float64)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 7, (12, 3), generator=g)
        y = torch.randint(0, 7, (12, 3), generator=g)
        mask = torch.ones(12, 3, dtype=torch.bool)
        final = {}
        for flag in ("1", "0"):
            monkeypatch.setenv("PSRNN_NATIVE", flag)
            cfg = ModelConfig(model=model, discrete=True, input_dim=7, output_dim=7, state_dim=4, obs_dim=3,
                              rank=rank, init="random")
            m = initialise_model(cfg, seed=1)
            opt = torch.optim.SGD(m.parameters(), lr=0.5)
            state = m.init_state(3)
            for _ in range(3):
                state = detach_state(state)
                out, state = m(x, state)
                loss = masked_loss(out, y, mask, True)
                opt.zero_grad()
                loss.backward()
                opt.step()
            final[flag] = {k: v.detach().clone() for k, v in m.state_dict().items()}
        for k in final["1"]:
            torch.testing.assert_close(final["1"][k], final["0"][k], atol=1e-10, rtol=1e-10)
    finally:
        torch.set_default_dtype(torch.float32)


def test_build_into_a_fresh_cache_and_disable(tmp_path, monkeypatch):
    lib = native.build(tmp_path / "cache")
    assert lib.parent == tmp_path / "cache" and lib.stat().st_size > 0
    assert native.build(tmp_path / "cache") == lib               # cached: same file, no rebuild
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".build-")]  # no temp left
    monkeypatch.setenv("PSRNN_NATIVE", "0")
    assert native.library() is None
    assert not native.usable(torch.zeros(1))
    monkeypatch.setenv("PSRNN_NATIVE", "1")
    assert native.usable(torch.zeros(1)) and not native.usable(torch.zeros(1, dtype=torch.float16))


def test_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(native.NativeBuildError, match="no-such-cc"):
        native.build(tmp_path / "other-cache")


def test_large_window_state_stays_normalised():
    """A long no-grad filter (the evaluation path) keeps unit norms and matches chunked filtering exactly."""
    g = torch.Generator().manual_seed(5)
    table = torch.randn(V, D, D, generator=g) / math.sqrt(D)
    x = torch.randint(0, V, (5000, 1), generator=g)
    b = torch.randn(D, generator=g) * 0.1
    qi = torch.nn.functional.normalize(torch.randn(D, generator=g), dim=0)
    q0 = qi.expand(1, D).clone()
    with torch.no_grad():
        whole = symbol_recurrence(table, x, b, q0, qi)
        first = symbol_recurrence(table, x[:2000], b, q0, qi)
        second = symbol_recurrence(table, x[2000:], b, first[-1], qi)
    torch.testing.assert_close(whole, torch.cat([first, second]), atol=0, rtol=0)
    assert torch.allclose(whole.norm(dim=-1), torch.ones(()), atol=1e-5)


@pytest.mark.parametrize("kind", ["rnn", "gru"])
@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_baseline_inference_loop_matches_torch(kind, n_layers, dtype, tol, monkeypatch):
    """The compiled no-gradient RNN/GRU loop gives torch.nn.RNN/GRU's outputs and states, resets included."""
    from pipeline.models import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(model=kind, discrete=True, input_dim=V, output_dim=V, obs_dim=5, state_dim=6,
                                    n_layers=n_layers)).to(dtype)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randint(0, V, (30, 3))
    reset = torch.zeros(30, 3, dtype=torch.bool)
    reset[10, 1] = reset[20] = True
    state = tuple(torch.randn_like(s) for s in model.init_state(3))
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv("PSRNN_NATIVE", flag)
        with torch.no_grad():
            out, st = model(x[:17], state, reset[:17])
            out2, st2 = model(x[17:], st, reset[17:])
        results.append((torch.cat([out, out2]), st2))
    (fast, fast_state), (slow, slow_state) = results
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol)
    for a, b in zip(fast_state, slow_state):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert not torch.equal(fast[12, 1], fast[12, 0])  # the inputs differ, so would a wrong reset


@pytest.mark.parametrize("kind", ["rnn", "gru"])
@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_baseline_training_loop_matches_torch(kind, n_layers, dtype, tol, monkeypatch):
    """The compiled RNN/GRU loop with its backward gives torch.nn.RNN/GRU's outputs, final state and the gradient
    of every parameter and of the initial state, resets included (one at step 0, one mid-window for one chain,
    one for every chain), a gradient on the final state too."""
    from pipeline.models import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(model=kind, discrete=False, input_dim=3, output_dim=3, obs_dim=5, state_dim=6,
                                    n_layers=n_layers)).to(dtype)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(13, 4, 3, dtype=dtype)
    reset = torch.zeros(13, 4, dtype=torch.bool)
    reset[0, 2] = reset[5, 1] = reset[9] = True
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv("PSRNN_NATIVE", flag)
        model.zero_grad()
        h0 = torch.randn(4, n_layers, 6, dtype=dtype, generator=torch.Generator().manual_seed(1)).requires_grad_()
        out, (h,) = model(x, (h0,), reset)
        ((out ** 2).sum() + (h ** 3).sum()).backward()
        results.append((out.detach(), h.detach(), h0.grad, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (out_f, h_f, g0_f, grads_f), (out_s, h_s, g0_s, grads_s) = results
    torch.testing.assert_close(out_f, out_s, rtol=tol, atol=tol)
    torch.testing.assert_close(h_f, h_s, rtol=tol, atol=tol)
    torch.testing.assert_close(g0_f, g0_s, rtol=tol, atol=tol)
    assert float(g0_f[2].abs().max()) == 0.0   # chain 2 resets before its first step: h0 reaches nothing
    for name in grads_s:
        torch.testing.assert_close(grads_f[name], grads_s[name], rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("kind", ["rnn", "gru"])
def test_baseline_training_loop_gradcheck(kind, monkeypatch):
    """torch.autograd.gradcheck of the compiled layer in float64 (gate inputs, W_hh, b_hh, h0), with resets."""
    from pipeline.models.baselines import _NativeRecurrentLayer

    monkeypatch.setenv("PSRNN_NATIVE", "1")
    g = torch.Generator().manual_seed(0)
    H, G = 3, (3 if kind == "gru" else 1)
    gi = torch.randn(6, 2, G * H, dtype=torch.float64, generator=g, requires_grad=True)
    W = (0.7 * torch.randn(G * H, H, dtype=torch.float64, generator=g)).requires_grad_()
    b = torch.randn(G * H, dtype=torch.float64, generator=g, requires_grad=True)
    h0 = torch.randn(2, H, dtype=torch.float64, generator=g, requires_grad=True)
    reset = torch.zeros(6, 2, dtype=torch.bool)
    reset[3, 0] = True
    assert torch.autograd.gradcheck(lambda *a: _NativeRecurrentLayer.apply(kind, *a, reset), (gi, W, b, h0))
    out = _NativeRecurrentLayer.apply(kind, gi, W, b, h0, reset)
    out[3:, 0].sum().backward()   # after the reset, chain 0 does not depend on h0
    assert float(h0.grad[0].abs().max()) == 0.0 and float(h0.grad[1].abs().max()) == 0.0


@pytest.mark.parametrize("kind", ["rnn", "gru"])
def test_baseline_training_loop_second_order_gradients(kind, monkeypatch):
    """A gradient penalty (create_graph=True) through the compiled layer gives torch.nn's second-order gradients:
    the C backward has no graph, so that backward recomputes the window with torch ops."""
    from pipeline.models import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(model=kind, discrete=False, input_dim=3, output_dim=3, obs_dim=4, state_dim=5,
                                    n_layers=2)).to(torch.float64)
    x = torch.randn(7, 3, 3, dtype=torch.float64)
    reset = torch.zeros(7, 3, dtype=torch.bool)
    reset[4, 1] = True
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv("PSRNN_NATIVE", flag)
        model.zero_grad()
        params = list(model.parameters())
        out, _ = model(x, model.init_state(3), reset)
        grads = torch.autograd.grad((out ** 2).sum(), params, create_graph=True)
        sum(g.pow(2).sum() for g in grads).backward()
        results.append([p.grad.clone() for p in params])
    for fast, slow in zip(*results):
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)


def test_baseline_under_cpu_autocast_takes_the_torch_path(monkeypatch):
    """Autocast makes the gate inputs bfloat16, which the C loop does not take: the torch cell runs instead."""
    from pipeline.models import ModelConfig, build_model

    monkeypatch.setenv("PSRNN_NATIVE", "1")
    model = build_model(ModelConfig(model="gru", discrete=True, input_dim=V, output_dim=V, obs_dim=4, state_dim=5))
    x = torch.randint(0, V, (6, 2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = model(x, model.init_state(2))
        out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and model.rnn.weight_hh_l0.grad is not None


@pytest.mark.parametrize("core", sorted(CORES))
@pytest.mark.parametrize("use_native", [True, False])
@pytest.mark.parametrize("grad", [True, False])
def test_a_nan_state_propagates_on_every_path(core, use_native, grad, monkeypatch):
    """A NaN norm is no degenerate step: NaN reaches the output, with or without gradients, C or torch (the C path
    and the no-grad numpy loop tested n > eps, false for NaN, and put q_init in its place: a model with a NaN
    weight scored finite metrics)."""
    monkeypatch.setenv("PSRNN_NATIVE", "1" if use_native else "0")
    case = _case(torch.float64)
    case["b"] = case["b"].clone()
    case["b"][0] = math.nan
    fn, names = CORES[core]
    extra = {"symbols": case["symbols"]} if core.endswith("symbols") else {}
    with torch.set_grad_enabled(grad):
        out = fn(*[case[n].clone().requires_grad_(grad) for n in names], case["reset"], **extra)
    assert torch.isnan(out).all()


def _plain_cell(core, leaves, reset, symbols):
    """The test's own cell in torch ops, differentiable to any order (Eq. 5, q_init at a reset)."""
    if core.startswith("factorized"):
        A, u, C, b, q, qi = leaves
        if core.endswith("symbols"):
            u = u[symbols]
        G = torch.einsum("ri,lbr,rk->lbik", A, u, C)
    else:
        G, b, q, qi = leaves
        if core == "symbols":
            G = G[symbols]
    outs = []
    for t in range(G.shape[0]):
        q = torch.where(reset[t].unsqueeze(-1), qi.expand_as(q), q)
        z = (G[t] @ q.unsqueeze(-1)).squeeze(-1) + b
        q = z / torch.linalg.vector_norm(z, dim=-1, keepdim=True)
        outs.append(q)
    return torch.stack(outs)


@pytest.mark.parametrize("core", sorted(CORES))
@pytest.mark.parametrize("use_native", [True, False])
def test_second_order_gradients_through_the_cells(core, use_native, monkeypatch):
    """create_graph=True (a gradient penalty) differentiates the cell recomputed in torch ops: the hand-written
    backwards have no graph (second-order gradients were wrong by 10² on the torch path, refused in C). Checked
    against the test's own cell, whose double backward is torch's."""
    monkeypatch.setenv("PSRNN_NATIVE", "1" if use_native else "0")
    case = _case(torch.float64)
    fn, names = CORES[core]
    extra = {"symbols": case["symbols"]} if core.endswith("symbols") else {}

    def second_order(cell):
        leaves = [case[n].clone().requires_grad_() for n in names]
        out = cell(leaves)
        w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
        first = torch.autograd.grad((out * w).sum(), leaves, create_graph=True)
        return torch.autograd.grad(sum((g ** 2).sum() for g in first), leaves)

    ours = second_order(lambda leaves: fn(*leaves, case["reset"], **extra))
    plain = second_order(lambda leaves: _plain_cell(core, leaves, case["reset"], case["symbols"]))
    for name, a, b in zip(names, ours, plain):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=f"{core}: {name}")


def test_the_torch_path_sums_symbol_gradients_in_a_fixed_order(monkeypatch):
    """Without the C kernels a symbol table's gradient is an index_select's: advanced indexing's parallel scatter
    summed float32 gradients in another order from run to run (relative differences ~1e-6 on 2 threads)."""
    monkeypatch.setenv("PSRNN_NATIVE", "0")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(0)
        table, utable = torch.randn(40, 20, 20, generator=g), torch.randn(40, 30, generator=g)
        A, C = torch.randn(30, 20, generator=g), torch.randn(30, 20, generator=g)
        symbols = torch.randint(0, 40, (200, 8), generator=g)
        q = torch.nn.functional.normalize(torch.randn(8, 20, generator=g), dim=-1)
        qi, b = q[0], torch.zeros(20)
        grads = []
        for _ in range(4):
            t, u = table.clone().requires_grad_(), utable.clone().requires_grad_()
            out = symbol_recurrence(t, symbols, b, q, qi) + factorized_recurrence(A, u, C, b, q, qi, symbols=symbols)
            (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
            grads.append((t.grad, u.grad))
        assert all(torch.equal(a, grads[0][0]) and torch.equal(c, grads[0][1]) for a, c in grads[1:])
    finally:
        torch.set_num_threads(threads)


def test_a_backward_runs_on_the_kernels_of_its_forward(monkeypatch):
    """PSRNN_NATIVE turned off between forward and backward: the C backward still runs (library() read the
    variable again and found None: an AttributeError)."""
    case = _case(torch.float64)
    for core in sorted(CORES):
        monkeypatch.setenv("PSRNN_NATIVE", "1")
        fn, names = CORES[core]
        extra = {"symbols": case["symbols"]} if core.endswith("symbols") else {}
        leaves = [case[n].clone().requires_grad_() for n in names]
        out = fn(*leaves, case["reset"], **extra)
        monkeypatch.setenv("PSRNN_NATIVE", "0")
        out.sum().backward()
        assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in leaves), core
