"""The CUDA path: training, evaluation, checkpoints and forecasts on a GPU agree with the CPU.

Skipped where torch sees no CUDA device (CI has none); run on a GPU machine with ``pytest tests/test_cuda.py``.
The CPU runs the PSRNN recurrences in compiled C with a hand-written backward, CUDA in Triton kernels (torch ops
without triton; cuDNN for the LSTM/GRU/RNN), so the two agree to float32 rounding, not bitwise: a few epochs of
BPTT keep the metrics within 1e-3 relative.
"""

import math

import numpy as np
import pytest
import torch

from pipeline.api import fit_model, load_fitted
from pipeline.data.synthetic import make_hmm_dataset, make_lgssm_dataset
from pipeline.train import TrainConfig, fit, load_checkpoint, resolve_device

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

RTOL = 1e-3


@pytest.fixture(scope="module")
def discrete():
    ds, _ = make_hmm_dataset(n_states=4, n_symbols=6, n_train=12, n_test=3, length=80, seed=0)
    return ds


@pytest.fixture(scope="module")
def continuous():
    ds, _ = make_lgssm_dataset(state_dim=2, obs_dim=2, n_train=12, n_test=4, length=50, seed=0)
    return ds


DISCRETE = {
    "psrnn": dict(model="psrnn"),
    # this toy 2-layer run is chaotic at a high rate: float32 rounding alone (C vs torch ops on one CPU) moves
    # epoch 1 by 10% at lr 1 and epoch 2 by 3% at lr 0.1 (with the 2SR draws of f7e4e77); at 0.03 they agree to 1e-6
    "psrnn_2layer": dict(model="psrnn", n_layers=2, lr=0.03),
    "factorized_psrnn": dict(model="factorized_psrnn", rank=8),
    "lstm": dict(model="lstm", lr=0.5),
    "gru": dict(model="gru", lr=0.5),
    "rnn": dict(model="rnn", lr=0.2),
}
CONTINUOUS = {
    "psrnn": dict(model="psrnn", lr=0.05),
    "factorized_psrnn": dict(model="factorized_psrnn", rank=8, lr=0.05),
    "kf": dict(model="kf", state_dim=2, lr=0.05),
    "lstm": dict(model="lstm", lr=0.05),
}


def _fit(data, options, device, discrete_data):
    kw = dict(state_dim=6, obs_dim=6, n_features=200, horizon=2, epochs=3, batch_size=4, seed=1)
    kw["bptt"] = 10 if discrete_data else 0
    return fit_model(data.train, data.test, device=device, **{**kw, **options})


@pytest.mark.parametrize("kind,name", [("discrete", n) for n in DISCRETE] + [("continuous", n) for n in CONTINUOUS])
def test_one_bptt_window_has_the_same_loss_and_gradient_on_cuda(kind, name, discrete, continuous):
    """The 2SR-initialised model, copied to the GPU: the loss of the first BPTT window and the gradient of every
    parameter agree with the CPU's (its compiled recurrence) to float32 rounding. cuDNN's TF32 (on by default for
    its RNNs, 10-bit mantissas: 1e-3 relative) is turned off here, so that the LSTM/GRU/RNN are held as tightly;
    the tolerance is relative to the largest gradient entry of the model (a parameter whose gradient is all
    cancellation, ~1e-8, has no digits to compare)."""
    import copy

    from pipeline.batching import make_streams
    from pipeline.metrics import masked_loss

    data, options = (discrete, DISCRETE[name]) if kind == "discrete" else (continuous, CONTINUOUS[name])
    cpu_model = _fit(data, {**options, "epochs": 0}, "cpu", kind == "discrete").model
    results = []
    for device, model in (("cpu", cpu_model), ("cuda", copy.deepcopy(cpu_model).to("cuda"))):
        streams = make_streams(data.train, 4, discrete=kind == "discrete").to(device, torch.float32)
        x, y, mask, reset = next(iter(streams.windows(10 if kind == "discrete" else 0)))
        model.train()
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            out, _ = model(x, model.init_state(streams.batch_size), reset)
            loss = masked_loss(out, y, mask, kind == "discrete")
            model.zero_grad(set_to_none=True)
            loss.backward()
        results.append((float(loss.detach()), {n: p.grad.detach().cpu() for n, p in model.named_parameters()}))
    (cpu_loss, cpu_grads), (gpu_loss, gpu_grads) = results
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-5)
    scale = max(float(g.abs().max()) for g in cpu_grads.values())
    for n, g in cpu_grads.items():
        np.testing.assert_allclose(gpu_grads[n].numpy(), g.numpy(), rtol=1e-4, atol=1e-5 * scale, err_msg=n)


