"""How far the autotuner's pick lands from the best config, and how much it changes from run to run.

    PYTHONPATH=.:benchmarks python benchmarks/autotune_spread.py [--d 64,128] [--N 4096,16384]
        [--causal both] [--kernels fwd,dkdv,dq] [--repeats 3] [--extra-stages 4,5]
        [--extra-configs 64x64/3/8,32x64/3/8] [--time-budget S]

For each FA2 shape (fp16) and each of the three tuned kernels (forward, dK/dV, dQ), each kernel
launched alone:

1. **reference**: every config of the library's list, timed in a CUDA graph (``do_bench_cudagraph``,
   the host out of the measurement), median;
2. **picks**: the autotuner run ``--repeats`` times from scratch (``launch.forget()``), once with
   Triton's default benchmarker (``do_bench``: L2 flushed before each run, CUDA events around each
   launch) and once with ``do_bench_cudagraph``; each pick is scored by its reference time.

``--extra-stages``: the reference also times each listed config at these pipeline depths (a sweep
for configs the list lacks; the picks still choose among the list's own). ``--extra-configs``: configs
(BLOCK_MxBLOCK_N/stages/warps) the reference also times, for each kernel of ``--kernels``. ``--repeats 0``: no picks.
Compiling comes first, in parallel worker processes (``schedule_ab.warm_all``). Output: one line per
(shape, kernel, benchmarker) and a JSON file in --out. benchmarks/TUNING.md quotes the results.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import triton
import triton.testing

from flashlib.kernels import attention_bwd, attention_fwd, launch
from flashlib.spec import AttentionSpec
from flashlib.timing import graph_time_ms
from schedule_ab import (ORIGINAL_CONFIGS, TUNED, candidates, label, parse_configs, shape_grid, tensors, warm_all,
                         write_results)


def triton_default(fn, quantiles):
    """What the autotuner uses unless told otherwise."""
    return triton.runtime.driver.active.get_benchmarker()(fn, quantiles=quantiles)


def in_a_graph(fn, quantiles):
    """The candidate: a CUDA graph of many launches, so the host's own time is not measured."""
    return graph_time_ms(fn, rep=100, quantiles=quantiles, return_mode="median")


BENCHMARKERS = {"do_bench": triton_default, "cudagraph": in_a_graph}


def kernel_calls(n: int, d: int, causal: bool):
    """One closure per tuned kernel, each launching that kernel alone on FA2 shapes."""
    q, k, v, do = tensors(n, d, torch.float16, seed=n + d)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    spec = AttentionSpec(causal=causal)
    attention_fwd.launch_attention_forward(q, k, v, o, lse, spec=spec)
    return {
        "fwd": lambda: attention_fwd.launch_attention_forward(q, k, v, o, lse, spec=spec),
        "dkdv": lambda: attention_bwd.launch_attention_backward(q, k, v, o, lse, do, None, dk, dv, spec=spec),
        "dq": lambda: attention_bwd.launch_attention_backward(q, k, v, o, lse, do, dq, None, None, spec=spec),
    }


