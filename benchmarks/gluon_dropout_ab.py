"""What dropout costs on Hopper, through the Gluon kernels and through the Triton kernels, in one process.

Issue 13 asks for dropout at most 15% slower than the same call without it. On Hopper the call without dropout
runs the warp-specialized Gluon kernels where they are preferred (:mod:`flashlib.kernels.attention_fwd_hopper`,
:mod:`flashlib.kernels.attention_bwd_hopper`); with dropout it ran the Triton kernels until session 45. This
script times, at the FlashAttention-2 benchmark's shapes (B * N = 16384, H * D = 2048), each call replayed from a
CUDA graph (``flashlib.timing.graph_time_ms``: GPU time alone):

* ``plain``: no dropout, the launchers' default route;
* ``gluon``: dropout p through the Gluon kernels (``use_gluon=True``);
* ``triton``: dropout p through the Triton kernels (``use_gluon=False``);

for the forward and the backward (dK, dV, dQ and D from a saved forward), and prints each dropout time over the
plain one (``fwd_gluon/plain``, ``bwd_...``, ``train_...`` for their sum). Each point also records how far apart
the two dropout routes' O are (``o_gluon_vs_triton``, a relative error), so a broken draw shows beside its time.

    PYTHONPATH=.:benchmarks python3 benchmarks/gluon_dropout_ab.py [--dtype fp16,bf16] [--d 128,64]
        [--N 1024,4096,16384] [--p 0.1] [--parts fwd,bwd] [--routes plain,gluon,triton]
        [--fwd-configs "bn64=128:64,64,3"] [--bwd-configs "m32=128:32,64,2"] [--kv-placements] [--out FILE]

``--fwd-configs`` times the Gluon forward with dropout in other (BLOCK_M, BLOCK_N, STAGES) configs as well
(``gluon_NAME``), for the head_dim given before the colon; ``--bwd-configs`` the backward with other configs of the
Gluon dK/dV kernel (its ``DROPOUT_CONFIGS``), each checked against the Triton kernels' gradients
(``dk_NAME_vs_triton``...). ``--kv-placements`` times the Gluon backward with dropout with K and V read from shared
memory (``bwd_gluon_shared``) and from registers (``bwd_gluon_regs``; ``DKDV_DROPOUT_REGISTER_OPERANDS``),
whichever is the default, and checks that both give the same gradients bit for bit (``kv_placements_equal``), at
the head dims where registers are the default (at 128 K and V spill in registers).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

import flashlib  # noqa: F401  (before triton: chooses the interpreter where there is no GPU)
from flashlib.bench_results import DTYPES, results_meta
from flashlib.kernels import attention_bwd_hopper as bwd_hopper
from flashlib.kernels import attention_fwd_hopper as hopper
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.spec import AttentionSpec
from flashlib.timing import graph_time_ms
from flashlib.validation import relative_error
from gluon_fwd_ab import (add_grid_options, config_in_place, config_variants, fa2_points, make_inputs,
                          operand_placements, print_row)

ROUTES = {"plain": None, "gluon": True, "triton": False}


def forward(q, k, v, spec, seed, use_gluon):
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    launch_attention_forward(q, k, v, o, lse, spec, dropout_seed=seed, use_gluon=use_gluon)
    return o, lse


def backward(q, k, v, o, lse, do, spec, seed, use_gluon):
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec, dropout_seed=seed, use_gluon=use_gluon)
    return dq, dk, dv


def timings(dtypes, dims, lengths, p: float, parts=("fwd", "bwd"), routes=tuple(ROUTES),
            fwd_configs=None, bwd_configs=None, kv_placements=False) -> list[dict]:
    rows = []
    seed = torch.tensor([20261204], dtype=torch.int64, device="cuda")
    for name, d, n, causal, batch, heads in fa2_points(dtypes, dims, lengths):
        q, k, v, do = make_inputs(batch, heads, heads, n, n, d, DTYPES[name], grad_out=True)
        row = dict(dtype=name, d=d, N=n, causal=causal, batch=batch, heads=heads, p=p)
        outputs = {}
        for route in routes:
            use_gluon = ROUTES[route]
            spec = AttentionSpec(causal=causal, dropout_p=0.0 if route == "plain" else p)
            o, lse = outputs[route] = forward(q, k, v, spec, seed, use_gluon)
            if "fwd" in parts:
                row[f"fwd_{route}_ms"] = graph_time_ms(lambda: forward(q, k, v, spec, seed, use_gluon), rep=100)
            if "bwd" in parts:
                row[f"bwd_{route}_ms"] = graph_time_ms(
                    lambda: backward(q, k, v, o, lse, do, spec, seed, use_gluon), rep=100)
        spec = AttentionSpec(causal=causal, dropout_p=p)
        for label, (config_d, config) in (fwd_configs or {}).items():
            if config_d == d:
                with config_in_place(hopper.CONFIGS, d, config):
                    o_config = forward(q, k, v, spec, seed, True)[0]
                    if "gluon" in outputs:
                        row[f"o_{label}_vs_gluon"] = relative_error(o_config, outputs["gluon"][0])
                    row[f"fwd_gluon_{label}_ms"] = graph_time_ms(lambda: forward(q, k, v, spec, seed, True), rep=100)
        if bwd_configs:
            o, lse = forward(q, k, v, spec, seed, False)
            triton_grads = backward(q, k, v, o, lse, do, spec, seed, False)
        for label, (config_d, config) in (bwd_configs or {}).items():
            if config_d == d:
                with config_in_place(bwd_hopper.DROPOUT_CONFIGS, d, config):
                    grads = backward(q, k, v, o, lse, do, spec, seed, True)
                    for grad_name, got, want in zip(("dq", "dk", "dv"), grads, triton_grads):
                        row[f"{grad_name}_{label}_vs_triton"] = relative_error(got, want)
                    row[f"bwd_gluon_{label}_ms"] = graph_time_ms(
                        lambda: backward(q, k, v, o, lse, do, spec, seed, True), rep=100)
        if kv_placements and d in bwd_hopper.DKDV_DROPOUT_REGISTER_OPERANDS:  # elsewhere K and V spill in registers
            o, lse = forward(q, k, v, spec, seed, True)
            shared, regs = operand_placements(lambda: backward(q, k, v, o, lse, do, spec, seed, True), bwd_hopper,
                                              "DKDV_DROPOUT_REGISTER_OPERANDS", d)
            row["kv_placements_equal"] = all(torch.equal(a, b) for a, b in zip(shared(), regs()))
            row["bwd_gluon_shared_ms"] = graph_time_ms(shared, rep=100)
            row["bwd_gluon_regs_ms"] = graph_time_ms(regs, rep=100)
            row["kv regs/shared"] = row["bwd_gluon_shared_ms"] / row["bwd_gluon_regs_ms"]  # > 1: registers faster
        if "gluon" in outputs and "triton" in outputs:
            row["o_gluon_vs_triton"] = relative_error(outputs["gluon"][0], outputs["triton"][0])
        for key in [key for key in row if key.endswith("_ms") and "plain" not in key]:
            part = key.split("_")[0]
            if f"{part}_plain_ms" in row:
                row[key[:-3] + "/plain"] = row[key] / row[f"{part}_plain_ms"]
        for route in ("gluon", "triton"):
            times = [row.get(f"{part}_{r}_ms") for part in ("fwd", "bwd") for r in (route, "plain")]
            if None not in times:  # forward + backward over the same without dropout
                row[f"train_{route}/plain"] = (times[0] + times[2]) / (times[1] + times[3])
        print_row(row)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_options(parser)
    parser.add_argument("--p", type=float, default=0.1, help="dropout_p (default 0.1)")
    parser.add_argument("--parts", default="fwd,bwd", help="comma list of fwd, bwd (default both)")
    parser.add_argument("--routes", default="plain,gluon,triton",
                        help="comma list of plain, gluon, triton (default all; plain is every ratio's base)")
    parser.add_argument("--fwd-configs", type=config_variants, default="",
                        help="other Gluon forward configs timed with dropout: 'NAME=D:BLOCK_M,BLOCK_N,STAGES;...'")
    parser.add_argument("--bwd-configs", type=config_variants, default="",
                        help="other Gluon dK/dV configs timed with dropout: 'NAME=D:BLOCK_M,BLOCK_N,STAGES;...'")
    parser.add_argument("--kv-placements", action="store_true",
                        help="time the Gluon backward with dropout with K and V from shared memory and registers")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not 0 < args.p < 1:
        parser.error(f"--p must lie in (0, 1); got {args.p}")
    parts, routes = args.parts.split(","), args.routes.split(",")
    if not set(parts) <= {"fwd", "bwd"} or not set(routes) <= set(ROUTES):
        parser.error(f"--parts takes fwd, bwd and --routes {', '.join(ROUTES)}; got {args.parts!r}, {args.routes!r}")
    rows = timings(args.dtype, args.d, args.N, args.p, parts, routes,
                   {label: (d, config) for label, (d, config, _) in args.fwd_configs.items()},
                   {label: (d, config) for label, (d, config, _) in args.bwd_configs.items()}, args.kv_placements)
    if args.out:
        with open(args.out, "w") as f:
            meta = results_meta(method="each call replayed from a CUDA graph (graph_time_ms, rep=100 ms)",
                                command=" ".join(sys.argv))
            json.dump(dict(meta=meta, timings=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
