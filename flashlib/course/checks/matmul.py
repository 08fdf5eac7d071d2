"""Check for notebook 02 (Triton and tiled matmul): the learner's matmul kernel.

The kernel is launched exactly as the library launches its own
(:func:`flashlib.kernels.matmul.launch_matmul`), on shapes with tails and several
steps along K. Out-of-bounds accesses are made visible and harmless: A and B are
views inside larger NaN-filled buffers (a load that ignores its mask reads NaN,
never foreign memory), and C is a view inside a larger buffer filled with a
sentinel value (a store past the edge of C changes the sentinel). Where a case has
no tails, a fixed pattern of numbers surrounds A and B instead of NaN, so that a
k-loop that uses the wrong stride reads wrong numbers, which the check recognises,
rather than NaN, which would tell nothing.

Masked lanes are made visible too: during the launch, a masked ``tl.load``
without ``other=`` fills its masked-off lanes with NaN (:func:`nan_in_masked_lanes`;
Triton's interpreter would fill them with 0, a GPU leaves whatever the registers
held). To tell that bug from a load that ignores its K mask, some cases keep 0
instead of NaN in the memory past the K edge of A and B: there, only masked lanes
without ``other=`` can bring NaN into C.

The fixed cases come first (the same values in every run): no tails; tails with 0
past the K edge; tails with NaN past the K edge; A, then B, a transposed view
(strides (1, ...)), where a k-loop that assumes a stride of 1, or steps along K
with the other stride, reads the wrong elements. Seeded random cases in float16
follow. The wrong answers it names: the stubs, no K-tail mask, a masked load
without other=, pointers not advanced, acc overwritten, a loop that stops before
the end of K, A's or B's strides not used, and (as their own verdicts) a store
outside C, and a load outside A or B (the interpreter's loads are recorded: rows of A
past M and columns of B past N reach no stored element of C, so values alone cannot
show them).
"""
from __future__ import annotations

import math

import torch

from ... import runtime
from ...kernels.matmul import launch_matmul
from ...validation import tolerance
from .framework import Case, Check, DEFAULT_TIME_LIMIT, Mistake, fixed_generator, register, run_check
from .undefined_memory import UNDEFINED_LANES, addresses_outside, nan_in_masked_lanes, stray_reads_problem

NOTEBOOK = "02_triton_tiled_matmul"
MATMUL_KERNEL = register(NOTEBOOK, "matmul_kernel", 3,
                         "The k-loop of a tiled matmul kernel: masked loads, tl.dot into acc, advance")

#: The value C and the buffer around it hold before the launch.
SENTINEL = -999.0

#: The seed of the fixed cases: the same values in every run, whatever the exercise's seed
#: (the grader's hidden draw mixes it with its own: :func:`~.framework.fixed_generator`).
FIXED_SEED = 20240202

# ------------------------------------------------------------------ launching

def _padded(t: torch.Tensor, pad_rows: int, pad_cols: int, fill: float, *, transposed: bool = False,
            k_axis: int | None = None, past_k: float | None = None):
    """(buffer, view): ``t`` copied into the middle of a larger buffer filled with ``fill``.

    ``fill`` None: a fixed pattern of small numbers instead (:func:`_numbers`).
    ``transposed``: the buffer holds t^T row by row, so the view has strides (1, ...).
    ``k_axis`` (0 or 1): the memory past the K edge of ``t`` along that axis holds ``past_k``.
    """
    rows, cols = t.shape
    shape = (rows + 2 * pad_rows, cols + 2 * pad_cols)
    storage = shape[::-1] if transposed else shape
    if fill is None:
        buffer = _numbers(storage).to(dtype=t.dtype, device=t.device)
    else:
        buffer = torch.full(storage, fill, dtype=t.dtype, device=t.device)
    logical = buffer.t() if transposed else buffer
    if past_k is not None and k_axis == 0:
        logical[pad_rows + rows:, :] = past_k
    elif past_k is not None and k_axis == 1:
        logical[:, pad_cols + cols:] = past_k
    view = logical[pad_rows:pad_rows + rows, pad_cols:pad_cols + cols]
    view.copy_(t)
    return buffer, view


