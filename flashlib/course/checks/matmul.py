"""Check for notebook 02 (Triton and tiled matmul): the learner's matmul kernel.

The kernel is launched exactly as the library launches its own
(:func:`flashlib.kernels.matmul.launch_matmul`), on shapes with tails and several
steps along K. Out-of-bounds accesses are made visible and harmless: A and B are
views inside larger NaN-filled buffers (a load that ignores its mask reads NaN,
never foreign memory), and C is a view inside a larger buffer filled with a
sentinel value (a store past the edge of C changes the sentinel).
"""
from __future__ import annotations

import math

import torch

from ... import runtime
from ...kernels.matmul import launch_matmul
from ...validation import tolerance
from .framework import DEFAULT_TIME_LIMIT, Case, Check, Mistake, register, run_check

NOTEBOOK = "02_triton_tiled_matmul"
MATMUL_KERNEL = register(NOTEBOOK, "matmul_kernel", 3,
                         "The k-loop of a tiled matmul kernel: masked loads, tl.dot into acc, advance")

#: The value C and the buffer around it hold before the launch.
SENTINEL = -999.0


def _padded(t: torch.Tensor, pad_rows: int, pad_cols: int, fill: float):
    """(buffer, view): ``t`` copied into the middle of a larger buffer filled with ``fill``."""
    rows, cols = t.shape
    buffer = torch.full((rows + 2 * pad_rows, cols + 2 * pad_cols), fill, dtype=t.dtype, device=t.device)
    view = buffer[pad_rows:pad_rows + rows, pad_cols:pad_cols + cols]
    view.copy_(t)
    return buffer, view


def _launch(kernel, case: Case) -> torch.Tensor:
    """Launch the learner's kernel on padded copies of A and B; return the view of C."""
    a, b, (block_m, block_n, block_k) = case.args
    _, a_view = _padded(a, block_m, block_k, math.nan)
    _, b_view = _padded(b, block_k, block_n, math.nan)
    c_empty = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    c_buffer, c_view = _padded(c_empty.fill_(SENTINEL), block_m, block_n, SENTINEL)
    case.context["c_buffer"] = c_buffer
    launch_matmul(kernel, a_view, b_view, c_view, block_m, block_n, block_k)
    return c_view


def _outside_c_untouched(case: Case, out: torch.Tensor) -> str | None:
    """The buffer around C must still hold the sentinel: no store past the edge of C."""
    _, _, (block_m, block_n, _) = case.args
    outside = torch.ones(case.context["c_buffer"].shape, dtype=torch.bool)
    outside[block_m:block_m + out.shape[0], block_n:block_n + out.shape[1]] = False
    around = case.context["c_buffer"].cpu()[outside]
    if not (around == SENTINEL).all():
        return ("wrote outside C: missing store mask. Mask the tl.store with "
                "(offs_m[:, None] < M) & (offs_n[None, :] < N)")
    return None


def _blocks_along_k(a, blocks):
    """K, BLOCK_K and the number of steps along K."""
    k = a.shape[1]
    block_k = blocks[2]
    return k, block_k, math.ceil(k / block_k)


def _first_block_only(a, b, blocks):
    """Pointers never advanced: every step reads the first K block again."""
    k, block_k, steps = _blocks_along_k(a, blocks)
    if steps < 2:
        return None
    a64, b64 = a.double().cpu(), b.double().cpu()
    first = a64[:, :block_k] @ b64[:block_k]
    # with the mask offs_k + k0 < K, step k0 reads the first min(BLOCK_K, K - k0) columns
    masked = sum(a64[:, :min(block_k, k - k0)] @ b64[:min(block_k, k - k0)]
                 for k0 in range(0, k, block_k))
    return [first, steps * first, masked]


def _last_block_only(a, b, blocks):
    """acc = tl.dot(a, b) instead of acc += ...: only the last step's product survives."""
    k, block_k, steps = _blocks_along_k(a, blocks)
    if steps < 2:
        return None
    last = (steps - 1) * block_k
    return a.double().cpu()[:, last:] @ b.double().cpu()[last:]


