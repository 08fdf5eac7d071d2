"""One device call: GPU facts, then flashlib's attention timed beside SDPA's backends.

Run on the GPU machine from the repository root (the GPU-marked pytest suite is run
by the same call, see benchmarks/README.md):

    PYTHONPATH=. python3 benchmarks/gpu_check.py --out results.json

Shapes follow the FlashAttention-2 benchmarks (batch * seqlen = 16384,
heads * head_dim = 2048). FLOPs: 4·B·H·N²·D forward, halved when causal; backward
2.5x forward. Times are triton.testing.do_bench medians, all in one process.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform

import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlib
from flashlib import flash_attention
from flashlib.gpu import detect_gpu
from flashlib.validation import relative_error

BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}


def _sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _flashlib(q, k, v, causal):
    return flash_attention(q, k, v, causal=causal)


def _time(fn, q, k, v, causal, mode):
    if mode == "fwd":
        return triton.testing.do_bench(lambda: fn(q, k, v, causal), warmup=50, rep=200, return_mode="median")
    o = fn(q, k, v, causal)
    do = torch.randn_like(o)
    return triton.testing.do_bench(lambda: o.backward(do, retain_graph=True), warmup=50, rep=200,
                                   grad_to_none=[q, k, v], return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", default="1024,4096,16384")
    parser.add_argument("--d", default="64,128")
    args = parser.parse_args()
    info = detect_gpu()
    rows = []
    impls = {"flashlib": _flashlib, **{name: _sdpa(b) for name, b in BACKENDS.items()}}
    for d in (int(x) for x in args.d.split(",")):
        for n in (int(x) for x in args.n.split(",")):
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                torch.manual_seed(0)
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True)
                           for _ in range(3))
                ref = impls["sdpa_flash"](q, k, v, causal)
                err = relative_error(_flashlib(q, k, v, causal), ref)
                fwd_flops = 4 * b * h * n * n * d / (2 if causal else 1)
                for mode in ("fwd", "bwd"):
                    flops = fwd_flops * (2.5 if mode == "bwd" else 1.0)
                    for name, fn in impls.items():
                        try:
                            ms = _time(fn, q, k, v, causal, mode)
                            tflops = flops / (ms * 1e-3) / 1e12
                        except Exception as exc:  # a backend may not support a shape
                            ms, tflops = None, None
                            print(f"{name} {mode} N={n} D={d} causal={causal}: {type(exc).__name__}: {exc}")
                        rows.append(dict(impl=name, mode=mode, N=n, D=d, causal=causal, batch=b, heads=h,
                                         dtype="fp16", ms=ms, tflops=tflops,
                                         flashlib_rel_err_vs_sdpa=err if name == "flashlib" else None))
                del q, k, v
                torch.cuda.empty_cache()
    result = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=info.as_dict(), torch=torch.__version__, triton=triton.__version__,
        flashlib=flashlib.__version__, python=platform.python_version(),
        method="triton.testing.do_bench median, warmup 50 ms, rep 200 ms; fp16; FA2 benchmark shapes",
        rows=rows,
    )
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    print(f"{'mode':4} {'N':>6} {'D':>4} {'causal':>6} " + " ".join(f"{name:>11}" for name in impls))
    for d in sorted({r['D'] for r in rows}):
        for n in sorted({r['N'] for r in rows}):
            for causal in (False, True):
                for mode in ("fwd", "bwd"):
                    cells = []
                    for name in impls:
                        match = [r for r in rows if (r['impl'], r['mode'], r['N'], r['D'], r['causal'])
                                 == (name, mode, n, d, causal)]
                        t = match[0]['tflops'] if match else None
                        cells.append(f"{t:11.1f}" if t else f"{'-':>11}")
                    print(f"{mode:4} {n:>6} {d:>4} {str(causal):>6} " + " ".join(cells))


if __name__ == "__main__":
    main()
