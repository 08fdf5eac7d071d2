"""Plots and widgets that the notebooks share.

Every plot function returns a matplotlib ``Figure`` that is already closed for
pyplot, so a notebook shows it exactly once: make it the last value of a cell (or
call ``display(fig)``). Widgets are built from ipywidgets, imported only when a
widget is asked for, so the plots work without it.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import PowerNorm
from matplotlib.ticker import FuncFormatter

_BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]


def format_bytes(n: float) -> str:
    """Bytes in binary units, e.g. 1536 -> '1.5 KiB', for tables and axis ticks."""
    n, unit = float(n), 0
    while abs(n) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        n, unit = n / 1024, unit + 1
    return f"{n:.0f} B" if unit == 0 else f"{n:.1f} {_BYTE_UNITS[unit]}"


def _check_same_length(**named: Sequence) -> None:
    """Raise a ValueError naming the sequences whose lengths differ from the first."""
    (first_name, first), *rest = named.items()
    for name, values in rest:
        if values is not None and len(values) != len(first):
            raise ValueError(f"{name} must have one value per entry of {first_name} "
                             f"({len(first)} values); got {len(values)}")
    if len(first) == 0:
        raise ValueError(f"{first_name} is empty: nothing to plot")


def _new_figure(ncols: int = 1, figsize=(6.4, 4.2)):
    """A pyplot figure closed at once, so it is shown only when returned (no double display)."""
    fig, axes = plt.subplots(1, ncols, figsize=figsize, layout="constrained")
    plt.close(fig)
    return fig, axes


def _log2_axis(ax, ticks: Sequence[int]) -> None:
    """Log base 2 on x with the given values as plain-number ticks."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))


# --- why the 1/sqrt(d) scale -------------------------------------------------------

def plot_dot_product_variance(ds: Sequence[int], unscaled: Sequence[float],
                              scaled: Sequence[float]):
    """Measured variance of q·k and of q·k/√d against d, with the theory (d and 1).

    Shows why attention divides by √d: for entries of variance 1 the raw dot
    product has variance d, the scaled one stays at 1 for every head size.
    """
    _check_same_length(ds=ds, unscaled=unscaled, scaled=scaled)
    fig, ax = _new_figure()
    ax.plot(ds, ds, "-", color="C0", alpha=0.5, label="theory: Var(q·k) = d")
    ax.plot(ds, unscaled, "o", color="C0", label="measured Var(q·k)")
    ax.plot(ds, [1.0] * len(ds), "-", color="C1", alpha=0.5, label="theory: Var(q·k/√d) = 1")
    ax.plot(ds, scaled, "s", color="C1", label="measured Var(q·k/√d)")
    _log2_axis(ax, ds)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("head dimension d")
    ax.set_ylabel("variance of the logit")
    ax.set_title("Dot products of random vectors grow with d; the scale undoes it")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    return fig


# --- softmax saturation: what large logits do ----------------------------------------

class Saturation(NamedTuple):
    """Softmax of random attention logits and how peaked its rows are."""

    probs: torch.Tensor       # (n_queries, n_keys) attention probabilities
    entropy: torch.Tensor     # (n_queries,) row entropy in nats: log(n_keys) uniform, 0 one-hot
    logit_std: float          # standard deviation of the logits fed to softmax
    max_prob: float           # mean over rows of the largest probability
    grad_norm: float          # mean Frobenius norm of the softmax Jacobian diag(p) - p p^T


def softmax_saturation(head_dim: int, scaled: bool = True, n_queries: int = 16,
                       n_keys: int = 64, seed: int = 0) -> Saturation:
    """Softmax of q·k (optionally / √d) for random q, k with N(0, 1) entries.

    Deterministic for a seed (float64 on the CPU). The Jacobian norm says how much
    gradient flows back through the softmax: it goes to 0 as rows become one-hot.
    """
    if not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"head_dim must be a positive integer; got {head_dim!r}")
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n_queries, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(n_keys, head_dim, generator=gen, dtype=torch.float64)
    logits = q @ k.T
    if scaled:
        logits = logits / math.sqrt(head_dim)
    probs = torch.softmax(logits, dim=-1)
    entropy = torch.special.entr(probs).sum(dim=-1)
    jacobian = torch.diag_embed(probs) - probs[:, :, None] * probs[:, None, :]
    return Saturation(
        probs=probs,
        entropy=entropy,
        logit_std=logits.std().item(),
        max_prob=probs.max(dim=-1).values.mean().item(),
        grad_norm=torch.linalg.matrix_norm(jacobian).mean().item(),
    )


