"""Two K/V heads of 64 as one of 128: does decoding at D = 64 stream faster with 256-byte key rows?

``PYTHONPATH=. python3 benchmarks/decode_head_pairs.py --out FILE.json [--dtype float16] [--rounds 3]``

At D = 64 the split-KV kernel reads each key of a K/V head as a 128-byte row; at D = 128 the same bytes
come as 256-byte rows, and the D = 128 grids of many programs stream at 3.1 TB/s where D = 64 ones stop at
2.95-3.05 (benchmarks/TUNING.md, twenty-ninth finding). This script asks whether the row size is why,
without changing the kernel: a (B, N, H_kv, 64) cache with H_kv even is, in memory, a (B, N, H_kv / 2, 128)
one, each row two adjacent heads. Padding every query with zeros over the other head's half gives scores
from its own head only (the zeros cancel the other half of each dot product), so the D = 128 launch on
those views computes the same attention; each output row keeps the half of its own head (P V of the pair
carries both heads' values; the softmax scale stays 1/8).

``--pair-config BLOCK_N,stages,warps`` pins the paired launch's config (the rule's for D = 128 otherwise).
Per shape (H_q = 32, D = 64), CUDA-graph medians in microseconds of: the library's launch at D = 64
(``d64``); the paired launch alone on prepared padded queries (``pairs_kernel``: what a kernel that pads Q
and stores its half itself would take); the paired launch with the padding and the gather of the halves
(``pairs_copies``: what a host-side version would take); and SDPA's cuDNN and flash backends. Rounds
interleave them; the paired output is checked against the D = 64 one.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics

import torch
import triton

from flashlib import detect_gpu
from flashlib.bench_decode import graph_time_us, sdpa_call
from flashlib.kernels import decode

HEADS_Q, HEAD_DIM = 32, 64
#: (batch, H_kv, N_k, N_q): the D = 64 grid points below SDPA's fastest backend in session 38's runs, and neighbours.
SHAPES = [(64, 32, 4096, 4), (64, 32, 16384, 4), (64, 32, 4096, 1), (64, 32, 1024, 4), (8, 32, 4096, 1),
          (8, 32, 32768, 1), (8, 32, 32768, 4), (64, 8, 16384, 1), (8, 8, 4096, 1), (8, 8, 16384, 1),
          (1, 32, 4096, 1), (1, 32, 32768, 1), (1, 8, 32768, 1)]


def head_halves(heads: int, heads_kv: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(query heads, which half of its pair each one's K/V head is): the indices of a (B, N_q, H, 2, D) view."""
    query_heads = torch.arange(heads, device=device)
    return query_heads, (query_heads // (heads // heads_kv)) % 2


def paired_query(q: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(B, N_q, H, 2D): each query in the half of its K/V head within the pair, zeros in the other."""
    batch, n_q, heads, head_dim = q.shape
    padded = q.new_zeros(batch, n_q, heads, 2 * head_dim)
    padded.view(batch, n_q, heads, 2, head_dim)[:, :, *head_halves(heads, heads_kv, q.device)] = q
    return padded


def own_half(o_pairs: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(B, N_q, H, D) from the paired launch's (B, N_q, H, 2D) output: each row's own head's half."""
    batch, n_q, heads, two_d = o_pairs.shape
    return o_pairs.view(batch, n_q, heads, 2, two_d // 2)[:, :, *head_halves(heads, heads_kv, o_pairs.device)]


def time_shape(batch, heads_kv, n_k, n_q, dtype, rounds, pair_config=None) -> dict:
    q = torch.randn(batch, n_q, HEADS_Q, HEAD_DIM, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, n_k, heads_kv, HEAD_DIM, device="cuda", dtype=dtype) for _ in range(2))
    lengths = torch.full((batch,), n_k, dtype=torch.int32, device="cuda")
    scale = HEAD_DIM ** -0.5
    k2, v2 = (t.view(batch, n_k, heads_kv // 2, 2 * HEAD_DIM) for t in (k, v))
    o, lse = torch.empty_like(q), torch.empty(batch, HEADS_Q, n_q, device="cuda")
    q2 = paired_query(q, heads_kv)
    o2, lse2 = torch.empty_like(q2), torch.empty_like(lse)

    def d64():
        decode.launch_splitkv_attention(q, k, v, o, lse, scale=scale, k_lens=lengths)

    def pairs_kernel():
        decode.launch_splitkv_attention(q2, k2, v2, o2, lse2, scale=scale, k_lens=lengths, config=pair_config)

    def pairs_copies():
        decode.launch_splitkv_attention(paired_query(q, heads_kv), k2, v2, o2, lse2, scale=scale, k_lens=lengths,
                                        config=pair_config)
        return own_half(o2, heads_kv)

    calls = {"d64": d64, "pairs_kernel": pairs_kernel, "pairs_copies": pairs_copies,
             "sdpa_cudnn": sdpa_call("CUDNN_ATTENTION", q, k, v), "sdpa_flash": sdpa_call("FLASH_ATTENTION", q, k, v)}
    d64()
    paired = pairs_copies()
    torch.cuda.synchronize()
    error = ((paired.float() - o.float()).norm() / o.float().norm()).item()
    lse_error = ((lse2 - lse).abs().max()).item()
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            samples[name].append(graph_time_us(call, repeat=10))
    us = {name: statistics.median(t) for name, t in samples.items()}
    plan64 = decode.plan_splitkv_launch(batch, HEADS_Q, heads_kv, n_q, n_k, HEAD_DIM, q.element_size(),
                                        decode.multiprocessor_count(0))
    plan128 = decode.plan_splitkv_launch(batch, HEADS_Q, heads_kv // 2, n_q, n_k, 2 * HEAD_DIM, q.element_size(),
                                         decode.multiprocessor_count(0), config=pair_config)
    gb = 2 * batch * n_k * heads_kv * HEAD_DIM * q.element_size() / 1e9
    row = dict(batch=batch, heads_q=HEADS_Q, heads_kv=heads_kv, n_k=n_k, n_q=n_q, head_dim=HEAD_DIM, us=us,
               gb_per_s={name: gb / t * 1e6 for name, t in us.items()}, rel_err_pairs_vs_d64=error,
               lse_max_abs_diff=lse_error, plan_d64=plan64._asdict(), plan_pairs=plan128._asdict())
    best_sdpa = min(us["sdpa_cudnn"], us["sdpa_flash"])
    print(f"B={batch:>2} H_kv={heads_kv:>2} N_k={n_k:>6} N_q={n_q}: d64 {us['d64']:.1f} "
          f"(plan {plan64.num_splits} splits, {plan64.config}), pairs {us['pairs_kernel']:.1f} "
          f"({plan128.num_splits}, {plan128.config}), with copies {us['pairs_copies']:.1f}, cuDNN {us['sdpa_cudnn']:.1f}, "
          f"flash {us['sdpa_flash']:.1f}; best SDPA / d64 {best_sdpa / us['d64']:.3f}, / pairs "
          f"{best_sdpa / us['pairs_kernel']:.3f}; err {error:.1e}", flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default=None, help='"B,H_kv,N_k,N_q;..." (default: SHAPES)')
    parser.add_argument("--pair-config", default=None,
                        help='"BLOCK_N,stages,warps" for the paired launch (default: the library\'s rule at D = 128)')
    args = parser.parse_args()
    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__,
                   args={k: v for k, v in vars(args).items() if k != "out"}, shapes=[])
    shapes = SHAPES if args.shapes is None else [tuple(int(x) for x in part.split(","))
                                                 for part in args.shapes.split(";") if part.strip()]
    pair_config = None if args.pair_config is None else tuple(int(x) for x in args.pair_config.split(","))
    for batch, heads_kv, n_k, n_q in shapes:
        results["shapes"].append(time_shape(batch, heads_kv, n_k, n_q, getattr(torch, args.dtype), args.rounds,
                                            pair_config))
        torch.cuda.empty_cache()
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
