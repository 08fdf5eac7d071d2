"""Check for notebook 04 (FlashAttention forward): the learner's forward kernel.

The kernel has :func:`flashlib.kernels.attention_fwd_simple.flash_forward_kernel`'s
signature and is launched as the library launches its teaching kernel
(:func:`~flashlib.kernels.attention_fwd_simple.launch_simple_forward`). Both outputs
are compared with the float64 reference: O and the row logsumexp L (natural log).

Out-of-bounds reads are made visible and harmless: q, k, v are views inside larger
NaN-filled buffers, so a load past the last key reads NaN, never foreign memory; O
and L start as NaN, so a row never written shows. Masked lanes are made visible too:
during the launch a masked ``tl.load`` without ``other=`` fills its masked-off lanes
with NaN (:func:`~flashlib.course.checks.undefined_memory.nan_in_masked_lanes`). To tell the two
apart, one case keeps 0 instead of NaN after the last key: there a load past N_K reads
0 (harmless, since those scores are set to -inf), and only masked lanes without
``other=`` bring NaN into O.

The fixed cases come first (the same values in every run): no tails, with the rows
of q, k and v twice HEAD_DIM apart in memory (as in a head-major view of (B, N, H, D)
tensors: a loop that steps by start_n * HEAD_DIM instead of start_n * stride_kn reads
the wrong keys); tails with 0, then NaN, after the last key; scores all near +100 (exp(s) overflows float32 unless
the max is subtracted); large gaps between key blocks, the first block about 100
above the later ones, then a later block 100 above the others (a running max taken
from the current block alone overflows alpha = exp(m_i - m_new)). Every case's q, k
and v hold multiples of 1/64, so that the scores are exact in float32 (and in TF32 on
a GPU) however large they are. Seeded random cases follow, the last one measuring
memory.

**No N x N matrix.** A Triton kernel cannot allocate memory; with this signature it
has nowhere to store the scores, so the only way to materialise S = Q K^T is outside
a kernel (plain torch, or an object dressed up as a kernel). The first is refused
(the answer must be a ``@triton.jit`` kernel); the second is caught by measuring
(:func:`flashlib.timing.peak_memory_bytes`) the memory allocated while the kernel
runs, on a case where the N x N scores would dwarf everything else.

The wrong answers it names: the stubs left in, acc or l (or both) not rescaled by
alpha, m never updated, the running max taken from the current block alone, the max
not subtracted at all, alpha flipped, p taken against the old max, no final division
by l, the softmax scale missing, applied twice or mixed with exp2's log2(e), L in log2
units or not m + log(l), keys past N_K left in the softmax (no tail mask on the
scores, or one key too many), a masked load of V without other=, and (in the
explanation) key blocks stepped through by HEAD_DIM instead of the row stride.
"""
from __future__ import annotations

import math

import torch

from ... import runtime
from ...timing import peak_memory_bytes
from ...kernels.attention_fwd_simple import launch_simple_forward
from ...reference import naive_attention
from ...validation import relative_error, tolerance
from .framework import (Case, Check, DEFAULT_TIME_LIMIT, Mistake, diagnosis_radius, distance, fixed_generator, register,
                        run_check)
from .undefined_memory import (AFTER_NAN, AFTER_ZERO, UNDEFINED_LANES, addresses_outside, in_padded_rows,
                               nan_in_masked_lanes, rows_read_by_head_dim_steps, stray_reads_problem)

NOTEBOOK = "04_flash_forward"
INNER_LOOP = register(NOTEBOOK, "inner_loop", 4,
                      "The inner loop of the FlashAttention forward kernel, then O = acc / l and L = m + log l")

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)

#: The seed of the fixed cases: the same values in every run, whatever the exercise's seed
#: (the grader's hidden draw mixes it with its own: :func:`~.framework.fixed_generator`).
FIXED_SEED = 20240404



# ------------------------------------------------------------------ launching