def _curves(fitted, metric):
    return [h["test"][metric] for h in fitted.history]


@pytest.mark.parametrize("kind,name", [("discrete", n) for n in DISCRETE] + [("continuous", n) for n in CONTINUOUS])
def test_training_on_cuda_follows_the_cpu(kind, name, discrete, continuous):
    """The same 2SR initialisation and BPTT on both devices: every epoch's test metric (epoch 0 included) and the
    final weights agree to float32 rounding, and the CUDA model's own predictions match its metric."""
    data, options, metric = ((discrete, DISCRETE[name], "bpc") if kind == "discrete"
                             else (continuous, CONTINUOUS[name], "mse"))
    on_cpu = _fit(data, options, "cpu", kind == "discrete")
    on_gpu = _fit(data, options, "cuda", kind == "discrete")
    assert next(on_gpu.model.parameters()).device.type == "cuda"
    cpu_curve, gpu_curve = _curves(on_cpu, metric), _curves(on_gpu, metric)
    assert all(math.isfinite(v) for v in gpu_curve)
    np.testing.assert_allclose(gpu_curve, cpu_curve, rtol=RTOL, err_msg=f"{kind} {name}: test {metric} per epoch")
    assert gpu_curve[-1] != gpu_curve[0], "training must have moved"
    for (pname, a), b in zip(on_cpu.model.named_parameters(), on_gpu.model.parameters()):
        np.testing.assert_allclose(b.detach().cpu().numpy(), a.detach().numpy(), rtol=1e-2, atol=1e-4,
                                   err_msg=pname)
    again = on_gpu.evaluate(data.test)
    assert again[metric] == pytest.approx(gpu_curve[-1], rel=1e-5)


