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
