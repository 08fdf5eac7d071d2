"""FP8 through the Gluon Hopper forward, checked and timed beside the Triton FP8 forward and flashlib's own 16-bit
forward, in one process on one GPU (issue 14: FP8 at least 1.4x flashlib's fp16 forward at N >= 4k, D = 128).

Checks first, each against the float64 reference of the dequantized inputs (O and L start as NaN, so an element
left unwritten fails): GQA 8/2, 1000 rows, per-tensor and per-head factors, D 64 and 128, causal or not, P through
shared memory and through registers, Q from registers and from shared memory (all four must agree exactly). Then the
FlashAttention-2 benchmark shapes (B * N = 16384, H * D = 2048), each call replayed from a CUDA graph
(``flashlib.timing.graph_time_ms``: GPU time alone), for

* ``fp16``: flashlib's fp16 forward as the launcher routes it (the Gluon forward at D = 128 from 1024 rows);
* ``fp8_triton``: FP8 through the Triton forward (``use_gluon=False``; what ``flash_attention`` runs at the head
  dims outside ``FP8_HEAD_DIMS``, the Gluon forward taking those inside);
* ``fp8_gluon``: FP8 through the Gluon forward (``use_gluon=True``), in its ``FP8_CONFIGS`` and in every
  ``--configs`` variant (``fp8_gluon_NAME``, checked against ``fp8_gluon``), with P entering P V from shared
  memory (its default, ``FP8_WEIGHTS_SHARED``) and from registers (``fp8_gluon_registers``), and with S reading Q
  from registers (its default, ``FP8_Q_IN_REGISTERS``) and from shared memory (``fp8_gluon_q_shared``): the same
  FP8 products, so every variant's O must equal ``fp8_gluon``'s;

with TFLOP/s (``flashlib.io_model.attention_flops``) and each FP8 time's speed-up over ``fp16``. Inputs: randn
quantized per tensor, V stored keys innermost, O in bfloat16.

    PYTHONPATH=.:benchmarks python3 benchmarks/gluon_fp8_ab.py [--d 128,64] [--N 1024,4096,16384]
        [--configs "s4=128:64,128,4;bn64=128:64,64,4"] [--no-checks] [--out FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import sys

import torch

import flashlib  # noqa: F401  (before triton: chooses the interpreter where there is no GPU)
from flashlib.bench import fa2_shape
from flashlib.fp8 import keys_innermost, quantize_fp8
from flashlib.io_model import attention_flops
from flashlib.kernels import attention_fwd_hopper as hopper
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec
from flashlib.timing import graph_time_ms
from flashlib.validation import relative_error
from gluon_fwd_ab import (config_in_place, config_variants, head_dims, positive_ints, print_row,
                          write_checks_and_timings)

#: O's and L's tolerances against the dequantized float64 reference (tests/test_fp8.py: P enters the tensor cores in
#: e4m3; FP8 tensor cores keep about 14 bits of their sums).
O_TOL, LSE_TOL = 3e-2, 1e-3


def quantized(batch, heads, heads_kv, n, d, per_head=False, seed=0):
    """FP8 q, k and V (keys innermost), their (3, B, H_kv) descale factors, and the float64 dequantized q, k, v."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    full = [torch.randn(batch, h, n, d, device="cuda", generator=gen) for h in (heads, heads_kv, heads_kv)]
    pairs = [quantize_fp8(t, per_head=per_head, kv_heads=heads_kv) for t in full]
    descale = torch.stack([s.expand(batch, heads_kv) for _, s in pairs]).contiguous()
    exact = []
    for (x8, s), h in zip(pairs, (heads, heads_kv, heads_kv)):
        factor = s.double().expand(batch, heads_kv).repeat_interleave(h // heads_kv, dim=1)[:, :, None, None]
        exact.append(x8.double() * factor)
    q8, k8, v8 = (x8 for x8, _ in pairs)
    return (q8, k8, keys_innermost(v8)), descale, exact


@contextlib.contextmanager
def weights_through(place: str, q_place: str = "registers"):
    """The Gluon forward's FP8 weights entering P V from ``place`` and S reading Q from ``q_place`` ("shared" or
    "registers"), restored on leaving."""
    saved = hopper.FP8_WEIGHTS_SHARED, hopper.FP8_Q_IN_REGISTERS
    hopper.FP8_WEIGHTS_SHARED, hopper.FP8_Q_IN_REGISTERS = place == "shared", q_place == "registers"
    try:
        yield
    finally:
        hopper.FP8_WEIGHTS_SHARED, hopper.FP8_Q_IN_REGISTERS = saved


def forward(q, k, v, causal, descale=None, use_gluon=None, out_dtype=torch.bfloat16):
    o = torch.full(q.shape, float("nan"), dtype=out_dtype if descale is not None else q.dtype, device=q.device)
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    launch_attention_forward(q, k, v, o, lse, AttentionSpec(causal=causal), descale=descale, use_gluon=use_gluon)
    return o, lse


def checks() -> list[dict]:
    rows = []
    for d in (128, 64):
        for causal in (False, True):
            for per_head in (False, True):
                (q8, k8, v8), descale, (q, k, v) = quantized(2, 8, 2, 1000, d, per_head)
                want, want_lse = naive_attention(q, k, v, causal=causal, return_lse=True)
                with weights_through("shared"):
                    o, lse = forward(q8, k8, v8, causal, descale, use_gluon=True)
                others = []
                for place, q_place in (("registers", "registers"), ("shared", "shared"), ("registers", "shared")):
                    with weights_through(place, q_place):
                        others.append(forward(q8, k8, v8, causal, descale, use_gluon=True))
                o_triton, _ = forward(q8, k8, v8, causal, descale, use_gluon=False)
                row = dict(case="gqa 8/2, 1000 rows", d=d, causal=causal, per_head=per_head,
                           o_error=relative_error(o, want), lse_error=relative_error(lse, want_lse),
                           o_triton_error=relative_error(o_triton, want), o_vs_triton=relative_error(o, o_triton),
                           variants_equal=all(torch.equal(o, o2) and torch.equal(lse, lse2) for o2, lse2 in others),
                           written=not (o.isnan().any() or lse.isnan().any()))
                row["status"] = "ok" if (row["written"] and row["o_error"] < O_TOL and row["lse_error"] < LSE_TOL
                                         and row["o_vs_triton"] < O_TOL and row["variants_equal"]) else "FAIL"
                print_row(row)
                rows.append(row)
    return rows


def timings(dims, lengths, configs) -> list[dict]:
    rows = []
    for d in dims:
        for n in lengths:
            for causal in (False, True):
                batch, heads = fa2_shape(n, d)
                (q8, k8, v8), descale, _ = quantized(batch, heads, heads, n, d)
                q16, k16, v16 = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16)
                                 for _ in range(3))
                flops = attention_flops(batch, heads, n, d, causal)
                row = dict(d=d, N=n, causal=causal, batch=batch, heads=heads)
                runs = {"fp16": lambda: forward(q16, k16, v16, causal),
                        "fp8_triton": lambda: forward(q8, k8, v8, causal, descale, use_gluon=False),
                        "fp8_gluon": lambda: forward(q8, k8, v8, causal, descale, use_gluon=True)}
                for name, run in runs.items():
                    row[f"{name}_ms"] = graph_time_ms(run, rep=100)
                o_gluon = runs["fp8_gluon"]()[0]
                for label, places in (("registers", ("registers", "registers")), ("q_shared", ("shared", "shared"))):
                    with weights_through(*places):
                        row[f"o_{label}_vs_fp8_gluon"] = relative_error(runs["fp8_gluon"]()[0], o_gluon)
                        row[f"fp8_gluon_{label}_ms"] = graph_time_ms(runs["fp8_gluon"], rep=100)
                for label, (config_d, config, _) in configs.items():
                    if config_d == d:
                        with config_in_place(hopper.FP8_CONFIGS, d, config):
                            row[f"o_{label}_vs_fp8_gluon"] = relative_error(runs["fp8_gluon"]()[0], o_gluon)
                            row[f"fp8_gluon_{label}_ms"] = graph_time_ms(runs["fp8_gluon"], rep=100)
                for key in [key for key in row if key.endswith("_ms")]:
                    row[key[:-3] + "_tflops"] = flops / row[key] / 1e9
                    if key.startswith("fp8"):
                        row[key[:-3] + "/fp16"] = row["fp16_ms"] / row[key]  # speed-up over fp16
                print_row(row)
                rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=head_dims, default="128,64")
    parser.add_argument("--N", type=positive_ints, default="1024,4096,16384")
    parser.add_argument("--configs", type=config_variants, default="",
                        help="other FP8 configs of the Gluon forward: 'NAME=D:BLOCK_M,BLOCK_N,STAGES;...'")
    parser.add_argument("--no-checks", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    check_rows = [] if args.no_checks else checks()
    return write_checks_and_timings(args.out, check_rows, timings(args.d, args.N, args.configs))


if __name__ == "__main__":
    sys.exit(main())