def describe_saturation(head_dim: int, scaled: bool, stats: Saturation) -> str:
    """One line of numbers for a saturation picture (used as the widget's readout)."""
    n_keys = stats.probs.shape[-1]
    how = "scaled by 1/√d" if scaled else "unscaled"
    return (f"d = {head_dim}, {how}: logit std {stats.logit_std:.1f}, "
            f"mean largest probability {stats.max_prob:.2f}, "
            f"mean row entropy {stats.entropy.mean().item():.2f} nats "
            f"(uniform: {math.log(n_keys):.2f}), "
            f"softmax gradient size {stats.grad_norm:.3f}")


def plot_softmax_saturation(head_dim: int, scaled: bool = True, n_queries: int = 16,
                            n_keys: int = 64, seed: int = 0):
    """Heat map of the attention probabilities and the entropy of each row.

    Unscaled logits at large d make each row nearly one-hot (entropy near 0):
    attention then copies one value vector, and almost no gradient flows.
    """
    stats = softmax_saturation(head_dim, scaled, n_queries, n_keys, seed)
    fig, (ax_p, ax_h) = _new_figure(ncols=2, figsize=(10, 3.8))
    # A fixed colour scale (0..1) so that pictures for different d compare; the square
    # root norm keeps small probabilities visible.
    image = ax_p.imshow(stats.probs.numpy(), norm=PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0),
                        cmap="viridis", aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax_p, label="probability (square-root scale)")
    ax_p.set_xlabel("key j")
    ax_p.set_ylabel("query i")
    ax_p.set_title("attention probabilities P[i, j]")

    rows = range(n_queries)
    ax_h.bar(rows, stats.entropy.numpy(), color="C2", label="row entropy")
    ax_h.axhline(math.log(n_keys), color="k", linestyle="--", label=f"uniform: log {n_keys}")
    ax_h.axhline(0.0, color="C3", linestyle=":", label="one-hot: 0")
    ax_h.set_ylim(-0.1, math.log(n_keys) * 1.5)
    ax_h.set_xlabel("query i")
    ax_h.set_ylabel("entropy (nats)")
    ax_h.set_title("how spread out each row is")
    ax_h.legend(loc="upper center", ncol=3, fontsize="small")
    how = "logits q·k/√d" if scaled else "unscaled logits q·k"
    fig.suptitle(f"d = {head_dim}, {how} (std {stats.logit_std:.1f})")
    return fig


def softmax_saturation_explorer(d_values: Sequence[int] = (4, 8, 16, 32, 64, 128, 256, 512, 1024),
                                head_dim: int = 64, scaled: bool = True,
                                n_queries: int = 16, n_keys: int = 64, seed: int = 0):
    """A slider for d and a scale switch, redrawing :func:`plot_softmax_saturation`.

    Returns an ``ipywidgets.VBox``: [HBox(slider, checkbox), HTML readout, Output].
    Move the slider with the scale off to watch the rows collapse to one-hot.
    """
    import ipywidgets as widgets

    if head_dim not in d_values:
        raise ValueError(f"head_dim must be one of d_values {tuple(d_values)}; got {head_dim}")
    slider = widgets.SelectionSlider(options=list(d_values), value=head_dim,
                                     description="head dim d", continuous_update=False)
    checkbox = widgets.Checkbox(value=scaled, description="scale logits by 1/√d")
    readout = widgets.HTML()
    out = widgets.Output()

    def redraw(_change=None):
        d, use_scale = slider.value, checkbox.value
        stats = softmax_saturation(d, use_scale, n_queries, n_keys, seed)
        readout.value = describe_saturation(d, use_scale, stats)
        fig = plot_softmax_saturation(d, use_scale, n_queries, n_keys, seed)
        # Set the Output widget's contents directly rather than capturing display():
        # the picture then lives in the widget only, also when run headless (nbval).
        with out.hold_sync():
            out.outputs = ()
            out.append_display_data(fig)

    slider.observe(redraw, names="value")
    checkbox.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([slider, checkbox]), readout, out])


# --- the N x N matrix: memory and time ------------------------------------------------

