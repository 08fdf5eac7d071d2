"""Where dropout's time goes in the forward kernel: the random draws against the layout change.

    python benchmarks/dropout_rng.py --d 64,128 [--variants plain,library,...]   # each in its own process
    python benchmarks/dropout_rng.py --d 64,128 --variants plain_bwd,library_bwd  # the backward kernels

Each variant replaces ``dropout_keep`` (the kernels look it up when they compile; they pass the
(sample, head)'s key where a variant expects its seed, and stream 0) and times the
forward at N = 4096, D = 64 or 128 (H = 2048 / D), fp16, fixed 128 x 64 blocks, against the kernel
without dropout; each run also counts the layout conversions in the kernel's TTGIR:

* ``library``: flashlib's own (:mod:`flashlib.kernels.dropout`: one hash per 16 x 16 square's word);
* ``philox8``: the first library version (one Philox4x32-7 call for 8 keys, 16-bit draws, join + reshape);
* ``philox16``: one call for 16 keys, 8-bit draws (flash-attn's resolution);
* ``layout_only``: the join + reshape of ``philox8`` on draws made without Philox (what the layout costs);
* ``hash_per_weight``: a cheap integer hash per weight, no reshape (what a per-element draw costs);
* ``pair_join2``: one 32-bit hash per pair of adjacent keys, split in two 16-bit draws by a join of 2
  (the accumulator holds adjacent columns in pairs: whether a join of 2 is free where 8 is not);
* ``floor``: ``(i + j) % 8 != 0`` (no randomness: what merely zeroing weights in the loop costs);
* ``pair_lowbias16``, ``quad_cols_*``, ``rows2cols2_*``: words laid out as the accumulator holds them
  (``cheap``: a multiply-add for the word, what the layout alone costs; ``lowbias``: a real hash);
* ``philox16_thread``: one Philox call for the 16 weights a thread holds in 32 columns.
``library``, ``philox*`` and ``*_lowbias*`` are usable generators; the others are measurements.
"""
import glob
import os
import subprocess
import sys
import tempfile

import torch
import triton
import triton.language as tl

from flashlib.kernels.dropout import mix32 as lowbias32


@triton.jit
def philox8(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = seed * 0  # the kernels pass one key per (sample, head): here it stands in for the seed
    q_pos = q_start + tl.arange(0, BLOCK_M)
    groups = k_start // 8 + tl.arange(0, BLOCK_N // 8)
    zero = (q_pos[:, None] * 0 + groups[None, :] * 0).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, zero + groups[None, :].to(tl.uint32), zero + q_pos[:, None].to(tl.uint32),
                               zero + stream.to(tl.uint32), zero, 7)
    low = 0xFFFF
    draws = tl.join(tl.join(tl.join(r0 & low, r0 >> 16), tl.join(r1 & low, r1 >> 16)),
                    tl.join(tl.join(r2 & low, r2 >> 16), tl.join(r3 & low, r3 >> 16)))
    draws = tl.reshape(draws, (BLOCK_M, BLOCK_N))
    return draws.to(tl.float32) >= dropout_p * 65536.0


