"""Where the backward's GPU time goes: the Gluon dK/dV kernel and the Gluon dQ kernel timed apart, each replayed from
a CUDA graph, beside the whole backward that runs both (``use_gluon=True``); the rest of the backward is the
preprocess kernel (D = rowsum(dO O)) and the gaps between launches (benchmarks/TUNING.md, fiftieth finding, issue 14).

Each kernel is also given the tensor-core rate it reaches on its own products: the dK/dV kernel multiplies four
products of 2 N_q N_k D a (sample, head) (S^T, dV, dP^T, dK), the dQ kernel three (S, dP, dQ), halved when causal;
the rate a kernel reaches on its products says how far it runs from the dense matmul's (about 800 TFLOP/s in fp16 on
the H100, issue 14). The kernel further from it is where a backward faster than cuDNN's has most to gain.

With ``--dropout P`` each part is timed again with dropout of probability P (issue 13: at most 1.15x the plain
backward), and the row says what dropout costs each kernel and which share of its extra time each one carries:
both kernels recompute the mask, so that share says where a cheaper draw or a different config would pay.
``--draws-ahead`` also times each kernel, and the whole backward, with their draws drawn a step ahead
(``attention_bwd_hopper.DKDV_DRAWS_AHEAD``, ``DQ_DRAWS_AHEAD``, sixty-first finding), after checking that the
gradients equal the default's bit for bit: ``dkdv ahead/now`` and ``dq ahead/now`` above 1 mean faster.

    PYTHONPATH=.:benchmarks python3 benchmarks/bwd_kernel_split.py [--dtype fp16] [--d 128] [--N 1024,4096,16384]
        [--dropout 0.1 [--draws-ahead]] [--out FILE]
"""
from __future__ import annotations

import argparse
import sys
from unittest import mock

import torch

import flashlib  # noqa: F401  (before triton: chooses the interpreter where there is no GPU)
from flashlib.bench_results import DTYPES
from flashlib.io_model import attention_flops
from flashlib.kernels import attention_bwd_hopper as bwd_hopper
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.kernels.attention_fwd import gluon_dropout_args, launch_attention_forward
from flashlib.spec import AttentionSpec
from flashlib.timing import graph_time_ms
from gluon_fwd_ab import (add_grid_options, dropout_probability, fa2_points, make_inputs, print_row,
                          write_checks_and_timings)

#: Products of 2 N_q N_k D FLOPs each kernel multiplies (before a causal mask halves them).
PRODUCTS = {"dkdv": 4, "dq": 3}


def part_calls(q, k, v, o, lse, do, grads, delta, spec: AttentionSpec, seed) -> dict:
    """The three timed calls of one spec: the whole backward with both Gluon kernels, as its default route takes them
    from 1024 rows at D = 128 and from 4096 at D = 64 (attention_bwd_hopper.MIN_ROWS, DQ_MIN_ROWS), and each kernel
    alone."""
    dq, dk, dv = grads
    scale, causal = spec.scale(q.shape[-1]), spec.causal
    drop = gluon_dropout_args(spec, seed, lse)  # the effective p (a multiple of 1/256), as the backward passes it
    return {
        "backward": lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec, dropout_seed=seed,
                                                      use_gluon=True),
        "dkdv": lambda: bwd_hopper.launch_attention_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, scale=scale,
                                                                causal=causal, **drop),
        "dq": lambda: bwd_hopper.launch_attention_dq_hopper(q, k, v, do, lse, delta, dq, scale=scale, causal=causal,
                                                            **drop),
    }


def ahead_timings(q, k, v, o, lse, do, grads, delta, spec: AttentionSpec, seed) -> dict:
    """Each kernel with dropout and the whole backward timed with both kernels' draws drawn a step ahead, once their
    gradients are checked bitwise equal to the default path's (``ahead_bitwise``; a row that says False is not
    timed)."""
    parts = part_calls(q, k, v, o, lse, do, grads, delta, spec, seed)
    parts["dkdv"]()
    parts["dq"]()
    now = [t.clone() for t in grads]
    head_dim = (q.shape[-1],)
    with mock.patch.object(bwd_hopper, "DKDV_DRAWS_AHEAD", head_dim), mock.patch.object(bwd_hopper, "DQ_DRAWS_AHEAD",
                                                                                        head_dim):
        for t in grads:
            t.fill_(float("nan"))
        parts["dkdv"]()
        parts["dq"]()
        row = {"ahead_bitwise": all(torch.equal(t, before) for t, before in zip(grads, now))}
        if row["ahead_bitwise"]:
            for part in ("backward", "dkdv", "dq"):
                row[f"{part}_dropout_ahead_ms"] = graph_time_ms(parts[part], rep=100)
    return row