def plot_memory_vs_seq_len(ns: Sequence[int], predicted: Sequence[float],
                           measured: Sequence[float], *, qkvo: Sequence[float] | None = None,
                           predicted_label: str = "predicted: S + P + O"):
    """Predicted bytes (line) and measured peak bytes (points) against N, log-log.

    On log-log axes N² is a straight line of slope 2; the optional ``qkvo`` line
    (Q, K, V and O alone, O(N·d)) has slope 1, so the gap between them is the
    N x N matrices.
    """
    _check_same_length(ns=ns, predicted=predicted, measured=measured, qkvo=qkvo)
    fig, ax = _new_figure()
    ax.plot(ns, predicted, "-", color="C0", label=predicted_label)
    ax.plot(ns, measured, "o", color="C3", markersize=8, label="measured peak")
    if qkvo is not None:
        ax.plot(ns, qkvo, "--", color="C7", label="Q, K, V, O alone: O(N·d)")
    _log2_axis(ax, ns)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: format_bytes(y)))
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("bytes")
    ax.set_title("Naive attention memory: the N x N matrices grow as N²")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    return fig


def plot_time_vs_seq_len(ns: Sequence[int], times_ms: Sequence[float], *,
                         label: str = "naive attention"):
    """Measured time against N, log-log, with an N² guide through the last point."""
    _check_same_length(ns=ns, times_ms=times_ms)
    fig, ax = _new_figure()
    ax.plot(ns, times_ms, "o-", color="C0", label=label)
    last_n, last_t = ns[-1], times_ms[-1]
    ax.plot(ns, [last_t * (n / last_n) ** 2 for n in ns], ":", color="k", label="∝ N² (guide)")
    _log2_axis(ax, ns)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("time (ms)")
    ax.set_title("Time of naive attention against N")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    return fig


# --- decoding: the roofline and the paged cache (notebook 09) -------------------------

