"""Tuning experiments for the attention kernels on a Hopper GPU, in one device call.

Two kinds of experiment, both on the FlashAttention-2 benchmark shapes
(batch * N = 16384, heads * D = 2048), fp16, at one N (4096 by default):

* a **config sweep**: every (BLOCK_M, BLOCK_N, num_stages, num_warps) of a grid
  that fits registers and shared memory, timed alone (the kernel wrapped in an
  autotuner of one config), to see what the library's shortlist misses;
* **source variants**: the kernel module with one small change applied by exact
  text replacement (``VARIANTS``), written beside the original as
  ``flashlib/kernels/_variant_<name>.py`` and timed with the best configs of the
  sweep. Each change and its prediction are in benchmarks/TUNING.md.

Run from a checkout of flashlib (the device tool copies the tree)::

    PYTHONPATH=. python3 benchmarks/tune_attention.py --kernel fwd --out $OUT/tune_fwd.json
    PYTHONPATH=. python3 benchmarks/tune_attention.py --kernel bwd --out $OUT/tune_bwd.json

Times are ``triton.testing.do_bench`` medians. A time budget (``--budget-s``)
stops the sweep early rather than lose everything to the device's time limit.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import itertools
import json
import pathlib
import time

import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlib  # noqa: F401  (decides the Triton mode first)
from flashlib.gpu import detect_gpu
from flashlib.kernels import attention_bwd, attention_fwd
from flashlib.spec import AttentionSpec
from flashlib.validation import relative_error

#: One small change each, as (old text, new text) replacements in the kernel module.
VARIANTS = {
    "fwd": {
        # A: accumulate P @ V inside the MMA (the accumulator is the dot's third operand).
        "acc_in_mma": [(
            "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)",
            "acc = acc * alpha[:, None]\n        acc = tl.dot(p.to(v.dtype), v, acc)",
        )],
        # B: in unmasked blocks, take the row max on raw scores and fold the scale into
        # one FMA per score (valid for a positive scale): one multiply per score less.
        "fma_scale": [
            ("qk = tl.dot(q, k) * qk_scale  # scores in log2 units\n        if MASKED:\n",
             "qk = tl.dot(q, k)\n        if MASKED:\n            qk = qk * qk_scale\n"),
            ("            m_new = tl.maximum(m_i, tl.max(qk, 1))\n"
             "            m_sub = m_new  # every score of an unmasked block is finite\n"
             "        p = tl.math.exp2(qk - m_sub[:, None])\n",
             "            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)\n"
             "            m_sub = m_new\n"
             "            qk = qk * qk_scale - m_sub[:, None]\n"
             "        if MASKED:\n"
             "            qk = qk - m_sub[:, None]\n"
             "        p = tl.math.exp2(qk)\n"),
        ],
    },
    "bwd": {
        # A: dK, dV and dQ accumulate inside their MMAs.
        "acc_in_mma": [
            ("dv += tl.dot(pT.to(do.dtype), do)", "dv = tl.dot(pT.to(do.dtype), do, dv)"),
            ("dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT))", "dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk)"),
            ("dq += tl.dot(ds.to(kT.dtype), tl.trans(kT))", "dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq)"),
        ],
    },
}
VARIANTS["fwd"]["acc_in_mma+fma_scale"] = VARIANTS["fwd"]["acc_in_mma"] + VARIANTS["fwd"]["fma_scale"]

FWD_KEY = ["Q_BUCKET", "K_BUCKET", "HEAD_DIM", "HAS_SEQ_LENS", "HAS_LEFT", "HAS_RIGHT"]
BWD_KEY = FWD_KEY + ["KV_GROUP"]


def variant_module(kernel: str, name: str):
    """The kernel module with the variant's replacements applied (each must match exactly once)."""
    base = attention_fwd if kernel == "fwd" else attention_bwd
    if name == "base":
        return base
    src = pathlib.Path(base.__file__).read_text()
    for old, new in VARIANTS[kernel][name]:
        if src.count(old) != 1:
            raise RuntimeError(f"variant {name}: the text to replace occurs {src.count(old)} times: {old!r}")
        src = src.replace(old, new)
    slug = name.replace("+", "_")
    path = pathlib.Path(base.__file__).with_name(f"_variant_{kernel}_{slug}.py")
    path.write_text(src)
    return importlib.import_module(f"flashlib.kernels._variant_{kernel}_{slug}")


