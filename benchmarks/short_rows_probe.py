"""Why the grid's N = 1024 points at head_dim 128 run far below the same kernels' CUDA-graph A/Bs, some runs only.

Sessions 53 and 66 measured, in full grids (``python -m flashlib.bench``, eager calls timed by do_bench), the
forward without a mask and the causal backward at D = 128, N = 1024 (B = 16, H = 16) at 0.65-0.70x cuDNN, where
the A/B scripts replaying the same kernels from CUDA graphs, and session 55's grid of those points alone, had them
level with it (benchmarks/TUNING.md, forty-third and fifty-ninth findings). Each of these calls is 0.25-0.9 ms of
GPU work. The probe tells apart, in one process and for each point:

- the grid's own measurement (``flashlib.bench.run_attention_benchmark``), repeated ``--rounds`` times: a first
  round slower than the next ones says warm-up (clocks, lazy initialisation), not the kernels;
- the GPU time alone: the same eager call replayed from a CUDA graph (a backward's: a training step's less a
  forward's, since a captured backward needs its forward in the same capture);
- the host's time per eager call: ``--calls`` calls issued back to back without a sync (the GPU's queue absorbs
  them), so the host is the bound when this exceeds the GPU time; the same at one head of 128 rows, where the
  GPU idles (and where the Triton kernels take the call, not the Gluon ones: a difference is the sizes' or the
  routes');
- whether the call synchronizes with the host at all (``torch.cuda.set_sync_debug_mode("error")``);
- with ``--gluon-launch-cache``, the host time a call with the Gluon kernels launched through ``JITFunction.run``
  and from the compiled-binary cache (``flashlib.kernels.launch.GLUON_DESCRIPTORS`` off, then on: the default
  since session 67, when this measured it), and the ratio of the two.

    PYTHONPATH=.:benchmarks python3 benchmarks/short_rows_probe.py [--dtype fp16,bf16] [--N 1024] [--rounds 3]
        [--gluon-launch-cache]

One JSON line per (dtype, mode, causal, N), then nothing else; the columns are TFLOP/s and µs.
"""
from __future__ import annotations

import argparse
import json
from unittest import mock

import torch
from front_door import host_us

from flashlib import flash_attention, runtime
from flashlib.bench import fa2_shape, run_attention_benchmark
from flashlib.bench_results import DTYPES
from flashlib.io_model import attention_flops
from flashlib.kernels import launch as launch_module
from flashlib.timing import graph_time_ms

#: (mode, causal) of the points that ran slow in the full grids.
POINTS = (("fwd", False), ("bwd", True), ("bwd", False), ("fwd", True))


def inputs(dtype: torch.dtype, n: int, d: int, batch: int, heads: int):
    """Fresh q, k, v (leaves that want a gradient) and dO."""
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(batch, heads, n, d, device="cuda", dtype=dtype)


def eager_call(mode: str, causal: bool, dtype: torch.dtype, n: int, d: int, batch: int, heads: int):
    """The grid's timed call at (mode, causal): a forward; a backward through the graph of one forward; or, for
    a CUDA graph (whose capture must hold the forward that the backward's stream comes from), a training step."""
    q, k, v, do = inputs(dtype, n, d, batch, heads)
    if mode == "fwd":
        return lambda: flash_attention(q, k, v, causal=causal)
    if mode == "train":
        def step():
            q.grad = k.grad = v.grad = None
            flash_attention(q, k, v, causal=causal).backward(do)
        return step
    o = flash_attention(q, k, v, causal=causal)

    def backward():
        q.grad = k.grad = v.grad = None
        o.backward(do, retain_graph=True)
    return backward


def host_us_per_call(call, calls: int) -> float:
    """Microseconds of host time a call: one loop of ``calls`` calls issued without a sync after a drained device
    (few enough that the GPU's queue absorbs their work at these sizes)."""
    return host_us(call, calls, warmup=1, repeats=1)