def plot_roofline(points: dict[str, float], peak_tflops: float, hbm_gb_per_s: float, *,
                  title: str = "Roofline", intensity_range: tuple[float, float] = (0.25, 4096.0)):
    """The roofline, attainable TFLOP/s = min(peak, I · bandwidth) against the arithmetic intensity I
    (FLOP/byte), log-log, with each named point of ``points`` ({label: intensity}) placed on the roof.

    The ridge point, peak / bandwidth, is the dotted vertical line: left of it a kernel is
    memory-bound (it can reach I · bandwidth at most), right of it compute-bound.
    """
    if not points:
        raise ValueError("points is empty: nothing to plot")
    if peak_tflops <= 0 or hbm_gb_per_s <= 0:
        raise ValueError(f"peak_tflops and hbm_gb_per_s must be positive; got {peak_tflops} and {hbm_gb_per_s}")
    for label, intensity in points.items():
        if not intensity > 0:
            raise ValueError(f"points[{label!r}] must be a positive intensity (FLOP/byte); got {intensity!r}")

    def roof(intensity: float) -> float:
        return min(peak_tflops, intensity * hbm_gb_per_s / 1e3)

    low, high = intensity_range
    low, high = min([low] + [i / 2 for i in points.values()]), max([high] + [i * 2 for i in points.values()])
    fig, ax = _new_figure(figsize=(7.2, 4.4))
    xs = [low * (high / low) ** (k / 199) for k in range(200)]
    ax.plot(xs, [roof(x) for x in xs], "k-", lw=2, label="roofline")
    ridge = peak_tflops * 1e3 / hbm_gb_per_s
    ax.axvline(ridge, color="k", ls=":", lw=1, label=f"ridge point: {ridge:.0f} FLOP/byte")
    for k, (label, intensity) in enumerate(points.items()):
        value = f"{intensity:.3g}" if intensity < 100 else f"{intensity:.0f}"
        ax.plot(intensity, roof(intensity), "o", color=f"C{k}", ms=8, label=f"{label}: {value} FLOP/byte")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def plot_block_table(block_table, seq_lens: Sequence[int], page_size: int, num_pages: int):
    """A paged KV cache drawn: each sequence's logical pages (top) and where they live in the pool (bottom).

    ``block_table`` (B, max_pages): ``block_table[b, j]`` is the pool page that holds tokens
    ``j * page_size`` to ``(j + 1) * page_size - 1`` of sequence b. Each sequence has a colour;
    a pool page takes the colour of the sequence that owns it (white: free), and is filled up to
    the share of its rows in use. Arrows go from logical to physical pages.
    """
    from matplotlib.patches import FancyArrowPatch, Rectangle

    table = torch.as_tensor(block_table).tolist()
    lens = [int(n) for n in seq_lens]
    _check_same_length(block_table=table, seq_lens=lens)
    if page_size < 1 or num_pages < 1:
        raise ValueError(f"page_size and num_pages must be >= 1; got {page_size} and {num_pages}")
    used = [-(-n // page_size) for n in lens]
    for b, (row, pages) in enumerate(zip(table, used)):
        if pages > len(row):
            raise ValueError(f"sequence {b} has {lens[b]} tokens, {pages} pages of {page_size}, but its row of "
                             f"block_table has {len(row)} entries")
        for j, page in enumerate(row[:pages]):
            if not 0 <= page < num_pages:
                raise ValueError(f"block_table[{b}, {j}] = {page} is not a page of the pool (0 to {num_pages - 1})")

    batch = len(table)
    width = max(num_pages, max(used, default=1))
    fig, ax = _new_figure(figsize=(min(0.75 * width + 2.5, 16), 1.2 + 0.75 * (batch + 2)))
    pool_y, gap = 0.0, 1.6
    owner, filled = {}, {}
    for b, (row, pages) in enumerate(zip(table, used)):
        y = pool_y + gap + (batch - 1 - b) * 1.0
        colour = f"C{b % 10}"
        ax.text(-0.2, y + 0.35, f"sequence {b}\n{lens[b]} token{'' if lens[b] == 1 else 's'}", ha="right",
                va="center", fontsize=8)
        for j in range(pages):
            rows_used = min(page_size, lens[b] - j * page_size)
            page = row[j]
            owner[page], filled[page] = b, rows_used / page_size
            ax.add_patch(Rectangle((j + 0.05, y), 0.9, 0.7, fc="white", ec="none", zorder=2))
            ax.add_patch(Rectangle((j + 0.05, y), 0.9 * rows_used / page_size, 0.7, color=colour, alpha=0.35,
                                   zorder=3))
            ax.add_patch(Rectangle((j + 0.05, y), 0.9, 0.7, fill=False, ec=colour, lw=1.5, zorder=3))
            ax.text(j + 0.5, y + 0.35, f"{j * page_size}..{j * page_size + rows_used - 1}\n→ page {page}",
                    ha="center", va="center", fontsize=7, zorder=4)
            ax.add_patch(FancyArrowPatch((j + 0.5, y), (page + 0.5, pool_y + 0.7), arrowstyle="->",
                                         mutation_scale=8, color=colour, alpha=0.5, lw=0.8, zorder=1))
    for page in range(num_pages):
        colour = f"C{owner[page] % 10}" if page in owner else "0.6"
        if page in owner:
            ax.add_patch(Rectangle((page + 0.05, pool_y), 0.9 * filled[page], 0.7, color=colour, alpha=0.35))
        ax.add_patch(Rectangle((page + 0.05, pool_y), 0.9, 0.7, fill=False, ec=colour, lw=1.5,
                               ls="-" if page in owner else "--"))
        ax.text(page + 0.5, pool_y + 0.35, str(page), ha="center", va="center", fontsize=8)
    ax.text(-0.2, pool_y + 0.35, f"pool\n{num_pages} pages", ha="right", va="center", fontsize=8)
    ax.set_xlim(-1.6, width + 0.1)
    ax.set_ylim(pool_y - 0.3, pool_y + gap + batch + 0.1)
    ax.set_axis_off()
    ax.set_title(f"Paged KV cache: pages of {page_size} tokens, logical (top) to physical (bottom); "
                 "dashed: free", fontsize=9)
    return fig


# --- across devices: memory against N, the ring's steps, overlap, causal balance (notebook 10) ---

def _token_count(x: float) -> str:
    """A token count for an axis tick: 512, 4k, 1M."""
    if x >= 2 ** 20:
        return f"{x / 2 ** 20:g}M"
    if x >= 1024:
        return f"{x / 1024:g}k"
    return f"{x:g}"


def _tokens_axis(ax, ticks: Sequence[int]) -> None:
    """Log base 2 on x, ticks at the given token counts written 512, 4k, 1M."""
    _log2_axis(ax, ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _token_count(x)))


def _duration(x: float) -> str:
    """A duration for a title: whole units from 100 on, three significant digits below."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def plot_memory_lines(ns: Sequence[int], series: dict[str, Sequence[float]], limits: dict[str, float] | None = None,
                      *, title: str = "Memory against the sequence length"):
    """Bytes against the sequence length N, log-log: a line per entry of ``series`` ({label: bytes per N}),
    and a dashed horizontal line per entry of ``limits`` ({label: bytes}), e.g. one GPU's memory."""
    if not series:
        raise ValueError("series is empty: nothing to plot")
    _check_same_length(ns=ns, **series)
    fig, ax = _new_figure(figsize=(7.2, 4.4))
    for k, (label, values) in enumerate(series.items()):
        ax.plot(ns, values, "o-", color=f"C{k}", ms=4, label=label)
    for label, value in (limits or {}).items():
        ax.axhline(value, color="k", ls="--", lw=1.2, label=label)
    _tokens_axis(ax, ns)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: format_bytes(y)))
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("bytes")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


