"""A persistent forward grid on Hopper: one program an SM walks many query tiles, against one program a tile.

Why: at N = 1k the forward at D = 128 runs 0.82x cuDNN, at N = 16k 0.93x (README grids, 2026-11-27). A
program of 128 query rows at N = 1k walks 8-16 key blocks, and at D = 128 only one program fits an SM
(138 registers a thread with 8 warps), so the SM idles while each new program loads Q and fills its
pipeline, and again while it writes O. cuDNN's and FlashAttention-3's forwards are persistent: a program
stays on its SM and the loads of the next tile overlap the end of the current one. Issue 14 lists "a
persistent grid" among the techniques to try; it had not been measured.

Three kernels of the same math as flashlib's unmasked stage (row max on raw scores, the scale folded into one
FMA, ``exp2``, P V into the accumulator in place; causal: a masked diagonal stage after the unmasked one),
N a multiple of the tiles, (B H N, D) host tensor descriptors:

* ``grid``: one program per (query block, head), as flashlib launches today (``qk_ahead.forward_kernel``'s
  form, with the causal stage added);
* ``persistent``: ``programs`` programs (the SM count times 1 or 2), each taking tiles ``pid, pid + programs,
  ...``; causal grids take the longest tiles (the last query blocks) first;
* ``flattened``: the same, its tile loop given ``tl.range(..., flatten=True)``, so that Triton fuses the tile
  loop and the key loop into one and its software pipeline can load the next tile's first K/V blocks while
  the current tile finishes (the form of Triton's persistent-matmul tutorial). Only one inner loop can be
  fused, so causal grids do not take it.

``--sass`` (no GPU needed): compiles each for sm_90a with the local Triton and prints registers and stack.
On a GPU: every output checked against float64 at the first and last heads and for unwritten (NaN) elements,
then CUDA-graph medians per config at FlashAttention-2's shapes (B N = 16384, H D = 2048), with flashlib's
autotuned forward and SDPA's cuDNN backend in the same process.

    PYTHONPATH=. python3 benchmarks/fwd_persistent.py --sass --d 64,128
    PYTHONPATH=. python3 benchmarks/fwd_persistent.py --d 128,64 --N 1024,4096,16384 --out fwd_persistent.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton
import triton.language as tl

from qk_ahead import LOG2E, descriptors, online_softmax_step

#: (BLOCK_M, BLOCK_N, stages, warps) per head dim
CONFIGS = {128: [(128, 64, 3, 8), (128, 128, 2, 8), (128, 64, 2, 8)],
           64: [(128, 64, 3, 8), (128, 128, 2, 8), (128, 64, 3, 4)]}
VARIANTS = ("grid", "persistent", "flattened")


@triton.jit
def _tile(Q, Q_ROWS, K, V, O, score_scale, row0, m0, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, Q_FROM_POINTER: tl.constexpr):
    """O of the query rows [m0, m0 + BLOCK_M) of the head whose rows start at ``row0``; Q through its
    descriptor, or with ``Q_FROM_POINTER`` through the (B H N, D) contiguous pointer ``Q_ROWS``."""
    if Q_FROM_POINTER:
        q = tl.load(Q_ROWS + (row0 + m0 + tl.arange(0, BLOCK_M))[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :])
    else:
        q = Q.load([row0 + m0, 0])
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    full_hi = m0 if CAUSAL else N
    for start_n in range(0, full_hi, BLOCK_N):
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, tl.dot(q, K.load([row0 + start_n, 0]).T),
                                V.load([row0 + start_n, 0]), score_scale)
    if CAUSAL:  # the diagonal: key j visible to row i where j <= i
        rows = m0 + tl.arange(0, BLOCK_M)
        for start_n in range(m0, m0 + BLOCK_M, BLOCK_N):
            qk = tl.dot(q, K.load([row0 + start_n, 0]).T) * score_scale
            qk = tl.where(rows[:, None] >= start_n + tl.arange(0, BLOCK_N)[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))  # finite: every row sees its own key
            p = tl.math.exp2(qk - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(tl.float16), V.load([row0 + start_n, 0]), acc * alpha[:, None])
            m_i = m_new
    O.store([row0 + m0, 0], (acc / l_i[:, None]).to(O.dtype))


@triton.jit
def grid_kernel(Q, K, V, O, score_scale, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """One program per (query block ``program_id(0)``, head ``program_id(1)``); causal: last blocks first."""
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m
    _tile(Q, Q, K, V, O, score_scale, tl.program_id(1) * N, start_m * BLOCK_M, N, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL,
          False)


@triton.jit
def persistent_kernel(Q, K, V, O, Q_ROWS, score_scale, N, heads, programs, HEAD_DIM: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, FLATTEN: tl.constexpr):
    """``programs`` programs; program p takes tiles p, p + programs, ... of ``heads * N / BLOCK_M``.
    Without a mask tile t is query block t % (N / BLOCK_M) of head t // (N / BLOCK_M) (a head's blocks
    together, for the L2); causal, the last query block of every head comes first. ``FLATTEN``: Q is read
    through the pointer ``Q_ROWS`` ((B H N, D) contiguous), not its descriptor: a descriptor load in the fused
    loop's tile prologue fails Triton's TMA lowering (a mutable/immutable shared-memory type mismatch)."""
    blocks = N // BLOCK_M
    for tile in tl.range(tl.program_id(0), blocks * heads, programs, flatten=FLATTEN):
        if CAUSAL:
            head = tile % heads
            start_m = blocks - 1 - tile // heads
        else:
            head = tile // blocks
            start_m = tile % blocks
        _tile(Q, Q_ROWS, K, V, O, score_scale, head * N, start_m * BLOCK_M, N, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL,
              FLATTEN)


def launcher(variant, q, k, v, o, config, causal, programs):
    """A no-argument call of ``variant`` on (B, H, N, D) contiguous fp16 q, k, v writing o."""
    block_m, block_n, stages, warps = config
    batch, heads, n, d = q.shape
    descs = descriptors(q, k, v, o, block_m, block_n)
    scale = d ** -0.5 * LOG2E
    common = dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, num_stages=stages, num_warps=warps)
    if variant == "grid":
        grid = (n // block_m, batch * heads)
        return lambda: grid_kernel[grid](*descs, scale, n, **common)
    return lambda: persistent_kernel[(programs,)](*descs, q, scale, n, batch * heads, programs,
                                                  FLATTEN=variant == "flattened", **common)


def sass_report(d: int, config, variant: str, causal: bool) -> str:
    """Registers and stack of a variant compiled for sm_90a with the local Triton (no GPU)."""
    from sass_counts import HOPPER, sass_of
    block_m, block_n, stages, warps = config
    sig = {"Q": f"tensordesc<fp16[{block_m},{d}]>", "K": f"tensordesc<fp16[{block_n},{d}]>",
           "V": f"tensordesc<fp16[{block_n},{d}]>", "O": f"tensordesc<fp16[{block_m},{d}]>",
           "score_scale": "fp32", "N": "i32"}
    consts = {"HEAD_DIM": d, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": causal}
    fn = grid_kernel
    if variant != "grid":
        fn = persistent_kernel
        sig = {**{key: sig[key] for key in "QKVO"}, "Q_ROWS": "*fp16", "score_scale": "fp32", "N": "i32",
               "heads": "i32", "programs": "i32"}
        consts["FLATTEN"] = variant == "flattened"
    sig.update({name: "constexpr" for name in consts})
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts)
    compiled = triton.compile(src, target=HOPPER, options=dict(num_warps=warps, num_stages=stages))
    _, res = sass_of(compiled)
    return f"registers {res.get('REG')}, stack {res.get('STACK')} B, shared {res.get('SHARED')} B"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", default="128,64")
    parser.add_argument("--N", default="1024,4096,16384")
    parser.add_argument("--causal", default="no,yes")
    parser.add_argument("--sass", action="store_true", help="compile for sm_90a and print registers (no GPU)")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds, after which no new shape starts")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dims = [int(x) for x in args.d.split(",")]
    causals = [c == "yes" for c in args.causal.split(",")]
    if args.sass:
        print(f"triton {triton.__version__}, sm_90a, fp16")
        for d in dims:
            for causal in causals:
                for config in CONFIGS[d]:
                    for variant in VARIANTS:
                        if causal and variant == "flattened":
                            continue
                        try:
                            report = sass_report(d, config, variant, causal)
                        except Exception as error:  # a pass that fails
                            report = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
                        print(f"D={d} causal={causal} {config} {variant:<10}: {report}", flush=True)
        return
    from flashlib import flash_attention
    from flashlib.bench import ATTENTION_IMPLS
    from flashlib.bench_results import results_meta
    from fwd_two_per_sm import reference_error
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = results_meta(command="PYTHONPATH=. python3 " + " ".join(sys.argv),
                        method="do_bench_cudagraph median (rep 20 ms); fp16; B N = 16384, H D = 2048; rel_err: O "
                               "against float64 at the first and last heads; programs = SMs x factor")
    start, rows = time.time(), []
    for d in dims:
        for causal in causals:
            for n in [int(x) for x in args.N.split(",")]:
                if time.time() - start > args.budget:
                    print("budget spent: no new shape", flush=True)
                    break
                batch, heads = 16384 // n, 2048 // d
                q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
                o = torch.empty_like(q)
                flops = 4 * batch * heads * n * n * d / (2 if causal else 1)
                point = dict(d=d, n=n, causal=causal)
                for config in CONFIGS[d]:
                    for variant, factor in (("grid", None), ("persistent", 1), ("persistent", 2),
                                            ("flattened", 1), ("flattened", 2)):
                        if causal and variant == "flattened":
                            continue
                        name = f"{variant}{'' if factor is None else ' x' + str(factor)} " \
                               f"{config[0]}x{config[1]}/{config[2]}/{config[3]}"
                        try:
                            call = launcher(variant, q, k, v, o, config, causal, sms * (factor or 1))
                            o.fill_(float("nan"))
                            call()
                            torch.cuda.synchronize()
                            unwritten = int(o.isnan().sum())
                            err = reference_error(q, k, v, o, causal)
                            ok = unwritten == 0 and err < 5e-3
                            ms = triton.testing.do_bench_cudagraph(call, rep=20) if ok else None
                        except Exception as error:  # a config that does not fit or compile
                            err, ms, unwritten = None, None, None
                            name += f" ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
                        rows.append(dict(point, impl=name, ms=ms, rel_err=err, unwritten=unwritten,
                                         tflops=flops / ms / 1e9 if ms else None))
                for name, call in (("flashlib", lambda: flash_attention(q, k, v, causal=causal)),
                                   ("sdpa_cudnn", lambda: ATTENTION_IMPLS["sdpa_cudnn"](q, k, v, causal))):
                    call()
                    ms = triton.testing.do_bench_cudagraph(call, rep=20)
                    rows.append(dict(point, impl=name, ms=ms, tflops=flops / ms / 1e9))
                here = [r for r in rows if all(r[key] == value for key, value in point.items())]
                for r in here:
                    tf = f"{r['tflops']:.0f}" if r.get("tflops") else "-"
                    print(f"D={d} N={n} causal={causal} {r['impl']:<34} {tf:>5} TFLOP/s  err {r.get('rel_err')}",
                          flush=True)
                best = {variant: max([r["tflops"] or 0 for r in here if r["impl"].startswith(variant)] or [0])
                        for variant in VARIANTS}
                if best["grid"]:
                    print(f"D={d} N={n} causal={causal} best persistent / grid {best['persistent'] / best['grid']:.3f}"
                          f", flattened / grid {best['flattened'] / best['grid']:.3f}", flush=True)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
