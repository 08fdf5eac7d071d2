"""Host time of flash_attention_with_kvcache's front door with the kernel launch taken out, on the CPU.

``.venv/bin/python benchmarks/decode_host_cpu.py > benchmarks/results/decode_host_cpu.txt``: the
checks, the append into a paged cache and the allocations of one decoding call (B 8, H 16, H_kv 4,
D 64, pages of 16), with and without the value checks, as microseconds per call over 500 calls, and
the top of a cProfile. CPU tensors: the append's indexing runs for real, the kernel does not.
"""
from __future__ import annotations

import cProfile
import datetime
import platform
import pstats
import time

import torch

import flashlib.decode as decode


def main():
    decode.launch_splitkv_attention = lambda *args, **kwargs: None  # the front door alone
    batch, heads, heads_kv, head_dim, page_size, pages = 8, 16, 4, 64, 16, 48
    k_pool = torch.zeros(batch * pages, page_size, heads_kv, head_dim)
    v_pool = torch.zeros_like(k_pool)
    table = torch.arange(batch * pages).view(batch, pages).int()
    lengths = torch.full((batch,), 100, dtype=torch.int32)
    q = torch.randn(batch, 1, heads, head_dim)
    k, v = torch.randn(batch, 1, heads_kv, head_dim), torch.randn(batch, 1, heads_kv, head_dim)

    def call(**kwargs):
        decode.flash_attention_with_kvcache(q, k_pool, v_pool, k, v, cache_seqlens=lengths, block_table=table,
                                            **kwargs)

    print(f"{datetime.date.today()}, python {platform.python_version()}, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}")
    with torch.no_grad():
        for name, kwargs in (("checked", {}), ("check_values=False", {"check_values": False})):
            for _ in range(50):
                call(**kwargs)
            begin = time.perf_counter()
            for _ in range(500):
                call(**kwargs)
            print(f"{name}: {(time.perf_counter() - begin) / 500 * 1e6:.0f} us per call")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(300):
            call(check_values=False)
        profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