def _numbers(shape) -> torch.Tensor:
    """A fixed pattern of small, exactly representable numbers (float64): what a buffer holds around A
    and B where reading it should give wrong *numbers* (a wrong stride), not NaN."""
    count = math.prod(shape)
    return ((torch.arange(count, dtype=torch.float64) * 7 % 23 - 11) / 8).reshape(shape)


#: What the memory around A and B holds, per case (``layout["around"]``).
AROUND_NAN, AROUND_NAN_ZERO_PAST_K, AROUND_NUMBERS = "nan", "nan, 0 past K", "numbers"


def _operands(a, b, blocks, layout):
    """(a_buffer, a_view, b_buffer, b_view) as the launch gets them: views inside padded buffers.

    Along M (A) and N (B) the padding is one block plus what every later step along K adds,
    so that a loop that steps along K with the other stride (stride_am, stride_bn) still
    reads inside the buffer.
    """
    block_m, block_n, block_k = blocks
    later_steps = (math.ceil(a.shape[1] / block_k) - 1) * block_k
    around = layout["around"]
    fill = None if around == AROUND_NUMBERS else math.nan
    past_k = 0.0 if around == AROUND_NAN_ZERO_PAST_K else None
    a_buffer, a_view = _padded(a, block_m + later_steps, block_k, fill,
                               transposed=layout["a"] == "transposed", k_axis=1, past_k=past_k)
    b_buffer, b_view = _padded(b, block_k, block_n + later_steps, fill,
                               transposed=layout["b"] == "transposed", k_axis=0, past_k=past_k)
    return a_buffer, a_view, b_buffer, b_view


def _launch(kernel, case: Case) -> torch.Tensor:
    """Launch the learner's kernel on padded copies of A and B; return the view of C."""
    a, b, blocks, layout = case.args
    block_m, block_n, block_k = blocks
    _, a_view, _, b_view = _operands(a, b, blocks, layout)
    c_empty = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    c_buffer, c_view = _padded(c_empty.fill_(SENTINEL), block_m, block_n, SENTINEL)
    case.context["c_buffer"] = c_buffer
    reads = []
    with nan_in_masked_lanes(reads):
        launch_matmul(kernel, a_view, b_view, c_view, block_m, block_n, block_k)
    # Loads may go here: A's M rows and B's N columns, each up to one block past K (a load past K brings NaN or 0
    # into C's values, which the K-tail diagnosis judges; a load past M or N changes nothing in C). Counted where
    # the launch ran (addresses mean nothing in another process), as a number the judge reads.
    m, k = a_view.shape
    n = b_view.shape[1]
    case.context["stray_reads"] = addresses_outside(reads, torch.as_strided(a_view, (m, k + block_k), a_view.stride()),
                                                    torch.as_strided(b_view, (k + block_k, n), b_view.stride()))
    return c_view


def _inside_its_operands(case: Case, out: torch.Tensor) -> str | None:
    """The buffer around C must still hold the sentinel (no store past the edge of C), and no load may read rows
    of A past M or columns of B past N (in the interpreter, where the check records what each load reads)."""
    _, _, (block_m, block_n, _), _ = case.args
    outside = torch.ones(case.context["c_buffer"].shape, dtype=torch.bool)
    outside[block_m:block_m + out.shape[0], block_n:block_n + out.shape[1]] = False
    around = case.context["c_buffer"].cpu()[outside]
    if not (around == SENTINEL).all():
        return ("wrote outside C: missing store mask. Mask the tl.store with "
                "(offs_m[:, None] < M) & (offs_n[None, :] < N)")
    return stray_reads_problem(
        case.context, "read outside A or B along M or N",
        "C comes out right, since the rows of A past M and the columns of B past N only reach elements of C that "
        "are never stored, but on a GPU such loads read foreign memory or fault. Mask A's loads along M as well "
        "as K, (offs_m[:, None] < M) & (offs_k[None, :] + k0 < K), and B's along N as well as K")


