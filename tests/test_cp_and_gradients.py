"""CP decomposition, equivalence of PSRNN and factorized PSRNN, and gradients against finite differences."""

import numpy as np
import pytest
import torch

from pipeline.decompose import cp_decompose
from pipeline.models import KalmanFilter, ModelConfig, PSRNN
from pipeline.models.psrnn import FactorizedPSRNNLayer, PSRNNLayer


@pytest.mark.parametrize("rank", [1, 5, 12])
def test_cp_reconstructs_a_rank_r_tensor(rank):
    rng = np.random.default_rng(rank)
    A, B, C = rng.standard_normal((rank, 12)), rng.standard_normal((rank, 7)), rng.standard_normal((rank, 12))
    W = np.einsum("ri,rj,rk->ijk", A, B, C)
    f = cp_decompose(W, rank, seed=0)
    assert f.A.shape == (rank, 12) and f.B.shape == (rank, 7) and f.C.shape == (rank, 12)
    assert f.relative_error < 1e-6
    assert np.linalg.norm(f.reconstruct() - W) / np.linalg.norm(W) < 1e-6
    # factors are balanced: the three columns of a component have the same norm
    norms = np.stack([np.linalg.norm(f.A, axis=1), np.linalg.norm(f.B, axis=1), np.linalg.norm(f.C, axis=1)])
    np.testing.assert_allclose(norms, norms[:1].repeat(3, 0), rtol=1e-8)


def test_cp_rejects_bad_rank():
    with pytest.raises(ValueError, match="rank"):
        cp_decompose(np.ones((2, 2, 2)), 0)


def _psrnn_pair(rank, d=8, d_o=5, V=7, seed=0, discrete=True, n_rff=40):
    """A PSRNN whose W has exact CP rank ``rank`` and the factorized PSRNN made from its decomposition. Discrete:
    V symbols through an embedding; continuous: V-dimensional inputs through an RFF encoder of ``n_rff``
    features. Every other parameter (encoder, b, q1, decoder) is random and shared by the two."""
    rng = np.random.default_rng(seed)
    A, B, C = rng.standard_normal((rank, d)), rng.standard_normal((rank, d_o)), rng.standard_normal((rank, d))
    W = np.einsum("ri,rj,rk->ijk", A, B, C)
    common = dict(discrete=discrete, input_dim=V, output_dim=V, state_dim=d, obs_dim=d_o, n_rff=n_rff)
    full = PSRNN(ModelConfig(model="psrnn", **common))
    fact = PSRNN(ModelConfig(model="factorized_psrnn", rank=rank, **common))
    f = cp_decompose(W, rank, seed=0)
    with torch.no_grad():
        full.cores[0].W.copy_(torch.as_tensor(W))
        for name in "ABC":
            getattr(fact.cores[0], name).copy_(torch.as_tensor(getattr(f, name)))
        shared = {k: v for k, v in full.state_dict().items() if not k.startswith("cores.0.W")}
        torch.manual_seed(seed)
        for k, v in shared.items():
            v.copy_(torch.randn_like(v))
        fact.load_state_dict({**fact.state_dict(), **shared})
        full.load_state_dict({**full.state_dict(), **shared})
    return full, fact


def test_factorized_psrnn_equals_psrnn_at_exact_rank():
    full, fact = _psrnn_pair(rank=4)
    x = torch.randint(0, 7, (30, 3))
    reset = torch.zeros(30, 3, dtype=torch.bool)
    reset[10, 1] = True
    with torch.no_grad():
        out_full, st_full = full(x, full.init_state(3), reset)
        out_fact, st_fact = fact(x, fact.init_state(3), reset)
    assert torch.allclose(out_full, out_fact, atol=1e-5, rtol=1e-5)
    assert torch.allclose(st_full[0], st_fact[0], atol=1e-5)


def test_factorized_psrnn_equals_psrnn_at_exact_rank_on_continuous_inputs():
    """The continuous path (RFF encoder, then FactorizedPSRNNLayer.forward / PSRNNLayer.forward, not the symbol
    tables of the discrete path): the same W as A, B, C factors gives the same outputs and states. W is not
    symmetric in its state modes, so a factorized update with A and C swapped (Wᵀ) differs by O(1)."""
    full, fact = _psrnn_pair(rank=4, discrete=False)
    assert isinstance(fact.cores[0], FactorizedPSRNNLayer) and not isinstance(full.cores[0], FactorizedPSRNNLayer)
    assert torch.equal(full.encoders[0].frequencies, fact.encoders[0].frequencies)
    torch.manual_seed(1)
    x = torch.randn(30, 3, 7)
    reset = torch.zeros(30, 3, dtype=torch.bool)
    reset[10, 1] = True
    with torch.no_grad():
        out_full, st_full = full(x, full.init_state(3), reset)
        out_fact, st_fact = fact(x, fact.init_state(3), reset)
        # the states themselves, layer by layer, through the continuous forward
        o = full.encoders[0](x)
        q_full = full.cores[0](o, full.init_state(3)[0], reset)
        q_fact = fact.cores[0](o, fact.init_state(3)[0], reset)
    assert out_full.shape == (30, 3, 7)
    assert torch.allclose(q_full, q_fact, atol=1e-5), (q_full - q_fact).abs().max()
    assert torch.allclose(out_full, out_fact, atol=1e-5, rtol=1e-5), (out_full - out_fact).abs().max()
    assert torch.allclose(st_full[0], st_fact[0], atol=1e-5)


