"""Two forward programs an SM at D = 128: flashlib's forward with its registers capped so that two 8-warp
programs share each SM, against its configs as they compile today.

Why: at D = 128 the forward's 128 x 64 tiles with 8 warps take 138 registers a thread (sm_90a), so one
program of 256 threads fills more than half of an SM's 65536 registers and runs alone, although its
shared memory (98 KB with 2 stages) would let two fit. Alone, its two warpgroups reach the softmax at about
the same time, and the tensor cores wait. Capped at 128 registers (``maxnreg``), ptxas fits the same code in
126 without a spill (``sass_counts.py --kernel fwd --d 128 --configs 128x64/2/8 --maxnreg 128``); two
programs an SM can then interleave one's softmax with the other's matmuls, the overlap FlashAttention-3 gets
from its ping-pong of two warpgroups. At D = 64, 128 x 128 tiles with 2 stages take 156 registers and fit 124
capped.

Each config is flashlib's own kernel, launched as its launcher would launch it (arguments captured from
``launch_attention_forward`` with fixed blocks), its output checked against float64 at the first and last
heads, then timed alone in a CUDA graph (``do_bench_cudagraph`` median). The library's forward as routed
(``flashlib as routed``: on Hopper the Gluon kernel where it is preferred, else the autotuned Triton one; until
session 64 labelled "flashlib autotuned") and SDPA's cuDNN backend are timed in the same process.
FlashAttention-2 benchmark shapes (B N = 16384, H D = 2048).

    PYTHONPATH=. python3 benchmarks/fwd_two_per_sm.py --out fwd_two_per_sm.json [--dtype fp16] [--budget 150]

``--dropout P``: every launch drops with probability P (one seed); each config's O is then checked against the first
config's (the mask is a function of the position and the seed, not of the tiles), and the forward as routed is also
timed without dropout, for the cost of dropout.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton

from config_text import parse_config
from flashlib import flash_attention
from flashlib.bench import ATTENTION_IMPLS
from flashlib.bench_results import results_meta
from flashlib.kernels import attention_fwd
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec

#: (head_dim, "BLOCK_MxBLOCK_N/stages/warps", maxnreg or None)
CONFIGS = {
    128: [("128x64/3/8", None), ("128x64/2/8", None), ("128x64/2/8", 128), ("128x128/2/8", None)],
    64: [("128x64/3/8", None), ("128x128/2/8", None), ("128x128/2/8", 128)],
}


def captured_launch(q, k, v, o, lse, spec, block_m, block_n):
    """(kernel, grid, args, kwargs) of the launch ``launch_attention_forward`` makes with fixed blocks."""
    calls = []
    real = attention_fwd.launch
    attention_fwd.launch = lambda fn, grid, *args, **kwargs: calls.append((fn, grid, args, kwargs))
    try:
        attention_fwd.launch_attention_forward(q, k, v, o, lse, spec, block_m=block_m, block_n=block_n)
    finally:
        attention_fwd.launch = real
    (call,) = calls
    return call


def reference_error(q, k, v, o, causal):
    """Largest relative error (Frobenius) of O at the first head of the first sample and the last head of the
    last, against float64 naive attention of those heads alone (all of them would not fit at N = 16k)."""
    worst = 0.0
    for b, h in ((0, 0), (-1, -1)):
        ref = naive_attention(*(t[b, h][None, None].double() for t in (q, k, v)), causal=causal)[0, 0]
        worst = max(worst, ((o[b, h].double() - ref).norm() / ref.norm()).item())
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", default="128,64")
    parser.add_argument("--N", default="1024,4096,16384")
    parser.add_argument("--causal", default="no,yes")
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout probability of every launch (default 0)")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds after which no new shape starts")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    start, rows = time.time(), []
    meta = results_meta(command="PYTHONPATH=. python3 " + " ".join(sys.argv),
                        method="do_bench_cudagraph median (rep 20 ms) of one launch; FA2 shapes B N = 16384, "
                               "H D = 2048; rel_err: O against float64 at two heads")
    for d in [int(x) for x in args.d.split(",")]:
        for causal in [c == "yes" for c in args.causal.split(",")]:
            for n in [int(x) for x in args.N.split(",")]:
                if time.time() - start > args.budget:
                    print("budget spent: no new shape", flush=True)
                    break
                batch, heads = 16384 // n, 2048 // d
                q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=dtype) for _ in range(3))
                spec = AttentionSpec(causal=causal, dropout_p=args.dropout, dropout_seed=1234)
                flops = 4 * batch * heads * n * n * d / (2 if causal else 1)
                point = dict(d=d, n=n, causal=causal, dtype=args.dtype, dropout=args.dropout)
                first = None
                for text, cap in CONFIGS[d]:
                    block_m, block_n, stages, warps = parse_config(text)
                    o = torch.full_like(q, float("nan"))
                    lse = torch.empty(batch, heads, n, device="cuda")
                    fn, grid, call_args, kwargs = captured_launch(q, k, v, o, lse, spec, block_m, block_n)
                    kwargs = {**kwargs, "num_stages": stages, "num_warps": warps}
                    if cap:
                        kwargs["maxnreg"] = cap
                    name = f"{text}" + (f" maxnreg {cap}" if cap else "")
                    try:
                        compiled = fn[grid](*call_args, **kwargs)
                        torch.cuda.synchronize()
                        if args.dropout:  # the same mask whatever the tiles: against the first config's O
                            first = o.clone() if first is None else first
                            err = ((o.double() - first.double()).norm() / first.double().norm()).item()
                        else:
                            err = reference_error(q, k, v, o, causal)
                        ms = triton.testing.do_bench_cudagraph(lambda: fn[grid](*call_args, **kwargs), rep=20)
                        regs, spills = compiled.n_regs, compiled.n_spills
                    except Exception as error:  # out of resources
                        err = ms = regs = spills = None
                        name += f" ({type(error).__name__})"
                    rows.append(dict(point, impl=name, ms=ms, rel_err=err, registers=regs, spills=spills,
                                     tflops=flops / ms / 1e9 if ms else None))
                timed = [("flashlib as routed",
                          lambda: flash_attention(q, k, v, causal=causal, dropout_p=args.dropout)),
                         ("sdpa_cudnn", lambda: ATTENTION_IMPLS["sdpa_cudnn"](q, k, v, causal))]
                if args.dropout:
                    timed.append(("flashlib as routed, no dropout", lambda: flash_attention(q, k, v, causal=causal)))
                for name, call in timed:
                    call()
                    ms = triton.testing.do_bench_cudagraph(call, rep=20)
                    rows.append(dict(point, impl=name, ms=ms, tflops=flops / ms / 1e9))
                for r in rows:
                    if all(r[key] == value for key, value in point.items()):
                        tf = f"{r['tflops']:.0f}" if r.get("tflops") else "-"
                        print(f"D={d} N={n} causal={causal} {r['impl']:<26} {tf:>5} TFLOP/s  regs {r.get('registers')} "
                              f"spills {r.get('spills')} err {r.get('rel_err')}", flush=True)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
