"""Tile maps: which tiles a Triton program reads and writes, drawn.

A tiled kernel is easiest to understand as a picture: one program owns one tile
of the output and walks over tiles of the inputs. This module computes those
maps exactly as the kernels do (so the pictures cannot drift from the code; a
test checks the matmul map against ``flashlib.kernels.matmul.matmul_kernel``)
and draws them with matplotlib, statically or behind an ipywidgets slider.

Plots are matplotlib figures already closed for pyplot (as in
:mod:`flashlib.viz`), so a notebook shows each one once, when it is the cell's
value or passed to ``display``. matplotlib and ipywidgets are imported only when drawing.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .integer_math import ceil_div

# Colours shared by the pictures: the program's own tile, the tiles it reads, the rest.
OWN_COLOUR = "#d62728"
READ_CMAP = "Blues"
DONE_COLOUR = "#d9d9d9"
MASK_HATCH = "////"


def _check_positive(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
        if value <= 0:
            raise ValueError(f"{name} must be a positive int, got {name}={value}")


@dataclasses.dataclass(frozen=True)
class MatmulTiling:
    """The launch of ``matmul_kernel`` for C (M x N) = A (M x K) @ B (K x N).

    Program ``pid`` computes tile ``tile_of(pid)`` of C and reads, one k-step at
    a time, the row-block ``pid_m`` of A and the column-block ``pid_n`` of B.
    """

    m: int
    n: int
    k: int
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8

    def __post_init__(self):
        _check_positive(m=self.m, n=self.n, k=self.k, block_m=self.block_m,
                        block_n=self.block_n, block_k=self.block_k, group_m=self.group_m)

    @property
    def num_pid_m(self) -> int:
        """Rows of tiles in C."""
        return ceil_div(self.m, self.block_m)

    @property
    def num_pid_n(self) -> int:
        """Columns of tiles in C."""
        return ceil_div(self.n, self.block_n)

    @property
    def num_k_steps(self) -> int:
        """Iterations of the k-loop: tiles of A (and of B) each program reads."""
        return ceil_div(self.k, self.block_k)

    @property
    def num_programs(self) -> int:
        """The launch grid: one program per tile of C."""
        return self.num_pid_m * self.num_pid_n

    def _check_pid(self, pid: int) -> None:
        if not isinstance(pid, (int, np.integer)) or not 0 <= pid < self.num_programs:
            raise ValueError(f"pid must be an int in [0, {self.num_programs}) for this grid, got pid={pid!r}")

    def tile_of(self, pid: int) -> tuple[int, int]:
        """(pid_m, pid_n) of program ``pid``: the grouped ordering of ``matmul_kernel``.

        Programs run in groups of ``group_m`` rows of tiles, column by column
        inside a group, so that programs running at the same time share tiles of
        A and B in the L2 cache. ``group_m=1`` is plain row-major order.
        """
        self._check_pid(pid)
        num_pid_in_group = self.group_m * self.num_pid_n
        group_id = pid // num_pid_in_group
        first_pid_m = group_id * self.group_m
        group_size_m = min(self.num_pid_m - first_pid_m, self.group_m)
        pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
        pid_n = (pid % num_pid_in_group) // group_size_m
        return int(pid_m), int(pid_n)

    def order(self) -> np.ndarray:
        """(num_pid_m, num_pid_n) array: the program id that computes each tile of C."""
        grid = np.full((self.num_pid_m, self.num_pid_n), -1, dtype=int)
        for pid in range(self.num_programs):
            grid[self.tile_of(pid)] = pid
        return grid

    def tiles_read(self, pid: int) -> dict[str, list[tuple[int, int]]]:
        """Tiles of A and B that program ``pid`` loads, in k-loop order.

        A tiles are (row-block, k-block), B tiles are (k-block, column-block).
        """
        pid_m, pid_n = self.tile_of(pid)
        steps = range(self.num_k_steps)
        return {"a": [(pid_m, s) for s in steps], "b": [(s, pid_n) for s in steps]}

    def blocks_touched(self, num_programs: int) -> tuple[int, int]:
        """(row-blocks of A, column-blocks of B) read by programs 0 .. num_programs-1.

        If those programs run at the same time, this is how many panels of A and
        B must sit in L2 together: fewer means more reuse.
        """
        _check_positive(num_programs=num_programs)
        tiles = [self.tile_of(p) for p in range(min(num_programs, self.num_programs))]
        return len({pm for pm, _ in tiles}), len({pn for _, pn in tiles})


# --------------------------------------------------------------------------- drawing

def _figure(**kwargs):
    """A pyplot figure, closed at once: shown only when it is a cell's value (no double display)."""
    import matplotlib.pyplot as plt

    fig = plt.figure(**kwargs)
    plt.close(fig)
    return fig


