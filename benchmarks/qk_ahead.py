"""Does issuing the next key block's Q K^T before this block's softmax let Hopper overlap the two?

FlashAttention-3's second trick ("intra-warpgroup overlap"): within one warpgroup, start the tensor-core
product S_{j+1} = Q K_{j+1}^T, asynchronous on Hopper (wgmma), and run the softmax of S_j on the ALUs and the
SFU while it computes, instead of waiting for each product before its softmax. In Triton the order of the
source is the only handle: this script writes the forward's unmasked loop both ways, as two small kernels
of the same math as flashlib's unmasked stage (row max on raw scores, the scale folded into one FMA, ``exp2``,
P V into the accumulator in place), non-causal, N a multiple of the key block, host tensor descriptors:

* ``base``: load K_j and V_j, S_j = Q K_j^T, softmax, acc += P_j V_j (flashlib's loop);
* ``ahead``: S_0 before the loop; in iteration j, load K_{j+1} and V_j, issue S_{j+1} = Q K_{j+1}^T, then the
  softmax of S_j and acc += P_j V_j; the last block after the loop.

``--sass`` (no GPU needed): compiles both for sm_90a with the local Triton and prints, per variant, the
registers, the stack, and the order of the loop's tensor-core instructions (HGMMA), their waits
(WARPGROUP.DEPBAR / WARPGROUP.ARRIVE) and the softmax's exponentials (MUFU.EX2): whether the compiler kept
S_{j+1} in flight across the softmax (no wait between its HGMMAs and the MUFUs) or waited at once.

On a GPU: both variants' outputs against float64 at the first and last heads, then CUDA-graph medians of
each config, at the FlashAttention-2 benchmark's shapes (B N = 16384, H D = 2048), fp16, with flashlib's own
forward and SDPA's cuDNN backend in the same process. ``--out FILE.json`` stores the rows.

    PYTHONPATH=. python3 benchmarks/qk_ahead.py --sass --d 64,128
    PYTHONPATH=. python3 benchmarks/qk_ahead.py --d 64,128 --N 1024,4096,16384 --out qk_ahead.json
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E = 1.4426950408889634
CONFIGS = [(128, 64, 3, 8), (128, 128, 2, 8), (128, 64, 2, 8), (128, 64, 3, 4), (128, 64, 2, 4)]


@triton.jit
def online_softmax_step(acc, l_i, m_i, qk, v, score_scale):
    """One key block's online-softmax step on raw scores ``qk`` (flashlib's unmasked path)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * score_scale)
    p = tl.math.exp2(qk * score_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def forward_kernel(Q, K, V, O, score_scale, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, AHEAD: tl.constexpr):
    """O of query block ``program_id(0)`` of head ``program_id(1)``; Q, K, V, O are (B H N, D) descriptors."""
    row0 = tl.program_id(1) * N
    m0 = tl.program_id(0) * BLOCK_M
    q = Q.load([row0 + m0, 0])
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    if AHEAD:
        qk = tl.dot(q, K.load([row0, 0]).T)
        for start_n in range(0, N - BLOCK_N, BLOCK_N):
            k_next = K.load([row0 + start_n + BLOCK_N, 0]).T
            v = V.load([row0 + start_n, 0])
            qk_next = tl.dot(q, k_next)  # issued before this block's softmax
            acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, v, score_scale)
            qk = qk_next
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, V.load([row0 + N - BLOCK_N, 0]), score_scale)
    else:
        for start_n in range(0, N, BLOCK_N):
            k = K.load([row0 + start_n, 0]).T
            v = V.load([row0 + start_n, 0])
            acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, tl.dot(q, k), v, score_scale)
    O.store([row0 + m0, 0], (acc / l_i[:, None]).to(O.dtype))


def descriptors(q, k, v, o, block_m, block_n):
    """(B H N, D) host descriptors of the four (B, H, N, D) contiguous tensors."""
    d = q.shape[-1]
    flat = [t.reshape(-1, d) for t in (q, k, v, o)]
    return (TensorDescriptor.from_tensor(flat[0], [block_m, d]), TensorDescriptor.from_tensor(flat[1], [block_n, d]),
            TensorDescriptor.from_tensor(flat[2], [block_n, d]), TensorDescriptor.from_tensor(flat[3], [block_m, d]))


