"""Same-process A/B of the order of a causal grid's programs, in pure GPU time (CUDA graphs), FA2 shapes.

- ``longest``: causal grids run their query blocks last to first, forward and dQ
  (``attention_fwd.LONGEST_FIRST``, the library's default);
- ``grid``: in grid order, the first query block first.

    PYTHONPATH=. python benchmarks/schedule_ab.py [--variants grid,longest] [--d 64,128]
        [--N 1024,4096,16384] [--causal both] [--dtype fp16] [--time-budget S]

(At commit 68fb205 this script also had a ``ws`` variant: the unmasked key loops as
``tl.range(..., warp_specialize=True)``. Triton 3.6 on the H100 refused it at 4 warps and gained
nothing at 8; benchmarks/TUNING.md, fifteenth finding. The switch was taken out of the kernels.
At commit 2285dd8 it had an ``exp2`` variant: half of the forward's exponentials in unmasked blocks as a
cubic on the FMA units, as FlashAttention-4 does; 14-20% slower in fp16 and in FP8, taken out too.)

Each variant autotunes over the library's own configs. Compiling is the slow part, so worker
processes first compile every variant's configs in parallel, one config at a time (a config that
does not compile is reported and left out of that variant), and the timed process then reads the
binaries from Triton's disk cache. For every shape the first variant autotunes and the others run the
configs it chose, so that only the variant differs; the variants are then timed in ``--rounds``
interleaved rounds (``do_bench_cudagraph``: the host is out of the measurement; medians reported).
O, dQ, dK and dV of every variant are compared with SDPA's (flash backend) by relative error, and with
the first variant's bitwise.
benchmarks/TUNING.md quotes the results.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
import triton.testing

from config_text import parse_config
from flashlib.kernels import attention_bwd, attention_fwd, launch
from flashlib.spec import AttentionSpec
from flashlib.timing import graph_time_ms

VARIANTS = ("grid", "longest")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
TUNED = {"fwd": attention_fwd.attention_fwd_kernel_autotuned,
         "dkdv": attention_bwd.attention_bwd_dkdv_kernel_autotuned,
         "dq": attention_bwd.attention_bwd_dq_kernel_autotuned}
#: Seconds the compiling workers get, all together (a compiler that hangs must not take the whole call).
WARM_TIMEOUT = 300
ORIGINAL_CONFIGS = {name: list(tuned.configs) for name, tuned in TUNED.items()}


def use(variant: str, configs: dict[str, list[triton.Config]]) -> None:
    """Switch the library to ``variant`` and forget every earlier choice and binary."""
    attention_fwd.LONGEST_FIRST = variant != "grid"
    for kernel, tuned in TUNED.items():
        tuned.configs = configs[kernel]
    launch.forget()


def tensors(n: int, d: int, dtype: torch.dtype, seed: int = 0):
    b, h = 16384 // n, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    return q, k, v, do


def calls(q, k, v, do, causal: bool):
    """(forward, backward) closures over preallocated outputs, and the outputs."""
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    spec = AttentionSpec(causal=causal)

    # use_gluon=False: the schedule is the Triton kernels'; the Gluon kernels that the route takes on Hopper ignore
    # it, so both sides of the A/B would time one kernel (session 64)
    def forward():
        attention_fwd.launch_attention_forward(q, k, v, o, lse, spec=spec, use_gluon=False)

    def backward():
        attention_bwd.launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec, use_gluon=False)
    return forward, backward, (o, dq, dk, dv)


def label(config: triton.Config) -> str:
    """A config as ``BLOCK_MxBLOCK_N s<stages> w<warps>``, `` dP-late`` for dK/dV's ``DP_AFTER_DV`` and `` r<N>``
    for a register cap (``maxnreg``)."""
    late = " dP-late" if config.kwargs.get("DP_AFTER_DV") else ""
    cap = f" r{config.maxnreg}" if getattr(config, "maxnreg", None) else ""
    return f"{config.kwargs['BLOCK_M']}x{config.kwargs['BLOCK_N']} s{config.num_stages} w{config.num_warps}{late}{cap}"


def parse_configs(text: str) -> list[tuple[int, int, int, int]]:
    """``"64x64/3/8,32x64/3/8"`` -> [(BLOCK_M, BLOCK_N, stages, warps), ...]; refuses anything else by name."""
    configs = []
    for item in filter(None, text.split(",")):
        try:
            config = parse_config(item)
        except ValueError:
            config = None
        if config is None or None in config:  # stages and warps are required here
            raise SystemExit(f"--extra-configs: expected items like 64x64/3/8 (BLOCK_MxBLOCK_N/stages/warps), got {item!r}")
        configs.append(config)
    return configs


def candidates(kernel: str, extra_stages=(), extra_configs=()) -> list[triton.Config]:
    """The kernel's library configs, then each of them again with every pipeline depth in ``extra_stages``,
    then the (BLOCK_M, BLOCK_N, stages, warps) of ``extra_configs`` that the list lacks."""
    configs = list(ORIGINAL_CONFIGS[kernel])
    seen = {label(c) for c in configs}
    hook = configs[0].pre_hook

    def add(config):
        if label(config) not in seen:
            seen.add(label(config))
            configs.append(config)
    for config in ORIGINAL_CONFIGS[kernel]:
        for stages in extra_stages:
            add(triton.Config(dict(config.kwargs), num_stages=stages, num_warps=config.num_warps,
                              pre_hook=config.pre_hook))
    for bm, bn, stages, warps in extra_configs:
        add(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages, num_warps=warps, pre_hook=hook))
    return configs


def warm(variant: str, d: int, causal: bool, dtype: str, kernel: str, extra_stages=(), extra_configs=()) -> dict:
    """Compile (and run once) every candidate config of ``kernel`` for ``variant``, one at a time."""
    q, k, v, do = tensors(4096, d, DTYPES[dtype])
    forward, backward, _ = calls(q, k, v, do, causal)
    ok, failed = [], []
    for config in candidates(kernel, extra_stages, extra_configs):
        single = {name: ORIGINAL_CONFIGS[name][:1] for name in TUNED}  # the others: a plain config
        single[kernel] = [config]
        use(variant, single)
        try:
            forward()
            if kernel != "fwd":
                backward()
            torch.cuda.synchronize()
            ok.append(label(config))
        except Exception as error:  # a config the compiler refuses: reported, left out
            failed.append(f"{label(config)}: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
    return {"ok": ok, "failed": failed}


def warm_all(variants, head_dims, causals, dtype, out: Path, extra_stages=(), kernels=tuple(TUNED),
             extra_configs=()) -> dict:
    """Run :func:`warm` for every (variant, D, causal, kernel) in parallel worker processes:
    {(variant, D, causal): {kernel: {"ok": [labels], "failed": [reasons]}}}."""
    jobs = {}
    stages = "-".join(map(str, extra_stages))
    more = "+".join(f"{bm}x{bn}/{s}/{w}" for bm, bn, s, w in extra_configs)
    for variant in variants:
        for d in head_dims:
            for causal in causals:
                for kernel in kernels:
                    path = out / f"warm_{variant}_{d}_{int(causal)}_{kernel}.json"
                    cmd = [sys.executable, __file__, "--warm", f"{variant},{d},{int(causal)},{dtype},{kernel},{stages},{more}",
                           "--warm-out", str(path)]
                    jobs[(variant, d, causal, kernel)] = (subprocess.Popen(cmd), path)
    reports: dict = {}
    deadline = time.time() + WARM_TIMEOUT
    for (variant, d, causal, kernel), (proc, path) in jobs.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
        report = json.loads(path.read_text()) if path.exists() else {"ok": [], "failed": [f"worker exit {proc.returncode}"]}
        reports.setdefault((variant, d, causal), {})[kernel] = report
    return reports


def shape_grid(args) -> tuple[list[int], list[int], list[bool], Path]:
    """(head dims, sequence lengths, causal flags, output folder) from ``--d``, ``--N``, ``--causal`` and
    ``--out``; prints the run's header line (GPU, versions, date, command) and makes the folder."""
    head_dims = [int(x) for x in args.d.split(",")]
    ns = [int(x) for x in args.N.split(",")]
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}; {' '.join(sys.argv)}", flush=True)
    return head_dims, ns, causals, out


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--d", default="64,128")
    parser.add_argument("--N", default="1024,4096,16384")
    parser.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    parser.add_argument("--dtype", default="fp16", choices=tuple(DTYPES))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (medians reported)")
    parser.add_argument("--time-budget", type=float, default=480.0, help="seconds; later shapes are skipped")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of the JSON results")
    parser.add_argument("--warm", help=argparse.SUPPRESS)
    parser.add_argument("--warm-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warm:
        variant, d, causal, dtype, kernel, stages, more = args.warm.split(",")
        report = warm(variant, int(d), bool(int(causal)), dtype, kernel, [int(x) for x in stages.split("-") if x],
                      parse_configs(more.replace("+", ",")))
        Path(args.warm_out).write_text(json.dumps(report))
        return

    start = time.time()
    variants = args.variants.split(",")
    head_dims, ns, causals, out = shape_grid(args)
    reports = warm_all(variants, head_dims, causals, args.dtype, out)
    print(f"# compiled in {time.time() - start:.0f} s", flush=True)
    usable = {}
    for (variant, d, causal), report in reports.items():
        for kernel, r in report.items():
            print(f"warm {variant} D{d} causal={causal} {kernel}: {len(r['ok'])} compiled"
                  + "".join(f"\n    refused {f}" for f in r["failed"]))

    rows = []
    for d in head_dims:
        for causal in causals:
            # a variant's configs: those that compiled for every kernel at this (D, causal)
            for variant in variants:
                report = reports.get((variant, d, causal), {})
                usable[(variant, d, causal)] = {
                    kernel: [c for c in ORIGINAL_CONFIGS[kernel] if label(c) in report.get(kernel, {}).get("ok", ())]
                    for kernel in TUNED}
            for n in ns:
                if time.time() - start > args.time_budget:
                    print(f"# time budget reached: D{d} causal={causal} N{n} skipped", flush=True)
                    continue
                q, k, v, do = tensors(n, d, DTYPES[args.dtype], seed=n + d)
                qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                    o_ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
                o_ref.backward(do)
                refs = (o_ref.detach(), qr.grad, kr.grad, vr.grad)
                b, h = q.shape[:2]
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                first, chosen, timed = None, None, {}
                for variant in variants:
                    # The first variant autotunes; the others run its choices, so that only the variant differs.
                    configs = usable[(variant, d, causal)] if chosen is None else chosen
                    if not all(configs.values()):
                        print(f"D{d} N{n} causal={causal} {variant}: no config compiled for some kernel", flush=True)
                        continue
                    use(variant, configs)
                    forward, backward, outs = calls(q, k, v, do, causal)
                    forward()
                    backward()
                    torch.cuda.synchronize()
                    chosen = chosen or {kernel: [tuned.best_config] for kernel, tuned in TUNED.items()}
                    errors = [relative_error(x, r) for x, r in zip(outs, refs)]
                    same = None if first is None else all(torch.equal(x, y) for x, y in zip(outs, first))
                    first = first or tuple(x.clone() for x in outs)
                    timed[variant] = (forward, backward, errors, same)
                times = {variant: ([], []) for variant in timed}
                for _ in range(args.rounds):  # rounds interleaved: a drift of the GPU's clock hits every variant
                    for variant, (forward, backward, _, _) in timed.items():
                        use(variant, chosen)
                        forward()
                        backward()
                        times[variant][0].append(graph_time_ms(forward, rep=100))
                        times[variant][1].append(graph_time_ms(backward, rep=100))
                for variant, (_, _, errors, same) in timed.items():
                    fwd_ms, bwd_ms = (statistics.median(t) for t in times[variant])
                    row = dict(variant=variant, d=d, n=n, causal=causal, dtype=args.dtype,
                               fwd_us=fwd_ms * 1e3, bwd_us=bwd_ms * 1e3,
                               fwd_tflops=flops / fwd_ms / 1e9, bwd_tflops=2.5 * flops / bwd_ms / 1e9,
                               fwd_us_rounds=[t * 1e3 for t in times[variant][0]],
                               bwd_us_rounds=[t * 1e3 for t in times[variant][1]],
                               rel_err_vs_sdpa=dict(zip(("o", "dq", "dk", "dv"), errors)),
                               bitwise_equal_to_first=same,
                               configs={kernel: str(c[0]) for kernel, c in chosen.items()})
                    rows.append(row)
                    print(f"D{d} N{n:5d} causal={causal!s:5} {variant:8s} fwd {row['fwd_tflops']:5.0f} TF "
                          f"bwd {row['bwd_tflops']:5.0f} TF  err o/dq/dk/dv "
                          + "/".join(f"{e:.1e}" for e in errors) + f"  same={same}", flush=True)
                write_results(out, f"schedule_ab_{args.dtype}", rows)
    use("longest", dict(ORIGINAL_CONFIGS))


def write_results(out: Path, stem: str, rows: list[dict]) -> None:
    """``out/<stem>_<gpu>.json``: the rows so far, with the GPU, versions, date and command (scripts
    rewrite it as they go, so that a call cut by its time limit still leaves what it measured)."""
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"), command=" ".join(sys.argv))
    name = torch.cuda.get_device_name().lower().replace(" ", "_")
    (out / f"{stem}_{name}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
