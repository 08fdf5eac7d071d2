"""Checks for notebook 05 (FlashAttention backward): dS from dP and D, and the dK/dV loop.

Exercise signatures (stated in the notebook):

* ``ds(p, dp, d) -> dS`` with p, dp of shape (..., N_q, N_k) (the probabilities and
  their gradient dP = dO V^T) and d of shape (..., N_q) (D = rowsum(dO * O), one
  float per query row); dS = P * (dP - D[..., None]), of p's shape and dtype.
  Checked in float64 on real attention problems (P from a softmax, some entries
  masked to 0), square and not.
* the loop body of a ``@triton.jit`` kernel with
  :func:`flashlib.kernels.attention_bwd_simple.flash_dkdv_kernel`'s signature,
  launched by :func:`~flashlib.kernels.attention_bwd_simple.launch_simple_dkdv`;
  dK and dV are compared with PyTorch autograd of the float64 reference attention.
  q and dO are views inside NaN-filled buffers (a load past N_Q reads NaN, never
  foreign memory), and dK, dV start as NaN, so rows never written show. During the
  launch a masked ``tl.load`` without ``other=`` fills its masked-off lanes with NaN
  (:func:`~flashlib.course.checks.undefined_memory.nan_in_masked_lanes`); one case keeps 0
  instead of NaN after the last query row of q and dO, so that there only such lanes
  (or, in the last head, L and D read past their end) bring NaN in. The fixed cases
  come first: no tails, with the rows of q and dO twice HEAD_DIM apart in memory (a
  loop that steps by start_m * HEAD_DIM instead of the row stride reads the wrong
  rows); tails with 0, then NaN, after the last query; large gaps
  between key blocks (scores about +20 in one block, -20 in another, which block
  depending on the query row), so that each tile of P = exp(S - L) is far from a
  softmax of the tile. A seeded random case follows. q, k, v and dO hold multiples of
  1/64, exact in TF32: on a GPU, float32 tl.dot rounds random inputs enough to put a
  right kernel at the edge of the tolerance.

The wrong answers they name. dS: D not subtracted, D broadcast along the keys
instead of the queries, rowsum(dP) or a sum over the query axis in place of D, P
twice, P missing, P applied to dP only, the sign flipped, dS transposed. dK/dV: the untouched stub,
P instead of P^T in dV, the scale missing in dK, dP in place of dS in dK, D not
subtracted, the sign of dS flipped, P not recomputed from L (plain exp, a softmax of
the tile alone, exp2 with natural-log L, scores not scaled), the query tail not masked,
a masked load without other=, and (in the explanation) query blocks stepped through by
HEAD_DIM instead of the row stride.
"""
from __future__ import annotations

import math

import torch

from ... import runtime
from ...kernels.attention_bwd_simple import launch_simple_dkdv
from ...reference import attention_mask, naive_attention, stable_softmax
from ...validation import relative_error, tolerance
from .framework import (Case, Check, DEFAULT_TIME_LIMIT, Mistake, diagnosis_radius, distance, fixed_generator, register,
                        run_check)
from .undefined_memory import (AFTER_NAN, AFTER_ZERO, UNDEFINED_LANES, in_padded_rows, nan_in_masked_lanes,
                               reads_in_padding, rows_read_by_head_dim_steps, stray_reads_problem)

NOTEBOOK = "05_flash_backward"
DS = register(NOTEBOOK, "ds", 2, "dS = P * (dP - D) from P, dP and D = rowsum(dO * O)")
DKDV_LOOP = register(NOTEBOOK, "dkdv_loop", 4,
                     "The loop of the dK/dV kernel: recompute P from L, dV += P^T dO, dK += scale * dS^T Q")

#: The seed of the fixed cases of the dK/dV check: the same values in every run, whatever the exercise's seed
#: (the grader's hidden draw mixes it with its own: :func:`~.framework.fixed_generator`).
FIXED_SEED = 20240505


