"""The backward with dQ added by the Gluon dK/dV kernel's atomics (``deterministic=False``) checked and timed beside
the deterministic two-kernel backward and cuDNN's, in one process on a Hopper GPU (benchmarks/TUNING.md,
forty-ninth finding).

Checks first, at every dtype, head_dim 64 and 128, causal or not and gluon_fwd_ab's cases (odd lengths, N_q != N_k,
GQA, the (B, N, H, D) layout), with and without dropout: dQ, dK, dV of ``launch_attention_backward(use_gluon=True,
deterministic=False)`` against float64 autograd (the kernel's own dropout mask for the reference), every element
written (outputs start as NaN), dK and dV bitwise those of the deterministic backward, dQ within rounding of its dQ,
and that the atomic kernel ran where it can (head_dim 128) and not elsewhere. Then the backward at the
FlashAttention-2 shapes: both ways replayed from CUDA graphs, and cuDNN's (SDPA's backward of its forward) timed
the same way where its backward can be captured, else by ``do_bench`` (the row says which).

    PYTHONPATH=.:benchmarks python3 benchmarks/gluon_atomic_dq_ab.py [--dtype fp16,bf16] [--d 128]
        [--N 1024,4096,16384] [--dropout 0.1] [--no-checks] --out FILE
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlib  # noqa: F401  (before triton: chooses the interpreter where there is no GPU)
from flashlib.bench_results import DTYPES
from flashlib.io_model import attention_flops
from flashlib.kernels import attention_bwd_hopper as bwd_hopper
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.kernels.dropout import dropout_mask, effective_dropout_p
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec
from flashlib.timing import graph_time_ms, time_ms
from flashlib.validation import relative_error, tolerance
from gluon_fwd_ab import (CHECK_CASES, add_grid_options, fa2_points, make_inputs, print_row,
                          write_checks_and_timings)


def backward(q, k, v, do, spec, seed, deterministic):
    """(dq, dk, dv, whether the kernel added dQ by atomics) after a forward, through ``launch_attention_backward``
    with the Gluon kernels wherever they can run; the gradients start as NaN, so an element never written shows."""
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    launch_attention_forward(q, k, v, o, lse, spec, dropout_seed=seed)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    atomic = []
    real = bwd_hopper.launch_attention_dkdv_hopper

    def counted(*args, **kwargs):
        atomic.append(kwargs.get("dq_acc") is not None)
        return real(*args, **kwargs)
    bwd_hopper.launch_attention_dkdv_hopper = counted
    try:
        launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec, dropout_seed=seed, use_gluon=True,
                                  deterministic=deterministic)
    finally:
        bwd_hopper.launch_attention_dkdv_hopper = real
    return dq, dk, dv, any(atomic)


def reference_grads(q, k, v, do, spec, seed):
    """float64 autograd's dQ, dK, dV, with the kernels' own dropout mask where there is dropout."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    keep = None
    if spec.dropout_p > 0:
        keep = dropout_mask(int(seed[0]), spec.dropout_p, *q.shape[:3], k.shape[2], q.device)
    out = naive_attention(q64, k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1),
                          causal=spec.causal, dropout_p=effective_dropout_p(spec.dropout_p), dropout_mask=keep)
    out.backward(do.double())
    return q64.grad, k64.grad, v64.grad


def make_check(dropout_p: float):
    def check(case, q, k, v, do, causal) -> dict:
        rows = []
        for p in (0.0, dropout_p) if dropout_p > 0 else (0.0,):
            spec = AttentionSpec(causal=causal, dropout_p=p)
            seed = torch.tensor([1234], dtype=torch.int64, device="cuda")
            *got, atomic = backward(q, k, v, do, spec, seed, deterministic=False)
            *fixed, _ = backward(q, k, v, do, spec, seed, deterministic=True)
            reference = reference_grads(q, k, v, do, spec, seed)
            errors = {name: relative_error(g, r) for name, g, r in zip("qkv", got, reference)}
            fixed_errors = {name: relative_error(g, r) for name, g, r in zip("qkv", fixed, reference)}
            written = all(not g.isnan().any() for g in got)
            dkdv_equal = torch.equal(got[1], fixed[1]) and torch.equal(got[2], fixed[2])
            expected_atomic = q.shape[-1] in bwd_hopper.ATOMIC_DQ_HEAD_DIMS
            ok = (written and dkdv_equal and atomic == expected_atomic
                  and all(e <= tolerance(q.dtype) for e in errors.values()))
            rows.append(dict(case=f"{case} p={p}", atomic_ran=atomic, written=written, dkdv_bitwise=dkdv_equal,
                             rel_err=errors, deterministic_rel_err=fixed_errors,
                             dq_vs_deterministic=relative_error(got[0], fixed[0]), status="ok" if ok else "wrong"))
        ok = all(r["status"] == "ok" for r in rows)
        return dict(case=case, runs=rows, status="ok" if ok else "wrong")
    return check


