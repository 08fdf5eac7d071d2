"""Where flashlib runs: on a CUDA GPU, or in Triton's interpreter on the CPU.

Triton decides between compiling a kernel and interpreting it when the kernel is
*decorated* with ``@triton.jit``, by reading ``TRITON_INTERPRET``.  This module is
imported first by ``flashlib/__init__.py``, so the choice is made before any kernel
of flashlib (or of a notebook that imported flashlib) is defined:

* the user set ``TRITON_INTERPRET`` → we respect it;
* no CUDA device → we set ``TRITON_INTERPRET=1`` (the interpreter, on CPU tensors);
* a CUDA device → kernels are compiled for it.

It is also the one place that answers "which device?" and "how big?" for the
notebooks, so that the course runs large on a GPU and small in the interpreter.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

TRITON_IMPORTED_TOO_EARLY = (
    "triton was imported before flashlib chose the interpreter: triton.language's own "
    "helpers (tl.cdiv, tl.maximum, ...) were built for a GPU, and kernels that call them "
    "fail in the interpreter with \"Cannot call @triton.jit'd outside of the scope of a "
    "kernel\". Import flashlib before triton, or set TRITON_INTERPRET=1 before starting "
    "Python (then restart the kernel)."
)

TRITON_MISSING = (
    "flashlib needs Triton, which cannot be imported here: Triton publishes wheels for Linux only, "
    "so on macOS or Windows run the course in a Linux container or WSL2 (README: 'Two commands'), "
    "and on Linux install it with pip install triton"
)


def _choose_mode() -> bool:
    """Set ``TRITON_INTERPRET`` if the user did not, and return whether we interpret."""
    if "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"
        chosen_by = "flashlib"
        if os.environ["TRITON_INTERPRET"] == "1" and "triton.language" in sys.modules:
            warnings.warn(TRITON_IMPORTED_TOO_EARLY, RuntimeWarning, stacklevel=3)
    else:
        chosen_by = "user"
    globals()["MODE_CHOSEN_BY"] = chosen_by
    return os.environ["TRITON_INTERPRET"] == "1"


MODE_CHOSEN_BY = "flashlib"
#: True when Triton kernels run in the interpreter (numpy, on the CPU).
INTERPRET: bool = _choose_mode()
try:
    import triton  # noqa: E402,F401 - only now, after TRITON_INTERPRET is chosen
except ImportError as _error:
    raise ImportError(TRITON_MISSING) from _error

#: The device on which flashlib makes tensors: the GPU, or the CPU for the interpreter.
DEVICE: torch.device = torch.device("cpu" if INTERPRET else "cuda")


def is_interpreter() -> bool:
    """True when kernels run in Triton's interpreter (slow, CPU, no performance)."""
    return INTERPRET


def mode_description() -> str:
    """One line saying where kernels run, for notebooks and benchmark tables."""
    if INTERPRET:
        return ("Triton interpreter on the CPU (TRITON_INTERPRET=1, set by "
                f"{MODE_CHOSEN_BY}): results are exact, timings are not GPU timings")
    return f"CUDA GPU: {torch.cuda.get_device_name()} (Triton compiles kernels)"


def pick(gpu, cpu):
    """Return ``gpu`` on a GPU and ``cpu`` in the interpreter: sizes for notebooks."""
    return cpu if INTERPRET else gpu


#: Named problem sizes shared by the notebooks: (GPU value, interpreter value).
_SIZES = {
    # one attention problem to look at
    "attention": (dict(batch=4, heads=16, seq_len=2048, head_dim=64),
                  dict(batch=1, heads=2, seq_len=128, head_dim=32)),
    # sequence lengths for sweeps (memory and time versus N)
    "seq_lens": ([256, 512, 1024, 2048, 4096, 8192],
                 [64, 128, 256, 512]),
    # one matmul problem (M, N, K)
    "matmul": ((4096, 4096, 4096), (192, 160, 96)),
    # matmul sizes for a benchmark table
    "matmul_sweep": ([(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
                      (4096, 4096, 4096)],
                     [(64, 64, 64), (128, 128, 64), (128, 96, 80)]),
    # block sizes for the block-size experiment (heat map)
    "block_sizes": ([16, 32, 64, 128, 256], [16, 32, 64]),
    # one decoding problem: a batch of sequences with a KV cache (notebook 09)
    "decode": (dict(batch=8, heads=32, heads_kv=8, cache_len=8192, head_dim=128, page_size=256),
               dict(batch=3, heads=8, heads_kv=2, cache_len=256, head_dim=32, page_size=32)),
}


def sizes(name: str):
    """Problem sizes by name, large on a GPU and small in the interpreter.

    >>> sizes("attention")["seq_len"] in (128, 2048)
    True
    """
    if name not in _SIZES:
        raise KeyError(f"Unknown problem-size name {name!r}; known: {sorted(_SIZES)}")
    gpu, cpu = _SIZES[name]
    return pick(gpu, cpu)


def dot_safe_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which a kernel may feed ``tl.dot`` for inputs of ``dtype``.

    Triton's interpreter multiplies the *bit patterns* of bfloat16 in ``tl.dot``
    (Triton issue 11584), which gives garbage silently. In the interpreter we
    therefore compute bfloat16 problems in float32 and cast the result back.
    """
    if INTERPRET and dtype == torch.bfloat16:
        return torch.float32
    return dtype


def dot_precision(dtype: torch.dtype) -> str:
    """The ``input_precision`` of ``tl.dot`` in flashlib's attention kernels for ``dtype`` inputs.

    float32 follows torch's float32 matmul setting, as ``torch.matmul`` does: full float32
    ("ieee") by default, TF32 (10-bit mantissa, tensor cores) once the user allows it with
    ``torch.backends.cuda.matmul.fp32_precision = "tf32"`` or the older
    ``torch.set_float32_matmul_precision("high")``. 16-bit inputs always use tensor cores;
    for them the value is Triton's default and changes nothing.
    """
    if dtype != torch.float32:
        return "tf32"
    setting = getattr(torch.backends.cuda.matmul, "fp32_precision", None)  # torch >= 2.9; reflects both APIs
    if setting is None:
        return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    return "tf32" if setting == "tf32" else "ieee"


def upcast_for_interpreter(*tensors: torch.Tensor):
    """Return the tensors, with bfloat16 ones upcast to float32 in the interpreter."""
    if not INTERPRET:  # on a GPU every dtype goes to tl.dot as it is (asked per launch: keep it cheap)
        return tensors
    return tuple(t.float() if t.dtype != dot_safe_dtype(t.dtype) else t for t in tensors)


def is_triton_kernel(obj) -> bool:
    """True for a ``@triton.jit`` function, compiled or interpreted (also autotuned)."""
    from triton.runtime.jit import KernelInterface

    return isinstance(obj, KernelInterface)


def manual_seed(seed: int = 0) -> torch.Generator:
    """Seed torch (CPU and GPU) and return a generator on the course's device."""
    torch.manual_seed(seed)
    return torch.Generator(device=DEVICE).manual_seed(seed)
