"""Shared memory's bandwidth against the tensor cores' rate: what a Hopper warpgroup product reads a cycle.

HBM traffic (:mod:`flashlib.io_model`) is one bound of an attention kernel; inside the SM there is another. A
Hopper warpgroup product ``wgmma.m64nNk`` multiplies a 64 x K tile A by a K x N tile B. B always comes from shared
memory; A comes from shared memory or from registers. An SM's tensor cores do 4096 multiply-adds' worth of
operations a cycle in 16 bits (8192 in FP8), and its shared memory delivers 128 bytes a cycle. So a product of
N columns, running at the tensor cores' rate, asks shared memory for

    (64 K + N K) * operand bytes / (2 * 64 * N * K / ops a cycle)  =  ops a cycle * bytes / 128 * (64 + N) / N

bytes a cycle: 4096 / N + 64 in 16 bits, the same in FP8 (half the bytes, twice the rate). At N = 64 that is all
128 bytes; with A in registers it is 64 whatever N. The Gluon kernels choose where their operands live from this
count (benchmarks/TUNING.md, thirty-eighth to fortieth findings): P of FP8 through shared memory costs bandwidth,
Q, K, V or dO held in registers give it back.
"""
from __future__ import annotations

#: Bytes an SM's shared memory delivers a cycle (Hopper).
SHARED_BYTES_PER_CYCLE = 128
#: Rows of A in one warpgroup product (``wgmma.m64nNk``).
PRODUCT_ROWS = 64
#: Operations (2 per multiply-add) an SM's tensor cores do a cycle, dense, by operand bytes: 16-bit and FP8 (H100).
TENSOR_OPS_PER_CYCLE = {2: 4096, 1: 8192}


def product_bytes_per_cycle(n: int, a_in_registers: bool = False, operand_bytes: int = 2) -> float:
    """Bytes a cycle that one warpgroup product of ``n`` columns reads from shared memory while the tensor cores
    run it at full rate: B (K x n) always, A (64 x K) unless ``a_in_registers``. K cancels out. ``operand_bytes``:
    2 (float16, bfloat16) or 1 (FP8)."""
    if operand_bytes not in TENSOR_OPS_PER_CYCLE:
        raise ValueError(f"operand_bytes must be one of {sorted(TENSOR_OPS_PER_CYCLE)} (FP8 or 16 bits); "
                         f"got {operand_bytes!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 8 or n > 256 or n % 8:
        raise ValueError(f"n must be a multiple of 8 from 8 to 256 (a wgmma's N); got {n!r}")
    rows_read = n + (0 if a_in_registers else PRODUCT_ROWS)  # per unit of K
    cycles_per_k = 2 * PRODUCT_ROWS * n / TENSOR_OPS_PER_CYCLE[operand_bytes]
    return rows_read * operand_bytes / cycles_per_k


def share_of_bandwidth(bytes_per_cycle: float) -> float:
    """``bytes_per_cycle`` as a fraction of an SM's shared-memory bandwidth (1.0: all of it)."""
    return bytes_per_cycle / SHARED_BYTES_PER_CYCLE
