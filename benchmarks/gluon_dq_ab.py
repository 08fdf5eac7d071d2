"""The Gluon dQ kernel (:func:`flashlib.kernels.attention_bwd_hopper.launch_attention_dq_hopper`) checked and timed
beside the Triton dQ kernel, in one process on a Hopper GPU (benchmarks/TUNING.md, thirty-fourth finding).

Checks first: its dQ against float64 autograd and against the Triton kernel's (odd lengths, N_q != N_k under a
causal mask, GQA, the (B, N, H, D) layout), the output filled with NaN before. Then, at the FlashAttention-2 shapes,
each replayed from a CUDA graph: the dQ pass alone (with D = rowsum(dO * O)) by either kernel, and the whole
backward (the Gluon dK/dV kernel where it is routed) with either dQ kernel. The Gluon kernel runs with Q and dO read
from shared memory (``dq_gluon``, ``bwd_gluon``) and from registers (``dq_gluon_regs``, ``bwd_gluon_regs``;
``DQ_REGISTER_OPERANDS``, thirty-ninth finding), whichever is the default: checked bitwise equal, and timed.

    PYTHONPATH=.:benchmarks python3 benchmarks/gluon_dq_ab.py [--dtype fp16,bf16] [--d 64,128]
        [--N 1024,4096,16384] [--variants "NAME=D:BLOCK_M,BLOCK_N,STAGES;..."] [--no-checks] --out FILE
"""
from __future__ import annotations

import sys
from unittest import mock

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
                          print_row, register_operands_in_place)


def forward(q, k, v, causal):
    spec = AttentionSpec(causal=causal)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    launch_attention_forward(q, k, v, o, lse, spec)
    return spec, o, lse


def triton_dq(head_dim: int):
    """A context in which the backward's dQ comes from the Triton kernel at ``head_dim``, whatever the route says:
    from 1024 rows at 128 and 4096 at 64 (``DQ_MIN_ROWS``) the Gluon dQ kernel is the default, so a plain
    ``launch_attention_backward`` would time the Gluon kernel against itself (as this script's "triton" columns did
    from sessions 43 to 63 at those points). ``DQ_MIN_ROWS`` goes without ``head_dim`` until the context ends; the
    dK/dV kernel keeps its own route."""
    kept = {d: rows for d, rows in bwd_hopper.DQ_MIN_ROWS.items() if d != head_dim}
    return mock.patch.dict(bwd_hopper.DQ_MIN_ROWS, kept, clear=True)


def dq_pass(q, k, v, o, lse, do, dq, spec, gluon: bool):
    """dQ alone: D = rowsum(dO * O), then either dQ kernel."""
    if not gluon:
        with triton_dq(q.shape[-1]):
            return launch_attention_backward(q, k, v, o, lse, do, dq, None, None, spec)
    delta = launch_attention_backward(q, k, v, o, lse, do, None, None, None, spec)
    bwd_hopper.launch_attention_dq_hopper(q, k, v, do, lse, delta, dq, scale=spec.scale(q.shape[-1]),
                                          causal=spec.causal)


def whole_backward(q, k, v, o, lse, do, dq, dk, dv, spec, gluon: bool):
    """dQ, dK, dV: dK/dV as routed, dQ by either kernel."""
    if not gluon:
        with triton_dq(q.shape[-1]):
            return launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec)
    delta = launch_attention_backward(q, k, v, o, lse, do, None, dk, dv, spec)
    bwd_hopper.launch_attention_dq_hopper(q, k, v, do, lse, delta, dq, scale=spec.scale(q.shape[-1]),
                                          causal=spec.causal)


def check(case, q, k, v, do, causal) -> dict:
    spec, o, lse = forward(q, k, v, causal)
    got, triton_grad = (torch.full_like(q, float("nan")) for _ in range(2))
    with _registers(q.shape[-1], on=False):
        dq_pass(q, k, v, o, lse, do, got, spec, True)
    dq_pass(q, k, v, o, lse, do, triton_grad, spec, False)
    from_registers = torch.full_like(q, float("nan"))
    with _registers(q.shape[-1]):
        dq_pass(q, k, v, o, lse, do, from_registers, spec, True)
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = naive_attention(q64, k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1), causal=causal)
    out.backward(do.double())
    error, vs_triton = relative_error(got, q64.grad), relative_error(got, triton_grad)
    registers_equal = bool(torch.equal(from_registers, got))
    ok = bool(torch.isfinite(got).all()) and error <= tolerance(q.dtype) and registers_equal
    return dict(case=case, rel_err=error, triton_rel_err=relative_error(triton_grad, q64.grad), vs_triton=vs_triton,
                registers_equal=registers_equal, status="ok" if ok else "wrong")


def timings(dtypes, dims, lengths, variants=None) -> list[dict]:
    rows = []
    for name, d, n, causal, batch, heads in fa2_points(dtypes, dims, lengths):
        q, k, v, do = make_inputs(batch, heads, heads, n, n, d, DTYPES[name], grad_out=True)
        spec, o, lse = forward(q, k, v, causal)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        flops = attention_flops(batch, heads, n, d, causal, mode="bwd")
        row = dict(dtype=name, d=d, N=n, causal=causal)
        calls = {}
        for gluon, impl in ((True, "gluon"), (False, "triton")):
            calls[f"dq_{impl}"] = lambda g=gluon: dq_pass(q, k, v, o, lse, do, dq, spec, g)
            calls[f"bwd_{impl}"] = lambda g=gluon: whole_backward(q, k, v, o, lse, do, dq, dk, dv, spec, g)
        for part in ("dq", "bwd"):  # gluon: Q and dO from shared memory; gluon_regs: from registers
            calls[f"{part}_gluon"], calls[f"{part}_gluon_regs"] = operand_placements(
                calls[f"{part}_gluon"], bwd_hopper, "DQ_REGISTER_OPERANDS", d)
        for name_, (vd, blocks, _) in (variants or {}).items():
            if vd == d:
                calls[f"bwd_{name_}"] = lambda blocks=blocks: _with_dq_config(d, blocks, calls["bwd_gluon"])
        for impl, call in calls.items():
            ms = graph_time_ms(call, rep=100)
            row[f"{impl}_ms"] = ms
            if impl.startswith("bwd"):
                row[f"{impl}_tflops"] = flops / ms * 1e-9
        row["dq gluon/triton"] = row["dq_triton_ms"] / row["dq_gluon_ms"]
        row["bwd gluon/triton"] = row["bwd_triton_ms"] / row["bwd_gluon_ms"]
        row["dq regs/shared"] = row["dq_gluon_ms"] / row["dq_gluon_regs_ms"]  # > 1: registers faster
        print_row(row)
        rows.append(row)
    return rows


def _registers(d, on=True):
    """The Gluon dQ kernel at head_dim ``d`` with Q and dO read from registers (``on``) or from shared memory,
    whichever the default is."""
    return register_operands_in_place(bwd_hopper, "DQ_REGISTER_OPERANDS", d, on)


def _with_dq_config(d, blocks, call):
    with config_in_place(bwd_hopper.DQ_CONFIGS, d, blocks):
        return call()


def main(argv=None) -> int:
    return backward_ab_main(argv, __doc__, "dQ", check, timings)


if __name__ == "__main__":
    sys.exit(main())
