"""``make demo``: run each finished kernel once, check it, and print what it did.

Headless and quick in the interpreter; on a GPU it also prints a short timing
table. Every line says whether the kernel agreed with the float64 reference.
"""
from __future__ import annotations

import torch

from . import runtime
from .attention import flash_attention
from .timing import BenchmarkRunner, print_comparison_table
from .gpu import print_gpu_info
from .matmul import triton_matmul
from .validation import validate_attention, validate_matmul


def _verdict(ok: bool) -> str:
    return "ok " if ok else "FAIL"


def _attention_demos():
    """(name, fn, causal) for the attention kernels of the library."""
    return [("flash_attention", flash_attention, False), ("flash_attention causal", flash_attention, True)]


def run_demo() -> bool:
    """Run the demos; return True when every kernel matched its reference."""
    print_gpu_info()
    print()
    all_ok = True
    m, n, k = runtime.sizes("matmul")
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    for dtype in dtypes:
        ok, diff = validate_matmul(triton_matmul, m, n, k, dtype=dtype, seed=0)
        all_ok &= ok
        print(f"[{_verdict(ok)}] triton_matmul {m}x{k} @ {k}x{n} {str(dtype)[6:]:>8}: max |diff| vs float64 = {diff:.2e}")
    shape = runtime.sizes("attention")
    for name, fn, causal in _attention_demos():
        for dtype in (torch.float32, torch.float16):
            ok, diff = validate_attention(fn, shape["batch"], shape["heads"], shape["seq_len"], shape["head_dim"],
                                          dtype=dtype, causal=causal, seed=0)
            all_ok &= ok
            print(f"[{_verdict(ok)}] {name} {tuple(shape.values())} {str(dtype)[6:]:>8}: max |diff| = {diff:.2e}")
    print()
    runner = BenchmarkRunner(dtype=torch.float16)
    print_comparison_table(runner.benchmark_matmul(triton_matmul, runtime.sizes("matmul_sweep")[:2]),
                           name="flashlib", baseline="torch")
    print()
    print("All kernels agree with the reference." if all_ok else "Some kernels disagree with the reference!")
    return all_ok


def main() -> None:
    raise SystemExit(0 if run_demo() else 1)


if __name__ == "__main__":
    main()
