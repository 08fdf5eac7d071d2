"""Online softmax: attention over key blocks without ever holding a full score row.

FlashAttention reads the keys one block at a time. For each query row it keeps
three numbers per row instead of the N scores:

* ``m``   the largest score seen so far (the running max),
* ``l``   the sum of ``exp(s - m)`` over the scores seen so far (the running sum),
* ``acc`` the sum of ``exp(s - m) * v`` over the keys seen so far (unnormalised output).

When a block raises the max from ``m_old`` to ``m_new``, everything summed so far
was computed relative to ``m_old``; multiplying it by ``exp(m_old - m_new)`` moves
it to the new reference, exactly (``exp(a - m_old) * exp(m_old - m_new) =
exp(a - m_new)``). At the end ``o = acc / l`` is softmax(scores) @ V.

Masked scores are ``-inf``. A row that has seen no visible key has ``m = -inf``,
``l = 0``, ``acc = 0``; we then subtract 0 instead of ``m`` so that no
``-inf - (-inf) = NaN`` appears, and its final output is 0 (logsumexp ``-inf``),
the convention of :mod:`flashlib.reference`.

Two partial results over disjoint key sets, each kept as ``(m, l, o)`` with ``o``
normalised, merge exactly (:func:`merge_partials`): this is how split-K decoding
(flash-decoding) and attention across devices (ring attention) combine their pieces.

This is the course's PyTorch reference of the algorithm (notebook 03); the Triton
kernel of notebook 04 does the same arithmetic on tiles.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple

import torch

from .reference import attention_mask, softmax_scale_for


class Partial(NamedTuple):
    """Softmax attention over a subset of keys: running max, sum and normalised output.

    ``m`` and ``l`` have the rows' shape (..., M); ``o`` is (..., M, D). A row with
    no visible key has ``m = -inf``, ``l = 0``, ``o = 0``.
    """

    m: torch.Tensor
    l: torch.Tensor  # noqa: E741  (the name used by the FlashAttention papers)
    o: torch.Tensor

    @property
    def lse(self) -> torch.Tensor:
        """logsumexp of the row's scores: ``m + log(l)`` (``-inf`` for an empty row)."""
        return self.m + torch.log(self.l)


class BlockState(NamedTuple):
    """The state after a key block: which block, its key range, and (m, l, acc)."""

    block: int
    start: int
    stop: int
    m: torch.Tensor
    l: torch.Tensor  # noqa: E741
    acc: torch.Tensor


