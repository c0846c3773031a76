"""pipeline.optim reproduces torch.optim's SGD and Adam updates and state dicts, and training never imports
torch._dynamo (the reason it exists)."""

import subprocess
import sys

import pytest
import torch

from pipeline.optim import SGD, Adam


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=g, dtype=torch.float64)),
            torch.nn.Parameter(torch.randn(5, generator=g, dtype=torch.float64))]


def _grads(step, params):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]


CASES = [
    (SGD, torch.optim.SGD, dict(lr=0.7)),
    (SGD, torch.optim.SGD, dict(lr=0.3, momentum=0.9, weight_decay=0.01)),
    (Adam, torch.optim.Adam, dict(lr=0.05)),
    (Adam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.1)),
]


@pytest.mark.parametrize("ours_cls,torch_cls,kwargs", CASES)
def test_updates_and_state_dicts_match_torch_optim(ours_cls, torch_cls, kwargs):
    ours_p, ref_p = _params(0), _params(0)
    ours, ref = ours_cls(ours_p, **kwargs), torch_cls(ref_p, foreach=False, **kwargs)
    for step in range(6):
        for opt, ps in ((ours, ours_p), (ref, ref_p)):
            opt.zero_grad(set_to_none=True)
            for p, g in zip(ps, _grads(step, ps)):
                p.grad = g.clone()
            opt.step()
        for a, b in zip(ours_p, ref_p):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    # either state dict resumes the other, exactly
    for src, dst_cls in ((ref, ours_cls), (ours, lambda ps, **kw: torch_cls(ps, foreach=False, **kw))):
        a_p, b_p = [p.detach().clone().requires_grad_() for p in ours_p], [p.detach().clone().requires_grad_()
                                                                           for p in ours_p]
        a = ours_cls(a_p, **kwargs)
        a.load_state_dict(ref.state_dict())
        b = dst_cls(b_p, **kwargs)
        b.load_state_dict(src.state_dict())
        for opt, ps in ((a, a_p), (b, b_p)):
            for p, g in zip(ps, _grads(99, ps)):
                p.grad = g.clone()
            opt.step()
        for x, y in zip(a_p, b_p):
            torch.testing.assert_close(x, y, rtol=1e-13, atol=1e-13)


def test_state_dict_layout_is_torch_optims():
    ps = _params(1)
    ours, ref = Adam(ps, lr=0.1), torch.optim.Adam(_params(1), lr=0.1)
    for opt, params in ((ours, ps), (ref, ref.param_groups[0]["params"])):
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
    a, b = ours.state_dict(), ref.state_dict()
    assert set(a["state"]) == set(b["state"]) == {0, 1}
    assert set(a["state"][0]) == set(b["state"][0])
    assert a["param_groups"][0]["params"] == b["param_groups"][0]["params"] == [0, 1]


def test_mismatched_state_dict_is_refused():
    opt = SGD(_params(0), lr=0.1)
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]})


def test_training_does_not_import_torch_dynamo():
    code = (
        "import sys, tempfile, numpy as np\n"
        "from pipeline.models import ModelConfig, build_model\n"
        "from pipeline.train import TrainConfig, fit\n"
        "rng = np.random.default_rng(0)\n"
        "data = [rng.integers(0, 4, 60) for _ in range(4)]\n"
        "m = build_model(ModelConfig(model='gru', input_dim=4, output_dim=4, obs_dim=4, state_dim=5,"
        " discrete=True))\n"
        "fit(m, data, data[:1], TrainConfig(epochs=1, bptt=10, batch_size=2, device='cpu'),"
        " checkpoint_path=tempfile.mktemp(suffix='.pt'))\n"
        "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