@triton.jit
def philox16(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = seed * 0  # the kernels pass one key per (sample, head): here it stands in for the seed
    q_pos = q_start + tl.arange(0, BLOCK_M)
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
def layout_only(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    q_pos = q_start + tl.arange(0, BLOCK_M)
    groups = k_start // 8 + tl.arange(0, BLOCK_N // 8)
    r0 = (q_pos[:, None] * 40503 + groups[None, :] * 2654435 + seed).to(tl.uint32)
    r1, r2, r3 = r0 * 3, r0 * 5, r0 * 7
    low = 0xFFFF
    draws = tl.join(tl.join(tl.join(r0 & low, r0 >> 16), tl.join(r1 & low, r1 >> 16)),
                    tl.join(tl.join(r2 & low, r2 >> 16), tl.join(r3 & low, r3 >> 16)))
    draws = tl.reshape(draws, (BLOCK_M, BLOCK_N))
    return draws.to(tl.float32) >= dropout_p * 65536.0


@triton.jit
def hash_per_weight(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = seed * 0  # the kernels pass one key per (sample, head): here it stands in for the seed
    q_pos = q_start + tl.arange(0, BLOCK_M)
    cols = k_start + tl.arange(0, BLOCK_N)
    x = (q_pos[:, None] * 40503 + cols[None, :] * 2654435 + seed + stream * 97).to(tl.uint32)
    x = (x ^ (x >> 16)) * 0x7feb352d
    x = (x ^ (x >> 15)) * 0x846ca68b
    x = x ^ (x >> 16)
    return (x >> 16).to(tl.float32) >= dropout_p * 65536.0


@triton.jit
def pair_join2(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = seed * 0  # the kernels pass one key per (sample, head): here it stands in for the seed
    q_pos = q_start + tl.arange(0, BLOCK_M)
    pairs = k_start // 2 + tl.arange(0, BLOCK_N // 2)
    x = (q_pos[:, None] * 40503 + pairs[None, :] * 2654435 + seed + stream * 97).to(tl.uint32)
    x = (x ^ (x >> 16)) * 0x7feb352d
    x = (x ^ (x >> 15)) * 0x846ca68b
    x = x ^ (x >> 16)
    draws = tl.reshape(tl.join(x & 0xFFFF, x >> 16), (BLOCK_M, BLOCK_N))
    return draws.to(tl.float32) >= dropout_p * 65536.0


@triton.jit
def floor(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    q_pos = q_start + tl.arange(0, BLOCK_M)
    cols = k_start + tl.arange(0, BLOCK_N)
    return ((q_pos[:, None] + cols[None, :]) & 7) != 0


# Draws laid out as the tensor-core accumulator holds them. On Hopper a thread holds, of each 16-row
# slab and 8-column tile, rows r and r + 8 and columns 2c and 2c + 1: words whose bytes go to those
# elements (joins of 2, then a permute) might reach the accumulator's layout without moving data.
@triton.jit
def _threshold(dropout_p, levels: tl.constexpr):
    return (tl.full((), 0.0, tl.float32) + dropout_p * levels).to(tl.uint32)


@triton.jit
def stream_key(seed, stream):
    return lowbias32(stream.to(tl.uint32) * 0x9E3779B9 + seed.to(tl.uint32))


@triton.jit
def pair_lowbias16(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = seed * 0  # the kernels pass one key per (sample, head): here it stands in for the seed
    q_pos = q_start + tl.arange(0, BLOCK_M)
    pairs = k_start // 2 + tl.arange(0, BLOCK_N // 2)
    x = lowbias32(((q_pos[:, None] << 16) | pairs[None, :]).to(tl.uint32) ^ stream_key(seed, stream))
    draws = tl.reshape(tl.join(x & 0xFFFF, x >> 16), (BLOCK_M, BLOCK_N))
    return draws >= _threshold(dropout_p, 65536.0)


@triton.jit
def _quad_bytes_to_cols(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # x (M, N/4): word of quad u, whose byte 2h + e goes to column 16(u // 4) + 8h + 2(u % 4) + e
    t = tl.join(tl.join(x & 0xFF, (x >> 16) & 0xFF), tl.join((x >> 8) & 0xFF, x >> 24))  # (M, N/4, h, e)
    t = tl.permute(tl.reshape(t, (BLOCK_M, BLOCK_N // 16, 4, 2, 2)), (0, 1, 3, 2, 4))
    return tl.reshape(t, (BLOCK_M, BLOCK_N))


@triton.jit
def quad_cols_cheap(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    q_pos = q_start + tl.arange(0, BLOCK_M)
    quads = k_start // 4 + tl.arange(0, BLOCK_N // 4)
    x = (q_pos[:, None] * 40503 + quads[None, :] * 2654435 + seed).to(tl.uint32)
    return _quad_bytes_to_cols(x, BLOCK_M, BLOCK_N) >= _threshold(dropout_p, 256.0)


@triton.jit
def quad_cols_lowbias(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = seed * 0  # the kernels pass one key per (sample, head): here it stands in for the seed
    q_pos = q_start + tl.arange(0, BLOCK_M)
    quads = k_start // 4 + tl.arange(0, BLOCK_N // 4)
    x = lowbias32(((q_pos[:, None] << 15) | quads[None, :]).to(tl.uint32) ^ stream_key(seed, stream))
    return _quad_bytes_to_cols(x, BLOCK_M, BLOCK_N) >= _threshold(dropout_p, 256.0)


@triton.jit
def _pair_rows(q_pos, BLOCK_M: tl.constexpr):
    # the first row of each (r, r + 8) pair of a 16-row slab: (M / 2,)
    v = tl.arange(0, BLOCK_M // 2)
    return tl.min(q_pos, 0) + 16 * (v // 8) + v % 8


@triton.jit
def _quad_bytes_to_rows_cols(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # x (M/2, N/2): word of row pair v and column pair P; byte 2h + e goes to row 16(v // 8) + 8h + v % 8,
    # column 2P + e
    t = tl.join(tl.join(x & 0xFF, (x >> 16) & 0xFF), tl.join((x >> 8) & 0xFF, x >> 24))  # (M/2, N/2, h, e)
    t = tl.permute(tl.reshape(t, (BLOCK_M // 16, 8, BLOCK_N // 2, 2, 2)), (0, 3, 1, 2, 4))
    return tl.reshape(t, (BLOCK_M, BLOCK_N))


@triton.jit
def rows2cols2_cheap(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    q_pos = q_start + tl.arange(0, BLOCK_M)
    pairs = k_start // 2 + tl.arange(0, BLOCK_N // 2)
    x = (_pair_rows(q_pos, BLOCK_M)[:, None] * 40503 + pairs[None, :] * 2654435 + seed).to(tl.uint32)
    return _quad_bytes_to_rows_cols(x, BLOCK_M, BLOCK_N) >= _threshold(dropout_p, 256.0)


@triton.jit
def rows2cols2_lowbias(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = seed * 0  # the kernels pass one key per (sample, head): here it stands in for the seed
    q_pos = q_start + tl.arange(0, BLOCK_M)
    pairs = k_start // 2 + tl.arange(0, BLOCK_N // 2)
    x = lowbias32(((_pair_rows(q_pos, BLOCK_M)[:, None] << 16) | pairs[None, :]).to(tl.uint32)
                  ^ stream_key(seed, stream))
    return _quad_bytes_to_rows_cols(x, BLOCK_M, BLOCK_N) >= _threshold(dropout_p, 256.0)


@triton.jit
def _bytes_he(r):
    return tl.join(tl.join(r & 0xFF, (r >> 16) & 0xFF), tl.join((r >> 8) & 0xFF, r >> 24))  # (.., h, e)


@triton.jit
def philox16_thread(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = seed * 0  # the kernels pass one key per (sample, head): here it stands in for the seed
    q_pos = q_start + tl.arange(0, BLOCK_M)
    # one Philox call per (row pair, column pair c of a 32-column group): 16 bytes, for rows (r, r + 8),
    # columns 32G + 8t + 2c + e, t = 0..3 (word t), e = 0, 1
    rows = _pair_rows(q_pos, BLOCK_M)
    groups = k_start // 8 + tl.arange(0, BLOCK_N // 8)
    zero = (rows[:, None] * 0 + groups[None, :] * 0).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, zero + groups[None, :].to(tl.uint32), zero + rows[:, None].to(tl.uint32),
                               zero + stream.to(tl.uint32), zero, 7)
    z = tl.join(tl.join(_bytes_he(r0), _bytes_he(r1)), tl.join(_bytes_he(r2), _bytes_he(r3)))  # (v, w, h, e, a, b)
    z = tl.reshape(z, (BLOCK_M // 16, 8, BLOCK_N // 32, 4, 2, 2, 2, 2))  # (s, rr, G, c, h, e, a, b), t = a + 2b
    z = tl.reshape(tl.permute(z, (0, 4, 1, 2, 7, 6, 3, 5)), (BLOCK_M, BLOCK_N))
    return z >= _threshold(dropout_p, 256.0)


@triton.jit
def square_packed(seed, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = seed * 0  # the kernels pass one key per (sample, head): here it stands in for the seed
    # the library's squares, with rows2cols2's word input: (query group << 16 | key group) ^ key
    qg = (q_start // 2 + tl.arange(0, BLOCK_M // 2))[:, None]
    kg = (k_start // 2 + tl.arange(0, BLOCK_N // 2))[None, :]
    x = lowbias32(((qg << 16) | kg).to(tl.uint32) ^ stream_key(seed, stream))
    t = tl.join(tl.join(x & 0xFF, (x >> 8) & 0xFF), tl.join((x >> 16) & 0xFF, x >> 24))
    t = tl.permute(tl.reshape(t, (BLOCK_M // 16, 8, BLOCK_N // 16, 8, 2, 2)), (0, 5, 1, 2, 4, 3))
    return tl.reshape(t, (BLOCK_M, BLOCK_N)) >= _threshold(dropout_p, 256.0)


VARIANTS = ("plain", "library", "philox8", "philox16", "layout_only", "hash_per_weight", "pair_join2", "floor",
            "pair_lowbias16", "quad_cols_cheap", "quad_cols_lowbias", "rows2cols2_cheap", "rows2cols2_lowbias",
            "philox16_thread", "square_packed")
REPLACEMENTS = VARIANTS[2:]


def run(variant: str, d: int) -> float:
    import flashlib  # noqa: F401
    from flashlib.kernels import attention_fwd
    from flashlib.spec import AttentionSpec

    if variant in REPLACEMENTS:
        attention_fwd.dropout_keep = globals()[variant]
    heads = 2048 // d
    q, k, v = (torch.randn(4, heads, 4096, d, device="cuda", dtype=torch.float16) for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(4, heads, 4096, device="cuda")
    spec = AttentionSpec(dropout_p=0.0 if variant == "plain" else 0.1)
    seed = torch.full((1,), 1234, dtype=torch.int64, device="cuda")  # on the device, as flashlib.ops draws it
    fn = lambda: attention_fwd.launch_attention_forward(q, k, v, o, lse, spec=spec, block_m=128, block_n=64,  # noqa
                                                        dropout_seed=seed)
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def run_backward(variant: str, d: int) -> float:
    """The backward launcher (dK/dV and dQ kernels, fixed 64 x 64 blocks) with and without dropout."""
    import flashlib  # noqa: F401
    from flashlib.kernels.attention_bwd import launch_attention_backward
    from flashlib.spec import AttentionSpec

    heads = 2048 // d
    q, k, v, o, do = (torch.randn(4, heads, 4096, d, device="cuda", dtype=torch.float16) for _ in range(5))
    lse = torch.randn(4, heads, 4096, device="cuda") + 8.0
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    spec = AttentionSpec(dropout_p=0.0 if variant == "plain_bwd" else 0.1)
    seed = torch.full((1,), 1234, dtype=torch.int64, device="cuda")  # on the device, as flashlib.ops draws it
    fn = lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec, block_m=64, block_n=64,  # noqa
                                           dropout_seed=seed)
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def ir_counts(cache_dir: str) -> str:
    """Layout conversions in the TTGIR of each attention kernel the child compiled."""
    counts = []
    for path in sorted(glob.glob(os.path.join(cache_dir, "**", "attention*.ttgir"), recursive=True)):
        text = open(path).read()
        counts.append(f"{os.path.basename(path)[:-6]}: convert_layout {text.count('ttg.convert_layout')}")
    return ", ".join(counts)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":  # a child: one variant, one head dim
        timer = run_backward if sys.argv[2].endswith("_bwd") else run
        print(f"{timer(sys.argv[2], int(sys.argv[3])):.4f}")
        return
    dims = sys.argv[sys.argv.index("--d") + 1].split(",") if "--d" in sys.argv else ["64"]
    chosen = sys.argv[sys.argv.index("--variants") + 1].split(",") if "--variants" in sys.argv else VARIANTS
    for d in map(int, dims):
        times, irs = {}, {}
        for variant in chosen:
            with tempfile.TemporaryDirectory() as cache:  # its own cache: a fresh compile, its own IR
                out = subprocess.run([sys.executable, __file__, "--one", variant, str(d)], capture_output=True,
                                     text=True, env={**os.environ, "TRITON_CACHE_DIR": cache})
                irs[variant] = ir_counts(cache)
            times[variant] = float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
            if out.returncode:
                print(variant, "failed:", out.stderr[-600:])
        print(f"D = {d}, H = {2048 // d}")
        for variant, ms in times.items():
            base = times.get("plain_bwd" if variant.endswith("_bwd") else "plain")
            ratio = f"{ms / base:.2f}x" if ms and base else ""
            print(f"{variant:>18}: {ms} ms {ratio}   ({irs[variant]})", flush=True)


if __name__ == "__main__":
    main()