def safe_shift(m: torch.Tensor) -> torch.Tensor:
    """``m`` with -inf replaced by 0: rows that saw no key subtract 0, not -inf (no NaN)."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def initial_state(rows_shape, head_dim: int, *, dtype=torch.float64, device=None):
    """(m, l, acc) before any key: m = -inf, l = 0, acc = 0, for rows of ``rows_shape``."""
    rows_shape = tuple(rows_shape)
    m = torch.full(rows_shape, float("-inf"), dtype=dtype, device=device)
    l = torch.zeros(rows_shape, dtype=dtype, device=device)  # noqa: E741
    acc = torch.zeros(rows_shape + (head_dim,), dtype=dtype, device=device)
    return m, l, acc


def online_softmax_step(m, l, acc, scores, v):  # noqa: E741
    """Fold one key block into the running (m, l, acc); return the new (m, l, acc).

    m, l: (..., M); acc: (..., M, D); scores: (..., M, Bn) already scaled and masked
    (-inf where a key is hidden); v: (..., Bn, D). ``acc`` stays unnormalised.
    """
    m_new = torch.maximum(m, scores.amax(dim=-1))
    m_ref = safe_shift(m_new)
    alpha = torch.exp(m - m_ref)                    # rescale of the old state, <= 1
    p = torch.exp(scores - m_ref.unsqueeze(-1))     # this block's weights, <= 1
    l_new = alpha * l + p.sum(dim=-1)
    acc_new = alpha.unsqueeze(-1) * acc + p @ v
    return m_new, l_new, acc_new


def finalize(m, l, acc) -> Partial:  # noqa: E741
    """Normalise the accumulator: o = acc / l, and 0 for rows that saw no key."""
    safe_l = torch.where(l > 0, l, torch.ones_like(l))
    return Partial(m, l, acc / safe_l.unsqueeze(-1))


def merge_partials(a, b) -> Partial:
    """Merge two partials (m, l, o) over disjoint key sets into the partial over both.

    Each side's sum is moved to the common max: ``w = l * exp(m - m_new)``; the
    merged output is the ``w``-weighted mean of the two outputs. Exact, and
    associative, so any number of pieces can be merged in any grouping.
    """
    m_a, l_a, o_a = a
    m_b, l_b, o_b = b
    m = torch.maximum(m_a, m_b)
    m_ref = safe_shift(m)
    w_a = l_a * torch.exp(m_a - m_ref)
    w_b = l_b * torch.exp(m_b - m_ref)
    l = w_a + w_b  # noqa: E741
    safe_l = torch.where(l > 0, l, torch.ones_like(l)).unsqueeze(-1)
    o = (w_a.unsqueeze(-1) * o_a + w_b.unsqueeze(-1) * o_b) / safe_l
    return Partial(m, l, o)


def _check_inputs(q, k, v, block_n):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., N, D), got shape {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes must match, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError("Q, K, V shapes must match in leading dims and head_dim: "
                         f"got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if isinstance(block_n, bool) or not isinstance(block_n, int):
        raise TypeError(f"block_n must be an int, got {type(block_n).__name__}")
    if block_n <= 0:
        raise ValueError(f"Block sizes must be positive: block_n = {block_n}")


def blockwise_states(q, k, v, block_n: int, *, causal: bool = False, mask=None,
                     softmax_scale: float | None = None) -> Iterator[BlockState]:
    """Walk the keys in blocks of ``block_n`` and yield the (m, l, acc) after each block.

    q: (..., N_q, D); k, v: (..., N_k, D). ``causal`` uses the bottom-right mask of
    :mod:`flashlib.reference`; ``mask`` (bool, broadcastable to (..., N_q, N_k),
    True = visible) is combined with it. Half-precision inputs are computed in
    float32; float32 and float64 in their own dtype. Arguments are checked at the call.
    """
    _check_inputs(q, k, v, block_n)
    return _walk_blocks(q, k, v, block_n, causal, mask, softmax_scale)


def _walk_blocks(q, k, v, block_n, causal, mask, softmax_scale) -> Iterator[BlockState]:
    """The generator behind :func:`blockwise_states` (its arguments already checked)."""
    work = torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(work), k.to(work), v.to(work)
    n_q, n_k, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = softmax_scale_for(head_dim, softmax_scale)
    visible = None
    if causal:
        visible = attention_mask(n_q, n_k, causal=True, device=q.device)[0, 0]
    if mask is not None:
        mask = torch.as_tensor(mask, dtype=torch.bool, device=q.device)
        visible = mask if visible is None else visible & mask
    m, l, acc = initial_state(q.shape[:-1], head_dim, dtype=work, device=q.device)  # noqa: E741
    for block, start in enumerate(range(0, n_k, block_n)):
        stop = min(start + block_n, n_k)
        scores = (q @ k[..., start:stop, :].transpose(-2, -1)) * scale
        if visible is not None:
            scores = scores.masked_fill(~visible[..., start:stop], float("-inf"))
        m, l, acc = online_softmax_step(m, l, acc, scores, v[..., start:stop, :])  # noqa: E741
        yield BlockState(block, start, stop, m, l, acc)


def blockwise_attention(q, k, v, block_n: int, causal: bool = False, *, mask=None,
                        softmax_scale: float | None = None, return_partial: bool = False):
    """softmax(q k^T * scale + mask) v computed one key block at a time.

    Same result as :func:`flashlib.reference.naive_attention` (to rounding), but
    never holds more than ``block_n`` scores per row. Returns O in q's dtype, or the
    :class:`Partial` (m, l, o) with ``return_partial`` (for merging, or ``.lse``).
    """
    state = None
    for state in blockwise_states(q, k, v, block_n, causal=causal, mask=mask,
                                  softmax_scale=softmax_scale):
        pass
    if state is None:  # no keys at all: every row is empty
        work = torch.promote_types(q.dtype, torch.float32)
        m, l, acc = initial_state(q.shape[:-1], v.shape[-1], dtype=work, device=q.device)  # noqa: E741
        state = BlockState(-1, 0, 0, m, l, acc)
    partial = finalize(state.m, state.l, state.acc)
    if return_partial:
        return partial
    return partial.o.to(q.dtype)


# --------------------------------------------------------------------------- widget

@dataclass
class StepperTrace:
    """Everything the stepper draws, computed once: per-block m, l and errors."""

    scores: torch.Tensor        # (M, N) scaled, masked scores (for the picture only)
    block_n: int
    row: int
    m: torch.Tensor             # (T, M) running max after each block
    l: torch.Tensor             # (T, M) running sum after each block
    error_vs_final: torch.Tensor  # (T,) rel. error of acc/l against the exact full output
    error_vs_seen: torch.Tensor   # (T,) rel. error against exact attention over the keys seen

    @property
    def n_blocks(self) -> int:
        return self.m.shape[0]


def trace_online_softmax(q, k, v, block_n: int, *, row: int = 0, causal: bool = False,
                         softmax_scale: float | None = None) -> StepperTrace:
    """Run :func:`blockwise_states` on 2D q (M, D), k, v (N, D) in float64 and record it."""
    from .reference import stable_softmax
    from .validation import relative_error

    if q.dim() != 2:
        raise ValueError(f"q must be 2D (M, D) for the stepper, got shape {tuple(q.shape)}")
    if not 0 <= row < q.shape[0]:
        raise ValueError(f"row must be in [0, {q.shape[0]}), got {row}")
    q, k, v = q.double(), k.double(), v.double()
    scale = softmax_scale_for(q.shape[-1], softmax_scale)
    scores = (q @ k.T) * scale
    if causal:
        scores = scores.masked_fill(~attention_mask(q.shape[0], k.shape[0], causal=True)[0, 0],
                                    float("-inf"))

    def exact(stop):  # softmax over the first `stop` keys, with the full rows in memory
        return stable_softmax(scores[:, :stop], dim=-1) @ v[:stop]

    final = exact(k.shape[0])
    ms, ls, err_final, err_seen = [], [], [], []
    for state in blockwise_states(q, k, v, block_n, causal=causal, softmax_scale=scale):
        o = finalize(state.m, state.l, state.acc).o
        ms.append(state.m.clone())
        ls.append(state.l.clone())
        err_final.append(relative_error(o, final))
        err_seen.append(relative_error(o, exact(state.stop)))
    return StepperTrace(scores, block_n, row, torch.stack(ms), torch.stack(ls),
                        torch.tensor(err_final, dtype=torch.float64),
                        torch.tensor(err_seen, dtype=torch.float64))


def plot_stepper_frame(trace: StepperTrace, step: int):
    """The stepper's picture after ``step`` blocks (1-based): scores, m and l, errors."""
    import matplotlib.pyplot as plt

    if not 1 <= step <= trace.n_blocks:
        raise ValueError(f"step must be in [1, {trace.n_blocks}], got {step}")
    row, block_n, t = trace.row, trace.block_n, step - 1
    n_keys = trace.scores.shape[1]
    seen = min(step * block_n, n_keys)
    fig, (ax_s, ax_m, ax_e) = plt.subplots(1, 3, figsize=(13, 3.6))
    fig.suptitle(f"Online softmax after key block {step} of {trace.n_blocks} (query row {row})")

    keys = torch.arange(n_keys)
    row_scores = trace.scores[row]
    read = keys < seen
    ax_s.scatter(keys[~read], row_scores[~read], s=10, color="lightgray", label="not read yet")
    ax_s.scatter(keys[read], row_scores[read], s=10, color="tab:blue", label="read")
    if torch.isfinite(trace.m[t, row]):
        ax_s.axhline(trace.m[t, row].item(), color="tab:red", lw=1.2, label="running max m")
    for edge in range(block_n, n_keys, block_n):
        ax_s.axvline(edge - 0.5, color="gray", lw=0.4, ls=":")
    ax_s.axvspan(-0.5, seen - 0.5, color="tab:blue", alpha=0.06)
    ax_s.set(xlabel="key j", ylabel="score s_j", title="scores of one query row")
    ax_s.legend(fontsize=7, loc="lower right")

    blocks = torch.arange(1, trace.n_blocks + 1)
    ax_m.plot(blocks, trace.m[:, row], color="tab:red", alpha=0.2)
    ax_m.plot(blocks[:step], trace.m[:step, row], "o-", color="tab:red", label="m")
    ax_m.set(xlabel="key blocks read", ylabel="running max m", title="m only grows; l is rescaled")
    ax_l = ax_m.twinx()
    ax_l.plot(blocks, trace.l[:, row], color="tab:green", alpha=0.2)
    ax_l.plot(blocks[:step], trace.l[:step, row], "s-", color="tab:green", label="l")
    ax_l.set_ylabel("running sum l")
    ax_m.legend(handles=ax_m.get_lines()[1:] + ax_l.get_lines()[1:], fontsize=7, loc="upper left")

    tiny = 1e-17  # show exact zeros on the log axis
    ax_e.semilogy(blocks, trace.error_vs_final.clamp_min(tiny), color="tab:purple", alpha=0.2)
    ax_e.semilogy(blocks[:step], trace.error_vs_final[:step].clamp_min(tiny), "o-",
                  color="tab:purple", label="acc/l vs final output")
    ax_e.semilogy(blocks[:step], trace.error_vs_seen[:step].clamp_min(tiny), "^-",
                  color="tab:orange", label="acc/l vs exact over keys read")
    ax_e.set(xlabel="key blocks read", ylabel="relative error (all rows)",
             title="partial output converges", ylim=(tiny / 2, 10))
    ax_e.legend(fontsize=7, loc="center left")
    fig.tight_layout()
    return fig


