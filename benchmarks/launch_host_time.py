"""Host time per call of each route into the attention kernels, and where it goes (cProfile).

    PYTHONPATH=.:benchmarks python benchmarks/launch_host_time.py ["raw fwd launcher" ...]
    PYTHONPATH=.:benchmarks python benchmarks/launch_host_time.py --direct-ab [--rounds 5]
    PYTHONPATH=.:benchmarks python benchmarks/launch_host_time.py --hf [--interleave [--rounds 5]]
        ["hf flashlib layer" ...]

One head, N = 128, fp16: the GPU work is tiny and queued asynchronously, so a loop of calls
is bound by the host and the time per call is the host's (``front_door.host_us``, best of 3
loops of 1000 calls). The names given on the command line are then profiled with cProfile
(1000 calls each). benchmarks/TUNING.md, sixth finding, quotes the results
(benchmarks/results/launch_host_time_nvidia_h100_80gb_hbm3.txt).

``--hf`` times instead the routes of one decoding step's attention in a Transformers layer (flashlib.hf against
sdpa's), at ``benchmarks/hf_generate.py``'s shapes (8 left-padded rows of 600 keys, 16 query heads on 4 K/V heads,
D = 128, bf16), and the parts of flashlib's: where an eager decoding step's host time goes (TUNING.md, forty-fifth
finding); then the GPU time of the split-KV call with the kernel's own split count and with one split (no merge
kernel), and of sdpa's layer.

``--interleave`` times the routes in ``--rounds`` rounds, each round in another rotation of their order, and prints
medians: one pass in a fixed order let ``splitkv_attention`` time slower than the route that calls it in two runs of
three (TUNING.md, fifty-first finding).

``--direct-ab`` compares, in one process and interleaved round by round (the GPU machine's
host varies from one call to the next), every route with remembered binaries launched through
Triton's own launcher (``launch.DIRECT_LAUNCH = False``) and through :mod:`flashlib.kernels.direct_launch`,
and prints the median of the rounds (TUNING.md, fourteenth finding).
"""
import argparse
import cProfile
import io
import pstats
import statistics

import torch
import triton
import triton.testing

from flashlib import flash_attention, flash_attention_with_kvcache
from flashlib.kernels import launch as launch_module
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.spec import AttentionSpec
from front_door import host_us


@triton.jit
def noop(x):
    pass