def cudnn_backward_ms(q, k, v, do, causal) -> tuple[float, str]:
    """cuDNN's backward (SDPA's, of its own forward): from a CUDA graph where it can be captured, else do_bench."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(*leaves, is_causal=causal)

    def call():
        torch.autograd.grad(o, leaves, do, retain_graph=True)
    try:
        return graph_time_ms(call, rep=100), "cuda graph"
    except Exception as error:  # noqa: BLE001  (a capture refused: time it eagerly, and say so)
        torch.cuda.synchronize()
        return time_ms(call), f"do_bench ({type(error).__name__})"


def timings(dtypes, dims, lengths, dropout_p: float, modes=(1, )) -> list[dict]:
    rows = []
    for name, d, n, causal, batch, heads in fa2_points(dtypes, dims, lengths):
        q, k, v, do = make_inputs(batch, heads, heads, n, n, d, DTYPES[name], grad_out=True)
        flops = attention_flops(batch, heads, n, d, causal, mode="bwd")
        for p in (0.0, dropout_p) if dropout_p > 0 else (0.0,):
            spec = AttentionSpec(causal=causal, dropout_p=p)
            seed = torch.tensor([99], dtype=torch.int64, device="cuda")
            o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
            launch_attention_forward(q, k, v, o, lse, spec, dropout_seed=seed)
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            row = dict(dtype=name, d=d, N=n, causal=causal, dropout_p=p)
            ms = graph_time_ms(lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec,
                                                                 dropout_seed=seed), rep=100)
            row["deterministic_tflops"] = flops / ms * 1e-9
            dq_fixed = dq.clone()
            for mode in modes if p == 0 else (1, ):
                impl = "atomic" if mode == 1 else f"atomic_mode{mode}"
                bwd_hopper.ATOMIC_DQ_MODE = mode
                try:
                    ms = graph_time_ms(lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec,
                                                                         dropout_seed=seed, deterministic=False),
                                       rep=100)
                finally:
                    bwd_hopper.ATOMIC_DQ_MODE = 1
                row[f"{impl}_tflops"] = flops / ms * 1e-9
                row[f"{impl}/deterministic"] = row[f"{impl}_tflops"] / row["deterministic_tflops"]
                row[f"{impl}_dq_vs_deterministic"] = relative_error(dq, dq_fixed)
            if p == 0:
                ms, method = cudnn_backward_ms(q, k, v, do, causal)
                row["cudnn_tflops"], row["cudnn_method"] = flops / ms * 1e-9, method
                row["atomic/cudnn"] = row["atomic_tflops"] / row["cudnn_tflops"]
                row["deterministic/cudnn"] = row["deterministic_tflops"] / row["cudnn_tflops"]
            print_row(row)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_options(parser)
    parser.set_defaults(d=[128])
    parser.add_argument("--dropout", type=float, default=0.1, help="also check and time with this dropout (0: not)")
    parser.add_argument("--modes", default="1", help="atomic_dq kernel experiments to time (ATOMIC_DQ_MODE)")
    parser.add_argument("--no-checks", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    check = make_check(args.dropout)
    check_rows = []
    if not args.no_checks:
        for name in args.dtype:
            for d in (64, 128):
                for causal in (False, True):
                    for case, shape, bnhd in CHECK_CASES:
                        tensors = make_inputs(*shape, d, DTYPES[name], bnhd=bnhd, grad_out=True)
                        check_rows.append(check(f"{name} d={d} causal={causal} {case}", *tensors, causal))
                        print_row(check_rows[-1])
    time_rows = timings(args.dtype, args.d, args.N, args.dropout, [int(m) for m in args.modes.split(",")])
    return write_checks_and_timings(args.out, check_rows, time_rows)


if __name__ == "__main__":
    sys.exit(main())