def host_syncs(call) -> str:
    """"none", or the first device-to-host synchronization the call makes (torch's sync debug mode)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
        return "none"
    except RuntimeError as exc:
        return str(exc).splitlines()[0][:200]
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def gpu_ms(mode: str, causal: bool, dtype: torch.dtype, n: int, d: int, batch: int, heads: int) -> float:
    """The call's GPU time alone, replayed from a CUDA graph; a backward's is a training step's less a forward's."""
    if mode == "fwd":
        return graph_time_ms(eager_call("fwd", causal, dtype, n, d, batch, heads))
    step = graph_time_ms(eager_call("train", causal, dtype, n, d, batch, heads))
    return step - graph_time_ms(eager_call("fwd", causal, dtype, n, d, batch, heads))


def host_us_gluon(call, calls: int, cached: bool) -> float:
    """:func:`host_us_per_call` with the Gluon kernels launched from the compiled-binary cache (``cached``) or
    through ``JITFunction.run`` (``flashlib.kernels.launch.GLUON_DESCRIPTORS``); the switch is put back after."""
    with mock.patch.object(launch_module, "GLUON_DESCRIPTORS", cached):
        return host_us_per_call(call, calls)


def probe(dtype: str, mode: str, causal: bool, n: int, d: int, rounds: int, calls: int,
          gluon_cached: bool = False) -> dict:
    """One point's grid rounds (flashlib and cuDNN), its GPU time from CUDA graphs, its host time a call at this
    size and at one head of 128 rows (where the GPU idles), and whether the call syncs with the host; with
    ``gluon_cached``, its host time a call with the Gluon kernels launched through ``JITFunction.run`` and from
    the cache."""
    row = dict(dtype=dtype, mode=mode, causal=causal, N=n, D=d)
    for r in range(rounds):
        for res in run_attention_benchmark(modes=(mode,), dtypes=(dtype,), causals=(causal,), head_dims=(d,),
                                           seq_lens=(n,), impls=("flashlib", "sdpa_cudnn"), log=lambda _: None):
            row[f"{res['impl']}_tflops_round{r}"] = None if res["tflops"] is None else round(res["tflops"], 1)
    batch, heads = fa2_shape(n, d)
    call = eager_call(mode, causal, DTYPES[dtype], n, d, batch, heads)
    row["syncs"] = host_syncs(call)
    row["host_us"] = round(host_us_per_call(call, calls), 1)
    if gluon_cached:
        row["host_us_gluon_run"] = round(host_us_gluon(call, calls, cached=False), 1)
        row["host_us_gluon_cached"] = round(host_us_gluon(call, calls, cached=True), 1)
        row["gluon cached/run"] = round(row["host_us_gluon_cached"] / row["host_us_gluon_run"], 3)
    row["host_us_one_small_head"] = round(host_us_per_call(
        eager_call(mode, causal, DTYPES[dtype], 128, d, 1, 1), calls), 1)
    try:
        ms = gpu_ms(mode, causal, DTYPES[dtype], n, d, batch, heads)
    except Exception as exc:  # noqa: BLE001 (the host times and the grid's rounds still stand)
        row["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return row
    row["graph_tflops"] = round(attention_flops(batch, heads, n, d, causal=causal, mode=mode) / (ms * 1e-3) / 1e12, 1)
    row["gpu_us"] = round(ms * 1e3, 1)
    row["host_bound"] = row["host_us"] > row["gpu_us"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="fp16,bf16")
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--N", default="1024")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--gluon-launch-cache", action="store_true",
                        help="also the host time a call with the Gluon kernels launched through JITFunction.run "
                             "and from the compiled-binary cache")
    args = parser.parse_args(argv)
    if runtime.INTERPRET:
        parser.error("needs a CUDA GPU: the interpreter's times say nothing about the host or the kernels")
    for dtype in args.dtype.split(","):
        for n in (int(x) for x in args.N.split(",")):
            for mode, causal in POINTS:
                row = probe(dtype, mode, causal, n, args.d, args.rounds, args.calls, args.gluon_launch_cache)
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
