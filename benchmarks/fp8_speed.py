"""FP8 forward against flashlib's own fp16 forward on the FlashAttention-2 benchmark shapes.

    python benchmarks/fp8_speed.py --out benchmarks/results/fp8_forward_<gpu>.json

B * N = 16384, H * D = 2048, q, k, v quantized per tensor (``flashlib.fp8.quantize_fp8``),
O in bfloat16; ``triton.testing.do_bench`` medians of ``flash_attention``. Also reports O's
relative error against the float64 reference of the 16-bit inputs (quantization included).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform

import torch
import triton
import triton.testing

import flashlib
from flashlib import flash_attention
from flashlib.fp8 import quantize_fp8
from flashlib.reference import naive_attention
from flashlib.validation import relative_error


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--d", default="64,128")
    parser.add_argument("--N", default="1024,4096,16384")
    args = parser.parse_args()
    rows = []
    for d in map(int, args.d.split(",")):
        for n in map(int, args.N.split(",")):
            for causal in (False, True):
                batch, heads = 16384 // n, 2048 // d
                q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
                (q8, dq), (k8, dk), (v8, dv) = (quantize_fp8(t) for t in (q, k, v))
                fp8 = dict(q_descale=dq, k_descale=dk, v_descale=dv)
                t16 = triton.testing.do_bench(lambda: flash_attention(q, k, v, causal=causal), return_mode="median")
                t8 = triton.testing.do_bench(lambda: flash_attention(q8, k8, v8, causal=causal, **fp8),
                                             return_mode="median")
                flops = 4 * batch * heads * n * n * d / (2 if causal else 1)
                sub = slice(0, 1)  # one sample's first 2 heads against float64
                o8 = flash_attention(q8, k8, v8, causal=causal, **fp8)
                want = naive_attention(*(t[sub, :2].double() for t in (q, k, v)), causal=causal)
                rows.append(dict(d=d, n=n, batch=batch, heads=heads, causal=causal, fp16_ms=t16, fp8_ms=t8,
                                 fp16_tflops=flops / t16 / 1e9, fp8_tflops=flops / t8 / 1e9, speedup=t16 / t8,
                                 fp8_rel_error_vs_fp16_inputs=relative_error(o8[sub, :2], want)))
                print({key: round(val, 4) if isinstance(val, float) else val for key, val in rows[-1].items()},
                      flush=True)
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  flashlib=flashlib.__version__, python=platform.python_version(),
                  date=datetime.date.today().isoformat(), command="python benchmarks/fp8_speed.py", rows=rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
