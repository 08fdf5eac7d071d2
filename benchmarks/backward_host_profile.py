"""Where an eager backward's host time goes at the grid's shortest points, read by cProfile on a GPU host.

    PYTHONPATH=.:benchmarks python3 benchmarks/backward_host_profile.py [--dtype fp16] [--calls 200] [--top 25]

Why: at head_dim 128, N = 1024 an eager backward took 380-630 µs of host time a call on an H100 host even with
every kernel launched from the compiled-binary cache (benchmarks/TUNING.md, sixtieth finding), against 11-26 µs
for a no-op Triton launch; on a slow host that bounds the call. Which Python it is was not known.

Each point's backward (through the graph of one forward, as ``short_rows_probe.py`` times it) runs ``--calls``
times with autograd's multithreading off, so that the backward's Python runs on this thread where cProfile sees it
(on autograd's device thread it costs more still: TUNING.md, seventh finding), and the device drained after each
call so that no launch waits on a full queue. Printed per point: the host time a call measured the same way with
and without the profiler, then the profile's functions by their own time and by their cumulative time.
Points: the Gluon route (B = 16, H = 16, N = 1024, D = 128) and the Triton route (one head of 128 rows), causal
and not.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
from short_rows_probe import eager_call

from flashlib import runtime
from flashlib.bench_results import DTYPES

#: (name, batch, heads, N, head_dim)
POINTS = (("gluon route", 16, 16, 1024, 128), ("triton route", 1, 1, 128, 128))


def host_us_drained(call, calls: int, profile: cProfile.Profile | None = None) -> float:
    """Microseconds of host time a call, each call started on a drained device (so no launch waits on the
    queue) and, with ``profile``, profiled alone (the drain is outside it)."""
    total = 0.0
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        if profile is not None:
            profile.enable()
        try:
            call()
        finally:
            if profile is not None:
                profile.disable()
        total += time.perf_counter() - start
    torch.cuda.synchronize()
    return total / calls * 1e6


def stats_text(profile: cProfile.Profile, sort: str, top: int) -> str:
    """The profile's ``top`` functions by ``sort`` ("tottime" or "cumulative"), as pstats prints them."""
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats(sort).print_stats(top)
    return out.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="fp16", choices=sorted(DTYPES))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    if runtime.INTERPRET:
        parser.error("needs a CUDA GPU: the interpreter's backward is not the GPU's")
    for name, batch, heads, n, d in POINTS:
        for causal in (False, True):
            call = eager_call("bwd", causal, DTYPES[args.dtype], n, d, batch, heads)
            with torch.autograd.set_multithreading_enabled(False):
                for _ in range(5):  # compile, autotune, remember the binaries
                    call()
                plain = host_us_drained(call, args.calls)
                profile = cProfile.Profile()
                profiled = host_us_drained(call, args.calls, profile)
            print(f"=== {name}: {args.dtype} B={batch} H={heads} N={n} D={d} causal={causal}: host a call "
                  f"{plain:.1f} µs ({profiled:.1f} µs profiled), autograd on this thread", flush=True)
            print(stats_text(profile, "tottime", args.top), flush=True)
            print(stats_text(profile, "cumulative", args.top), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
