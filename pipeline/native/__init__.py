"""The compiled sequential core of the PSRNN layers (``recurrence.c``), built on first use and loaded with ctypes.

Why C and not torch: a PSRNN step on PTB is a 20×20 matrix–vector product per chain. In torch each of the
~10 ops of a forward-plus-backward step costs 5–25 µs of dispatch for under 1 µs of arithmetic, so the cell ran at
half the speed of ``torch.nn.LSTM`` (whose loop is in C++). A plain C loop over the chains removes the dispatch.
Plain C through ctypes, not a torch C++ extension: it compiles in about a second with the system C compiler
(torch's headers take a minute and need ninja) and has no ABI tie to the torch build.

The library is compiled once per source version into a cache directory — ``$PSRNN_NATIVE_CACHE``, else
``$XDG_CACHE_HOME/psrnn-pipeline``, else ``~/.cache/psrnn-pipeline`` (a temporary directory if none is writable) —
written to a temporary file and renamed, so concurrent DVC stages never load half a library. Without a C compiler
(``$CC``, else ``cc``/``gcc``/``clang``), or with ``PSRNN_NATIVE=0``, :func:`library` returns None and the layers
use their pure-torch path, which computes the same numbers (tests hold the two together).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("recurrence.c")
SOURCES = (SOURCE, SOURCE.with_name("recurrence_impl.h"))   # the library is keyed by both
ABI = 9
# Reassociation lets the compiler vectorise the short dot products and sums, and fused multiply-adds are allowed
# (ISO C mode turns contraction off); results stay deterministic for a given binary, and NaN and Inf still
# propagate (unlike -ffast-math). -march=native: the cache key holds the CPU's identity.
CFLAGS = ("-O3", "-shared", "-fPIC", "-std=c99", "-ffp-contract=fast", "-fno-math-errno", "-fassociative-math",
          "-fno-signed-zeros", "-fno-trapping-math")
NATIVE_ARCH = ("-march=native",)

_ctypes_of = {torch.float32: "f32", torch.float64: "f64"}


class NativeBuildError(RuntimeError):
    pass


def enabled() -> bool:
    return os.environ.get("PSRNN_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def _cpu_identity() -> str:
    """Model and feature flags of this CPU: a library built with -march=native must not load on another CPU
    that shares the cache directory (a network home, say)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor()
    keep = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("model name", "flags", "Features",
                                                                          "CPU part")]
    return hashlib.sha256("\n".join(sorted(set(keep))).encode()).hexdigest()[:16]


def _cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("PSRNN_NATIVE_CACHE"):
        dirs.append(Path(os.environ["PSRNN_NATIVE_CACHE"]))
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    dirs.append(Path(base) / "psrnn-pipeline")
    dirs.append(Path(tempfile.gettempdir()) / f"psrnn-pipeline-{os.getuid() if hasattr(os, 'getuid') else 0}")
    return dirs


def build(cache_dir: Path | None = None) -> Path:
    """Compile ``recurrence.c`` (if not already cached) and return the shared library's path."""
    cc = _compiler()
    if cc is None:
        raise NativeBuildError("no C compiler found (set CC, or install gcc)")
    source = b"".join(f.read_bytes() for f in SOURCES)
    ident = " ".join((cc, *CFLAGS, *NATIVE_ARCH, platform.machine(), sys.platform, _cpu_identity()))
    key = hashlib.sha256(source + ident.encode()).hexdigest()[:16]
    name = f"psrnn_recurrence-{key}.so"
    errors = []
    for d in ([cache_dir] if cache_dir else _cache_dirs()):
        lib = d / name
        if lib.is_file():
            return lib
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=d)
            os.close(fd)
        except OSError as exc:
            errors.append(f"{d}: {exc}")
            continue
        try:
            for arch in (NATIVE_ARCH, ()):  # a compiler without -march=native still builds a portable library
                proc = subprocess.run([cc, *CFLAGS, *arch, "-o", tmp, str(SOURCE), "-lm"], capture_output=True,
                                      text=True, timeout=120)
                if proc.returncode == 0:
                    break
            if proc.returncode != 0:
                raise NativeBuildError(f"{cc} failed on {SOURCE}: {proc.stderr.strip().splitlines()[-1:]}")
            os.replace(tmp, lib)
            return lib
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NativeBuildError(f"{cc} could not build {SOURCE}: {exc}") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise NativeBuildError("no writable cache directory for the compiled recurrence: " + "; ".join(errors))