def _nan_if_k_tail(a, b, blocks):
    """No K-tail mask: the tail step reads the NaN around A and B into every entry of C."""
    k, block_k, _ = _blocks_along_k(a, blocks)
    if k % block_k == 0:
        return None
    return torch.full((a.shape[0], b.shape[1]), math.nan, dtype=torch.float64)


MATMUL_MISTAKES = (
    Mistake("stored nothing",
            "C still holds the value it had before the launch: the kernel stored nothing "
            "(is it still the stub? the tile of C must be written with tl.store)",
            lambda a, b, blocks: torch.full((a.shape[0], b.shape[1]), SENTINEL, dtype=torch.float64),
            stub=True),
    Mistake("stored zeros",
            "C is all zeros: nothing was accumulated into acc (is the k-loop still the stub? "
            "each step must add tl.dot(a, b) to acc)",
            lambda a, b, blocks: torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64),
            stub=True),
    Mistake("no K-tail mask",
            "the K-tail mask is missing (or ignores k0): the last step read past the K edge of A "
            "or B, where this check keeps NaN. Load with mask offs_k + k0 < K (and other=0.0) "
            "in both loads",
            _nan_if_k_tail),
    Mistake("pointers not advanced",
            "looks like the pointers are not advanced: every step multiplies the first K block "
            "again (A[:, :BLOCK_K] @ B[:BLOCK_K, :]). Add BLOCK_K * stride_ak to the A pointers "
            "and BLOCK_K * stride_bk to the B pointers after each step",
            _first_block_only),
    Mistake("acc overwritten",
            "looks like acc is overwritten instead of accumulated: only the last K block's "
            "product survives. Use acc += tl.dot(a, b)",
            _last_block_only),
)


def _matmul_case(gen, m, n, k, dtype, blocks, note) -> Case:
    a = torch.randn(m, k, generator=gen, dtype=torch.float64).to(dtype)
    b = torch.randn(k, n, generator=gen, dtype=torch.float64).to(dtype)
    expected = a.double() @ b.double()  # reference on the rounded inputs
    bm, bn, bk = blocks
    description = (f"A ({m}, {k}) @ B ({k}, {n}), {str(dtype).replace('torch.', '')}, "
                   f"BLOCK_M/N/K = {bm}/{bn}/{bk}: {note}")
    return Case(description, (a.to(runtime.DEVICE), b.to(runtime.DEVICE), blocks), expected,
                tolerance(dtype), shape_words="(M, N)", out_dtype=dtype)


def _matmul_cases(gen):
    return [
        _matmul_case(gen, 64, 64, 96, torch.float32, (32, 32, 32), "no tails, 3 steps along K"),
        _matmul_case(gen, 45, 70, 50, torch.float32, (32, 32, 32),
                     "M, N and K are not multiples of the blocks"),
        _matmul_case(gen, 20, 24, 40, torch.float16, (32, 32, 16),
                     "M and N smaller than one block, K tail"),
        _matmul_case(gen, 40, 48, 130, torch.float16, (16, 32, 32),
                     "5 steps along K, the last one 2 wide"),
    ]


def _accept_kernel(kernel) -> str | None:
    if not runtime.is_triton_kernel(kernel):
        return ("this is not a @triton.jit kernel (plain torch/python?): pass the kernel itself, "
                "decorated with @triton.jit, with matmul_kernel's signature")
    return None


MATMUL_KERNEL_CHECK = Check(
    MATMUL_KERNEL, _matmul_cases, MATMUL_MISTAKES, call=_launch, accept=_accept_kernel,
    inspect=_outside_c_untouched,
    nonfinite_hint=("NaN in C: A and B sit inside NaN-filled buffers here, so some tl.load "
                    "read past an edge of A or B; mask every load (and pass other=0.0)"),
    # compiling a kernel on a GPU takes a few seconds per case
    time_limit=runtime.pick(gpu=30.0, cpu=DEFAULT_TIME_LIMIT),
)


def check_matmul_kernel(kernel, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check a @triton.jit kernel with ``matmul_kernel``'s signature (launched by launch_matmul)."""
    return run_check(MATMUL_KERNEL_CHECK, kernel, seed=seed, time_limit_s=time_limit_s)