def test_auto_picks_cuda_and_resume_on_cuda_equals_uninterrupted_training(tmp_path, discrete):
    """``device: auto`` trains on the GPU; two epochs in one go equal one epoch, a checkpoint, a resume and one
    more epoch on the GPU (the checkpoint's RNG states must come back to the CPU for torch.set_rng_state)."""
    from pipeline.api import initialise_model
    from pipeline.models.common import ModelConfig

    assert resolve_device("auto").type == "cuda"

    def make():
        return initialise_model(ModelConfig(model="psrnn", discrete=True, input_dim=6, output_dim=6, state_dim=6,
                                            obs_dim=6, init="random"), seed=0)

    cfg = TrainConfig(epochs=2, lr=0.5, bptt=10, batch_size=4, seed=3, device="auto", optimizer="sgd", momentum=0.9)
    straight = make()
    r1 = fit(straight, discrete.train, discrete.test, cfg)
    assert next(straight.parameters()).device.type == "cuda"

    ck = tmp_path / "checkpoint.pt"
    fit(make(), discrete.train, discrete.test, TrainConfig(**{**cfg.__dict__, "epochs": 1}), checkpoint_path=ck)
    resumed = make()
    r2 = fit(resumed, discrete.train, discrete.test, cfg, checkpoint_path=ck)
    assert len(r2.history) == 3 and load_checkpoint(ck)["epoch"] == 2
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters()):
        np.testing.assert_allclose(b.detach().cpu().numpy(), a.detach().cpu().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_allclose([h["test"]["bpc"] for h in r2.history], [h["test"]["bpc"] for h in r1.history],
                               rtol=1e-5)


def test_a_cuda_checkpoint_resumes_on_the_cpu_and_back(tmp_path, continuous):
    """A run moved between devices mid-way (train.device may change on resume) continues from its checkpoint."""
    from pipeline.api import initialise_model
    from pipeline.models.common import ModelConfig

    def make():
        return initialise_model(ModelConfig(model="gru", discrete=False, input_dim=2, output_dim=2, state_dim=6,
                                            obs_dim=4, init="xavier"), seed=0)

    base = dict(lr=0.5, bptt=0, batch_size=4, seed=2)
    ck = tmp_path / "checkpoint.pt"
    fit(make(), continuous.train, continuous.test, TrainConfig(epochs=1, device="cuda", **base), checkpoint_path=ck)
    on_cpu = make()
    r = fit(on_cpu, continuous.train, continuous.test, TrainConfig(epochs=2, device="cpu", **base),
            checkpoint_path=ck)
    assert next(on_cpu.parameters()).device.type == "cpu" and [h["epoch"] for h in r.history] == [0, 1, 2]
    back = make()
    r = fit(back, continuous.train, continuous.test, TrainConfig(epochs=3, device="cuda", **base), checkpoint_path=ck)
    assert next(back.parameters()).device.type == "cuda" and [h["epoch"] for h in r.history] == [0, 1, 2, 3]
    assert all(math.isfinite(h["test"]["mse"]) for h in r.history)


@pytest.mark.parametrize("model", ["factorized_psrnn", "kf"])
def test_a_model_fitted_on_cuda_saves_and_loads_on_either_device(model, continuous, tmp_path):
    rank = {"rank": 5} if model == "factorized_psrnn" else {}
    fitted = fit_model(continuous.train, continuous.test, model=model, **rank,
                       state_dim=2 if model == "kf" else 5,
                       obs_dim=5, n_features=100, horizon=3, epochs=1, lr=0.05, batch_size=4, device="cuda")
    path = tmp_path / "fitted.pt"
    fitted.save(path)
    expected = fitted.predict(continuous.test)
    for device in ("cpu", "cuda"):
        again = load_fitted(path, device=device)
        assert next(again.model.parameters()).device.type == device
        for a, b in zip(again.predict(continuous.test), expected):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # forecasts feed each prediction back: on the GPU as on the CPU
    gpu = fitted.forecast(continuous.test, 5)
    cpu = load_fitted(path, device="cpu").forecast(continuous.test, 5)
    for a, b in zip(gpu, cpu):
        assert a.shape == (5, 2)
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_a_long_stream_filters_alike_on_both_devices(discrete):
    """Evaluation carries the state through chunks of 2048 steps: one 10 000-step stream gives the same BPC."""
    from pipeline.train import evaluate

    fitted = fit_model(discrete.train, discrete.test, model="factorized_psrnn", rank=8, state_dim=6, obs_dim=6,
                       n_features=200, horizon=2, epochs=0, device="cpu")
    stream = [np.tile(np.concatenate(discrete.train), 11)[:10_000]]
    on_cpu = evaluate(fitted.model, stream)
    on_gpu = evaluate(fitted.model.to("cuda"), stream)
    assert on_gpu["bpc"] == pytest.approx(on_cpu["bpc"], rel=1e-5)
    assert on_gpu["accuracy"] == pytest.approx(on_cpu["accuracy"], abs=2e-4)


def test_the_triton_kernels_run_on_cuda_and_equal_the_torch_ops_in_float64():
    """On CUDA the PSRNN recurrences run in the Triton kernels (when triton is importable, as with torch's CUDA
    wheels): compiled, in float64, their states and every gradient equal the torch-ops path's to 1e-12, with
    resets, a (V, d, d) table, and a degenerate step that falls back to q_init."""
    import importlib.util

    from pipeline import native
    from pipeline.models.psrnn import _CompiledRecurrence, _NormalizedRecurrence

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: CUDA runs the torch ops")
    g = torch.Generator().manual_seed(0)
    L, B, d, V = 12, 5, 20, 7
    dev = dict(device="cuda", dtype=torch.float64)
    table = (torch.randn(V, d, d, generator=g, dtype=torch.float64) / d ** 0.5).to(**dev)
    table[3] = 0.0                                            # with b = 0 below: a zero vector, q_init instead
    symbols = torch.randint(0, V, (L, B), generator=g).cuda()
    b = torch.zeros(d, **dev)
    q = torch.nn.functional.normalize(torch.randn(B, d, generator=g, dtype=torch.float64), dim=1).to(**dev)
    q_init = torch.nn.functional.normalize(torch.randn(d, generator=g, dtype=torch.float64), dim=0).to(**dev)
    reset = torch.zeros(L, B, dtype=torch.bool, device="cuda")
    reset[0, 1] = reset[6, 3] = True
    assert native.gpu_usable(d, table, b, q, q_init)
    assert bool((symbols == 3).any())
    weights = torch.randn(L, B, d, generator=g, dtype=torch.float64).to(**dev)
    results = []
    for fn in (_CompiledRecurrence, _NormalizedRecurrence):
        leaves = [t.clone().requires_grad_() for t in (table, b, q, q_init)]
        out = (fn.apply(native.gpu_kernels(), *leaves, reset, 1e-12, symbols) if fn is _CompiledRecurrence
               else fn.apply(leaves[0][symbols], *leaves[1:], reset, 1e-12))
        (out * weights).sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves])
    for name, a, r in zip(("out", "table", "b", "q", "q_init"), *results):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_the_triton_kernels_run_on_their_tensors_device_not_the_current_one():
    """Triton launches on the current device: a model on cuda:1 (train.device: cuda:1) while cuda:0 is current ran
    its recurrence on device 0 until the launches were put under ``torch.cuda.device_of``. On cuda:1, with cuda:0
    current, the states and every gradient equal the torch-ops path's on the CPU (float64, resets, a table)."""
    import importlib.util

    from pipeline import native
    from pipeline.models.psrnn import _CompiledRecurrence, _NormalizedRecurrence

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: CUDA runs the torch ops")
    g = torch.Generator().manual_seed(1)
    L, B, d, V = 9, 4, 6, 5
    table = torch.randn(V, d, d, generator=g, dtype=torch.float64) / d ** 0.5
    symbols = torch.randint(0, V, (L, B), generator=g)
    b = torch.randn(d, generator=g, dtype=torch.float64)
    q = torch.nn.functional.normalize(torch.randn(B, d, generator=g, dtype=torch.float64), dim=1)
    q_init = torch.nn.functional.normalize(torch.randn(d, generator=g, dtype=torch.float64), dim=0)
    reset = torch.zeros(L, B, dtype=torch.bool)
    reset[0, 1] = reset[4, 2] = True
    weights = torch.randn(L, B, d, generator=g, dtype=torch.float64)
    results = []
    with torch.cuda.device(0):
        for device in ("cuda:1", "cpu"):
            leaves = [t.to(device).requires_grad_() for t in (table, b, q, q_init)]
            if device == "cpu":
                out = _NormalizedRecurrence.apply(leaves[0][symbols], *leaves[1:], reset, 1e-12)
            else:
                assert torch.cuda.current_device() == 0 and native.gpu_usable(d, *leaves)
                out = _CompiledRecurrence.apply(native.gpu_kernels(), *leaves, reset.to(device), 1e-12,
                                                symbols.to(device))
                assert out.device == torch.device("cuda", 1)
            (out * weights.to(device)).sum().backward()
            results.append([out.detach().cpu()] + [t.grad.cpu() for t in leaves])
    for name, a, r in zip(("out", "table", "b", "q", "q_init"), *results):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12, msg=name)


