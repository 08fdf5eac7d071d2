"""Where dropout's time goes in the forward kernel: the random draws against the layout change.

    python benchmarks/dropout_rng.py            # runs every variant, each in its own process

Each variant replaces ``dropout_keep`` (the kernels look it up when they compile) and times the
forward at N = 4096, D = 64, fp16, fixed 128 x 64 blocks, against the kernel without dropout:

* ``philox8``: the library's (one Philox4x32-7 call for 8 keys, 16-bit draws, join + reshape);
* ``philox16``: one call for 16 keys, 8-bit draws (flash-attn's resolution);
* ``layout_only``: the join + reshape of ``philox8`` on draws made without Philox (what the layout costs);
* ``hash_per_weight``: a cheap integer hash per weight, no reshape (what a per-element draw costs).
Only the first two are usable generators; the others are measurements.
"""
import subprocess
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def philox16(seed, stream, q_pos, k_start, dropout_p, BLOCK_N: tl.constexpr):
    BLOCK_M: tl.constexpr = q_pos.shape[0]
    groups = k_start // 16 + tl.arange(0, BLOCK_N // 16)
    zero = (q_pos[:, None] * 0 + groups[None, :] * 0).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, zero + groups[None, :].to(tl.uint32), zero + q_pos[:, None].to(tl.uint32),
                               zero + stream.to(tl.uint32), zero, 7)
    b = 0xFF
    a = tl.join(tl.join(r0 & b, (r0 >> 8) & b), tl.join((r0 >> 16) & b, r0 >> 24))
    c = tl.join(tl.join(r1 & b, (r1 >> 8) & b), tl.join((r1 >> 16) & b, r1 >> 24))
    d = tl.join(tl.join(r2 & b, (r2 >> 8) & b), tl.join((r2 >> 16) & b, r2 >> 24))
    e = tl.join(tl.join(r3 & b, (r3 >> 8) & b), tl.join((r3 >> 16) & b, r3 >> 24))
    draws = tl.reshape(tl.join(tl.join(a, c), tl.join(d, e)), (BLOCK_M, BLOCK_N))
    return draws.to(tl.float32) >= dropout_p * 256.0


@triton.jit
def layout_only(seed, stream, q_pos, k_start, dropout_p, BLOCK_N: tl.constexpr):
    BLOCK_M: tl.constexpr = q_pos.shape[0]
    groups = k_start // 8 + tl.arange(0, BLOCK_N // 8)
    r0 = (q_pos[:, None] * 40503 + groups[None, :] * 2654435 + seed).to(tl.uint32)
    r1, r2, r3 = r0 * 3, r0 * 5, r0 * 7
    low = 0xFFFF
    draws = tl.join(tl.join(tl.join(r0 & low, r0 >> 16), tl.join(r1 & low, r1 >> 16)),
                    tl.join(tl.join(r2 & low, r2 >> 16), tl.join(r3 & low, r3 >> 16)))
    draws = tl.reshape(draws, (BLOCK_M, BLOCK_N))
    return draws.to(tl.float32) >= dropout_p * 65536.0


@triton.jit
def hash_per_weight(seed, stream, q_pos, k_start, dropout_p, BLOCK_N: tl.constexpr):
    cols = k_start + tl.arange(0, BLOCK_N)
    x = (q_pos[:, None] * 40503 + cols[None, :] * 2654435 + seed + stream * 97).to(tl.uint32)
    x = (x ^ (x >> 16)) * 0x7feb352d
    x = (x ^ (x >> 15)) * 0x846ca68b
    x = x ^ (x >> 16)
    return (x >> 16).to(tl.float32) >= dropout_p * 65536.0


VARIANTS = ("plain", "philox8", "philox16", "layout_only", "hash_per_weight")


def run(variant: str) -> float:
    import flashlib  # noqa: F401
    from flashlib.kernels import attention_fwd
    from flashlib.spec import AttentionSpec

    if variant in ("philox16", "layout_only", "hash_per_weight"):
        attention_fwd.dropout_keep = globals()[variant]
    q, k, v = (torch.randn(4, 32, 4096, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(4, 32, 4096, device="cuda")
    spec = AttentionSpec(dropout_p=0.0 if variant == "plain" else 0.1, dropout_seed=1234)
    fn = lambda: attention_fwd.launch_attention_forward(q, k, v, o, lse, spec=spec, block_m=128, block_n=64)  # noqa
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(f"{run(sys.argv[1]):.4f}")
    else:
        times = {}
        for variant in VARIANTS:
            out = subprocess.run([sys.executable, __file__, variant], capture_output=True, text=True)
            times[variant] = float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
            if out.returncode:
                print(variant, "failed:", out.stderr[-600:])
        for variant, ms in times.items():
            ratio = f"{ms / times['plain']:.2f}x" if ms and times["plain"] else ""
            print(f"{variant:>16}: {ms} ms {ratio}")
