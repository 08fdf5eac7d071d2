"""The Gluon dK/dV kernel (:mod:`flashlib.kernels.attention_bwd_hopper`) checked and timed beside the Triton
backward, in one process on a Hopper GPU (benchmarks/TUNING.md, thirty-second and thirty-third findings).

Checks first: dQ, dK, dV of ``launch_attention_backward(use_gluon=True)`` against float64 autograd and against the
Triton kernels' (odd lengths, N_q != N_k under a causal mask, GQA, the (B, N, H, D) layout), and that the Gluon
kernel ran. Then the backward at the FlashAttention-2 shapes, both ways, each replayed from a CUDA graph. At head_dim
64 the Gluon kernel runs both ways, K and V read from shared memory (``gluon``) and from registers (``gluon_regs``,
``DKDV_REGISTER_OPERANDS``, thirty-ninth and fifty-fourth findings), whichever is the default: checked bitwise equal
to each other, and timed (in registers, 128 rows a step spill: :data:`REGISTER_OPERAND_HEAD_DIMS`).

    PYTHONPATH=. python3 benchmarks/gluon_bwd_ab.py [--dtype fp16,bf16] [--d 64,128] [--N 1024,4096,16384]
        [--variants "NAME=D:BLOCK_M,BLOCK_N,STAGES;..."] [--no-checks] --out FILE

``--variants``: the Gluon kernel also with other (query rows a step, keys a consumer, Q/dO slots) at a head_dim,
timed beside its own; e.g. ``"m32=128:32,64,3"``, the config head_dim 128 had before the thirty-third finding.
"""
from __future__ import annotations

import sys

import torch

import flashlib  # noqa: F401  (before triton: chooses the interpreter where there is no GPU)
from flashlib.bench_results import DTYPES
from flashlib.io_model import attention_flops
from flashlib.kernels import attention_bwd_hopper as bwd_hopper
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec
from flashlib.timing import graph_time_ms
from flashlib.validation import relative_error, tolerance
from gluon_fwd_ab import (backward_ab_main, config_in_place, fa2_points, make_inputs, operand_placements,
                          print_row)

#: The head dims at which the dK/dV kernel can hold K and V in registers without spilling (thirty-ninth finding),
#: with 64 query rows a step. With the 128 rows a step of ``CONFIGS[64]`` since session 63 they spill (58-82 STL a
#: step, fifty-fifth finding): ``gluon_regs`` at 64 now times that spilling kernel beside the default, and a
#: ``--variants`` entry of 64 rows (K and V in shared memory) stands for the older default's blocks.
REGISTER_OPERAND_HEAD_DIMS = (64,)


def backward(q, k, v, do, causal, use_gluon):
    """(dq, dk, dv) after a forward, through ``launch_attention_backward``."""
    spec = AttentionSpec(causal=causal)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    launch_attention_forward(q, k, v, o, lse, spec)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec, use_gluon=use_gluon)
    return dq, dk, dv


def check(case, q, k, v, do, causal) -> dict:
    calls = []
    real = bwd_hopper.launch_attention_dkdv_hopper
    bwd_hopper.launch_attention_dkdv_hopper = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    try:
        got = backward(q, k, v, do, causal, True)
    finally:
        bwd_hopper.launch_attention_dkdv_hopper = real
    triton_grads = backward(q, k, v, do, causal, False)
    registers_equal = True
    if q.shape[-1] in REGISTER_OPERAND_HEAD_DIMS:
        shared, from_registers = (run() for run in operand_placements(
            lambda: backward(q, k, v, do, causal, True), bwd_hopper, "DKDV_REGISTER_OPERANDS", q.shape[-1]))
        registers_equal = all(torch.equal(a, b) for a, b in zip(from_registers, shared))
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = naive_attention(q64, k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1), causal=causal)
    out.backward(do.double())
    errors = {name: relative_error(g, r.grad) for name, g, r in zip("qkv", got, (q64, k64, v64))}
    vs_triton = {name: relative_error(g, t) for name, g, t in zip("qkv", got, triton_grads)}
    ok = bool(calls) and all(e <= tolerance(q.dtype) for e in errors.values()) and registers_equal
    return dict(case=case, gluon_ran=bool(calls), rel_err=errors, vs_triton=vs_triton,
                registers_equal=registers_equal, status="ok" if ok else "wrong")


def with_config(d, blocks, call):
    """``call()`` with the Gluon dK/dV kernel's config at head_dim ``d`` replaced by ``blocks``."""
    with config_in_place(bwd_hopper.CONFIGS, d, blocks):
        return call()


def timings(dtypes, dims, lengths, variants=None) -> list[dict]:
    rows = []
    for name, d, n, causal, batch, heads in fa2_points(dtypes, dims, lengths):
        q, k, v, do = make_inputs(batch, heads, heads, n, n, d, DTYPES[name], grad_out=True)
        spec = AttentionSpec(causal=causal)
        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
        launch_attention_forward(q, k, v, o, lse, spec)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        flops = attention_flops(batch, heads, n, d, causal, mode="bwd")
        row = dict(dtype=name, d=d, N=n, causal=causal)
        calls = {impl: (lambda use_gluon=use_gluon: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec,
                                                                             use_gluon=use_gluon))
                 for impl, use_gluon in (("gluon", True), ("triton", False))}
        if d in REGISTER_OPERAND_HEAD_DIMS:  # gluon: K and V from shared memory; gluon_regs: from registers
            calls["gluon"], calls["gluon_regs"] = operand_placements(calls["gluon"], bwd_hopper,
                                                                     "DKDV_REGISTER_OPERANDS", d)
        for name_, (vd, blocks, _) in (variants or {}).items():
            if vd == d:
                calls[name_] = lambda blocks=blocks: with_config(d, blocks, calls["gluon"])
        for impl, call in calls.items():
            ms = graph_time_ms(call, rep=100)
            row[f"{impl}_tflops"] = flops / ms * 1e-9
        row["gluon/triton"] = row["gluon_tflops"] / row["triton_tflops"]
        print_row(row)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    return backward_ab_main(argv, __doc__, "dK/dV", check, timings)


if __name__ == "__main__":
    sys.exit(main())