def online_softmax_stepper(q=None, k=None, v=None, *, block_n: int = 8, row: int = 0,
                           causal: bool = False, seed: int = 0):
    """A slider over key blocks showing m, l and the partial output converging.

    Without q, k, v it makes a small float64 problem (16 queries, 64 keys, d = 16)
    from ``seed``. Returns an ipywidgets VBox with attributes ``slider``, ``trace``,
    ``figure`` (the last frame drawn) and ``draw(step)``.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    if q is None or k is None or v is None:
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(16, 16, generator=gen, dtype=torch.float64) * 1.5
        k = torch.randn(64, 16, generator=gen, dtype=torch.float64) * 1.5
        v = torch.randn(64, 16, generator=gen, dtype=torch.float64)
    trace = trace_online_softmax(q, k, v, block_n, row=row, causal=causal)
    slider = widgets.IntSlider(value=1, min=1, max=trace.n_blocks, step=1,
                               description="blocks read", continuous_update=False)
    output = widgets.Output()
    box = widgets.VBox([slider, output])

    def draw(step: int):
        fig = plot_stepper_frame(trace, step)
        with output:
            output.clear_output(wait=True)
            display(fig)
        plt.close(fig)
        box.figure = fig
        return fig

    slider.observe(lambda change: draw(change["new"]), names="value")
    box.slider, box.trace, box.draw = slider, trace, draw
    draw(slider.value)
    return box