#: What a rank computes against one K/V shard, in full shard x shard blocks of query-key pairs.
_KIND_NAMES = {"full": "all", "diagonal": "diagonal", "half": "half", "skip": "skipped"}


def ring_step_kinds(world_size: int, causal: bool = True, scheme: str = "contiguous") -> list[list[tuple[int, str]]]:
    """For each rank and step of the ring, (the rank whose K/V shard it holds, what it computes with it):
    "full", "diagonal" (its own shard, causal), "half" (half of the queries or of the keys) or "skip",
    from :func:`flashlib.distributed.step_work`."""
    from .distributed import step_work

    table = []
    for rank in range(world_size):
        row = []
        for step in range(world_size):
            source = (rank - step) % world_size
            work = step_work(rank, source, 2, causal, scheme)
            if work is None:
                kind = "skip"
            elif work.causal:
                kind = "diagonal"
            elif work.q_rows.stop - work.q_rows.start < 2 or work.kv_rows.stop - work.kv_rows.start < 2:
                kind = "half"
            else:
                kind = "full"
            row.append((source, kind))
        table.append(row)
    return table


#: The work of each kind, in full shard x shard blocks (the causal diagonal is half a block, N/W large).
KIND_WORK = {"full": 1.0, "diagonal": 0.5, "half": 0.5, "skip": 0.0}


def plot_ring_schedule(world_size: int, causal: bool = True, schemes: Sequence[str] = ("contiguous", "zigzag")):
    """The ring step by step: which K/V shard each rank holds at each step (rank (r - t) mod W) and how much
    of it its queries see (colour: the work, in full shard x shard blocks), one panel per scheme."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size}")
    fig, axes = _new_figure(ncols=len(schemes), figsize=(3.6 * len(schemes) + 0.6, 0.55 * world_size + 1.6))
    axes = list(axes) if len(schemes) > 1 else [axes]
    for ax, scheme in zip(axes, schemes):
        table = ring_step_kinds(world_size, causal, scheme)
        work = [[KIND_WORK[kind] for _, kind in row] for row in table]
        image = ax.imshow(work, cmap="Blues", vmin=0.0, vmax=1.4, aspect="auto")
        for rank, row in enumerate(table):
            for step, (source, kind) in enumerate(row):
                ax.text(step, rank, f"K/V {source}\n{_KIND_NAMES[kind]}", ha="center", va="center", fontsize=7,
                        color="white" if KIND_WORK[kind] >= 1.0 else "black")
        ax.set_xticks(range(world_size))
        ax.set_yticks(range(world_size))
        ax.set_xlabel("step t")
        ax.set_ylabel("rank r")
        ax.set_title(f"{scheme}{', causal' if causal else ''}: busiest rank "
                     f"{max(sum(r) for r in work):g} blocks", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.8, label="work (blocks)")
    return fig


def plot_work_per_rank(world_size: int, schemes: Sequence[str] = ("contiguous", "zigzag")):
    """Causal ring attention's work per rank, in full shard x shard blocks, stacked by step, one panel per
    scheme; the dashed line is the mean (perfect balance). The ring ends when its busiest rank does."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size}")
    fig, axes = _new_figure(ncols=len(schemes), figsize=(3.6 * len(schemes) + 0.9, 3.6))
    axes = list(axes) if len(schemes) > 1 else [axes]
    top = 0.0
    for ax, scheme in zip(axes, schemes):
        work = [[KIND_WORK[kind] for _, kind in row] for row in ring_step_kinds(world_size, True, scheme)]
        bottom = [0.0] * world_size
        for step in range(world_size):
            heights = [work[rank][step] for rank in range(world_size)]
            ax.bar(range(world_size), heights, bottom=bottom, color=f"C{step % 10}", edgecolor="white",
                   label=f"step {step}")
            bottom = [b + h for b, h in zip(bottom, heights)]
        mean = sum(bottom) / world_size
        ax.axhline(mean, color="k", ls="--", lw=1, label=f"mean: {mean:g}")
        top = max(top, max(bottom))
        ax.set_xticks(range(world_size))
        ax.set_xlabel("rank")
        ax.set_ylabel("work (full shard blocks)")
        ax.set_title(f"{scheme}, causal: busiest rank {max(bottom):g}", fontsize=9)
    for ax in axes:
        ax.set_ylim(0, top * 1.15)
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


