"""Timing and memory measurements: what every benchmark of flashlib measures with.

On a GPU, times are ``triton.testing.do_bench`` medians (warm-up, cache flush,
CUDA events). In the interpreter we time with ``time.perf_counter`` and *say so*:
those numbers measure numpy, not a kernel, and are only for seeing that the
benchmark runs. Also here: peak memory of one call, the GPU's measured ceilings
(copy bandwidth, matmul peak) and the tiled matmul's comparison table.
"""
from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
from typing import Callable, Iterable

import torch

from . import runtime


def time_ms(fn: Callable[[], object], warmup: int = 25, rep: int = 100, grad_to_none=None) -> float:
    """Median milliseconds of ``fn()``: do_bench on a GPU, perf_counter in the interpreter.

    On the GPU ``warmup`` and ``rep`` are milliseconds (as in do_bench); in the
    interpreter they are clamped to a couple of calls. ``grad_to_none``: tensors whose
    ``.grad`` is reset before each call (so a timed backward does not accumulate).
    """
    if not runtime.INTERPRET:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none,
                                             return_mode="median"))

    def call():
        for t in grad_to_none or ():
            t.grad = None
        fn()

    return _cpu_time_ms(call, rep)


def graph_time_ms(fn: Callable[[], object], rep: int = 20, **kwargs):
    """``triton.testing.do_bench_cudagraph(fn, rep, **kwargs)`` (GPU time alone: the calls replayed from a CUDA
    graph) after draining the device.

    do_bench_cudagraph warms up and captures on a stream it creates, which does not wait for the caller's
    stream (triton-lang/triton#10312, open): inputs still being written there are read unfinished. On the
    H100 a paged cache's block table was read before its copy ended and the decoding kernel went to an
    illegal address (benchmarks/TUNING.md, twenty-fourth finding).
    """
    import triton.testing

    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=rep, **kwargs)


def _cpu_time_ms(call: Callable[[], object], rep: int, warmup_budget_s: float = 2.0) -> float:
    """Median milliseconds of ``call()`` off the GPU, after a warm-up that lasts until it is stable.

    The first calls pay one-off costs (thread pools, allocations, lazy imports) that can be
    a thousand times one call of a small op; the warm-up goes on until two calls in a row
    agree within 25% (at most 10 calls or ``warmup_budget_s``). A call shorter than a few
    milliseconds is repeated inside each sample, so the clock's resolution does not count.
    """
    previous, started = None, time.perf_counter()
    for _ in range(10):
        begin = time.perf_counter()
        call()
        last = time.perf_counter() - begin
        if previous is not None and abs(last - previous) <= 0.25 * max(last, previous):
            break
        previous = last
        if time.perf_counter() - started > warmup_budget_s:
            break
    inner = min(1000, max(1, int(0.005 / max(last, 1e-7))))
    samples = []
    for _ in range(max(1, min(rep, 5 if last < 0.2 else 3))):
        begin = time.perf_counter()
        for _ in range(inner):
            call()
        samples.append((time.perf_counter() - begin) * 1e3 / inner)
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


def free_memory() -> None:
    """Collect garbage and return cached CUDA blocks (between measurements, and after a failure)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure_ceilings(warmup: int = 25, repeat: int = 100) -> dict:
    """The GPU's measured roofs: a 1 GiB device-to-device copy and an 8192^3 fp16 matmul.

    None for both in the interpreter (numpy has no roofline worth drawing).
    """
    if runtime.DEVICE.type != "cuda":
        return {"hbm_gb_per_s": None, "matmul_tflops": None}
    ceilings = {"hbm_gb_per_s": _copy_gb_per_s(warmup, repeat), "matmul_tflops": _matmul_peak(warmup, repeat)}
    free_memory()
    return ceilings


def _copy_gb_per_s(warmup: int, repeat: int) -> float:
    src = torch.rand(2 ** 28, device="cuda")  # 1 GiB of float32
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup, repeat)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9  # read + write


def _matmul_peak(warmup: int, repeat: int) -> float:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2))
    return matmul_tflops(8192, 8192, 8192, time_ms(lambda: a @ b, warmup, repeat))
