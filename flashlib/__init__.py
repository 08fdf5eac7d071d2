"""flashlib: FlashAttention built step by step in Triton.

Importing flashlib first decides where Triton kernels run (see
:mod:`flashlib.runtime`): on a CUDA GPU, or in Triton's interpreter on the CPU.
"""
from . import runtime  # noqa: F401  (must come first: sets TRITON_INTERPRET)
from .gpu import detect_gpu, print_gpu_info
from .matmul import triton_matmul
from .attention import flash_attention, flash_attention_v2
from .decode import flash_attention_with_kvcache
from .variants import select_variant
from .varlen import flash_attention_varlen, pack_sequences, unpack_sequences
from .reference import naive_attention, sdpa_attention, stable_softmax
from .validation import relative_error, validate_attention, validate_matmul

__all__ = [
    "runtime", "detect_gpu", "print_gpu_info", "triton_matmul", "flash_attention", "flash_attention_v2",
    "flash_attention_varlen", "flash_attention_with_kvcache", "select_variant", "pack_sequences", "unpack_sequences",
    "naive_attention", "sdpa_attention", "stable_softmax",
    "relative_error", "validate_attention", "validate_matmul",
]
__version__ = "0.1.0"