# ------------------------------------------------------------------ wrong answers

def _blocks_along_k(a, blocks):
    """K, BLOCK_K and the number of steps along K."""
    k = a.shape[1]
    block_k = blocks[2]
    return k, block_k, math.ceil(k / block_k)


def _first_block_only(a, b, blocks, layout):
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


def _last_block_only(a, b, blocks, layout):
    """acc = tl.dot(a, b) instead of acc += ...: only the last step's product survives."""
    k, block_k, steps = _blocks_along_k(a, blocks)
    if steps < 2:
        return None
    last = (steps - 1) * block_k
    return a.double().cpu()[:, last:] @ b.double().cpu()[last:]


def _stops_early(a, b, blocks, layout):
    """A loop that ends before K (range(0, K - BLOCK_K, ...), range(0, K // BLOCK_K * BLOCK_K, ...)):
    C holds the product over the first c columns of A only, c a multiple of BLOCK_K below K."""
    k, block_k, _ = _blocks_along_k(a, blocks)
    a64, b64 = a.double().cpu(), b.double().cpu()
    return [a64[:, :c] @ b64[:c] for c in range(block_k, k, block_k)] or None


def _nan_if_k_tail(a, b, blocks, layout):
    """No K-tail mask: the tail step reads the NaN past the K edge of A and B into every entry of C."""
    k, block_k, _ = _blocks_along_k(a, blocks)
    if k % block_k == 0 or layout["around"] != AROUND_NAN:  # where 0 lies past K, reading it changes nothing
        return None
    return torch.full((a.shape[0], b.shape[1]), math.nan, dtype=torch.float64)


def _nan_from_masked_lanes(a, b, blocks, layout):
    """A masked load without other=: the masked K-tail lanes are NaN (this check's fill) in every sum.

    Named only where the memory past K holds 0, so that a load without a K mask reads 0 there."""
    k, block_k, _ = _blocks_along_k(a, blocks)
    if k % block_k == 0 or layout["around"] != AROUND_NAN_ZERO_PAST_K:
        return None
    return torch.full((a.shape[0], b.shape[1]), math.nan, dtype=torch.float64)