def _require_triton(case):
    """Skip without triton (CUDA then runs the torch ops, which tests/test_native.py holds to the C loops); with
    it, the cells below must run in the Triton kernels, not silently in the torch ops."""
    import importlib.util

    from pipeline import native
    from pipeline.models.psrnn import _compiled_kernels

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: CUDA runs the torch ops")
    cuda = {k: case[k].to("cuda") for k in ("G", "b", "q", "qi")}
    assert _compiled_kernels(cuda["G"], cuda["b"], cuda["q"], cuda["qi"]) is native.gpu_kernels() is not None


@pytest.mark.parametrize("core", ["full", "symbols", "factorized", "factorized_symbols"])
@pytest.mark.parametrize("degenerate", [False, True])
def test_every_cell_on_cuda_equals_the_cpu_in_float64(core, degenerate):
    """The four cells through their public functions (which pick the Triton kernels on CUDA and the C loops on the
    CPU): states with and without gradients, and every gradient, agree in float64 to rounding, with resets and a
    degenerate step (z = 0: q_init) on both devices."""
    from test_native import CORES, _case

    _require_triton(_case(torch.float64))
    case = _case(torch.float64, degenerate=degenerate)
    fn, names = CORES[core]
    results = []
    for device in ("cpu", "cuda"):
        leaves = [case[n].detach().clone().to(device).requires_grad_() for n in names]
        extra = {"symbols": case["symbols"].to(device)} if core.endswith("symbols") else {}
        reset = case["reset"].to(device)
        out = fn(*leaves, reset, **extra)
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=device).reshape(out.shape)
        (out * weights).sum().backward()
        with torch.no_grad():
            out_nograd = fn(*[t.detach() for t in leaves], reset, **extra)
        results.append([t.detach().cpu() for t in (out, out_nograd, *(leaf.grad for leaf in leaves))])
    for name, a, r in zip(("out", "out without grad", *names), results[1], results[0]):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12, msg=f"{core}: {name}")