def one_config(kernel_fn, key, cfg):
    bm, bn, stages, warps = cfg
    return triton.autotune(configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages,
                                                  num_warps=warps)], key=key)(kernel_fn)


def fwd_candidates(block_d: int):
    grid = itertools.product((64, 128), (32, 64, 128), (2, 3, 4), (4, 8))
    budget = attention_fwd.smem_budget()
    return [c for c in grid if attention_fwd._fits(*c, block_d, 2, 4096, budget)]


def bwd_candidates(which: str, block_d: int):
    if which == "dkdv":
        grid = itertools.product((16, 32, 64), (64, 128), (2, 3), (4, 8))
    else:
        grid = itertools.product((64, 128), (16, 32, 64), (2, 3), (4, 8))
    budget = attention_fwd.smem_budget()
    return [c for c in grid if attention_bwd._fits(which, *c, block_d, 2, budget)]


def make_inputs(n: int, d: int, seed: int = 0):
    b, h = 16384 // n, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
    return q, k, v, do


def flops(n, d, causal, mode):
    b, h = 16384 // n, 2048 // d
    f = 4 * b * h * n * n * d / (2 if causal else 1)
    return f * (2.5 if mode == "bwd" else 1.0)


def bench(fn, warmup, rep):
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def sdpa_times(q, k, v, do, causal, mode, warmup, rep):
    out = {}
    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                if mode == "fwd":
                    out[name] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup, rep)
                else:
                    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                    o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    out[name] = bench(lambda: o.backward(do, retain_graph=True), warmup, rep)
        except Exception as exc:  # a backend may refuse a shape
            out[name] = None
            print(f"{name}: {type(exc).__name__}: {exc}")
    return out