def split_row(name: str, d: int, n: int, causal: bool, batch: int, heads: int, dropout_p: float = 0.0,
              draws_ahead: bool = False) -> dict:
    q, k, v, do = make_inputs(batch, heads, heads, n, n, d, DTYPES[name], grad_out=True)
    seed = torch.tensor([20261207], dtype=torch.int64, device=q.device)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    row = dict(dtype=name, d=d, N=n, causal=causal, batch=batch, heads=heads)
    for suffix, p in (("", 0.0), ("_dropout", dropout_p)) if dropout_p > 0 else (("", 0.0),):
        spec = AttentionSpec(causal=causal, dropout_p=p)
        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=q.device)
        launch_attention_forward(q, k, v, o, lse, spec, dropout_seed=seed)
        delta = launch_attention_backward(q, k, v, o, lse, do, *grads, spec, dropout_seed=seed, use_gluon=True)
        for part, call in part_calls(q, k, v, o, lse, do, grads, delta, spec, seed).items():
            row[f"{part}{suffix}_ms"] = graph_time_ms(call, rep=100)
        if draws_ahead and p > 0:
            row.update(ahead_timings(q, k, v, o, lse, do, grads, delta, spec, seed))
    row["backward_tflops"] = attention_flops(batch, heads, n, d, causal, mode="bwd") / row["backward_ms"] * 1e-9
    product = 2.0 * batch * heads * n * n * d * (0.5 if causal else 1.0)
    for part, count in PRODUCTS.items():
        row[f"{part}_share"] = row[f"{part}_ms"] / row["backward_ms"]
        row[f"{part}_product_tflops"] = count * product / row[f"{part}_ms"] * 1e-9
    row["rest_share"] = 1.0 - row["dkdv_share"] - row["dq_share"]  # the preprocess and the launches' gaps
    if "dkdv_dropout_ahead_ms" in row:
        for part in PRODUCTS:
            row[f"{part} ahead/now"] = row[f"{part}_dropout_ms"] / row[f"{part}_dropout_ahead_ms"]
        row["backward_dropout_ahead_cost"] = row["backward_dropout_ahead_ms"] / row["backward_ms"]
    if dropout_p > 0:
        extra = row["backward_dropout_ms"] - row["backward_ms"]
        for part in ("backward",) + tuple(PRODUCTS):
            row[f"{part}_dropout_cost"] = row[f"{part}_dropout_ms"] / row[f"{part}_ms"]
        for part in PRODUCTS:  # the share of dropout's extra backward time this kernel's extra time makes
            row[f"{part}_dropout_extra_share"] = ((row[f"{part}_dropout_ms"] - row[f"{part}_ms"]) / extra
                                                  if extra > 0 else None)  # None: dropout cost nothing measurable
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_options(parser)
    parser.set_defaults(dtype=["fp16"], d=[128])
    parser.add_argument("--dropout", type=dropout_probability, default=0.0,
                        help="also time each part with dropout of this probability (0: plain only)")
    parser.add_argument("--draws-ahead", action="store_true",
                        help="with --dropout, also the kernels' draws drawn a step ahead (checked, then timed)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.draws_ahead and not args.dropout:
        parser.error("--draws-ahead times dropout's draws: give --dropout P too")
    rows = []
    for point in fa2_points(args.dtype, args.d, args.N):
        rows.append(split_row(*point, dropout_p=args.dropout, draws_ahead=args.draws_ahead))
        print_row(rows[-1])
    return write_checks_and_timings(args.out, [], rows)


if __name__ == "__main__":
    sys.exit(main())