def test_state_is_normalised_and_reset_restarts_from_q1():
    full, _ = _psrnn_pair(rank=3)
    x = torch.randint(0, 7, (12, 2))
    reset = torch.zeros(12, 2, dtype=torch.bool)
    reset[5, 0] = True
    with torch.no_grad():
        core, enc = full.cores[0], full.encoders[0]
        states = core(enc(x), full.init_state(2)[0], reset)
        assert torch.allclose(states.norm(dim=-1), torch.ones(12, 2), atol=1e-5)
        # element 0 restarted at step 5: its states from then on equal a fresh run of x[5:]
        fresh = core(enc(x[5:, :1]), full.init_state(1)[0])
    assert torch.allclose(states[5:, 0], fresh[:, 0], atol=1e-6)


def test_zero_norm_update_falls_back_to_initial_state():
    layer = PSRNNLayer(state_dim=3, obs_dim=2)  # W = 0 and b = 0: every update has norm 0
    q0 = layer.initial().expand(4, 3)
    out = layer(torch.randn(5, 4, 2), q0)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, layer.initial().expand(5, 4, 3))


def _random_double_layer(factorized: bool, d: int, d_o: int, rank: int):
    """A float64 PSRNN (or factorized, of ``rank``) layer with standard-normal parameters from torch's global RNG."""
    layer = (FactorizedPSRNNLayer(d, d_o, rank=rank) if factorized else PSRNNLayer(d, d_o)).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p))
    return layer


@pytest.mark.parametrize("factorized", [False, True])
def test_gradcheck_psrnn_cells(factorized):
    torch.manual_seed(0)
    d, d_o, L, B = 4, 3, 5, 2
    layer = _random_double_layer(factorized, d, d_o, rank=3)
    o = torch.randn(L, B, d_o, dtype=torch.float64, requires_grad=True)
    q = torch.nn.functional.normalize(torch.randn(B, d, dtype=torch.float64), dim=-1).requires_grad_()
    names = [n for n, _ in layer.named_parameters()]

    def f(o, q, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (o, q))

    inputs = (o, q, *[p.detach().clone().requires_grad_() for p in layer.parameters()])
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("resets", ["none", "aligned", "per_chain"])
def test_gradcheck_kalman_filter(resets):
    """In float64 against finite differences. With resets, chains restart from (x0, P0) mid-sequence, so the
    gradients of x0 and of P0's Cholesky factor are checked too; "aligned" resets (every chain at the same steps)
    take the shared covariance recursion, "per_chain" ones the batched path."""
    torch.manual_seed(0)
    n, m, L, B = 3, 2, 6, 2
    kf = KalmanFilter(ModelConfig(model="kf", discrete=False, input_dim=m, output_dim=m, state_dim=n)).double()
    with torch.no_grad():
        kf.A.copy_(0.5 * torch.randn(n, n, dtype=torch.float64))
        kf.C.copy_(torch.randn(m, n, dtype=torch.float64))
        kf.noise_chol.copy_(torch.eye(n + m, dtype=torch.float64) + 0.1 * torch.randn(n + m, n + m,
                                                                                       dtype=torch.float64))
        kf.x0.copy_(torch.randn(n, dtype=torch.float64))
        kf.P0_chol.copy_(torch.eye(n, dtype=torch.float64) + 0.2 * torch.randn(n, n, dtype=torch.float64))
    reset = None
    if resets != "none":
        reset = torch.zeros(L, B, dtype=torch.bool)
        reset[0] = True
        if resets == "aligned":
            reset[3] = True
        else:
            reset[2, 0] = reset[4, 1] = True
    x = torch.randn(L, B, m, dtype=torch.float64, requires_grad=True)
    names = [n_ for n_, _ in kf.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in kf.parameters()]

    def f(x, *ps):
        state = (kf.x0.detach().expand(B, -1), torch.eye(n, dtype=torch.float64).expand(B, n, n))
        out, _ = torch.func.functional_call(kf, dict(zip(names, ps)), (x, state, reset))
        return out

    if reset is not None:  # the reset path is exercised: x0 and P0 receive a gradient
        f(x, *params).pow(2).sum().backward()
        grads = dict(zip(names, (p.grad for p in params)))
        for name in ("x0", "P0_chol"):
            assert grads[name] is not None and grads[name].abs().sum() > 0, f"{name} gets no gradient at a reset"
        for p in params:
            p.grad = None
    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("factorized", [False, True])