def _draw_grid(ax, rows: int, cols: int, true_h: int, true_w: int, bh: int, bw: int, title: str) -> None:
    """A matrix of true_h x true_w elements cut into bh x bw tiles; padding hatched."""
    from matplotlib.patches import Rectangle

    pad_h, pad_w = rows * bh, cols * bw
    ax.set_xlim(0, pad_w)
    ax.set_ylim(pad_h, 0)
    ax.set_aspect("equal")
    ax.add_patch(Rectangle((0, 0), true_w, true_h, fill=False, lw=1.5, ec="black", zorder=3))
    if pad_w > true_w:  # tail: lanes the masks switch off
        ax.add_patch(Rectangle((true_w, 0), pad_w - true_w, pad_h, fc="white", ec="grey",
                               hatch=MASK_HATCH, lw=0, zorder=2))
    if pad_h > true_h:
        ax.add_patch(Rectangle((0, true_h), pad_w, pad_h - true_h, fc="white", ec="grey",
                               hatch=MASK_HATCH, lw=0, zorder=2))
    for r in range(rows + 1):
        ax.axhline(r * bh, color="grey", lw=0.6, zorder=1)
    for c in range(cols + 1):
        ax.axvline(c * bw, color="grey", lw=0.6, zorder=1)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=10)


def _fill(ax, row: int, col: int, bh: int, bw: int, true_h: int, true_w: int, colour,
          label: str | None = None, text_colour: str = "black", fontsize: float = 8) -> None:
    """Colour tile (row, col), clipped to the matrix (a tail tile is smaller), and label it."""
    from matplotlib.patches import Rectangle

    x, y = col * bw, row * bh
    w, h = min(bw, true_w - x), min(bh, true_h - y)
    ax.add_patch(Rectangle((x, y), w, h, fc=colour, ec="none", zorder=0.5))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center",
                fontsize=fontsize, color=text_colour, zorder=4)


def plot_matmul_tiles(tiling: MatmulTiling, pid: int, show_done: bool = True):
    """Figure: program ``pid``'s tile of C and the tiles of A and B it reads.

    Laid out as the product is written: A on the left, B on top, C where the
    row of A meets the column of B. Reads are numbered by k-step; hatching marks
    padding past the matrix edge, which the masks keep out of loads and stores.
    With ``show_done``, tiles of C finished by earlier programs are greyed.
    """
    from matplotlib import colormaps

    tiling._check_pid(pid)
    t = tiling
    pid_m, pid_n = t.tile_of(pid)
    rows, cols, steps = t.num_pid_m, t.num_pid_n, t.num_k_steps
    pad_m, pad_n, pad_k = rows * t.block_m, cols * t.block_n, steps * t.block_k
    fig = _figure(figsize=(9, 9 * (pad_k + pad_m) / (pad_k + pad_n) * 0.95), layout="constrained")
    grid = fig.add_gridspec(2, 2, width_ratios=[pad_k, pad_n], height_ratios=[pad_k, pad_m])
    ax_b, ax_a, ax_c = fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    ax_note = fig.add_subplot(grid[0, 0])
    ax_note.axis("off")

    cmap = colormaps[READ_CMAP]
    shade = [cmap(0.35 + 0.5 * s / max(1, steps - 1)) for s in range(steps)]
    reads = t.tiles_read(pid)
    for s, (r, c) in enumerate(reads["a"]):
        _fill(ax_a, r, c, t.block_m, t.block_k, t.m, t.k, shade[s], f"k{s}", "white" if s > steps / 2 else "black")
    for s, (r, c) in enumerate(reads["b"]):
        _fill(ax_b, r, c, t.block_k, t.block_n, t.k, t.n, shade[s], f"k{s}", "white" if s > steps / 2 else "black")

    order = t.order()
    label_all = rows * cols <= 150
    for r in range(rows):
        for c in range(cols):
            p = order[r, c]
            if p == pid:
                _fill(ax_c, r, c, t.block_m, t.block_n, t.m, t.n, OWN_COLOUR, str(p), "white", 9)
            elif show_done and p < pid:
                _fill(ax_c, r, c, t.block_m, t.block_n, t.m, t.n, DONE_COLOUR, str(p) if label_all else None)
            elif label_all:
                _fill(ax_c, r, c, t.block_m, t.block_n, t.m, t.n, "white", str(p), "grey")

    _draw_grid(ax_a, rows, steps, t.m, t.k, t.block_m, t.block_k, f"A  ({t.m} x {t.k})")
    _draw_grid(ax_b, steps, cols, t.k, t.n, t.block_k, t.block_n, f"B  ({t.k} x {t.n})")
    _draw_grid(ax_c, rows, cols, t.m, t.n, t.block_m, t.block_n,
               f"C  ({t.m} x {t.n}), tiles labelled by program id")
    ax_note.text(0.0, 0.95,
                 f"program {pid}\n→ tile C[{pid_m}, {pid_n}]\n\n"
                 f"reads A row-block {pid_m}\nand B column-block {pid_n},\n"
                 f"{steps} k-steps (k0 … k{steps - 1})\n\n"
                 f"BLOCK_M={t.block_m}  BLOCK_N={t.block_n}\nBLOCK_K={t.block_k}  GROUP_M={t.group_m}\n\n"
                 f"grey: tiles done by programs < {pid}\nhatched: padding, masked off",
                 va="top", ha="left", fontsize=9, family="monospace", transform=ax_note.transAxes)
    return fig