def _read_tiles(buffer, view, other_axis: int, other_stride: int, k_stride: int, advance: int, block_k: int):
    """What a k-loop reads for every (other index, k) of ``view`` (A: other = m; B: other = n) when it
    addresses it as other * other_stride + (k % BLOCK_K) * k_stride + (k // BLOCK_K) * BLOCK_K * advance
    (the mask keeps other and k inside the view). None if that reads outside the buffer."""
    n_other, k = view.shape[other_axis], view.shape[1 - other_axis]
    o = torch.arange(n_other).unsqueeze(1)
    kk = torch.arange(k).unsqueeze(0)
    address = (view.storage_offset() + o * other_stride + (kk % block_k) * k_stride
               + (kk // block_k) * (block_k * advance))
    flat = buffer.reshape(-1)
    if address.min() < 0 or address.max() >= flat.numel():
        return None
    return flat[address].double().cpu()


def _wrong_strides(operand: str):
    """A's (or B's) tiles read with another stride than the view's: stride 1 assumed along K (a_ptrs +=
    BLOCK_K), the other stride used along K, pointers rebuilt in the loop without one of the strides, or
    the row length (K or N) assumed. Each variant is what the kernel reads, from the very buffer."""
    def compute(a, b, blocks, layout):
        a_buffer, a_view, b_buffer, b_view = _operands(a, b, blocks, layout)
        block_k = blocks[2]
        k = a.shape[1]
        a64, b64 = a.double().cpu(), b.double().cpu()
        if operand == "A":
            s_other, s_k = a_view.stride()  # (stride_am, stride_ak)
            row_length = k
            buffer, view, axis = a_buffer, a_view, 0
        else:
            s_k, s_other = b_view.stride()  # (stride_bk, stride_bn)
            row_length = b.shape[1]
            buffer, view, axis = b_buffer, b_view, 1
        right = (s_other, s_k, s_k)
        if operand == "A":
            guesses = [(s_other, s_k, 1), (s_other, s_k, s_other), (s_other, 1, 1), (s_other, s_other, s_other),
                       (row_length, 1, 1)]
        else:
            guesses = [(s_other, s_k, 1), (s_other, s_k, s_other), (1, s_k, s_k), (s_other, s_other, s_other),
                       (1, row_length, row_length)]
        variants = []
        for guess in dict.fromkeys(guesses):
            if guess == right:
                continue
            read = _read_tiles(buffer, view, axis, *guess, block_k)
            if read is None:
                continue
            product = read @ b64 if operand == "A" else a64 @ read.t()
            if torch.isfinite(product).any():  # all NaN tells nothing: every NaN source gives it
                variants.append(product)
        return variants or None
    return compute


MATMUL_MISTAKES = (
    Mistake("stored nothing",
            "C still holds the value it had before the launch: the kernel stored nothing "
            "(is it still the stub? the tile of C must be written with tl.store)",
            lambda a, b, blocks, layout: torch.full((a.shape[0], b.shape[1]), SENTINEL, dtype=torch.float64),
            stub=True),
    Mistake("stored zeros",
            "C is all zeros: nothing was accumulated into acc (is the k-loop still the stub? "
            "each step must add tl.dot(a, b) to acc)",
            lambda a, b, blocks, layout: torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64),
            stub=True),
    Mistake("no K-tail mask",
            "the K-tail mask is missing (or ignores k0): the last step read past the K edge of A "
            "or B, where this check keeps NaN. Load with mask offs_k + k0 < K (and other=0.0) "
            "in both loads",
            _nan_if_k_tail),
    Mistake("masked load without other",
            UNDEFINED_LANES + ": in the last step the lanes past K are masked, so their NaN enters every "
            "sum of C. Add other=0.0 to both loads: tl.load(a_ptrs, mask=..., other=0.0)",
            _nan_from_masked_lanes),
    Mistake("pointers not advanced",
            "looks like the pointers are not advanced: every step multiplies the first K block "
            "again (A[:, :BLOCK_K] @ B[:BLOCK_K, :]). Add BLOCK_K * stride_ak to the A pointers "
            "and BLOCK_K * stride_bk to the B pointers after each step",
            _first_block_only),
    Mistake("acc overwritten",
            "looks like acc is overwritten instead of accumulated: only the last K block's "
            "product survives. Use acc += tl.dot(a, b)",
            _last_block_only),
    Mistake("loop stops early",
            "the k-loop stops before the end of K: C holds the product over the first blocks along K "
            "only, the last block (or the partial tail) is missing. A bound like K - BLOCK_K or "
            "K // BLOCK_K * BLOCK_K drops it: loop with for k0 in range(0, K, BLOCK_K) and let the mask "
            "offs_k + k0 < K handle the tail",
            _stops_early),
    Mistake("A strides",
            "A is not read through its strides: A[m, k] is at a_ptr + m * stride_am + k * stride_ak for "
            "any layout (A may be a transposed view, where stride_ak is not 1, or a slice of a wider "
            "tensor, where stride_am is not K). Advance a_ptrs by BLOCK_K * stride_ak; never assume a "
            "stride is 1 or K, nor step along K with stride_am",
            _wrong_strides("A")),
    Mistake("B strides",
            "B is not read through its strides: B[k, n] is at b_ptr + k * stride_bk + n * stride_bn for "
            "any layout (B may be a transposed view, where stride_bn is not 1, or a slice of a wider "
            "tensor, where stride_bk is not N). Advance b_ptrs by BLOCK_K * stride_bk; never assume a "
            "stride is 1 or N, nor step along K with stride_bn",
            _wrong_strides("B")),
)


# ------------------------------------------------------------------ cases

def _layout(a: str = "rows", b: str = "rows", around: str = AROUND_NAN) -> dict:
    """How the launch lays A and B out ("rows" or "transposed") and what their buffers hold around them."""
    return {"a": a, "b": b, "around": around}


def _matmul_case(gen, m, n, k, dtype, blocks, note, layout=None) -> Case:
    layout = layout or _layout()
    a = torch.randn(m, k, generator=gen, dtype=torch.float64).to(dtype)
    b = torch.randn(k, n, generator=gen, dtype=torch.float64).to(dtype)
    expected = a.double() @ b.double()  # reference on the rounded inputs
    bm, bn, bk = blocks
    _, a_view, _, b_view = _operands(a, b, blocks, layout)
    for name, view in (("A", a_view), ("B", b_view)):
        if layout[name.lower()] == "transposed":
            note += f"; {name} is a transposed view, strides {tuple(view.stride())}"
    description = (f"A ({m}, {k}) @ B ({k}, {n}), {str(dtype).replace('torch.', '')}, "
                   f"BLOCK_M/N/K = {bm}/{bn}/{bk}: {note}")
    return Case(description, (a.to(runtime.DEVICE), b.to(runtime.DEVICE), blocks, layout), expected,
                tolerance(dtype), shape_words="(M, N)", out_dtype=dtype)


def _fixed_cases() -> list[Case]:
    """The same inputs in every run, made to catch what random shapes miss."""
    gen = fixed_generator(FIXED_SEED)
    f32, blocks = torch.float32, (32, 32, 32)
    return [
        _matmul_case(gen, 64, 64, 96, f32, blocks, "no tails, 3 steps along K", _layout(around=AROUND_NUMBERS)),
        _matmul_case(gen, 45, 70, 80, f32, blocks, "M, N and K are not multiples of the blocks, "
                     "3 steps along K, the last one 16 wide; the memory past K holds 0",
                     _layout(around=AROUND_NAN_ZERO_PAST_K)),
        _matmul_case(gen, 45, 70, 50, f32, blocks, "M, N and K are not multiples of the blocks; "
                     "the memory past every edge holds NaN"),
        _matmul_case(gen, 48, 40, 64, f32, (16, 16, 16), "4 steps along K",
                     _layout(a="transposed", around=AROUND_NUMBERS)),
        _matmul_case(gen, 40, 48, 64, f32, (16, 16, 16), "4 steps along K",
                     _layout(b="transposed", around=AROUND_NUMBERS)),
    ]


def _matmul_cases(gen):
    return _fixed_cases() + [
        _matmul_case(gen, 20, 24, 40, torch.float16, (32, 32, 16),
                     "M and N smaller than one block, K tail"),
        # a last step 1 wide: a loop over range(0, K - 1, BLOCK_K) drops exactly that step
        _matmul_case(gen, 40, 48, 129, torch.float16, (16, 32, 32),
                     "5 steps along K, the last one 1 wide"),
    ]


def _accept_kernel(kernel) -> str | None:
    if not runtime.is_triton_kernel(kernel):
        return ("this is not a @triton.jit kernel (plain torch/python?): pass the kernel itself, "
                "decorated with @triton.jit, with matmul_kernel's signature")
    return None


MATMUL_KERNEL_CHECK = Check(
    MATMUL_KERNEL, _matmul_cases, MATMUL_MISTAKES, call=_launch, accept=_accept_kernel,
    inspect=_inside_its_operands,
    nonfinite_hint=("NaN in C: either some tl.load read past an edge of A or B (where a case has tails, they "
                    "sit inside NaN-filled buffers: mask every load), or " + UNDEFINED_LANES + ": pass "
                    "other=0.0 to every masked load"),
    # compiling a kernel on a GPU takes a few seconds per case
    time_limit=runtime.pick(gpu=30.0, cpu=DEFAULT_TIME_LIMIT),
)


def check_matmul_kernel(kernel, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check a @triton.jit kernel with ``matmul_kernel``'s signature (launched by launch_matmul)."""
    return run_check(MATMUL_KERNEL_CHECK, kernel, seed=seed, time_limit_s=time_limit_s)