def _declare(lib: ctypes.CDLL) -> None:
    i, p, f = ctypes.c_int, ctypes.c_void_p, ctypes.c_double
    sigs = {
        "psrnn_full_forward": [i, i, i, p, i, p, p, p, p, p, f, p, p, p],
        "psrnn_full_backward": [i, i, i, p, p, p, p, p, p, f, p, p, p, p, p],
        "psrnn_factorized_forward": [i, i, i, i, p, p, p, p, p, p, p, p, f, p, p, p, p, p, p],
        "psrnn_factorized_backward": [i, i, i, i, p, p, p, p, p, p, p, p, f, p, p, p, p, p, p, p],
        "psrnn_rnn_layer_forward": [i, i, i, i, p, p, p, p, p, p, p, p],
        "psrnn_rnn_layer_backward": [i, i, i, i, p, p, p, p, p, p, p, p, p, p],
    }
    for stem, args in sigs.items():
        for suffix in ("f32", "f64"):
            fn = getattr(lib, f"{stem}_{suffix}")
            fn.argtypes = args
            fn.restype = None


@functools.lru_cache(maxsize=1)
def _load() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(str(build()))
        lib.psrnn_native_abi.restype = ctypes.c_int
        if lib.psrnn_native_abi() != ABI:
            raise NativeBuildError(f"compiled recurrence reports ABI {lib.psrnn_native_abi()}, expected {ABI}")
        _declare(lib)
        return lib
    except (NativeBuildError, OSError) as exc:
        warnings.warn(f"PSRNN native recurrence unavailable, using the slower torch path: {exc}", RuntimeWarning,
                      stacklevel=3)
        return None


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None when disabled (``PSRNN_NATIVE=0``) or when they cannot be built. The backward
    entry points take :func:`_load`'s instead: a backward runs on the kernels of its forward even if
    ``PSRNN_NATIVE`` changed in between (it had found None)."""
    return _load() if enabled() else None


def usable(*tensors: torch.Tensor) -> bool:
    """The kernels apply to CPU tensors of one floating dtype (float32/float64), when the library is available."""
    t0 = tensors[0]
    if t0.device.type != "cpu" or t0.dtype not in _ctypes_of:
        return False
    if any(t.device.type != "cpu" or t.dtype != t0.dtype for t in tensors):
        return False
    return library() is not None


# ------------------------------------------------------------------------------------------ CUDA (Triton)

#: the largest state dimension of the Triton kernels (a program holds one d x d step matrix in registers);
#: larger states run as torch ops on CUDA
GPU_MAX_DIM = 128


def gpu_enabled() -> bool:
    return os.environ.get("PSRNN_TRITON", "1").strip().lower() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=1)
def _load_gpu():
    try:
        from pipeline.native import triton_kernels
    except Exception as exc:  # triton absent or broken: the torch ops compute the same numbers, slower
        warnings.warn(f"PSRNN Triton kernels unavailable ({type(exc).__name__}: {exc}); the PSRNN recurrences "
                      "run as torch ops on CUDA (several times slower)", RuntimeWarning, stacklevel=3)
        return None
    return triton_kernels


def gpu_kernels():
    """:mod:`pipeline.native.triton_kernels`, or None when disabled (``PSRNN_TRITON=0``) or triton is missing."""
    return _load_gpu() if gpu_enabled() else None


def gpu_usable(state_dim: int, *tensors: torch.Tensor) -> bool:
    """The Triton kernels apply to CUDA tensors on one device, of one dtype (float32/float64), for a state of at
    most :data:`GPU_MAX_DIM` entries."""
    t0 = tensors[0]
    if t0.device.type != "cuda" or t0.dtype not in _ctypes_of or state_dim > GPU_MAX_DIM:
        return False
    if any(t.device != t0.device or t.dtype != t0.dtype for t in tensors):
        return False
    return gpu_kernels() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    """The address of ``t``'s data for the C loops, which read and write it as host memory: a tensor on another
    device (a CUDA ``reset`` or symbol tensor beside CPU weights) is refused instead of crashing the process."""
    if t is None:
        return None
    if t.device.type != "cpu":
        raise ValueError(f"the compiled CPU recurrence got a tensor on {t.device}; expected the model's inputs on "
                         "the model's device (cpu)")
    return t.data_ptr()


def _reset_bytes(reset: torch.Tensor | None) -> torch.Tensor | None:
    if reset is None or not bool(reset.any()):
        return None
    return reset.to(torch.uint8).contiguous()


# ----------------------------------------------------------------------------------------------- kernels


def full_forward(G, b, q0, q_init, reset, eps, idx=None, store_inputs=True):
    """q_{t+1} = n(G_t q_t + b): returns (out, inputs, norms) with shapes (L,B,d), (L,B,d), (L,B); inputs is None
    unless ``store_inputs`` (the loop writes them anyway: the argument is for the interface it shares with
    :func:`pipeline.native.triton_kernels.full_forward`).

    G is (L,B,d,d), or with ``idx`` (L,B) int64 a table (V,d,d) from which step t of chain b takes G[idx[t,b]];
    a table is passed to the loop transposed (its faster layout: axpys instead of dot products), which costs
    nothing at V·d² elements.
    """
    fn = getattr(library(), "psrnn_full_forward_" + _ctypes_of[G.dtype])
    transposed = idx is not None
    G = G.detach().transpose(1, 2) if transposed else G.detach()
    G, b, q0, q_init = (x.detach().contiguous() for x in (G, b, q0, q_init))
    L, B = (idx.shape if idx is not None else G.shape[:2])
    d = G.shape[-1]
    ix = _index(idx, G.shape[0])
    out = torch.empty((L, B, d), dtype=G.dtype)
    inputs = torch.empty_like(out)
    norms = torch.empty((L, B), dtype=G.dtype)
    rb = _reset_bytes(reset)
    args = (_ptr(G), int(transposed), _ptr(ix), _ptr(b), _ptr(q0), _ptr(q_init), _ptr(rb), float(eps),
            _ptr(inputs), _ptr(out), _ptr(norms))
    fn(L, B, d, *args)
    return out, (inputs if store_inputs else None), norms


def full_backward(G, inputs, out, norms, reset, eps, grad_out, idx=None, grad_G=True):
    """Returns (grad_z (L,B,d), grad_G (shape of G, or None), grad_q0 (B,d), grad_q_init (B,d) per chain)."""
    fn = getattr(_load(), "psrnn_full_backward_" + _ctypes_of[G.dtype])
    G, inputs, out, norms, grad_out = (x.detach().contiguous() for x in (G, inputs, out, norms, grad_out))
    L, B, d = out.shape
    ix = _index(idx, G.shape[0], check=False)
    grad_z = torch.empty((L, B, d), dtype=G.dtype)
    gG = None
    if grad_G:  # a symbol table's gradient is summed into by the loop; per-step gradients are written
        gG = torch.zeros_like(G) if ix is not None else torch.empty_like(G)
    g_q0 = torch.empty((B, d), dtype=G.dtype)
    g_init = torch.empty((B, d), dtype=G.dtype)
    rb = _reset_bytes(reset)
    fn(L, B, d, _ptr(G), _ptr(ix), _ptr(inputs), _ptr(out), _ptr(norms), _ptr(rb), float(eps), _ptr(grad_out),
       _ptr(grad_z), _ptr(gG), _ptr(g_q0), _ptr(g_init))
    return grad_z, gG, g_q0, g_init


def _index(idx: torch.Tensor | None, n_table: int, check: bool = True) -> torch.Tensor | None:
    """Symbol indices as contiguous int64, checked against the table (C does no bounds checks). The backward
    passes ``check=False``: it gets the indices its forward already checked."""
    if idx is None:
        return None
    ix = idx.detach().to(torch.int64).contiguous()
    if check and ix.numel():
        low, high = torch.stack(torch.aminmax(ix)).tolist()   # one copy to the host (on CUDA, one wait)
        if low < 0 or high >= n_table:
            raise IndexError(f"symbol index out of range [0, {n_table}): min {low}, max {high}")
    return ix


def factorized_forward(A, u, C, b, q0, q_init, reset, eps, keep=False, idx=None):
    """q_{t+1} = n(Aᵀ(u_t ⊙ C q_t) + b): returns (out, inputs, norms, cq, m), with cq = C q_t and m = u_t ⊙ C q_t
    (L,B,r) kept for the backward if ``keep``. u is (L,B,r), or with ``idx`` (L,B) a table (V,r) of symbols."""
    fn = getattr(library(), "psrnn_factorized_forward_" + _ctypes_of[A.dtype])
    A, u, b, q0, q_init = (x.detach().contiguous() for x in (A, u, b, q0, q_init))
    CT = C.detach().T.contiguous()
    L, B = (idx.shape if idx is not None else u.shape[:2])
    r, d = A.shape
    ix = _index(idx, u.shape[0])
    out = torch.empty((L, B, d), dtype=A.dtype)
    inputs = torch.empty_like(out)
    norms = torch.empty((L, B), dtype=A.dtype)
    cq = torch.empty((L, B, r), dtype=A.dtype) if keep else None
    m = torch.empty((L, B, r), dtype=A.dtype) if keep else None
    work = torch.empty((2 * r + d) * B, dtype=A.dtype)
    rb = _reset_bytes(reset)
    fn(L, B, d, r, _ptr(A), _ptr(CT), _ptr(u), _ptr(ix), _ptr(b), _ptr(q0), _ptr(q_init), _ptr(rb), float(eps),
       _ptr(inputs), _ptr(out), _ptr(norms), _ptr(cq), _ptr(m), _ptr(work))
    return out, inputs, norms, cq, m


def factorized_backward(A, u, C, cq, out, norms, reset, eps, grad_out, idx=None):
    """Returns (grad_z (L,B,d), grad_u (shape of u), w (L,B,r) = (A ∂z_t) ⊙ u_t, grad_q0 (B,d), grad_q_init (B,d)
    per chain)."""
    fn = getattr(_load(), "psrnn_factorized_backward_" + _ctypes_of[A.dtype])
    u, C, cq, out, norms, grad_out = (x.detach().contiguous() for x in (u, C, cq, out, norms, grad_out))
    AT = A.detach().T.contiguous()
    L, B, d = out.shape
    r = AT.shape[1]
    ix = _index(idx, u.shape[0], check=False)
    grad_z = torch.empty((L, B, d), dtype=AT.dtype)
    grad_u = torch.zeros_like(u) if ix is not None else torch.empty_like(u)
    w = torch.empty((L, B, r), dtype=AT.dtype)
    g_q0 = torch.empty((B, d), dtype=AT.dtype)
    g_init = torch.empty((B, d), dtype=AT.dtype)
    work = torch.empty((r + d) * B + d, dtype=AT.dtype)
    rb = _reset_bytes(reset)
    fn(L, B, d, r, _ptr(AT), _ptr(C), _ptr(u), _ptr(ix), _ptr(cq), _ptr(out), _ptr(norms), _ptr(rb), float(eps),
       _ptr(grad_out), _ptr(grad_z), _ptr(grad_u), _ptr(w), _ptr(g_q0), _ptr(g_init), _ptr(work))
    return grad_z, grad_u, w, g_q0, g_init


RNN_KINDS = {"rnn": 0, "gru": 1}   # torch's CPU LSTM is already a fused oneDNN loop


def rnn_layer_forward(kind: str, gi, W_hh, b_hh, h0, reset, keep_gates: bool = False):
    """One layer of torch.nn.RNN (tanh) / GRU (see ``psrnn_rnn_layer_forward``).

    gi (L,B,G·H) = x W_ihᵀ + b_ih, W_hh (G·H,H), b_hh (G·H), h0 (B,H), reset (L,B) bool or None (zero state
    before step t). Returns (out (L,B,H), h_L (B,H), gates): gates (L,B,4H) holds what the GRU's backward needs
    (``keep_gates``; None otherwise and for the RNN)."""
    k = RNN_KINDS[kind]
    fn = getattr(library(), "psrnn_rnn_layer_forward_" + _ctypes_of[gi.dtype])
    gi = gi.detach().contiguous()
    L, B, GH = gi.shape
    H = W_hh.shape[1]
    if GH != (1 if k == 0 else 3) * H or W_hh.shape[0] != GH:
        raise ValueError(f"{kind}: gate inputs of width {GH} for hidden size {H}")
    WhhT = W_hh.detach().T.contiguous()
    bhh = b_hh.detach().contiguous()
    h = h0.detach().clone(memory_format=torch.contiguous_format)
    out = torch.empty((L, B, H), dtype=gi.dtype)
    gates = torch.empty((L, B, 4 * H), dtype=gi.dtype) if keep_gates and k == 1 else None
    work = torch.empty(B * GH, dtype=gi.dtype)
    rb = _reset_bytes(reset)
    fn(k, L, B, H, _ptr(gi), _ptr(WhhT), _ptr(bhh), _ptr(rb), _ptr(h), _ptr(out), _ptr(gates), _ptr(work))
    return out, h, gates


def rnn_layer_backward(kind: str, W_hh, out, h0, gates, reset, grad_out):
    """The backward of :func:`rnn_layer_forward` (see ``psrnn_rnn_layer_backward``): returns (grad_gi, grad_gh,
    grad_h0), grad_gh (L,B,G·H) the gradient on gh_t = W_hh h_{t-1} + b_hh."""
    k = RNN_KINDS[kind]
    fn = getattr(_load(), "psrnn_rnn_layer_backward_" + _ctypes_of[out.dtype])
    L, B, H = out.shape
    GH = W_hh.shape[0]
    Whh = W_hh.detach().contiguous()
    grad_out = grad_out.contiguous()
    h0 = h0.detach().contiguous()   # held by a name: a temporary's memory would be freed before the call
    grad_gi = torch.empty((L, B, GH), dtype=out.dtype)
    grad_gh = torch.empty((L, B, GH), dtype=out.dtype)
    grad_h0 = torch.empty((B, H), dtype=out.dtype)
    work = torch.empty(3 * B * H, dtype=out.dtype)
    rb = _reset_bytes(reset)
    fn(k, L, B, H, _ptr(Whh), _ptr(out), _ptr(h0), _ptr(gates), _ptr(rb), _ptr(grad_out),
       _ptr(grad_gi), _ptr(grad_gh), _ptr(grad_h0), _ptr(work))
    return grad_gi, grad_gh, grad_h0