def _launch(kernel, case: Case):
    """Launch the learner's kernel on padded copies; measure memory where the case asks."""
    q, k, v, (block_m, block_n), after = case.args
    fill = 0.0 if after == AFTER_ZERO else math.nan
    row_stride = case.context.get("row_stride")
    q, k, v = (in_padded_rows(t, block, fill, row_stride) for t, block in ((q, block_m), (k, block_n), (v, block_n)))
    o = torch.full_like(q, math.nan, memory_format=torch.contiguous_format)
    lse = torch.full(q.shape[:3], math.nan, dtype=torch.float32, device=q.device)
    reads = []

    def launch():
        reads.clear()
        with nan_in_masked_lanes(reads):
            launch_simple_forward(kernel, q, k, v, block_m, block_n, out=(o, lse))

    if "memory_budget" in case.context:
        case.context["allocated"] = peak_memory_bytes(launch)
    else:
        launch()
    # Loads may read q, k and v's own elements only. A load past the last key brings NaN (or 0) that a masked
    # score hides from O, yet on a GPU it reads foreign memory or faults. Counted where the launch ran
    # (addresses mean nothing in the grader's other process), as a number the judge reads.
    case.context["stray_reads"] = addresses_outside(reads, q, k, v)
    return o, lse


def _inside_q_k_and_v(case: Case, out) -> str | None:
    """No load may read past the last query or key (in the interpreter, where the check records each load)."""
    return stray_reads_problem(
        case.context, "read past the last key or query",
        "the scores of keys past N_K are masked, so O can come out right here, but on a GPU such loads read "
        "foreign memory or fault. Mask the loads of K and V with the key index of the current block, "
        "start_n + offs_n < N_K (cols[None, :] < N_K for K^T, cols[:, None] < N_K for V), and pass other=0.0")


def _inspect(case: Case, out) -> str | None:
    """What the values cannot show: loads past q, k and v, and an N x N matrix in memory."""
    return _inside_q_k_and_v(case, out) or _no_scores_in_memory(case, out)


def _no_scores_in_memory(case: Case, out) -> str | None:
    """The launch must not allocate anything like the N x N scores."""
    allocated, budget = case.context.get("allocated"), case.context.get("memory_budget")
    if allocated is None or allocated <= budget:
        return None
    return (f"right values, but the launch allocated {allocated / 2**20:.1f} MiB: the N x N scores of "
            f"this case take {case.context['scores_bytes'] / 2**20:.1f} MiB. FlashAttention never stores "
            "S = Q K^T: each BLOCK_M x BLOCK_N tile of scores lives in registers inside the kernel. "
            "Do not compute the scores with torch, outside the kernel")


# ------------------------------------------------------------------ wrong answers

def _simulate(q, k, v, blocks, *, scale_power=1, scale_factor=1.0, rescale_acc=True, rescale_l=True,
              update_m=True, running_max=True, alpha_flipped=False, p_old_max=False, divide=True, extra_keys=0,
              dtype=torch.float64):
    """The kernel's loop in float64, with one part done the way a typical bug does it: (O, L, m, l).

    The scores are scaled by ``scale_factor * (1/sqrt(D)) ** scale_power``;
    ``extra_keys`` zero keys (score 0, value 0) join the last key block: what an
    unmasked tail lets into the softmax. ``running_max=False``: m_new is this block's
    max alone; ``alpha_flipped``: alpha = exp(m_new - m_i); ``p_old_max``: p = exp(s - m_i).
    ``dtype=torch.float32`` computes as the kernel does, overflow included.
    """
    q, k, v = (t.detach().cpu().to(dtype) for t in (q, k, v))
    block_n = blocks[1]
    scale = scale_factor * (1 / math.sqrt(q.shape[-1])) ** scale_power
    if extra_keys:
        zeros = torch.zeros(k.shape[:2] + (extra_keys, k.shape[3]), dtype=dtype)
        k, v = torch.cat([k, zeros], dim=2), torch.cat([v, zeros], dim=2)
    m = torch.full(q.shape[:3], -math.inf, dtype=dtype)
    l = torch.zeros(q.shape[:3], dtype=dtype)  # noqa: E741
    acc = torch.zeros(q.shape, dtype=dtype)
    for start in range(0, k.shape[2], block_n):
        s = q @ k[:, :, start:start + block_n].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(dim=-1)) if running_max else s.amax(dim=-1)
        alpha = torch.exp(m_new - m) if alpha_flipped else torch.exp(m - m_new)
        p = torch.exp(s - (m if p_old_max else m_new).unsqueeze(-1))
        l = (alpha * l if rescale_l else l) + p.sum(dim=-1)  # noqa: E741
        acc = (alpha.unsqueeze(-1) * acc if rescale_acc else acc) + p @ v[:, :, start:start + block_n]
        if update_m:
            m = m_new
    out = acc / l.unsqueeze(-1) if divide else acc
    return tuple(t.double() for t in (out, m + torch.log(l), m, l))