# ---------------------------------------------------------------------------- dS

DS_MISTAKES = (
    Mistake("D not subtracted",
            "D was not subtracted: dS = P * (dP - D[..., None]), not P * dP. The softmax couples "
            "the scores of a row: raising one score lowers every other probability of that row",
            lambda p, dp, d: p * dp),
    Mistake("D along the keys",
            "D was broadcast along the keys: `dp - d` lines d up with the *last* axis (keys), so "
            "entry (i, j) subtracted D_j. D has one value per query row: subtract d[..., None] "
            "(shape (..., N_q, 1)), so that row i subtracts D_i",
            lambda p, dp, d: p * (dp - d.unsqueeze(-2))),
    Mistake("rowsum(dP)",
            "rowsum(dP) is not D: D_i = sum_j P_ij dP_ij (= rowsum(dO * O)), a P-weighted sum. "
            "Use the d given",
            lambda p, dp, d: p * (dp - dp.sum(dim=-1, keepdim=True))),
    Mistake("D over the queries",
            "D was summed over the query axis (-2): D_i = sum_j P_ij dP_ij sums over the keys of "
            "row i, the last axis. Simplest: use the d given",
            lambda p, dp, d: p * (dp - (p * dp).sum(dim=-2, keepdim=True))),
    Mistake("P twice",
            "P is applied twice: dS = P * (dP - D), with P once",
            lambda p, dp, d: p * p * (dp - d.unsqueeze(-1))),
    Mistake("P missing",
            "the factor P is missing: dS = P * (dP - D), not dP - D (a masked entry, P = 0, "
            "must get dS = 0)",
            lambda p, dp, d: dp - d.unsqueeze(-1)),
    Mistake("P on dP only",
            "P multiplies dP only: dS = P * dP - P * D = P * (dP - D), not P * dP - D",
            lambda p, dp, d: p * dp - d.unsqueeze(-1)),
    Mistake("sign flipped",
            "the sign is flipped: dS = P * (dP - D), not P * (D - dP)",
            lambda p, dp, d: p * (d.unsqueeze(-1) - dp)),
    Mistake("transposed",
            "dS is transposed: it has P's layout, queries along rows (axis -2) and keys along "
            "columns (axis -1); no .T or .transpose is needed",
            lambda p, dp, d: (p * (dp - d.unsqueeze(-1))).transpose(-2, -1)),
)


def _ds_case(gen, description, lead, n_q, n_k, *, causal=False, empty_rows=(), dtype=torch.float64) -> Case:
    """P, dP and D of a real attention problem, in ``dtype``; expected dS (float64, from those values)."""
    head_dim = 8

    def randn(*shape):
        return torch.randn(*lead, *shape, generator=gen, dtype=torch.float64)

    q, k, v, do = randn(n_q, head_dim) * 1.5, randn(n_k, head_dim) * 1.5, randn(n_k, head_dim), randn(n_q, head_dim)
    scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
    if causal:
        visible = attention_mask(n_q, n_k, causal=True)[0, 0]
        scores = scores.masked_fill(~visible, -math.inf)
    for row in empty_rows:
        scores[..., row, :] = -math.inf
    p = stable_softmax(scores)
    o = p @ v
    dp = do @ v.transpose(-2, -1)
    d = (do * o).sum(dim=-1)
    p, dp, d = (t.to(dtype) for t in (p, dp, d))
    shape = f"{tuple(lead) + (n_q, n_k)}"
    expected = p.double() * (dp.double() - d.double().unsqueeze(-1))
    return Case(f"p and dp {shape}, d {tuple(lead) + (n_q,)}, {str(dtype).replace('torch.', '')}: {description}",
                (p, dp, d), expected, tolerance(dtype), shape_words="(..., N_q, N_k), like p", out_dtype=dtype)


