"""Timing and memory measurements, and the benchmark command line.

On a GPU, times are ``triton.testing.do_bench`` medians (warm-up, cache flush,
CUDA events). In the interpreter we time with ``time.perf_counter`` and *say so*:
those numbers measure numpy, not a kernel, and are only for seeing that the
benchmark runs.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Callable, Iterable

import torch

from . import runtime


def time_ms(fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds of ``fn()``: do_bench on a GPU, perf_counter in the interpreter.

    On the GPU ``warmup`` and ``rep`` are milliseconds (as in do_bench); in the
    interpreter they are clamped to a couple of calls.
    """
    if not runtime.INTERPRET:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    fn()  # warm-up: the interpreter has no compile step, but torch may allocate
    samples = []
    for _ in range(max(1, min(rep, 3))):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


@contextlib.contextmanager
def _stderr_silenced():
    """Hide what C++ writes to file descriptor 2 (the profiler's start/stop lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_bytes(fn: Callable[[], object]) -> int:
    """Peak memory allocated *by* ``fn()`` above what was allocated before it.

    CUDA: torch's allocator statistics. CPU: torch's profiler, which records every
    allocation and free of CPU tensors; we replay them to find the peak.
    """
    if runtime.DEVICE.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with _stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # Allocations are charged to the op that made them (its *self* memory), frees
    # appear as "[memory]" events with negative sizes; replay them in time order.
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def matmul_tflops(m: int, n: int, k: int, ms: float) -> float:
    """2·M·N·K floating-point operations in ``ms`` milliseconds, in TFLOP/s."""
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


class BenchmarkRunner:
    """Times a function against torch on a list of sizes and prints a comparison."""

    def __init__(self, dtype: torch.dtype = torch.float16, warmup: int = 25, rep: int = 100):
        self.dtype = dtype if not runtime.INTERPRET else torch.float32
        self.warmup, self.rep = warmup, rep

    def benchmark_matmul(self, fn: Callable, sizes: Iterable[tuple[int, int, int]],
                         baseline: Callable = torch.matmul) -> list[dict]:
        """Time ``fn(a, b)`` and ``baseline(a, b)`` for each (M, N, K); return rows."""
        results = []
        for m, n, k in sizes:
            a = torch.randn(m, k, device=runtime.DEVICE, dtype=self.dtype)
            b = torch.randn(k, n, device=runtime.DEVICE, dtype=self.dtype)
            ms_fn = time_ms(lambda: fn(a, b), self.warmup, self.rep)
            ms_base = time_ms(lambda: baseline(a, b), self.warmup, self.rep)
            results.append(dict(
                M=m, N=n, K=k, dtype=str(self.dtype).replace("torch.", ""),
                ms=ms_fn, baseline_ms=ms_base,
                tflops=matmul_tflops(m, n, k, ms_fn), baseline_tflops=matmul_tflops(m, n, k, ms_base),
                speedup=ms_base / ms_fn, interpreter=runtime.INTERPRET,
            ))
        return results


def print_comparison_table(results: list[dict], name: str = "triton", baseline: str = "torch") -> None:
    """Print one line per size: times, TFLOP/s and speedup versus the baseline."""
    if not results:
        print("(no results)")
        return
    print(f"{'M':>6} {'N':>6} {'K':>6} {name + ' ms':>12} {baseline + ' ms':>12} "
          f"{name + ' TFLOP/s':>16} {baseline + ' TFLOP/s':>16} {'speedup':>8}")
    for r in results:
        print(f"{r['M']:>6} {r['N']:>6} {r['K']:>6} {r['ms']:>12.3f} {r['baseline_ms']:>12.3f} "
              f"{r['tflops']:>16.3g} {r['baseline_tflops']:>16.3g} {r['speedup']:>7.2f}x")
    if any(r["interpreter"] for r in results):
        print("Note: these are Triton *interpreter* timings on the CPU (numpy), not GPU kernel "
              "timings; they say nothing about speed on a GPU.")


def main(argv: list[str] | None = None) -> None:
    """``python -m flashlib.bench``: the matmul benchmark table."""
    from .matmul import triton_matmul

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    parser.add_argument("--warmup", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args(argv)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    print(runtime.mode_description())
    runner = BenchmarkRunner(dtype=dtype, warmup=args.warmup, rep=args.repeat)
    print_comparison_table(runner.benchmark_matmul(triton_matmul, runtime.sizes("matmul_sweep")),
                           name="flashlib", baseline="torch")


if __name__ == "__main__":
    main()