def plot_program_order(tiling: MatmulTiling, group_ms=(1, 4), wave: int | None = None):
    """Figure: the order in which programs cover C, one panel per GROUP_M.

    Each tile shows the id of the program that computes it. The first ``wave``
    programs (those that run at the same time on the GPU) are outlined, and the
    title counts the panels of A and B they need between them.
    """
    from matplotlib.patches import Rectangle

    wave = wave or tiling.num_pid_n
    _check_positive(wave=wave)
    fig = _figure(figsize=(4.2 * len(group_ms), 4.6), layout="constrained")
    axes = fig.subplots(1, len(group_ms), squeeze=False)[0]
    for ax, group_m in zip(axes, group_ms):
        t = dataclasses.replace(tiling, group_m=group_m)
        order = t.order()
        ax.imshow(order, cmap="viridis", alpha=0.55, aspect="equal")
        for (r, c), p in np.ndenumerate(order):
            ax.text(c, r, str(p), ha="center", va="center", fontsize=8,
                    fontweight="bold" if p < wave else "normal")
            if p < wave:
                ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec=OWN_COLOUR, lw=2))
        a_blocks, b_blocks = t.blocks_touched(wave)
        name = "row-major" if group_m == 1 else "grouped"
        ax.set_title(f"GROUP_M={group_m} ({name})\nfirst {wave} programs read "
                     f"{a_blocks} A + {b_blocks} B panels = {a_blocks + b_blocks}", fontsize=10)
        ax.set_xticks(range(t.num_pid_n))
        ax.set_yticks(range(t.num_pid_m))
        ax.set_xlabel("pid_n (column of tiles)")
        ax.set_ylabel("pid_m (row of tiles)")
    return fig