def run(q, k, v, o, config, ahead):
    block_m, block_n, stages, warps = config
    batch, heads, n, d = q.shape
    descs = descriptors(q, k, v, o, block_m, block_n)
    grid = (n // block_m, batch * heads)
    return lambda: forward_kernel[grid](*descs, d ** -0.5 * LOG2E, n, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
                                        AHEAD=ahead, num_stages=stages, num_warps=warps)


def sass_report(d: int, config, ahead: bool) -> str:
    """Registers, stack and the loop's HGMMA / wait / MUFU.EX2 order, compiled for sm_90a (no GPU)."""
    from sass_counts import HOPPER, sass_of
    block_m, block_n, stages, warps = config
    sig = {"Q": f"tensordesc<fp16[{block_m},{d}]>", "K": f"tensordesc<fp16[{block_n},{d}]>",
           "V": f"tensordesc<fp16[{block_n},{d}]>", "O": f"tensordesc<fp16[{block_m},{d}]>",
           "score_scale": "fp32", "N": "i32", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr",
           "BLOCK_N": "constexpr", "AHEAD": "constexpr"}
    consts = {"HEAD_DIM": d, "BLOCK_M": block_m, "BLOCK_N": block_n, "AHEAD": ahead}
    src = triton.compiler.ASTSource(fn=forward_kernel, signature=sig, constexprs=consts)
    compiled = triton.compile(src, target=HOPPER, options=dict(num_warps=warps, num_stages=stages))
    sass, res = sass_of(compiled)
    seq = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if not m:
            continue
        op = m.group(1)
        if op.startswith("HGMMA"):
            seq.append("G")
        elif op.startswith("WARPGROUP.DEPBAR") or op.startswith("WARPGROUP.ARRIVE") or op.startswith("WARPSYNC"):
            seq.append("|" if "DEPBAR" in op else "a")
        elif op.startswith("MUFU.EX2"):
            seq.append("e")
        elif op.startswith("BRA"):
            seq.append(" B ")
    text = re.sub(r"(.)\1{3,}", lambda mm: f"{mm.group(1)}x{len(mm.group(0))}", "".join(seq))
    return f"registers {res.get('REG')}, stack {res.get('STACK')} B\n    {text}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", default="64,128")
    parser.add_argument("--N", default="1024,4096,16384")
    parser.add_argument("--sass", action="store_true", help="compile for sm_90a and print the loop's order (no GPU)")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds, after which no new shape starts")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dims = [int(x) for x in args.d.split(",")]
    if args.sass:
        print(f"triton {triton.__version__}, sm_90a; G = HGMMA, | = WARPGROUP.DEPBAR (wait), a = WARPGROUP.ARRIVE or WARPSYNC, e = MUFU.EX2, B = branch")
        for d in dims:
            for config in CONFIGS:
                for ahead in (False, True):
                    print(f"D={d} {config} {'ahead' if ahead else 'base '}: {sass_report(d, config, ahead)}")
        return
    from flashlib import flash_attention
    from flashlib.bench import ATTENTION_IMPLS
    from flashlib.bench_results import results_meta
    from fwd_two_per_sm import reference_error
    start = time.time()
    rows = []
    for d in dims:
        for n in [int(x) for x in args.N.split(",")]:
            if time.time() - start > args.budget:
                print("budget spent", file=sys.stderr)
                break
            batch, heads = 16384 // n, 2048 // d
            q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
            o = torch.full_like(q, float("nan"))
            flops = 4 * batch * heads * n * n * d
            times = {}
            for config in CONFIGS:
                for ahead in (False, True):
                    name = f"{'ahead' if ahead else 'base'} {config[0]}x{config[1]}/{config[2]}/{config[3]}"
                    try:
                        call = run(q, k, v, o, config, ahead)
                        o.fill_(float("nan"))
                        call()
                        torch.cuda.synchronize()
                        err = reference_error(q, k, v, o, causal=False)
                        ms = triton.testing.do_bench_cudagraph(call, rep=20) if err < 5e-3 else None
                    except Exception as error:  # a config that does not fit
                        err, ms = None, None
                        name += f" ({type(error).__name__})"
                    times[name] = ms
                    rows.append(dict(d=d, n=n, impl=name, ms=ms, rel_err=err,
                                     tflops=flops / ms / 1e9 if ms else None))
            for name, call in (("flashlib", lambda: flash_attention(q, k, v)),
                               ("sdpa_cudnn", lambda: ATTENTION_IMPLS["sdpa_cudnn"](q, k, v, False))):
                ms = triton.testing.do_bench_cudagraph(call, rep=20)
                rows.append(dict(d=d, n=n, impl=name, ms=ms, tflops=flops / ms / 1e9))
            for r in rows:
                if r["d"] == d and r["n"] == n:
                    tf = f"{r['tflops']:.0f}" if r.get("tflops") else "-"
                    print(f"D={d} N={n} {r['impl']:<26} {tf:>5} TFLOP/s  err {r.get('rel_err')}")
            best = {a: max((r["tflops"] or 0) for r in rows if r["d"] == d and r["n"] == n
                           and r["impl"].startswith(a)) for a in ("base", "ahead")}
            print(f"D={d} N={n} best ahead / best base: {best['ahead'] / best['base']:.3f}")
            if args.out:
                meta = results_meta(command="PYTHONPATH=. python3 " + " ".join(sys.argv),
                                    method="do_bench_cudagraph median (rep 20 ms); fp16; B N = 16384, H D = 2048")
                with open(args.out, "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
