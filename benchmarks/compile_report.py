"""What the compiler made of flashlib's forward kernel for Hopper, without a GPU.

Triton compiles for a named target offline (its wheel carries ptxas), so the PTX and
the register count of a config can be read on any machine. For each config this prints
the Hopper instructions that matter for attention (``wgmma`` tensor-core ops, TMA bulk
tensor copies, ``cp.async`` pointer copies), the registers per thread and the stack
bytes (spilled registers) of the cubin, read with cuobjdump. The tensors are specialised as a launch on contiguous fp16
(B, H, N, D) tensors would be (strides divisible by 16, unit stride along D).

    python benchmarks/compile_report.py                      # the Hopper configs, D 64 and 128
    python benchmarks/compile_report.py --d 128 --config 128,128,3,8 --causal

benchmarks/TUNING.md quotes its output.
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU target even on a machine without one
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashlib.kernels.attention_fwd import attention_fwd_kernel  # noqa: E402

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
POINTERS = ("Q", "K", "V", "O")
FLOAT_POINTERS = ("LSE", "ALIBI", "DESCALE")
INT_POINTERS = {"SEQ_LENS": "*i32", "CU_SEQLENS_Q": "*i32", "CU_SEQLENS_K": "*i32", "TILES": "*i8"}
FLOATS = ("sm_scale", "SOFTCAP", "DROPOUT_P")


def forward_source(head_dim: int, block_m: int, block_n: int, *, causal: bool, tma: str, fp8: bool = False):
    """An ASTSource of the forward kernel, specialised like a launch on contiguous tensors."""
    names = list(inspect.signature(attention_fwd_kernel.fn).parameters)
    constexprs = dict(
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), HAS_SEQ_LENS=False, IS_VARLEN=False,
        HAS_LEFT=False, HAS_RIGHT=causal, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False,
        RECORD_TILES=False, DOT_PRECISION="tf32", TMA=tma, NEGATIVE_SCALE=False, K_MULTIPLE_OF_128=True,
        FP8=fp8, V_TRANSPOSED=fp8 and tma == "host", BLOCK_M=block_m, BLOCK_N=block_n,
        stride_qd=1, stride_kd=1, stride_od=1, WINDOW_RIGHT=0)
    if not fp8:  # FP8 reads V with the keys innermost (stride_vn = 1)
        constexprs["stride_vd"] = 1
    else:
        constexprs["stride_vn"] = 1
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in POINTERS:
            dtype = ("bf16" if name == "O" else "fp8e4nv") if fp8 else "fp16"
            rows = block_m if name in ("Q", "O") else block_n
            tile = f"{constexprs['BLOCK_D']},{rows}" if name == "V" and constexprs["V_TRANSPOSED"] else \
                f"{rows},{constexprs['BLOCK_D']}"
            signature[name] = f"tensordesc<{dtype}[1,1,{tile}]>" if tma == "host" else f"*{dtype}"
        elif name in FLOAT_POINTERS:
            signature[name] = "*fp32"
        elif name in INT_POINTERS:
            signature[name] = INT_POINTERS[name]
        elif name in FLOATS:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
        if name in POINTERS + FLOAT_POINTERS or name.startswith("stride_") and name not in constexprs:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(attention_fwd_kernel, signature=signature, constexprs=constexprs, attrs=attrs)


def report(head_dim, block_m, block_n, stages, warps, *, causal, tma, fp8=False) -> dict:
    """Compile one config for sm_90 and count what matters in its PTX; registers and stack bytes from cuobjdump."""
    source = forward_source(head_dim, block_m, block_n, causal=causal, tma=tma, fp8=fp8)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages))
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(CUOBJDUMP), "-res-usage", str(path)], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return dict(
        D=head_dim, config=f"{block_m}x{block_n} s{stages} w{warps}", causal=causal, tma=tma,
        wgmma=len(re.findall(r"wgmma\.mma_async", ptx)),
        wgmma_fp8=len(re.findall(r"wgmma\.mma_async\S*e4m3", ptx)),
        shared_stores=len(re.findall(r"st\.shared", ptx)),
        tma_loads=len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
        cp_async=len(re.findall(r"cp\.async\.(?:ca|cg)", ptx)),
        registers=int(regs.group(1)) if regs else None,
        stack=int(stack.group(1)) if stack else None,
        shared=compiled.metadata.shared,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", default="64,128", help="head dims (default 64,128)")
    parser.add_argument("--config", action="append", help="BLOCK_M,BLOCK_N,stages,warps (repeatable)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--fp8", action="store_true", help="float8 e4m3 Q, K, V (V keys-innermost), bfloat16 O")
    parser.add_argument("--tma", default="host,device,none", help="descriptor modes (default all three)")
    args = parser.parse_args()
    configs = [tuple(int(x) for x in c.split(",")) for c in args.config] if args.config else \
        [(128, 128, 3, 8), (128, 64, 3, 4), (128, 64, 3, 8), (64, 64, 3, 4)]
    print("| D | config | causal | TMA | wgmma (fp8) | TMA copies | cp.async | st.shared | registers | stack bytes "
          "| shared |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for d in (int(x) for x in args.d.split(",")):
        for bm, bn, stages, warps in configs:
            for tma in args.tma.split(","):
                r = report(d, bm, bn, stages, warps, causal=args.causal, tma=tma, fp8=args.fp8)
                print(f"| {r['D']} | {r['config']} | {r['causal']} | {r['tma']} | {r['wgmma']} ({r['wgmma_fp8']}) | "
                      f"{r['tma_loads']} | {r['cp_async']} | {r['shared_stores']} | {r['registers']} | {r['stack']} | "
                      f"{r['shared']} |")


if __name__ == "__main__":
    main()