def run_fwd(args, deadline, rows):
    for d, causal in itertools.product(args.d, (False, True)):
        q, k, v, _ = make_inputs(args.n, d)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        base = {**sdpa_times(q, k, v, None, causal, "fwd", args.warmup, args.rep)}
        fl = flops(args.n, d, causal, "fwd")
        for name, ms in base.items():
            rows.append(dict(kernel="fwd", variant=name, D=d, causal=causal, config=None, ms=ms,
                             tflops=fl / ms / 1e9 if ms else None))
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
        timed = []
        for name in ["base"] + list(VARIANTS["fwd"]):
            module = variant_module("fwd", name)
            configs = fwd_candidates(max(16, d)) if name == "base" else [cfg for _, cfg in sorted(timed)[:args.top]]
            for cfg in configs:
                if time.time() > deadline:
                    print("time budget spent: stopping the sweep here")
                    return
                module.attention_fwd_kernel_autotuned = one_config(module.attention_fwd_kernel, FWD_KEY, cfg)
                try:
                    # use_gluon=False: on Hopper the route would send most points to the Gluon kernel (session 64)
                    run = lambda: module.launch_attention_forward(  # noqa: E731
                        q, k, v, o, lse, spec=AttentionSpec(causal=causal), use_gluon=False)
                    o.fill_(float("nan"))
                    run()
                    err = relative_error(o.float(), ref)
                    ms = bench(run, args.warmup, args.rep)
                except Exception as exc:
                    print(f"fwd {name} D={d} causal={causal} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                if name == "base":
                    timed.append((ms, cfg))
                rows.append(dict(kernel="fwd", variant=name, D=d, causal=causal, config=list(cfg), ms=ms,
                                 tflops=fl / ms / 1e9, rel_err=err))
        torch.cuda.empty_cache()  # the next head_dim's tensors replace these (the closures hold them until then)


def run_bwd(args, deadline, rows):
    for d, causal in itertools.product(args.d, (False, True)):
        q, k, v, do = make_inputs(args.n, d)
        fl = flops(args.n, d, causal, "bwd")
        for name, ms in sdpa_times(q, k, v, do, causal, "bwd", args.warmup, args.rep).items():
            rows.append(dict(kernel="bwd", variant=name, D=d, causal=causal, config=None, ms=ms,
                             tflops=fl / ms / 1e9 if ms else None))
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
        attention_fwd.launch_attention_forward(q, k, v, o, lse, spec=AttentionSpec(causal=causal))
        qg, kg, vg = (t.detach().float().requires_grad_() for t in (q, k, v))
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do.float())
        refs = (qg.grad, kg.grad, vg.grad)
        dq, dk, dv = (torch.empty_like(q) for _ in range(3))
        best = {}
        for name in ["base"] + list(VARIANTS["bwd"]):
            module = variant_module("bwd", name)
            for which in ("dkdv", "dq"):
                timed = []
                configs = (bwd_candidates(which, max(16, d)) if name == "base"
                           else [best[which]] if which in best else [])
                for cfg in configs:
                    if time.time() > deadline:
                        print("time budget spent: stopping the sweep here")
                        return
                    fn = module.attention_bwd_dkdv_kernel if which == "dkdv" else module.attention_bwd_dq_kernel
                    tuned = one_config(fn, BWD_KEY, cfg)
                    other = best.get("dq" if which == "dkdv" else "dkdv")
                    if which == "dkdv":
                        module.attention_bwd_dkdv_kernel_autotuned = tuned
                        if other:
                            module.attention_bwd_dq_kernel_autotuned = one_config(
                                module.attention_bwd_dq_kernel, BWD_KEY, other)
                    else:
                        module.attention_bwd_dq_kernel_autotuned = tuned
                        if other:
                            module.attention_bwd_dkdv_kernel_autotuned = one_config(
                                module.attention_bwd_dkdv_kernel, BWD_KEY, other)
                    run = lambda: module.launch_attention_backward(  # noqa: E731
                        q, k, v, o, lse, do, dq, dk, dv, spec=AttentionSpec(causal=causal), use_gluon=False)
                    try:
                        for t in (dq, dk, dv):
                            t.fill_(float("nan"))
                        run()
                        err = max(relative_error(g.float(), r) for g, r in zip((dq, dk, dv), refs))
                        ms = bench(run, args.warmup, args.rep)
                    except Exception as exc:
                        print(f"bwd {name} {which} D={d} causal={causal} {cfg}: {type(exc).__name__}: "
                              f"{str(exc)[:120]}")
                        continue
                    timed.append((ms, cfg))
                    rows.append(dict(kernel="bwd", variant=name, part=which, D=d, causal=causal,
                                     config=list(cfg), other=list(other) if other else None, ms=ms,
                                     tflops=fl / ms / 1e9, rel_err=err))
                if name == "base" and timed:
                    best[which] = min(timed)[1]
        torch.cuda.empty_cache()  # the next head_dim's tensors replace these (the closures hold them until then)


def summary(rows):
    print(f"{'kernel':6} {'D':>4} {'causal':>6} {'variant':22} {'config':18} {'TFLOP/s':>8} {'rel_err':>8}")
    keys = sorted({(r["kernel"], r["D"], r["causal"]) for r in rows})
    for kernel, d, causal in keys:
        group = [r for r in rows if (r["kernel"], r["D"], r["causal"]) == (kernel, d, causal) and r["tflops"]]
        for variant in dict.fromkeys(r["variant"] for r in group):
            mine = [r for r in group if r["variant"] == variant]
            top = max(mine, key=lambda r: r["tflops"])
            part = top.get("part", "")
            cfg = f"{part}{top['config']}" if top["config"] else "-"
            err = f"{top['rel_err']:.1e}" if top.get("rel_err") is not None else "-"
            print(f"{kernel:6} {d:>4} {str(causal):>6} {variant:22} {cfg:18} {top['tflops']:8.1f} {err:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=["fwd", "bwd"], required=True)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--d", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128])
    parser.add_argument("--top", type=int, default=3, help="configs of the base sweep tried on each variant")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rep", type=int, default=40)
    parser.add_argument("--budget-s", type=float, default=500)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    start = time.time()
    rows: list[dict] = []
    try:
        (run_fwd if args.kernel == "fwd" else run_bwd)(args, start + args.budget_s, rows)
    finally:
        result = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__,
                      n=args.n, method=f"do_bench median, warmup {args.warmup} ms, rep {args.rep} ms; fp16; "
                                       "FA2 shapes (B*N=16384, H*D=2048)",
                      seconds=round(time.time() - start), rows=rows)
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
        summary(rows)


if __name__ == "__main__":
    main()