def only(kernel: str, configs) -> None:
    """Give ``kernel``'s autotuner these configs and forget every earlier choice."""
    TUNED[kernel].configs = list(configs)
    launch.forget()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", default="64,128")
    parser.add_argument("--N", default="4096,16384")
    parser.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    parser.add_argument("--kernels", default=",".join(TUNED))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--extra-stages", default="", help="e.g. 4,5: also time the list's configs at these depths")
    parser.add_argument("--extra-configs", default="", help="e.g. 64x64/3/8: also time these configs")
    parser.add_argument("--time-budget", type=float, default=520.0)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    start = time.time()
    head_dims, ns, causals, out = shape_grid(args)
    extra_stages = [int(x) for x in args.extra_stages.split(",") if x]
    kernels = args.kernels.split(",")
    extra_configs = parse_configs(args.extra_configs)
    reports = warm_all(["longest"], head_dims, causals, "fp16", out, extra_stages, kernels, extra_configs)
    print(f"# compiled in {time.time() - start:.0f} s", flush=True)
    rows = []
    for d in head_dims:
        for causal in causals:
            report = reports.get(("longest", d, causal), {})
            for n in ns:
                if time.time() - start > args.time_budget:
                    print(f"# time budget reached: D{d} causal={causal} N{n} skipped", flush=True)
                    continue
                calls = kernel_calls(n, d, causal)
                for kernel, call in calls.items():
                    if kernel not in kernels:
                        continue
                    if time.time() - start > args.time_budget:
                        print(f"# time budget reached: D{d} causal={causal} N{n} {kernel} skipped", flush=True)
                        continue
                    vars(TUNED[kernel]).pop("best_config", None)
                    call()
                    if "best_config" not in vars(TUNED[kernel]):  # session 55, on an H100: the forward went by it
                        raise SystemExit(f"{kernel}: this GPU's launch does not run schedule_ab.TUNED[{kernel!r}] "
                                         "(Hopper's forward has kernels of its own), so its picks cannot be watched")
                    compiled = set(report.get(kernel, {}).get("ok", ()))
                    configs = [c for c in ORIGINAL_CONFIGS[kernel] if label(c) in compiled]
                    reference = {}
                    for config in [c for c in candidates(kernel, extra_stages, extra_configs)
                                   if label(c) in compiled]:
                        only(kernel, [config])
                        call()
                        reference[label(config)] = graph_time_ms(call, rep=100, return_mode="median") * 1e3
                    best = min((label(c) for c in configs), key=reference.get)
                    swept = min(reference, key=reference.get)
                    if swept != best:
                        print(f"D{d} N{n:5d} causal={causal!s:5} {kernel:4s} sweep: {swept} {reference[swept]:8.1f} us, "
                              f"{(1 - reference[swept] / reference[best]) * 100:.1f}% under the list's best {best}",
                              flush=True)
                    rows.append(dict(d=d, n=n, causal=causal, kernel=kernel, benchmarker=None, best=best,
                                     best_us=reference[best], swept=swept, swept_us=reference[swept], picks=[],
                                     losses=[], reference_us=reference))
                    for name, bench in BENCHMARKERS.items() if args.repeats else ():
                        vars(TUNED[kernel])["do_bench"] = bench  # the autotuner's benchmarker (a cached property)
                        picks = []
                        for _ in range(args.repeats):
                            only(kernel, configs)
                            call()
                            picks.append(label(TUNED[kernel].best_config))
                        losses = [reference[p] / reference[best] - 1 for p in picks]
                        row = dict(d=d, n=n, causal=causal, kernel=kernel, benchmarker=name, best=best,
                                   best_us=reference[best], picks=picks, losses=losses, reference_us=reference)
                        rows.append(row)
                        print(f"D{d} N{n:5d} causal={causal!s:5} {kernel:4s} {name:9s} best {best:13s} "
                              f"{reference[best]:8.1f} us  picks " + ", ".join(
                                  f"{p} (+{loss * 100:.1f}%)" for p, loss in zip(picks, losses)), flush=True)
                    vars(TUNED[kernel]).pop("do_bench", None)
                    only(kernel, ORIGINAL_CONFIGS[kernel])
                    write_results(out, "autotune_spread_fp16", rows)
    for name in BENCHMARKERS:
        losses = [loss for r in rows if r["benchmarker"] == name for loss in r["losses"]]
        if losses:
            print(f"# {name}: mean loss {statistics.mean(losses) * 100:.2f}%, max {max(losses) * 100:.1f}%, "
                  f"picks off the best {sum(loss > 0 for loss in losses)} of {len(losses)}, "
                  f"over 2% {sum(loss > 0.02 for loss in losses)}", flush=True)



if __name__ == "__main__":
    main()
