"""Decoding repeated, every run compared bitwise with the first and with the float64 reference: a race
(a merge that reads partials too early, a page read before it is written) shows as runs that differ.
Several copies at once put other processes' kernels between ours.

    PYTHONPATH=. python benchmarks/decode_stress.py [--repeats 30]

The problems are those of tests/test_decode.py's GPU test: 3 sequences (0, 1000 and 4092 cached tokens
of 4096, 4 new ones appended), 32 query heads over 32, 8 or 1 kv heads, D = 64 and 128, fp16 and bf16,
a contiguous and a paged cache (64-token pages, shuffled).
"""
from __future__ import annotations

import argparse
import itertools

import torch

from flashlib import flash_attention_with_kvcache
from flashlib.bench_decode import paged_copy
from flashlib.reference import kvcache_attention
from flashlib.validation import relative_error, tolerance


def problem(dtype, head_dim: int, heads_kv: int, seed: int = 12):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to("cuda", dtype)
    q = randn(3, 4, 32, head_dim)
    k_cache, v_cache = randn(3, 4096, heads_kv, head_dim), randn(3, 4096, heads_kv, head_dim)
    k, v = randn(3, 4, heads_kv, head_dim), randn(3, 4, heads_kv, head_dim)
    lengths = torch.tensor([0, 1000, 4092], dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, k, v, lengths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    bad = 0
    for dtype, head_dim, heads_kv in itertools.product((torch.float16, torch.bfloat16), (64, 128), (32, 8, 1)):
        q, k_cache, v_cache, k, v, lengths = problem(dtype, head_dim, heads_kv)
        k_pool, v_pool, table = paged_copy(k_cache, v_cache, torch.Generator().manual_seed(12), page_size=64)
        first = None
        for i in range(args.repeats):  # appending the same tokens at the same places again changes nothing
            o = flash_attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths)
            o_paged = flash_attention_with_kvcache(q, k_pool, v_pool, k, v, cache_seqlens=lengths, block_table=table)
            if first is None:
                first = (o, o_paged)
                ref = kvcache_attention(q.double(), k_cache.double(), v_cache.double(), lengths + 4)
                errors = [relative_error(x, ref) for x in first]
                print(f"{dtype} D{head_dim} kv{heads_kv}: rel err {errors[0]:.2e} paged {errors[1]:.2e} "
                      f"(tol {tolerance(dtype):.1e})", flush=True)
                bad += sum(e >= tolerance(dtype) for e in errors)
            for name, x, x0 in (("contiguous", o, first[0]), ("paged", o_paged, first[1])):
                if not torch.equal(x, x0):
                    bad += 1
                    diff = (x.float() - x0.float()).abs()
                    print(f"  run {i} {name}: differs from run 0 by up to {diff.max().item():.3e}, "
                          f"NaN {x.isnan().any().item()}, (b, n, h) {diff.flatten(2).amax(-1).nonzero().tolist()[:8]}",
                          flush=True)
    print(f"bad {bad}", flush=True)


if __name__ == "__main__":
    main()