def plot_vector_blocks(n: int, block: int):
    """Figure: a vector of ``n`` elements cut into blocks, one per program; masked lanes hatched."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    _check_positive(n=n, block=block)
    programs = ceil_div(n, block)
    cmap = colormaps["tab10"]
    fig = _figure(figsize=(max(6, 0.5 * programs * block + 1), 2.0), layout="constrained")
    ax = fig.add_subplot()
    for pid in range(programs):
        for lane in range(block):
            offset = pid * block + lane
            live = offset < n
            ax.add_patch(Rectangle((offset, 0), 1, 1, fc=cmap(pid % 10) if live else "white",
                                   alpha=0.6 if live else 1, ec="black", lw=0.8,
                                   hatch=None if live else MASK_HATCH))
            ax.text(offset + 0.5, 0.5, str(offset), ha="center", va="center", fontsize=8,
                    color="black" if live else "grey",
                    bbox=None if live else dict(boxstyle="square,pad=0.2", fc="white", ec="none"), zorder=5)
        on = min(block, n - pid * block)
        ax.text(pid * block + block / 2, -0.35, f"program {pid}\nmask: {on}/{block} lanes on",
                ha="center", va="center", fontsize=9)
    ax.set_xlim(-0.2, programs * block + 0.2)
    ax.set_ylim(1.2, -0.9)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"n={n}, BLOCK={block}: cdiv(n, BLOCK) = {programs} programs\n"
                 "offsets = pid*BLOCK + tl.arange(0, BLOCK); hatched lanes have mask False",
                 fontsize=10)
    return fig


def matmul_tile_widget(tiling: MatmulTiling, group_ms=(1, 2, 4, 8)):
    """An ipywidgets slider over program id (and a GROUP_M choice) redrawing the tile map."""
    import ipywidgets as widgets
    from IPython.display import display

    choices = sorted(set(group_ms) | {tiling.group_m})
    pid = widgets.IntSlider(value=0, min=0, max=tiling.num_programs - 1, description="program id",
                            continuous_update=False)
    group = widgets.Dropdown(options=choices, value=tiling.group_m, description="GROUP_M")
    out = widgets.Output()

    def draw(_change=None):
        fig = plot_matmul_tiles(dataclasses.replace(tiling, group_m=group.value), pid.value)
        with out:
            out.clear_output(wait=True)
            display(fig)

    pid.observe(draw, names="value")
    group.observe(draw, names="value")
    draw()
    return widgets.VBox([widgets.HBox([pid, group]), out])


# ------------------------------------------------------------------ attention tile maps

#: How a program met a (query block, key block) tile, as the forward kernel records it.
TILE_SKIPPED, TILE_COMPUTED, TILE_MASKED = 0, 1, 2
ATTENTION_TILE_COLOURS = {TILE_COMPUTED: "#4c72b0", TILE_MASKED: "#f2a65a", TILE_SKIPPED: "white"}
HIDDEN_COLOUR = (0.25, 0.25, 0.25, 0.45)  # scores the mask hides, drawn over the tiles


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionTiles:
    """The tiles of one head's score matrix S (N_q x N_k) and what the forward kernel did with each.

    ``status[i, j]`` for query block i and key block j: :data:`TILE_COMPUTED` (loaded,
    no element mask), :data:`TILE_MASKED` (loaded, scores masked element by element:
    a mask edge or the N tail cuts it) or :data:`TILE_SKIPPED` (never loaded).
    ``visible`` (N_q, N_k) says which scores the mask keeps
    (:func:`flashlib.reference.attention_mask`).
    """

    status: np.ndarray
    visible: np.ndarray
    block_m: int
    block_n: int
    label: str = ""

    @property
    def n_q(self) -> int:
        return int(self.visible.shape[0])

    @property
    def n_k(self) -> int:
        return int(self.visible.shape[1])

    def counts(self) -> dict[str, int]:
        """How many tiles were computed whole, computed with a mask, and skipped."""
        return {name: int((self.status == value).sum())
                for name, value in (("computed", TILE_COMPUTED), ("masked", TILE_MASKED),
                                    ("skipped", TILE_SKIPPED))}

    def visited(self, query_block: int) -> list[int]:
        """Key blocks the program of ``query_block`` visited, in loop order (ascending)."""
        if not 0 <= query_block < self.status.shape[0]:
            raise ValueError(f"query_block must be in [0, {self.status.shape[0]}), got {query_block}")
        return [int(j) for j in np.flatnonzero(self.status[query_block])]


def _mask_label(causal: bool, window, seq_len) -> str:
    parts = (["causal"] if causal else []) + ([f"window {tuple(window)}"] if window is not None else [])
    parts += [f"seq_len {seq_len}"] if seq_len is not None else []
    return ", ".join(parts) or "no mask"


def record_attention_tiles(n_q: int, n_k: int, *, block_m: int, block_n: int, causal: bool = False,
                           window=None, seq_len: int | None = None, head_dim: int = 16,
                           label: str | None = None) -> AttentionTiles:
    """Run flashlib's forward kernel on one random head and return the tiles it visited.

    The record is the kernel's own (``launch_attention_forward(tiles=...)``), not a
    model of it: the picture shows what the code does. ``seq_len`` pads the sample
    (keys and queries from ``seq_len`` on are padding).
    """
    import torch

    from . import runtime
    from .kernels.attention_fwd import launch_attention_forward
    from .reference import attention_mask
    from .spec import AttentionSpec

    _check_positive(n_q=n_q, n_k=n_k, block_m=block_m, block_n=block_n, head_dim=head_dim)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, n_q, head_dim, generator=gen).to(runtime.DEVICE)
    k, v = (torch.randn(1, 1, n_k, head_dim, generator=gen).to(runtime.DEVICE) for _ in range(2))
    out = torch.empty_like(q)
    lse = torch.empty(1, 1, n_q, device=runtime.DEVICE)
    tiles = torch.zeros(1, ceil_div(n_q, block_m), ceil_div(n_k, block_n), dtype=torch.int8, device=runtime.DEVICE)
    lens = None if seq_len is None else torch.tensor([seq_len], dtype=torch.int32)
    launch_attention_forward(q, k, v, out, lse, AttentionSpec(causal=causal, window=window),
                             block_m=block_m, block_n=block_n,
                             seq_lens=None if lens is None else lens.to(runtime.DEVICE), tiles=tiles)
    visible = attention_mask(n_q, n_k, causal=causal, window=window, seq_lens=lens)[0, 0].numpy()
    if seq_len is not None:  # padding queries see nothing
        visible = visible & (np.arange(n_q) < seq_len)[:, None]
    return AttentionTiles(tiles[0].cpu().numpy().astype(int), visible, block_m, block_n,
                          _mask_label(causal, window, seq_len) if label is None else label)


def _draw_attention_panel(ax, t: AttentionTiles, program: int | None) -> None:
    from matplotlib.patches import Rectangle

    rows, cols = t.status.shape
    for (i, j), state in np.ndenumerate(t.status):
        x, y = j * t.block_n, i * t.block_m
        w, h = min(t.block_n, t.n_k - x), min(t.block_m, t.n_q - y)
        ax.add_patch(Rectangle((x, y), w, h, fc=ATTENTION_TILE_COLOURS[int(state)], ec="none", zorder=0.5))
    # Grey the hidden scores of the tiles that were loaded (a skipped tile hides all of its scores).
    loaded = np.repeat(np.repeat(t.status != TILE_SKIPPED, t.block_m, 0), t.block_n, 1)[:t.n_q, :t.n_k]
    hidden = np.zeros(t.visible.shape + (4,))
    hidden[~t.visible & loaded] = HIDDEN_COLOUR
    ax.imshow(hidden, extent=(0, t.n_k, t.n_q, 0), interpolation="nearest", zorder=1)
    _draw_grid(ax, rows, cols, t.n_q, t.n_k, t.block_m, t.block_n, "")
    ax.set_aspect("auto")
    if program is not None:
        for step, j in enumerate(t.visited(program)):
            ax.text(j * t.block_n + min(t.block_n, t.n_k - j * t.block_n) / 2,
                    program * t.block_m + min(t.block_m, t.n_q - program * t.block_m) / 2, str(step),
                    ha="center", va="center", fontsize=8, color="white", fontweight="bold", zorder=5)
        ax.add_patch(Rectangle((0, program * t.block_m), cols * t.block_n, t.block_m, fill=False,
                               ec=OWN_COLOUR, lw=2.5, zorder=6))
    ticks_n = range(0, cols * t.block_n + 1, t.block_n) if cols <= 16 else []
    ticks_m = range(0, rows * t.block_m + 1, t.block_m) if rows <= 16 else []
    ax.set_xticks(list(ticks_n))
    ax.set_yticks(list(ticks_m))
    ax.tick_params(labelsize=7)
    ax.set_xlabel(f"key j  (BLOCK_N = {t.block_n})")
    ax.set_ylabel(f"query i  (BLOCK_M = {t.block_m})")
    c = t.counts()
    ax.set_title(f"{t.label}: {c['computed']} computed, {c['masked']} masked,\n"
                 f"{c['skipped']} skipped of {t.status.size} tiles", fontsize=10)


def plot_attention_tiles(*maps: AttentionTiles, program: int | None = None):
    """Figure: one panel per map, the score matrix cut into BLOCK_M x BLOCK_N tiles.

    Tiles are coloured by what the kernel did (blue: computed whole, orange: computed
    with an element mask, white: skipped, never loaded); inside loaded tiles the
    scores the mask hides are greyed; hatching marks padding past N. With ``program``, the row of tiles
    of that query block's program is outlined and its key blocks numbered in loop order.
    """
    from matplotlib.patches import Patch

    if not maps or not all(isinstance(m, AttentionTiles) for m in maps):
        raise TypeError(f"expected one or more AttentionTiles (from record_attention_tiles), got {maps!r:.80}")
    width = 4.6 * len(maps)
    fig = _figure(figsize=(width, 4.9), layout="constrained")
    axes = fig.subplots(1, len(maps), squeeze=False)[0]
    for ax, t in zip(axes, maps):
        _draw_attention_panel(ax, t, program)
    handles = [Patch(fc=ATTENTION_TILE_COLOURS[TILE_COMPUTED], label="computed, no mask"),
               Patch(fc=ATTENTION_TILE_COLOURS[TILE_MASKED], label="computed with an element mask"),
               Patch(fc="white", ec="grey", label="skipped: never loaded"),
               Patch(fc=HIDDEN_COLOUR, label="hidden scores in a loaded tile")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4 if len(maps) > 1 else 2, fontsize=8,
               frameon=False)
    return fig