def _variant(**flags):
    """A mistake's output (O, L) from :func:`_simulate` with ``flags``."""
    return lambda q, k, v, blocks, *_: _simulate(q, k, v, blocks, **flags)[:2]


def _without_key_tail(**flags):
    """A mistake's output (O, L), named only in cases without a key tail, where no load can bring NaN in:
    for bugs whose NaN would otherwise look like a load's."""
    def compute(q, k, v, blocks, *_):
        if k.shape[2] % blocks[1]:
            return None
        return _simulate(q, k, v, blocks, **flags)[:2]
    return compute


def _max_not_subtracted(q, k, v, blocks, *_):
    """p = exp(s), l += rowsum(p), acc += p v, L = log(l): the softmax without its max, in float32 as the
    kernel computes it, so that exp(s) overflows (inf, then O = inf / inf = NaN) where the kernel's does."""
    q, k, v = (t.detach().cpu().float() for t in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1])
    l = torch.zeros(q.shape[:3])  # noqa: E741
    acc = torch.zeros(q.shape)
    for start in range(0, k.shape[2], blocks[1]):
        p = torch.exp(q @ k[:, :, start:start + blocks[1]].transpose(-2, -1) * scale)
        l = l + p.sum(dim=-1)  # noqa: E741
        acc = acc + p @ v[:, :, start:start + blocks[1]]
    return (acc / l.unsqueeze(-1)).double(), torch.log(l).double()


def _nan_from_masked_lanes(q, k, v, blocks, after):
    """A masked load of V without other=: the lanes past N_K are NaN (this check's fill), and p = 0 there
    does not help (0 * NaN = NaN): every row of O is NaN. L is right, or NaN too if K was loaded that way
    and its NaN scores were not replaced by -inf. Named only where the memory after the last key holds 0,
    so that a load without a mask reads 0 there."""
    if after != AFTER_ZERO or k.shape[2] % blocks[1] == 0:
        return None
    nan_o = torch.full(q.shape, math.nan, dtype=torch.float64)
    lse = _simulate(q, k, v, blocks)[1]
    return [(nan_o, lse), (nan_o, torch.full_like(lse, math.nan))]


def _stubs(q, k, v, blocks, *_):
    """What the stubs give: O = acc = 0 and L = m = -inf; or 0/0 = NaN if only the loop is a stub."""
    empty_l = torch.full(q.shape[:3], -math.inf, dtype=torch.float64)
    return [(torch.zeros(q.shape, dtype=torch.float64), empty_l),
            (torch.full(q.shape, math.nan, dtype=torch.float64), empty_l)]


def _not_divided(q, k, v, blocks, *_):
    out, lse, m, l = _simulate(q, k, v, blocks, divide=False)  # noqa: E741
    return [(out, lse), (out, m), (out, torch.log(l))]


