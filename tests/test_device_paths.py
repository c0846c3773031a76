"""What of the CUDA path can be checked without a GPU: device names, how often training copies a number from the
device to the host (each copy waits for the device), and that the Triton kernels launch on their tensors' device
without waiting for it. tests/test_cuda.py runs the same paths on a GPU."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline import native
from pipeline.models.common import ModelConfig, SequenceModel
from pipeline.train import TrainConfig, fit, resolve_device


class _ScalarReads(TorchDispatchMode):
    """Counts the reads of a tensor's values into Python (``item``, ``float``, ``bool``, ``tolist``, ``numpy``):
    on CUDA each is a copy to the host that waits for every queued kernel. ``tolist`` and ``numpy`` of a CPU
    tensor dispatch no op, so they are counted by wrapping them for the duration."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self._saved = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in ("tolist", "numpy"):
            self._saved[name] = torch.Tensor.__dict__.get(name)   # None: inherited from torch._C.TensorBase
            original = getattr(torch.Tensor, name)

            def counted(t, *args, _original=original, **kwargs):
                self.count += 1
                return _original(t, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)


def test_a_cuda_index_is_resolved_by_number(monkeypatch):
    """train.device accepts cuda:<digits> (pipeline.train_config.DEVICE), leading zeros included; torch.device's
    parser refuses 'cuda:01' ("Invalid device string"), which escaped resolve_device as a RuntimeError on a GPU
    machine instead of meaning cuda:1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:01") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda") and resolve_device("cuda").index is None
    assert resolve_device("auto").type == "cuda"
    with pytest.raises(ValueError, match=r"^train\.device='cuda:2': this machine has 2 CUDA devices"):
        resolve_device("cuda:2")


class _Linear(SequenceModel):
    """A model whose forward reads no value into Python; it notes the count of ``reads`` at each training forward,
    so that the reads between two consecutive ones are one training step's."""

    def __init__(self, reads):
        super().__init__(ModelConfig(model="rnn", discrete=False, input_dim=2, output_dim=2))
        self.lin = torch.nn.Linear(2, 2)
        self.reads, self.at_forward = reads, []

    def init_state(self, batch_size):
        return (torch.zeros(batch_size, 1, device=self.lin.weight.device),)

    def forward(self, x, state, reset=None):
        if self.training:
            self.at_forward.append(self.reads.count)
        return self.lin(x), tuple(state)


def test_training_reads_one_number_per_step_from_the_device():
    """A training step copies the loss and the gradient norm to the host once: it did four times (whether the
    window has a target, the loss's finiteness, its value, the norm's finiteness), each a wait for the device on
    CUDA. Counted on the CPU by a dispatch mode, between consecutive forwards of the training loop."""
    rng = np.random.default_rng(0)
    data = [rng.standard_normal((n, 2)).astype(np.float32) for n in (12, 9, 7, 30, 5, 11)]
    with _ScalarReads() as reads:
        model = _Linear(reads)
        fit(model, data, data[:2], TrainConfig(epochs=2, lr=0.01, bptt=4, batch_size=3, device="cpu"))
    per_step = np.diff(model.at_forward)
    assert len(per_step) >= 10
    # within an epoch one read per step; across the epoch boundary, also the epoch's evaluation
    assert sorted(per_step)[:-1] == [1] * (len(per_step) - 1), per_step