@pytest.mark.parametrize("core", ["full", "symbols", "factorized", "factorized_symbols"])
@pytest.mark.parametrize("grad", [True, False])
def test_a_nan_state_propagates_on_cuda(core, grad):
    """A NaN norm is no degenerate step in the Triton kernels either (they tested n > eps, false for NaN, and put
    q_init in its place: a model with a NaN weight scored finite metrics); the interpreter's check of this needs
    triton >= 3.9, so the compiled kernels are held to it here."""
    from test_native import CORES, _case

    case = {k: v.to("cuda") for k, v in _case(torch.float64).items()}
    _require_triton(case)
    case["b"][0] = math.nan
    fn, names = CORES[core]
    extra = {"symbols": case["symbols"]} if core.endswith("symbols") else {}
    with torch.set_grad_enabled(grad):
        out = fn(*[case[n].clone().requires_grad_(grad) for n in names], case["reset"], **extra)
    assert out.is_cuda and torch.isnan(out).all()


def test_second_order_gradients_on_cuda_equal_the_cpu():
    """create_graph=True through the CUDA cell recomputes it in torch ops (the Triton backward has no graph): a
    gradient penalty's gradient equals the CPU's."""
    from test_native import CORES, _case

    case = _case(torch.float64)
    _require_triton(case)
    fn, names = CORES["symbols"]
    grads = []
    for device in ("cpu", "cuda"):
        leaves = [case[n].detach().clone().to(device).requires_grad_() for n in names]
        out = fn(*leaves, case["reset"].to(device), symbols=case["symbols"].to(device))
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=device).reshape(out.shape)
        first = torch.autograd.grad((out * weights).sum() + out[..., 0].pow(3).sum(), leaves, create_graph=True)
        penalty = sum(g.square().sum() for g in first)
        grads.append([g.cpu() for g in torch.autograd.grad(penalty, leaves)])
    for name, a, r in zip(names, grads[1], grads[0]):
        torch.testing.assert_close(a, r, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_a_trained_run_predicts_evaluates_and_forecasts_alike_on_both_devices(kind, discrete, continuous, tmp_path):
    """``psrnn predict`` / ``forecast`` take ``--device auto``, so on a GPU machine they filter on CUDA: the files
    and metrics they write match the CPU's (predictions streamed in blocks, state carried across them; sampled
    draws come from numpy streams, so the devices draw alike where no probability sits within float32 rounding of
    a draw)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.inference import TrainedRun, forecast_file, predict_file

    data = discrete if kind == "discrete" else continuous
    fitted = fit_model(data.train, data.test, model="factorized_psrnn", rank=5, state_dim=5, obs_dim=5,
                       n_features=100, horizon=2, epochs=1, lr=0.05, batch_size=4, device="cpu")
    if kind == "discrete":
        run = TrainedRun(model=fitted.model, dataset="hmm", variant="f", seed=0, epoch=1, kind="discrete",
                         vocab=[str(10 * (i + 1)) for i in range(6)])
        raw = [np.asarray(run.vocab)[t] for t in data.test]
        cols = {"symbol": np.concatenate(raw)}
    else:
        run = TrainedRun(model=fitted.model, dataset="lgssm", variant="f", seed=0, epoch=1, kind="continuous",
                         features=["a", "b"], mean=np.array([1.0, -2.0]), std=np.array([3.0, 0.5]))
        raw = [t * run.std + run.mean for t in data.test]
        x = np.concatenate(raw)
        cols = {"a": x[:, 0], "b": x[:, 1]}
    ids = np.concatenate([np.full(len(t), i) for i, t in enumerate(raw)])
    steps = np.concatenate([np.arange(len(t)) for t in raw])
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"trajectory": ids, "step": steps, **cols}), src)
    tables = {}
    for device in ("cpu", "cuda"):
        summary = predict_file(run, src, tmp_path / f"pred_{device}.parquet", device=device, block_rows=7,
                               probabilities=kind == "discrete")
        assert next(run.model.parameters()).device.type == device
        forecast_file(run, src, tmp_path / f"fc_{device}.parquet", steps=6, sample=kind == "discrete", seed=3,
                      device=device)
        tables[device] = (summary, pq.read_table(tmp_path / f"pred_{device}.parquet"),
                          pq.read_table(tmp_path / f"fc_{device}.parquet"), run.evaluate(raw, device=device))
    (s_cpu, p_cpu, f_cpu, e_cpu), (s_gpu, p_gpu, f_gpu, e_gpu) = tables["cpu"], tables["cuda"]
    assert p_cpu.column_names == p_gpu.column_names and f_cpu.column_names == f_gpu.column_names
    for cpu_table, gpu_table, rtol in ((p_cpu, p_gpu, 1e-4), (f_cpu, f_gpu, 1e-3)):
        for name in cpu_table.column_names:
            a, b = cpu_table.column(name), gpu_table.column(name)
            if pa.types.is_list(a.type):   # the probabilities per row
                a, b = pa.concat_arrays(a.chunks).flatten(), pa.concat_arrays(b.chunks).flatten()
            a, b = a.to_numpy(zero_copy_only=False), b.to_numpy(zero_copy_only=False)
            if a.dtype.kind == "f":
                np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol / 10, err_msg=name)
            else:   # symbols too: no argmax or draw of this data sits within float32 rounding of a flip
                assert a.tolist() == b.tolist(), name
    for key, value in e_cpu.items():
        assert e_gpu[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for key in s_cpu["metrics"]:
        assert s_gpu["metrics"][key] == pytest.approx(s_cpu["metrics"][key], rel=1e-4, abs=1e-6), key