def _lse_variants(q, k, v, blocks, log2_units: bool):
    out, lse, m, l = _simulate(q, k, v, blocks)  # noqa: E741
    if log2_units:  # exp2 with log2(e) folded into the scores: m is in log2 units
        m2 = m * LOG2E
        return [(out, m2 + torch.log2(l)), (out, m2 + torch.log(l))]
    return [(out, torch.log(l)), (out, m), (out, m + l), (out, m * l)]


def _key_tail(one_too_many: bool):
    def compute(q, k, v, blocks, *_):
        n_k, block_n = k.shape[2], blocks[1]
        pad = -n_k % block_n
        if pad == 0:  # no tail: the mistake changes nothing here
            return None
        return _simulate(q, k, v, blocks, extra_keys=1 if one_too_many else pad)[:2]
    return compute


FORWARD_MISTAKES = (
    Mistake("stubs",
            "O is all zeros (or NaN) and L is -inf: the loop body and the final normalisation are "
            "still the stubs (`pass` and `out, lse = acc, m_i`). Write the loop body, then "
            "out = acc / l_i[:, None] and lse = m_i + tl.log(l_i)",
            _stubs, stub=True),
    Mistake("acc not rescaled",
            "acc was not rescaled by alpha: when the running max grows, what acc holds is relative to "
            "the old max. Use acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)",
            _variant(rescale_acc=False)),
    Mistake("l not rescaled",
            "l_i was not rescaled by alpha: when the running max grows, the old sum is relative to the "
            "old max. Use l_i = l_i * alpha + tl.sum(p, 1)",
            _variant(rescale_l=False)),
    Mistake("nothing rescaled",
            "neither l_i nor acc was rescaled: multiply both by alpha = tl.exp(m_i - m_new) before "
            "adding this block's terms",
            _variant(rescale_acc=False, rescale_l=False)),
    Mistake("m not updated",
            "m_i is never updated (m_i = m_new is missing at the end of the loop body): alpha is then "
            "exp(-inf - m_new) = 0 at every block, so only the last key block counts",
            _variant(update_m=False)),
    Mistake("running max from this block alone",
            "the running max must be the max of the old m and this block's max: m_new = "
            "tl.maximum(m_i, tl.max(s, 1)). With this block's max alone, m_new drops when an earlier key "
            "block held much larger scores (as here), and alpha = exp(m_i - m_new) overflows to inf "
            "(then O = inf / inf = NaN)",
            _variant(running_max=False, dtype=torch.float32)),
    Mistake("max not subtracted",
            "the scores are exponentiated without subtracting the running max: exp(s) overflows float32 "
            "(inf, then O = inf / inf = NaN) once a score passes about 88, as here. Use "
            "p = tl.exp(s - m_new[:, None]), rescale l_i and acc by alpha = tl.exp(m_i - m_new), and "
            "L = m_i + tl.log(l_i)",
            _max_not_subtracted),
    Mistake("alpha flipped",
            "alpha is flipped: the old state is rescaled by alpha = tl.exp(m_i - m_new) (old max minus new "
            "max, at most 1). exp(m_new - m_i) is exp(+inf) = inf at the first block (m_i = -inf), and "
            "0 * inf = NaN",
            _without_key_tail(alpha_flipped=True)),
    Mistake("p against the old max",
            "p is taken against the old max: p = tl.exp(s - m_new[:, None]), with the max that includes "
            "this block. Against m_i, the first block gives exp(s + inf) = inf (and later blocks can "
            "overflow too)",
            _without_key_tail(p_old_max=True)),
    Mistake("no final division",
            "O was not divided by l: acc is unnormalised. After the loop, out = acc / l_i[:, None]",
            _not_divided),
    Mistake("scale missing",
            "the softmax scale is missing: multiply the scores by sm_scale, s = tl.dot(q, k) * sm_scale",
            _variant(scale_power=0)),
    Mistake("scale twice",
            "the softmax scale is applied twice: the scores come out scaled by sm_scale**2 = 1/D, e.g. "
            "from scaling q (or k) and then the scores, or multiplying by sm_scale and dividing by "
            "sqrt(HEAD_DIM). sm_scale already is 1/sqrt(D): apply it once, s = tl.dot(q, k) * sm_scale",
            _variant(scale_power=2)),
    Mistake("log2 scale with exp",
            "the scores are scaled by sm_scale * log2(e) but exponentiated with tl.exp: that pair belongs "
            "with tl.exp2 (exp2(x * log2(e)) = exp(x)). Here use s = tl.dot(q, k) * sm_scale and tl.exp",
            _variant(scale_factor=LOG2E)),
    Mistake("exp2 without log2(e)",
            "tl.exp2 is used on scores scaled by sm_scale alone: exp2(x) = exp(x * ln 2), a different "
            "softmax. Use tl.exp, or fold log2(e) into the scale with exp2",
            _variant(scale_factor=LN2)),
    Mistake("L in log2 units",
            "O is right but L is in log2 units: with exp2 and log2(e) folded into the scores, m_i is a "
            "log2 quantity. L must be the natural-log logsumexp, m + log(l) in natural units "
            "(here: lse = m_i + tl.log(l_i) with tl.exp throughout)",
            lambda q, k, v, blocks, *_: _lse_variants(q, k, v, blocks, log2_units=True)),
    Mistake("L formula",
            "O is right but L is not the row logsumexp: L = m_i + tl.log(l_i) (l_i is relative to m_i, "
            "so logsumexp = m + log(l))",
            lambda q, k, v, blocks, *_: _lse_variants(q, k, v, blocks, log2_units=False)),
    Mistake("no key-tail mask",
            "the keys past N_K were not masked out of the scores: in the last key block they load as 0 "
            "(score 0) and still get weight exp(0 - m). Set them to -inf: "
            "s = tl.where(cols[None, :] < N_K, s, float('-inf'))",
            _key_tail(one_too_many=False)),
    Mistake("key-tail mask off by one",
            "the key-tail mask lets one key too many in (cols <= N_K?): keys are 0 .. N_K - 1, so mask "
            "with cols < N_K",
            _key_tail(one_too_many=True)),
    Mistake("masked load without other",
            UNDEFINED_LANES + ": the lanes of V past N_K are masked, and p = 0 there does not cancel them "
            "(0 * NaN = NaN), so every row of O is NaN. Add other=0.0 to the loads of K and V: "
            "tl.load(..., mask=cols[:, None] < N_K, other=0.0)",
            _nan_from_masked_lanes),
)