def ring_timeline(compute: float, transfer: float, world_size: int) -> list[tuple[float, float, float]]:
    """(start, end of compute, end of the transfer posted at its start) of each step of a ring whose step
    computes for ``compute`` and moves one K/V shard in ``transfer`` (the next shard travels while this one
    is computed; the last step sends nothing, its transfer is 0 long). Step t + 1 starts when both are done."""
    if compute < 0 or transfer < 0 or world_size < 1:
        raise ValueError(f"compute and transfer must be >= 0 and world_size >= 1; got {compute}, {transfer}, "
                         f"{world_size}")
    steps, start = [], 0.0
    for step in range(world_size):
        moved = transfer if step + 1 < world_size else 0.0
        steps.append((start, start + compute, start + moved))
        start += max(compute, moved)
    return steps


def plot_ring_timeline(panels: dict[str, tuple[float, float]], world_size: int, *, unit: str = "µs"):
    """A ring's W steps on two streams, one panel per entry of ``panels`` ({label: (compute, transfer)} per
    step, in ``unit``): compute bars on one line, transfers on the other, and hatched the time the compute
    stream waits for a transfer (none when the transfer hides behind the compute)."""
    if not panels:
        raise ValueError("panels is empty: nothing to plot")
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.0, 1.6 * len(panels) + 0.6), layout="constrained",
                             squeeze=False)
    plt.close(fig)
    for ax, (label, (compute, transfer)) in zip(axes[:, 0], panels.items()):
        steps = ring_timeline(compute, transfer, world_size)
        end = max(max(c, x) for _, c, x in steps)
        waited = sum(max(0.0, x - c) for _, c, x in steps)
        wide = 0.09 * end  # a bar narrower than this is left without its label
        for step, (start, compute_end, transfer_end) in enumerate(steps):
            ax.barh(1, compute_end - start, left=start, height=0.6, color="C0", edgecolor="white")
            if compute_end - start >= wide:
                ax.text((start + compute_end) / 2, 1, f"attend {step}", ha="center", va="center", fontsize=7,
                        color="white")
            if transfer_end > start:
                ax.barh(0, transfer_end - start, left=start, height=0.6, color="C1", edgecolor="white")
                if transfer_end - start >= wide:
                    ax.text((start + transfer_end) / 2, 0, f"K/V for {step + 1}", ha="center", va="center",
                            fontsize=7)
            if transfer_end > compute_end:
                ax.barh(1, transfer_end - compute_end, left=compute_end, height=0.6, color="none", edgecolor="C3",
                        hatch="///")
        ax.set_yticks([0, 1], ["transfer", "compute"])
        ax.set_xlim(0, end * 1.02)
        ax.set_xlabel(unit)
        state = "the transfers hide behind the compute" if waited == 0 else \
            f"the compute waits {_duration(waited)} {unit} ({waited / end:.0%})"
        ax.set_title(f"{label}: {_duration(end)} {unit} for {world_size} steps; {state}", fontsize=9)
    return fig


def plot_overlap_condition(shard_lens: Sequence[int], compute: Sequence[float],
                           transfers: dict[str, Sequence[float]], marks: dict[str, float] | None = None, *,
                           unit: str = "µs", title: str = "One ring step: compute against transfer"):
    """Time of one ring step against the shard length N/W, log-log: the compute (slope 2) and the transfer
    over each link of ``transfers`` (slope 1); ``marks`` ({label: N/W}) draws where a transfer starts to hide."""
    _check_same_length(shard_lens=shard_lens, compute=compute, **transfers)
    fig, ax = _new_figure(figsize=(7.2, 4.4))
    ax.plot(shard_lens, compute, "-", color="k", lw=2, label="compute (attention of one block)")
    for k, (label, values) in enumerate(transfers.items()):
        ax.plot(shard_lens, values, "--", color=f"C{k}", label=f"transfer over {label}")
    for k, (label, shard) in enumerate((marks or {}).items()):
        ax.axvline(shard, color=f"C{k}", ls=":", lw=1.2, label=f"{label}: hides from N/W ≈ {shard:,.0f}")
    _tokens_axis(ax, shard_lens)
    ax.set_yscale("log")
    ax.set_xlabel("shard length N/W (tokens per rank)")
    ax.set_ylabel(f"time per step ({unit})")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return fig