def test_the_triton_kernels_launch_on_their_tensors_device_without_waiting(monkeypatch):
    """Triton launches a kernel on the current CUDA device and its stream, whatever device the tensors are on: a
    model on cuda:1 while cuda:0 is current (train.device: cuda:1) ran its recurrence on device 0. Both launches
    must be inside ``torch.cuda.device_of`` of their tensors. And a forward reads one number from the device (the
    symbols' bounds), a backward none (a reset window was first tested with ``reset.any()``, the bounds read
    twice). The kernels themselves are replaced here (no GPU); tests/triton_interpreted.py runs them."""
    pytest.importorskip("triton")
    from pipeline.native import triton_kernels

    guarded: list[torch.Tensor] = []
    launches: list[tuple[str, bool]] = []

    class DeviceOf:
        def __init__(self, t):
            self.t = t

        def __enter__(self):
            guarded.append(self.t)

        def __exit__(self, *exc):
            guarded.remove(self.t)

    class Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                launches.append((self.name, bool(guarded) and all(a.device == guarded[-1].device
                                                                  for a in tensors)))
            return launch

    monkeypatch.setattr(torch.cuda, "device_of", DeviceOf)
    monkeypatch.setattr(triton_kernels, "_full_forward_kernel", Kernel("forward"))
    monkeypatch.setattr(triton_kernels, "_full_backward_kernel", Kernel("backward"))
    L, B, d, V = 5, 3, 4, 6
    G, b, q, q_init = torch.zeros(V, d, d), torch.zeros(d), torch.zeros(B, d), torch.zeros(d)
    idx = torch.randint(0, V, (L, B), generator=torch.Generator().manual_seed(0))
    reset = torch.zeros(L, B, dtype=torch.bool)
    with _ScalarReads() as reads:
        out, inputs, norms = triton_kernels.full_forward(G, b, q, q_init, reset, 1e-12, idx=idx)
    assert reads.count == 1
    with _ScalarReads() as reads:   # grad_G=False: torch's one_hot checks its indices on the CPU (not on CUDA)
        triton_kernels.full_backward(G, inputs, out, norms, reset, 1e-12, torch.zeros(L, B, d), idx=idx,
                                     grad_G=False)
    assert reads.count == 0
    assert launches == [("forward", True), ("backward", True)]
    with pytest.raises(IndexError, match=r"symbol index out of range \[0, 6\): min 6, max 6"):
        triton_kernels.full_forward(G, b, q, q_init, reset, 1e-12, idx=torch.full((L, B), V))


def test_the_c_kernels_refuse_a_tensor_that_is_not_in_host_memory():
    """The C loops read every pointer as host memory: a CUDA reset or symbol tensor beside a CPU model (evaluate
    with device='cuda' and the model left on the CPU) was passed through and crashed the process. The meta device
    stands in for CUDA here."""
    if native.library() is None:
        pytest.skip("no C compiler: the C kernels are not built")
    L, B, d, V = 4, 2, 3, 5
    G = torch.zeros(V, d, d)
    out = torch.full((L, B, d), 0.5)
    norms = torch.ones(L, B)
    idx = torch.zeros(L, B, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="got a tensor on meta"):
        native.full_backward(G, out, out, norms, None, 1e-12, out, idx=idx)
    assert native._ptr(None) is None and native._ptr(G) == G.data_ptr()


def test_check_refuses_a_device_this_machine_lacks(tmp_path, defaults, capsys, monkeypatch):
    """`psrnn check` said valid to train.overrides.<v>.device: cuda on a machine without CUDA; refine stopped on it
    after the spectral stages. Where CUDA is present, one index past the last GPU is the device it lacks."""
    import copy

    from pipeline import cli
    from pipeline.config import dump_yaml

    monkeypatch.delenv("PSRNN_DEBUG", raising=False)
    raw = copy.deepcopy(defaults)
    raw["datasets"] = ["hmm"]
    del raw["custom"]   # its file is not in tmp_path
    bad = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    raw["hmm"]["train"]["overrides"] = {"gru": {"device": bad}}
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 1
    assert capsys.readouterr().err.startswith(
        f"psrnn check: error: hmm.train.overrides.gru.device='{bad}': "
        + ("this machine has" if torch.cuda.is_available() else "CUDA is not available"))
    raw["datasets"] = ["lgssm"]   # a dataset left out of datasets is not trained: its devices are not asked for
    (tmp_path / "params.yaml").write_text(dump_yaml(raw))
    assert cli.main(["--root", str(tmp_path), "check"]) == 0