# ------------------------------------------------------------------ cases

def _case(gen, description, shape_q, n_k, dtype, blocks, *, spread=1.0, memory=False, after=AFTER_NAN,
          key_offsets=None, row_stride=None) -> Case:
    """Random q, k, v (``spread`` scales q and k) in multiples of 1/64: float16, float32 and TF32 (tl.dot's
    float32 on a GPU) hold them exactly, and Q K^T comes out exact, however large the scores.
    With ``key_offsets`` (one per key), designed scores: q[..., 0] = sqrt(D) and k[..., 0] = the key's
    offset, so that every score is its key's offset plus a random part. With ``row_stride``, the rows of
    q, k and v lie that many elements apart in memory (the launch passes that stride), not D."""
    batch, heads, n_q, head_dim = shape_q
    q = torch.randn(shape_q, generator=gen, dtype=torch.float64) * spread
    k = torch.randn(batch, heads, n_k, head_dim, generator=gen, dtype=torch.float64) * spread
    v = torch.randn(batch, heads, n_k, head_dim, generator=gen, dtype=torch.float64)
    q, k, v = (torch.round(t * 64) / 64 for t in (q, k, v))
    if key_offsets is not None:
        q[..., 0] = math.sqrt(head_dim)
        k[..., 0] = torch.tensor(key_offsets, dtype=torch.float64)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    expected = naive_attention(q.double(), k.double(), v.double(), return_lse=True)
    bm, bn = blocks
    description = (f"q {tuple(shape_q)}, k and v {(batch, heads, n_k, head_dim)}, "
                   f"{str(dtype).replace('torch.', '')}, BLOCK_M = {bm}, BLOCK_N = {bn}: {description}")
    context = {}
    if memory:
        scores = batch * heads * n_q * n_k * 4
        context = {"scores_bytes": scores, "memory_budget": scores // 4}
    if row_stride is not None:
        context["row_stride"] = row_stride
        description += (f"; the rows of q, k and v are {row_stride} elements apart in memory "
                        f"(stride_qn = stride_kn = stride_vn = {row_stride}, not HEAD_DIM = {head_dim})")
    return Case(description, tuple(t.to(runtime.DEVICE) for t in (q, k, v)) + (blocks, after), expected,
                tolerance(dtype), shape_words=("(B, H, N_q, D)", "(B, H, N_q)"),
                out_dtype=(dtype, torch.float32), output_names=("O", "L"), context=context)


def _fixed_cases() -> list[Case]:
    """The same inputs in every run, made to catch what random ones miss."""
    gen = fixed_generator(FIXED_SEED)
    f32, blocks = torch.float32, (16, 32)
    return [
        _case(gen, "no tails, 2 key blocks", (1, 2, 64, 32), 64, f32, (32, 32), spread=1.5, row_stride=64),
        _case(gen, "N_q and N_k not multiples of the blocks (the last key block holds 8 keys); the memory "
              "after the last key holds 0", (1, 2, 40, 16), 72, f32, blocks, spread=1.5, after=AFTER_ZERO),
        _case(gen, "N_q and N_k not multiples of the blocks (the last key block holds 8 keys); the memory "
              "after the last key holds NaN", (1, 1, 40, 16), 72, f32, blocks, spread=1.5),
        _case(gen, "every score is about +100 (no gaps between key blocks)", (1, 1, 24, 16), 80, f32, blocks,
              key_offsets=[100.0] * 80),
        _case(gen, "large gaps: the scores of key block 0 are about +60, those of the later key blocks "
              "about -40", (1, 1, 24, 16), 80, f32, blocks, key_offsets=[60.0] * 32 + [-40.0] * 48),
        _case(gen, "large gaps, a later key block larger: the scores of key block 1 are about +60, those of "
              "key blocks 0 and 2 about -40", (1, 1, 24, 16), 80, f32, blocks,
              key_offsets=[-40.0] * 32 + [60.0] * 32 + [-40.0] * 16),
    ]


def _forward_cases(gen):
    return _fixed_cases() + [
        _case(gen, "3 key blocks, the last one 16 keys", (2, 1, 48, 64), 80, torch.float16, (32, 32)),
        _case(gen, "N = 512, where the N x N scores would take 1 MiB: the memory the launch allocates "
              "is measured", (1, 1, 512, 16), 512, torch.float32, (64, 64), memory=True),
    ]


def _explain(case: Case, out) -> list[str]:
    """Which of O and L are right; where NaN or inf came in without a key tail, that no load brought it."""
    verdicts, nonfinite = [], False
    for name, got, want in zip(("O", "L"), out, case.expected):
        finite = torch.isfinite(want)
        got = got.detach().double().cpu()
        error = relative_error(got[finite], want[finite])
        verdicts.append(f"{name} {'right' if error <= case.tolerance else 'wrong'}")
        nonfinite |= bool((~torch.isfinite(got) & finite).any())
    lines = ["compared: " + ", ".join(verdicts)]
    k, (_, block_n) = case.args[1], case.args[3]
    stray = case.context.get("stray_reads")
    if nonfinite and isinstance(stray, int) and not isinstance(stray, bool) and stray > 0:
        lines.append(f"loads read {stray} element(s) past the last query or key (their memory holds NaN here): "
                     "mask every load of Q, K and V with its row index")
    elif nonfinite and k.shape[2] % block_n == 0 and not _the_stubs_output(out):
        lines.append("this case has no key tail (N_K is a multiple of BLOCK_N): no load reads past the last "
                     "key here, so the NaN or inf comes from the arithmetic")
    if _reads_rows_head_dim_apart(case, out):
        lines.append("likely mistake: the key blocks were stepped through by start_n * HEAD_DIM (rows assumed "
                     "HEAD_DIM apart): here they are stride_kn apart, as in a head-major view of (B, N, H, D) "
                     "tensors. Advance by start_n * stride_kn for K and start_n * stride_vn for V")
    return lines


def _the_stubs_output(out) -> bool:
    """Whether (O, L) is what the exercise's stubs give: the loop left out, O = acc = 0 (or 0 / 0 = NaN once
    divided by l) and L = m_i = -inf (then log(0) = -inf): that -inf is no arithmetic's."""
    o, lse = (t.detach().cpu() for t in out)
    return bool(((o == 0).all() or o.isnan().all()) and torch.isneginf(lse).all())


def _reads_rows_head_dim_apart(case: Case, out) -> bool:
    """Whether (O, L) is what a kernel gives that steps from key block to key block by BLOCK_N * HEAD_DIM
    elements (in K, in V or in both) where the case's rows are further apart."""
    row_stride = case.context.get("row_stride")
    if row_stride is None:
        return False
    q, k, v, (_, block_n), after = case.args
    fill = 0.0 if after == AFTER_ZERO else math.nan
    k_read, v_read = (rows_read_by_head_dim_steps(t, block_n, row_stride, fill) for t in (k, v))
    if k_read is None:
        return False
    q64, k64, v64 = (t.detach().double().cpu() for t in (q, k, v))
    close_enough = diagnosis_radius(case)
    for keys, values in ((k_read, v_read), (k_read, v64), (k64, v_read)):
        o_read, lse_read = naive_attention(q64, keys, values, return_lse=True)
        if max(distance(out[0], o_read), distance(out[1], lse_read)) <= close_enough:
            return True
    return False


def _accept_kernel(kernel) -> str | None:
    if not runtime.is_triton_kernel(kernel):
        return ("this is not a @triton.jit kernel (plain torch/python?): pass the kernel itself, "
                "decorated with @triton.jit, with flash_forward_kernel's signature")
    return None


FORWARD_KERNEL_CHECK = Check(
    INNER_LOOP, _forward_cases, FORWARD_MISTAKES, call=_launch, accept=_accept_kernel,
    inspect=_inspect, explain=_explain,
    nonfinite_hint=("NaN or inf in O or L. Where the last key block has a tail, either a tl.load read past "
                    "the last key (k and v sit inside NaN-filled buffers here: mask the K and V loads with "
                    "cols < N_K), or " + UNDEFINED_LANES + ": pass other=0.0 to every masked load. Otherwise "
                    "it comes from the arithmetic: alpha = tl.exp(m_i - m_new) and p = tl.exp(s - "
                    "m_new[:, None]) never exceed 1, and l_i > 0 after the loop (no 0 / 0, no log(0))"),
    # compiling takes a few seconds per case on a GPU; the first memory measurement starts a profiler
    time_limit=runtime.pick(gpu=30.0, cpu=2 * DEFAULT_TIME_LIMIT),
)


def check_flash_forward_kernel(kernel, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check a @triton.jit kernel with ``flash_forward_kernel``'s signature (launched by launch_simple_forward)."""
    return run_check(FORWARD_KERNEL_CHECK, kernel, seed=seed, time_limit_s=time_limit_s)
