"""Tiled matrix multiplication C = A @ B in Triton.

Each program computes one BLOCK_M x BLOCK_N tile of C. It walks along K in steps
of BLOCK_K, loading a tile of A and a tile of B, and accumulates their product
in float32 registers. Masks on the loads and the store handle sizes that are
not multiples of the block sizes. Programs are ordered in groups of GROUP_M
rows of tiles, so that neighbouring programs reuse the same tiles of B from L2.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Which tile of C is ours? Grouped ordering: GROUP_M rows of tiles per group.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # Masks zero the parts of the tiles that lie past M, N or K.
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] + k0 < K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c = acc.to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _gpu_configs():
    """Autotune candidates: big tiles for tensor cores, a few smaller ones for small K/N."""
    shapes = [
        (128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 4),
        (128, 128, 32, 4, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
        (64, 64, 32, 5, 2), (32, 64, 32, 5, 2),
    ]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8},
                          num_stages=stages, num_warps=warps)
            for m, n, k, stages, warps in shapes]


#: The same kernel with its block sizes chosen by benchmarking, once per (M, N, K, dtype).
matmul_kernel_autotuned = triton.autotune(configs=_gpu_configs(), key=["M", "N", "K"])(matmul_kernel)

#: The block sizes used in the interpreter, where autotuning would only measure numpy.
INTERPRETER_BLOCKS = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)


def launch_matmul(kernel, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                  block_m: int, block_n: int, block_k: int, group_m: int = 8) -> torch.Tensor:
    """Launch a kernel with ``matmul_kernel``'s signature on fixed block sizes.

    Shared by :func:`flashlib.matmul.triton_matmul` and the course's checks, so a
    learner's kernel is launched exactly as the library's is.
    """
    m, k = a.shape
    n = b.shape[1]
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    kernel[grid](
        a, b, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
    )
    return c


def launch_matmul_autotuned(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Launch the autotuned kernel (GPU), or the interpreter's fixed blocks."""
    if runtime.INTERPRET:
        blocks = INTERPRETER_BLOCKS
        return launch_matmul(matmul_kernel, a, b, c, blocks["BLOCK_M"], blocks["BLOCK_N"], blocks["BLOCK_K"])
    m, k = a.shape
    n = b.shape[1]

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    matmul_kernel_autotuned[grid](
        a, b, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
    )
    return c