def test_gradcheck_with_resets_and_initial_state(factorized):
    """The hand-written backward of the recurrence, through trajectory resets, against finite differences."""
    torch.manual_seed(1)
    d, d_o, L, B = 3, 2, 6, 3
    layer = _random_double_layer(factorized, d, d_o, rank=2)
    reset = torch.zeros(L, B, dtype=torch.bool)
    reset[2, 0] = reset[4, 2] = True
    names = [n for n, _ in layer.named_parameters()]
    o = torch.randn(L, B, d_o, dtype=torch.float64, requires_grad=True)
    q = torch.nn.functional.normalize(torch.randn(B, d, dtype=torch.float64), dim=-1).requires_grad_()

    def f(o, q, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (o, q, reset))

    inputs = (o, q, *[p.detach().clone().requires_grad_() for p in layer.parameters()])
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def test_custom_backward_matches_autograd_of_the_plain_loop():
    torch.manual_seed(2)
    L, B, d = 7, 4, 5
    G = torch.randn(L, B, d, d, dtype=torch.float64, requires_grad=True)
    b = torch.randn(d, dtype=torch.float64, requires_grad=True)
    q0 = torch.nn.functional.normalize(torch.randn(B, d, dtype=torch.float64), dim=-1).requires_grad_()
    qi = torch.nn.functional.normalize(torch.randn(d, dtype=torch.float64), dim=0).requires_grad_()
    reset = torch.zeros(L, B, dtype=torch.bool)
    reset[3, 1] = True
    from pipeline.models.psrnn import normalized_recurrence

    w = torch.randn(L, B, d, dtype=torch.float64)
    (normalized_recurrence(G, b, q0, qi, reset) * w).sum().backward()
    fast = [t.grad.clone() for t in (G, b, q0, qi)]
    for t in (G, b, q0, qi):
        t.grad = None
    q, outs = q0, []
    for t in range(L):
        q = torch.where(reset[t].unsqueeze(-1), qi.expand_as(q), q)
        z = torch.bmm(G[t], q.unsqueeze(-1)).squeeze(-1) + b
        q = z / z.norm(dim=-1, keepdim=True)
        outs.append(q)
    (torch.stack(outs) * w).sum().backward()
    for a, t in zip(fast, (G, b, q0, qi)):
        assert torch.allclose(a, t.grad, atol=1e-10)


def test_rff_cosine_backward_is_autograds_to_the_bit():
    """The encoder's cosine computes autograd's CosBackward (grad * -sin h) in one buffer: the same bits, so that
    training curves did not move when it replaced h.cos()."""
    from pipeline.models.psrnn import _Cosine

    for dtype in (torch.float32, torch.float64):
        g = torch.Generator().manual_seed(3)
        h = (torch.randn(300, 257, generator=g, dtype=dtype) * 7).requires_grad_()
        grad = torch.randn(300, 257, generator=g, dtype=dtype)
        expected, = torch.autograd.grad(h.cos(), h, grad)
        got, = torch.autograd.grad(_Cosine.apply(h), h, grad)
        assert torch.equal(got, expected) and torch.equal(_Cosine.apply(h), h.cos())
    h64 = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_Cosine.apply, (h64,))


@pytest.mark.parametrize("discrete", [True, False])
def test_metric_sums_of_whole_blocks_equal_the_masked_ones(discrete):
    """MetricSums takes a block whose mask is all true without boolean indexing: the same sums to the bit."""
    from pipeline.metrics import MetricSums

    g = torch.Generator().manual_seed(1)
    out = torch.randn(64, 3, 11, generator=g)
    y = torch.randint(0, 11, (64, 3), generator=g) if discrete else torch.randn(64, 3, 11, generator=g)
    full = torch.ones(64, 3, dtype=torch.bool)
    whole, reference = MetricSums(discrete=discrete), MetricSums(discrete=discrete)
    whole.add(out, y, full)
    with torch.no_grad():   # the boolean-indexing path of the same elements
        if discrete:
            logp = torch.log_softmax(out[full].double(), dim=-1)
            reference.loss_sum = float(-logp.gather(1, y[full][:, None]).sum())
            reference.correct = int((logp.argmax(-1) == y[full]).sum())
            reference.count = int(full.sum())
        else:
            diff = (out[full] - y[full]).double()
            reference.loss_sum, reference.count = float((diff ** 2).sum()), int(diff.numel())
    assert whole.result() == reference.result()
    partial = full.clone()
    partial[-1, 1:] = False                       # a stream that ended: its steps are left out
    some = MetricSums(discrete=discrete)
    some.add(out, y, partial)
    assert some.count == (int(partial.sum()) if discrete else int(partial.sum()) * 11)
