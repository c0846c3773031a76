"""Models, recurrences and batching: what a mutation audit of ``pipeline/models``, ``pipeline/native``,
``metrics``, ``batching``, ``naive`` and ``optim`` found untested (80 mutants, 5 survivors that changed
behaviour): the random PSRNN's Xavier decoder and zero bias, the RFF encoder's √(2/D) scale (invisible to the
2SR consistency tests while b = 0, since the normalisation undoes any scale), a stream's first state against a
reset's, the compiled recurrence's degenerate-update threshold, and ``Streams.to`` casting the targets."""

import math

import numpy as np
import pytest
import scipy.stats
import torch

from pipeline.api import initialise_model
from pipeline.batching import make_streams
from pipeline.models.common import ModelConfig
from pipeline.models.psrnn import RFFEncoder, factorized_recurrence, normalized_recurrence


@pytest.mark.parametrize("discrete", [True, False])
def test_random_psrnn_has_zero_bias_and_a_xavier_uniform_decoder(discrete):
    """init='random' (README/paper baseline): zero bias in every layer, decoder U(±sqrt(6/(fan_in+fan_out)))
    with zero bias. A nonzero bias or torch's default / normal decoder init fail."""
    cfg = ModelConfig(model="psrnn", discrete=discrete, input_dim=40, output_dim=40, state_dim=30, obs_dim=5,
                      n_layers=2, n_rff=20, init="random")
    m = initialise_model(cfg, seed=2)
    for core in m.cores:
        assert not core.b.detach().any()
    assert not m.decoder.bias.detach().any()
    w = m.decoder.weight.detach().double().numpy()
    fan_out, fan_in = w.shape
    a = np.sqrt(6.0 / (fan_in + fan_out))
    x = w.ravel()
    assert np.abs(x).max() <= a * (1 + 1e-6)
    assert np.abs(x).max() >= a * (1 - 10.0 / x.size)
    assert scipy.stats.kstest(x, "uniform", args=(-a, 2 * a)).pvalue > 1e-6


def test_rff_encoder_approximates_the_gaussian_kernel():
    """o = U^T sqrt(2/D) cos(Omega^T x + beta): with U = I and Omega ~ N(0, 1/sigma^2), beta ~ U(0, 2pi), the
    feature inner product estimates k(x, y) = exp(-|x-y|^2 / 2 sigma^2) (Rahimi & Recht); a wrong scale
    (sqrt(1/D)) halves it."""
    D, m, sigma = 2000, 3, 1.5   # estimates within ~0.02 (std); the wrong scale gives 0.5
    g = torch.Generator().manual_seed(0)
    enc = RFFEncoder(m, D, D).double()
    with torch.no_grad():
        enc.frequencies.copy_(torch.randn(m, D, generator=g, dtype=torch.float64) / sigma)
        enc.offsets.copy_(torch.rand(D, generator=g, dtype=torch.float64) * 2 * math.pi)
        enc.projection.copy_(torch.eye(D, dtype=torch.float64))
        x = torch.tensor([[0.0, 0.0, 0.0], [0.5, -1.0, 0.3]], dtype=torch.float64)
        f = enc(x)
    k = math.exp(-float(((x[0] - x[1]) ** 2).sum()) / (2 * sigma ** 2))
    assert abs(float(f[0] @ f[0]) - 1.0) < 0.1
    assert abs(float(f[1] @ f[1]) - 1.0) < 0.1
    assert abs(float(f[0] @ f[1]) - k) < 0.1


def test_init_state_is_the_state_a_reset_restarts_from():
    """Starting a stream from init_state must equal restarting it by a reset at step 0 (q1 normalised both ways),
    whatever b: an unnormalised start only shows once the bias is nonzero."""
    torch.manual_seed(0)
    m = initialise_model(ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=5,
                                     obs_dim=4, n_layers=2, n_rff=30, init="random"), seed=1).double()
    with torch.no_grad():
        for core in m.cores:
            core.b.copy_(torch.linspace(0.2, 1.0, 5, dtype=torch.float64))
            core.q1.mul_(7.0)   # an unnormalised q1 parameter, as training leaves it
    x = torch.tensor([[0, 1], [2, 3], [4, 5], [1, 0]])
    with torch.no_grad():
        a, _ = m(x, m.init_state(2))
        other = tuple(torch.full_like(s, 0.3) for s in m.init_state(2))
        reset = torch.zeros(4, 2, dtype=torch.bool)
        reset[0] = True
        b, _ = m(x, other, reset)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_small_but_nonzero_updates_are_normalised_not_reset():
    """Only a norm <= eps (1e-12) falls back to q_init; an update of norm ~1e-4 is a valid direction and must be
    normalised on the compiled path too (a larger threshold silently resets the state)."""
    g = torch.Generator().manual_seed(0)
    L, B, d, r = 5, 3, 4, 3
    G = torch.randn(L, B, d, d, generator=g, dtype=torch.float64) * 1e-4
    b = torch.zeros(d, dtype=torch.float64)
    q0 = torch.nn.functional.normalize(torch.randn(B, d, generator=g, dtype=torch.float64), dim=-1)
    qi = torch.nn.functional.normalize(torch.ones(d, dtype=torch.float64), dim=0)
    with torch.no_grad():
        out = normalized_recurrence(G, b, q0, qi)
    q = q0
    for t in range(L):
        z = torch.einsum("bik,bk->bi", G[t], q)
        assert float(z.norm(dim=-1).max()) < 1e-3
        q = z / z.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(out[t], q, rtol=1e-10, atol=1e-12)
    A = torch.randn(r, d, generator=g, dtype=torch.float64) * 1e-2
    C = torch.randn(r, d, generator=g, dtype=torch.float64) * 1e-2
    u = torch.randn(L, B, r, generator=g, dtype=torch.float64)
    with torch.no_grad():
        out = factorized_recurrence(A, u, C, b, q0, qi)
    q = q0
    for t in range(L):
        z = (u[t] * (q @ C.T)) @ A
        q = z / z.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(out[t], q, rtol=1e-10, atol=1e-12)


def test_to_converts_targets_with_inputs():
    """Streams.to(device, dtype) must cast y like x: a float64 model is scored on float64 targets (and a
    bfloat16 one on targets of its own dtype), not on whatever make_streams stored."""
    rng = np.random.default_rng(0)
    s = make_streams([rng.standard_normal((6, 2)), rng.standard_normal((4, 2))], 2, discrete=False)
    assert s.y.dtype == torch.float32
    for dtype in (torch.float64, torch.bfloat16):
        moved = s.to("cpu", dtype)
        assert moved.x.dtype == dtype and moved.y.dtype == dtype
        assert torch.equal(moved.y, s.y.to(dtype))