def routes() -> dict:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(4))
    o, lse = torch.empty_like(q), torch.empty(1, 1, 128, device="cuda")
    spec = AttentionSpec(causal=True)
    dropout = AttentionSpec(causal=True, dropout_p=0.1)
    seed = torch.full((1,), 2**40 + 12345, dtype=torch.int64, device="cuda")  # on the device, as flashlib.ops has it
    gq, gk, gv = (t.clone().requires_grad_() for t in (q, k, v))
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    # head_dim 128: the backward's streamed tiles come through host descriptors too
    q2, k2, v2, do2, o2, dq2, dk2, dv2 = (torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.float16)
                                          for _ in range(8))
    launch_attention_forward(q2, k2, v2, o2, lse, spec=spec)
    # one decoding step: 4 sequences, 8 query heads on 2 K/V heads, 1024 cached keys
    cache_k, cache_v = (torch.randn(4, 1024, 2, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    q_new, lens = torch.randn(4, 1, 8, 64, device="cuda", dtype=torch.float16), torch.full(
        (4,), 1000, dtype=torch.int32, device="cuda")
    return {
        "noop triton kernel": lambda: noop[(1,)](q),
        "empty_like": lambda: torch.empty_like(q),
        "raw fwd launcher": lambda: launch_attention_forward(q, k, v, o, lse, spec=spec),
        "raw fwd launcher tma off": lambda: launch_attention_forward(q, k, v, o, lse, spec=spec, use_tma=False),
        "raw fwd launcher dropout": lambda: launch_attention_forward(q, k, v, o, lse, spec=dropout,
                                                                         dropout_seed=seed),
        "raw fwd launcher d128 gluon": lambda: launch_attention_forward(q2, k2, v2, o2, lse, spec=spec, use_gluon=True),
        "raw fwd launcher d128 triton": lambda: launch_attention_forward(q2, k2, v2, o2, lse, spec=spec,
                                                                         use_gluon=False),
        "raw bwd launcher": lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec),
        "raw bwd launcher d128": lambda: launch_attention_backward(q2, k2, v2, o2, lse, do2, dq2, dk2, dv2,
                                                                   spec=spec),
        "flash_attention_with_kvcache": lambda: flash_attention_with_kvcache(q_new, cache_k, cache_v,
                                                                             cache_seqlens=lens),
        "flash_attention nograd": lambda: flash_attention(q, k, v, causal=True),
        "flash_attention fwd+bwd": lambda: flash_attention(gq, gk, gv, causal=True).backward(do),
        "flash_attention nograd dropout": lambda: flash_attention(q, k, v, causal=True, dropout_p=0.1),
    }


def hf_routes() -> dict:
    """One decoding step's attention in a Transformers layer, flashlib's and sdpa's, and the parts of flashlib's."""
    import types

    import transformers  # noqa: F401  (flashlib[hf])
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from flashlib import hf
    from flashlib.decode import splitkv_attention
    from flashlib.kernels.decode import launch_splitkv_attention

    torch.manual_seed(0)
    batch, heads, heads_kv, n_k, head_dim = 8, 16, 4, 600, 128
    query = torch.randn(batch, heads, 1, head_dim, device="cuda", dtype=torch.bfloat16)
    key, value = (torch.randn(batch, heads_kv, n_k, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    # left padding of 0, 37, 74, ... keys: True where a token is
    tokens = torch.arange(n_k, device="cuda")[None, :] >= torch.arange(0, batch * 37, 37, device="cuda")[:, None]
    module = types.SimpleNamespace(is_causal=True, num_key_value_groups=heads // heads_kv)
    shared = hf._with_a_shared_plan(tokens.clone())  # as the model's mask function hands it to every layer
    plan = hf._padding_plan(shared)
    sdpa_mask = tokens[:, None, None, :]  # sdpa's mask of a decoding step: (B, 1, 1, N_k)
    q = query.transpose(1, 2)
    k_pages, v_pages, table = hf._token_pages(key.transpose(1, 2), value.transpose(1, 2), plan)
    spec = AttentionSpec(causal=True)
    o, lse = torch.empty_like(q), torch.empty(batch, heads, 1, device="cuda")
    return {
        "hf sdpa layer": lambda: sdpa_attention_forward(module, query, key, value, sdpa_mask),
        "hf flashlib layer": lambda: hf.flashlib_attention_forward(module, query, key, value, shared),
        "hf flashlib layer own plan": lambda: hf.flashlib_attention_forward(module, query, key, value, tokens),
        "kvcache token pages": lambda: flash_attention_with_kvcache(q, k_pages, v_pages, cache_seqlens=plan.lengths,
                                                                    block_table=table, check_values=False),
        "kvcache token pages one split": lambda: flash_attention_with_kvcache(
            q, k_pages, v_pages, cache_seqlens=plan.lengths, block_table=table, check_values=False, num_splits=1),
        "splitkv_attention": lambda: splitkv_attention(q, k_pages, v_pages, "bnhd", spec, k_lens=plan.lengths,
                                                       block_table=table),
        "raw splitkv launcher": lambda: launch_splitkv_attention(q, k_pages, v_pages, o, lse, scale=0.088,
                                                                 causal=True, k_lens=plan.lengths, block_table=table),
        "masked_fill": lambda: q.masked_fill(plan.padded_queries(1), 0),
    }


def interleaved(fns: dict, rounds: int) -> None:
    """Each route's host time over ``rounds`` rounds, every round visiting the routes in another rotation of their
    order (a route timed right after another need not pay for it every time); medians, with the rounds' spread."""
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(host_us(fns[name], calls=1000))
    print(f"{'route':32s} {'median us':>10s}   (min-max of {rounds} rounds, each in a rotated order)")
    for name in names:
        print(f"{name:32s} {statistics.median(times[name]):10.1f}   ({min(times[name]):.1f}-{max(times[name]):.1f})",
              flush=True)


def direct_ab(fns: dict, rounds: int) -> None:
    """Each route's host time with Triton's launcher and with the direct one, interleaved; medians."""
    times = {(name, direct): [] for name in fns for direct in (False, True)}
    for _ in range(rounds):
        for direct in (False, True):
            launch_module.DIRECT_LAUNCH = direct
            for name, fn in fns.items():
                times[name, direct].append(host_us(fn, calls=1000))
    launch_module.DIRECT_LAUNCH = True
    print(f"{'route':32s} {'Triton launcher':>16s} {'direct':>10s}   (median of {rounds} rounds, us)")
    for name in fns:
        before, after = (statistics.median(times[name, d]) for d in (False, True))
        print(f"{name:32s} {before:16.1f} {after:10.1f}   {before - after:+6.1f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", nargs="*", help="routes to profile with cProfile after timing them all")
    parser.add_argument("--direct-ab", action="store_true", help="Triton's launcher against the direct one")
    parser.add_argument("--interleave", action="store_true",
                        help="time the routes in --rounds rounds, each in a rotated order, and print medians")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hf", action="store_true", help="time a Transformers decoding step's attention routes "
                        "instead (and the no-op launch)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1; got {args.rounds}")
    fns = routes()
    if args.hf:  # only those, with a no-op launch for scale
        fns = {"noop triton kernel": fns["noop triton kernel"], **hf_routes()}
    with torch.set_grad_enabled(not args.hf):  # generate runs under no_grad
        if args.direct_ab:
            direct_ab(fns, args.rounds)
            return
        if args.interleave:
            interleaved(fns, args.rounds)
        else:
            for name, fn in fns.items():
                print(f"{name:30s} {host_us(fn, calls=1000):8.1f} us", flush=True)
        if args.hf:  # what fewer launches would cost the GPU: its own time, from CUDA-graph replays
            for name in ("kvcache token pages", "kvcache token pages one split", "hf sdpa layer"):
                gpu_us = triton.testing.do_bench_cudagraph(fns[name], rep=200) * 1e3
                print(f"{name:30s} {gpu_us:8.1f} us of GPU time (do_bench_cudagraph)", flush=True)
        for name in args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(1000):
                fns[name]()
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(22)
            print("=====", name)
            print(out.getvalue()[-6000:])


if __name__ == "__main__":
    main()