def _ds_cases(gen):
    return [
        _ds_case(gen, "one head, 6 queries and 6 keys", (), 6, 6),
        _ds_case(gen, "5 queries, 9 keys, causal (P = 0 above the diagonal)", (), 5, 9, causal=True),
        _ds_case(gen, "batch 2, 3 heads, 7 queries, 12 keys; row 3 sees no key (P = 0, D = 0)",
                 (2, 3), 7, 12, empty_rows=(3,)),
        _ds_case(gen, "batch 2, 2 heads, 8 queries, 8 keys, causal", (2, 2), 8, 8, causal=True),
        # dS in p's dtype: an answer that upcasts to float64 passed every float64 case
        _ds_case(gen, "one head, 6 queries, 10 keys", (), 6, 10, dtype=torch.float32),
    ]


DS_CHECK = Check(DS, _ds_cases, DS_MISTAKES,
                 nonfinite_hint="NaN or inf: dS needs no division and no log; P, dP and D are finite")


def check_ds(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(p, dp, d) -> dS``: dS = P * (dP - D[..., None]) for p, dp (..., N_q, N_k), d (..., N_q)."""
    return run_check(DS_CHECK, fn, seed=seed, time_limit_s=time_limit_s)


# ---------------------------------------------------------------------- dK / dV

def _pad_rows(t: torch.Tensor, block: int) -> torch.Tensor:
    """``t`` (..., N, ...) zero-padded along dim 2 to a multiple of ``block`` (what masked loads give)."""
    missing = -t.shape[2] % block
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[2] = missing
    return torch.cat([t, t.new_zeros(shape)], dim=2)


def _simulate_dkdv(q, k, v, o, do, lse, blocks, *, p_from="lse", dv_with="P^T", dk_from="dS",
                   dk_scaled=True, subtract_d=True, sign=1.0):
    """The kernel's loops in float64, tile by tile, one part done the way a typical bug does it: (dK, dV).

    ``p_from``: "lse" (exp(S - L), right), "exp" (exp(S)), "tile softmax" (a softmax
    over the tile's keys), "exp2" (2 ** (S - L)) or "unscaled" (exp(Q K^T - L)).
    ``dv_with``: "P^T" (right) or "P" (P_tile @ dO_tile, which needs square tiles).
    """
    block_m, block_n = blocks
    if dv_with == "P" and block_m != block_n:
        return None
    q, k, v, o, do, lse = (t.detach().double().cpu() for t in (q, k, v, o, do, lse))
    n_k, head_dim = k.shape[2], q.shape[3]
    scale = 1 / math.sqrt(head_dim)
    delta = (do * o).sum(dim=-1)
    q, do = _pad_rows(q, block_m), _pad_rows(do, block_m)
    lse, delta = (_pad_rows(t.unsqueeze(-1), block_m).squeeze(-1) for t in (lse, delta))
    k, v = _pad_rows(k, block_n), _pad_rows(v, block_n)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for j in range(0, k.shape[2], block_n):
        cols = slice(j, j + block_n)
        for i in range(0, q.shape[2], block_m):
            rows = slice(i, i + block_m)
            qk = q[:, :, rows] @ k[:, :, cols].transpose(-2, -1)
            s = qk * scale
            l_i = lse[:, :, rows].unsqueeze(-1)
            p = {"lse": lambda: torch.exp(s - l_i),
                 "exp": lambda: torch.exp(s),
                 "tile softmax": lambda: torch.softmax(s, dim=-1),
                 "exp2": lambda: torch.exp2(s - l_i),
                 "unscaled": lambda: torch.exp(qk - l_i)}[p_from]()
            do_i = do[:, :, rows]
            dv[:, :, cols] += (p.transpose(-2, -1) if dv_with == "P^T" else p) @ do_i
            dp = do_i @ v[:, :, cols].transpose(-2, -1)
            ds = sign * p * (dp - delta[:, :, rows].unsqueeze(-1)) if subtract_d else p * dp
            grad = ds if dk_from == "dS" else dp
            dk[:, :, cols] += (grad.transpose(-2, -1) @ q[:, :, rows]) * (scale if dk_scaled else 1.0)
    return dk[:, :, :n_k], dv[:, :, :n_k]


def _dkdv_variant(**flags):
    return lambda *args: _simulate_dkdv(*args[:7], **flags)


def _stub(q, k, v, o, do, lse, blocks, *_):
    """The untouched stub: the loop does nothing, dK = dV = 0 are stored."""
    return torch.zeros(k.shape, dtype=torch.float64), torch.zeros(v.shape, dtype=torch.float64)


def _no_tail_mask(q, k, v, o, do, lse, blocks, after):
    """NaN read past N_Q (the buffers around q and dO, or after L and D) spreads to every key's dK and dV.

    Where 0 lies after q and dO, only the last head reads NaN: past the end of L and D (the other heads
    read the next head's first rows there, which q = dO = 0 cancel)."""
    if q.shape[2] % blocks[0] == 0:
        return None
    everywhere = torch.full(k.shape, math.nan, dtype=torch.float64)
    last_head = torch.zeros(k.shape, dtype=torch.float64)  # only the last head reads past the end of L and D
    last_head[-1, -1] = math.nan
    right = _simulate_dkdv(q, k, v, o, do, lse, blocks)
    dk_last, dv_last = (torch.where(last_head.isnan(), last_head, r) for r in right)
    if after == AFTER_ZERO:
        return (dk_last, dv_last)
    return [(everywhere, everywhere.clone()), (dk_last, dv_last)]


def _nan_from_masked_lanes(q, k, v, o, do, lse, blocks, after):
    """Masked loads without other=: the query rows past N_Q are NaN (this check's fill) in every head, and
    P = 0 or dO = 0 does not cancel them (0 * NaN = NaN): dK and dV are NaN for every key (only dK, if
    only D was loaded that way). Named only where 0 lies after q and dO, so that a load without a mask
    cannot give NaN in every head."""
    if after != AFTER_ZERO or q.shape[2] % blocks[0] == 0:
        return None
    everywhere = torch.full(k.shape, math.nan, dtype=torch.float64)
    right_dv = _simulate_dkdv(q, k, v, o, do, lse, blocks)[1]
    return [(everywhere, everywhere.clone()), (everywhere.clone(), right_dv)]


DKDV_MISTAKES = (
    Mistake("stub",
            "dK and dV are all zeros: the loop body is still the stub (`pass`). Write it: load the "
            "query block, recompute P, then add to dv and dk",
            _stub, stub=True),
    Mistake("P instead of P^T",
            "dV used P where it needs P^T: dV_j = sum_i P_ij dO_i, so each key row collects over the "
            "query rows. Use dv += tl.dot(tl.trans(p), do) (p is BLOCK_M x BLOCK_N, queries x keys)",
            _dkdv_variant(dv_with="P")),
    Mistake("dK scale missing",
            "dK is missing the softmax scale: S = Q K^T * scale, so dK = dS^T Q * scale. Multiply by "
            "sm_scale",
            _dkdv_variant(dk_scaled=False)),
    Mistake("dP in dK",
            "dK used dP where it needs dS: dK = scale * dS^T Q with dS = P * (dP - D). dP is the "
            "gradient of P, not of the scores S",
            _dkdv_variant(dk_from="dP")),
    Mistake("D not subtracted",
            "D was not subtracted: dS = P * (dP - D[:, None]), with D loaded from DELTA for the query "
            "rows of this block",
            _dkdv_variant(subtract_d=False)),
    Mistake("dS sign flipped",
            "the sign of dS is flipped: dS = P * (dP - D), not P * (D - dP)",
            _dkdv_variant(sign=-1.0)),
    Mistake("P not from L",
            "P is not recomputed with the logsumexp: the forward saved L = logsumexp of each row's "
            "scores, so P = exp(S - L[:, None]) exactly, normalised over the *whole* row. exp(S) "
            "alone is unnormalised, and a softmax over this tile sees only BLOCK_N of the keys",
            lambda *args: [_simulate_dkdv(*args[:7], p_from="exp"),
                           _simulate_dkdv(*args[:7], p_from="tile softmax")]),
    Mistake("exp2 with natural L",
            "P uses exp2 with natural-log quantities: L is a natural logsumexp, so P = tl.exp(S - L); "
            "exp2 needs both S and L multiplied by log2(e)",
            _dkdv_variant(p_from="exp2")),
    Mistake("scores not scaled",
            "the scores are not scaled before recomputing P: S = Q K^T * sm_scale, exactly as in the "
            "forward that produced L",
            _dkdv_variant(p_from="unscaled")),
    Mistake("no query-tail mask",
            "NaN from reading past the last query: the last query block hangs over N_Q, and this check "
            "keeps NaN after the last row of q and dO (in some cases only after L and D). Mask the loads "
            "of q and dO with rows[:, None] < N_Q and of L and D with rows < N_Q (other=0.0)",
            _no_tail_mask),
    Mistake("masked load without other",
            UNDEFINED_LANES + ": the query rows past N_Q are masked, and P = 0 or dO = 0 there does not "
            "cancel them (0 * NaN = NaN), so every key's dK and dV is NaN. Add other=0.0 to the loads of "
            "q, dO, L and D: tl.load(..., mask=rows[:, None] < N_Q, other=0.0)",
            _nan_from_masked_lanes),
)


def _dkdv_case(gen, description, shape, n_k, blocks, *, spread=1.5, after=AFTER_NAN, key_offsets=None,
               row_stride=None, dtype=torch.float32) -> Case:
    """``dtype`` inputs (float32 unless said), their float64 reference O and L, and dK, dV from autograd in
    float64. A float16 case holds the kernel to its casts: tl.dot takes two operands of one type, so P and dS
    (float32) must be cast to dO's and Q's type before their products.

    q, k, v and dO hold multiples of 1/64: TF32 (tl.dot's float32 on a GPU) holds them exactly and
    Q K^T and dO V^T come out exact, so that only P and dS are rounded there (random float32 inputs
    rounded to TF32 put the teaching kernel at the edge of the float32 tolerance on a GPU).
    With ``key_offsets`` (one per key), designed scores: q[..., 0] = +-sqrt(D) (the sign alternating
    from row to row) and k[..., 0] = the key's offset, so that every score is +-its key's offset plus
    a random part. With ``row_stride``, the rows of q and dO lie that many elements apart in memory (the
    launch passes that stride), not D.
    """
    batch, heads, n_q, head_dim = shape
    q = torch.randn(shape, generator=gen, dtype=torch.float64) * spread
    k = torch.randn(batch, heads, n_k, head_dim, generator=gen, dtype=torch.float64) * spread
    v = torch.randn(batch, heads, n_k, head_dim, generator=gen, dtype=torch.float64)
    do = torch.randn(shape, generator=gen, dtype=torch.float64)
    q, k, v, do = (torch.round(t * 64) / 64 for t in (q, k, v, do))
    if key_offsets is not None:
        signs = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat((n_q + 1) // 2)[:n_q]
        q[..., 0] = math.sqrt(head_dim) * signs
        k[..., 0] = torch.tensor(key_offsets, dtype=torch.float64)
    q, k, v, do = (t.to(dtype) for t in (q, k, v, do))  # the kernel's inputs
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o, lse = naive_attention(q64, k64, v64, return_lse=True)
    dk, dv = torch.autograd.grad(o, (k64, v64), do.double())
    bm, bn = blocks
    description = (f"q and dO {tuple(shape)}, k and v {(batch, heads, n_k, head_dim)}, "
                   f"{str(dtype).replace('torch.', '')}, BLOCK_M = {bm}, BLOCK_N = {bn}: {description}")
    context = {}
    if row_stride is not None:
        context["row_stride"] = row_stride
        description += (f"; the rows of q and dO are {row_stride} elements apart in memory "
                        f"(stride_qn = stride_don = {row_stride}, not HEAD_DIM = {head_dim})")
    args = tuple(t.to(runtime.DEVICE) for t in (q, k, v, o.detach().to(dtype), do, lse.detach().float()))
    return Case(description, args + (blocks, after), (dk, dv), tolerance(dtype),
                shape_words=("(B, H, N_k, D), like k",) * 2, out_dtype=(dtype, dtype),
                output_names=("dK", "dV"), context=context)


def _fixed_dkdv_cases() -> list[Case]:
    """The same inputs in every run, made to catch what random ones miss."""
    gen = fixed_generator(FIXED_SEED)
    return [
        _dkdv_case(gen, "no tails, 2 query blocks", (1, 2, 64, 32), 64, (32, 32), row_stride=64),
        _dkdv_case(gen, "N_q = 24 and N_k = 40 not multiples of the blocks (the last query block holds 8 "
                   "rows); the memory after the last query row of q and dO holds 0", (1, 2, 24, 16), 40, (16, 32),
                   after=AFTER_ZERO),
        _dkdv_case(gen, "N_q = 40 and N_k = 72 not multiples of the blocks (the last query block holds 8 "
                   "rows); the memory after the last query row holds NaN", (1, 1, 40, 16), 72, (16, 32)),
        _dkdv_case(gen, "large gaps: the scores of key block 0 are about +20 and those of key block 1 about "
                   "-20 in even query rows, the other way round in odd ones (key block 2, 16 keys: +-5); "
                   "tails in both", (1, 1, 48, 16), 80, (32, 32),
                   key_offsets=[20.0] * 32 + [-20.0] * 32 + [5.0] * 16),
    ]


def _dkdv_cases(gen):
    return _fixed_dkdv_cases() + [
        _dkdv_case(gen, "batch 2, more queries than keys, tails in both", (2, 1, 80, 64), 48, (32, 16)),
        _dkdv_case(gen, "the inputs in float16, tails in both", (1, 2, 40, 32), 48, (16, 32), dtype=torch.float16),
    ]


def _launch_dkdv(kernel, case: Case):
    """Launch the learner's kernel on padded q and dO, into NaN-filled dK and dV."""
    q, k, v, o, do, lse, (block_m, block_n), after = case.args
    fill = 0.0 if after == AFTER_ZERO else math.nan
    row_stride = case.context.get("row_stride")
    q, do = in_padded_rows(q, block_m, fill, row_stride), in_padded_rows(do, block_m, fill, row_stride)
    dk = torch.full_like(k, math.nan)
    dv = torch.full_like(v, math.nan)
    reads = []
    with nan_in_masked_lanes(reads):
        launch_simple_dkdv(kernel, q, k, v, o, do, lse, block_m, block_n, out=(dk, dv))
    # Loads of q and dO past N_Q read the buffers around them: where P is masked there, dK and dV come out right,
    # yet on a GPU such loads read foreign memory or fault. Counted where the launch ran, as a number.
    case.context["stray_reads"] = reads_in_padding(reads, q, do)
    return dk, dv


def _inside_q_and_do(case: Case, out) -> str | None:
    """No load may read q or dO past the last query (in the interpreter, where the check records each load)."""
    return stray_reads_problem(
        case.context, "read q or dO past the last query",
        "dK and dV can come out right here, but on a GPU such loads read foreign memory or fault. Mask the "
        "loads of Q and dO (and of L and D) with the row index of the current block, start_m + offs_m < N_Q, "
        "and pass other=0.0")


def _explain_dkdv(case: Case, out) -> list[str]:
    """Which of dK and dV are right; where NaN or inf came in without a query tail, that no load brought it."""
    verdicts = [f"{name} {'right' if relative_error(got, want) <= case.tolerance else 'wrong'}"
                for name, got, want in zip(("dK", "dV"), out, case.expected)]
    lines = ["compared: " + ", ".join(verdicts)]
    nonfinite = any(not torch.isfinite(got.detach().cpu()).all() for got in out)
    q, (block_m, _) = case.args[0], case.args[6]
    if nonfinite and q.shape[2] % block_m == 0:
        lines.append("this case has no query tail (N_Q is a multiple of BLOCK_M): no load reads past the "
                     "last query here, so the NaN or inf comes from the arithmetic")
    if _reads_rows_head_dim_apart(case, out):
        lines.append("likely mistake: the query blocks were stepped through by start_m * HEAD_DIM (rows assumed "
                     "HEAD_DIM apart): here they are stride_qn apart, as in a head-major view of (B, N, H, D) "
                     "tensors. Advance by start_m * stride_qn for Q and start_m * stride_don for dO")
    return lines


def _dkdv_of(q, k, v, do, lse, delta):
    """dK, dV (float64) from these rows of q and dO with the given L and D: the loop's sums, untiled."""
    scale = 1 / math.sqrt(q.shape[-1])
    p = torch.exp(q @ k.transpose(-2, -1) * scale - lse.unsqueeze(-1))
    ds = p * (do @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    return ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ do


def _reads_rows_head_dim_apart(case: Case, out) -> bool:
    """Whether (dK, dV) is what a kernel gives that steps from query block to query block by
    BLOCK_M * HEAD_DIM elements (in Q, in dO or in both) where the case's rows are further apart; L and D,
    one float per row, are read right."""
    row_stride = case.context.get("row_stride")
    if row_stride is None:
        return False
    q, k, v, o, do, lse, (block_m, _), after = case.args
    fill = 0.0 if after == AFTER_ZERO else math.nan
    q_read, do_read = (rows_read_by_head_dim_steps(t, block_m, row_stride, fill) for t in (q, do))
    if q_read is None:
        return False
    q64, k64, v64, o64, do64, lse64 = (t.detach().double().cpu() for t in (q, k, v, o, do, lse))
    delta = (do64 * o64).sum(dim=-1)
    close_enough = diagnosis_radius(case)
    for queries, grads in ((q_read, do_read), (q_read, do64), (q64, do_read)):
        dk_read, dv_read = _dkdv_of(queries, k64, v64, grads, lse64, delta)
        if max(distance(out[0], dk_read), distance(out[1], dv_read)) <= close_enough:
            return True
    return False


def _accept_kernel(kernel) -> str | None:
    if not runtime.is_triton_kernel(kernel):
        return ("this is not a @triton.jit kernel (plain torch/python?): pass the kernel itself, "
                "decorated with @triton.jit, with flash_dkdv_kernel's signature")
    return None


DKDV_CHECK = Check(
    DKDV_LOOP, _dkdv_cases, DKDV_MISTAKES, call=_launch_dkdv, accept=_accept_kernel, explain=_explain_dkdv,
    inspect=_inside_q_and_do,
    nonfinite_hint=("NaN or inf in dK or dV. Where the last query block has a tail, either a tl.load read "
                    "past N_Q (q and dO sit inside NaN-filled buffers here and L and D are followed by NaN: "
                    "mask the loads with rows < N_Q), or " + UNDEFINED_LANES + ": pass other=0.0 to every "
                    "masked load. Otherwise it comes from the arithmetic: P = exp(S - L) never exceeds 1, "
                    "exp(S) alone can overflow"),
    # compiling takes a few seconds per case on a GPU; the interpreter is slow
    time_limit=runtime.pick(gpu=30.0, cpu=2 * DEFAULT_TIME_LIMIT),
)


def check_dkdv_kernel(kernel, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check a @triton.jit kernel with ``flash_dkdv_kernel``'s signature (launched by launch_simple_dkdv)."""
    return run_check(DKDV_CHECK, kernel, seed=seed, time_limit_s=time_limit_s)
