"""flashlib.tiles: the tile maps must be the kernel's own, and the pictures must draw them."""
import dataclasses
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashlib import runtime
from flashlib.kernels.matmul import matmul_kernel
from flashlib.tiles import (MatmulTiling, matmul_tile_widget, plot_matmul_tiles, plot_program_order,
                            plot_vector_blocks)


def kernel_program_order(tiling: MatmulTiling) -> np.ndarray:
    """Which program writes each tile of C, observed by launching the real kernel on growing grids.

    Launching only programs 0..p-1 writes exactly the tiles of those programs;
    the tile that appears when the grid grows from p to p+1 is program p's.
    """
    t = tiling
    a = torch.ones(t.m, t.k, device=runtime.DEVICE)
    b = torch.ones(t.k, t.n, device=runtime.DEVICE)
    order = np.full((t.num_pid_m, t.num_pid_n), -1)
    for p in range(1, t.num_programs + 1):
        c = torch.zeros(t.m, t.n, device=runtime.DEVICE)
        matmul_kernel[(p,)](a, b, c, t.m, t.n, t.k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            c.stride(0), c.stride(1), BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                            BLOCK_K=t.block_k, GROUP_M=t.group_m)
        written = c.cpu().numpy() != 0
        for r in range(t.num_pid_m):
            for col in range(t.num_pid_n):
                tile = written[r * t.block_m:(r + 1) * t.block_m, col * t.block_n:(col + 1) * t.block_n]
                if tile.all() and order[r, col] < 0:
                    order[r, col] = p - 1
    return order


@pytest.mark.parametrize("tiling", [
    MatmulTiling(80, 64, 16, 16, 16, 16, group_m=2),   # 5 x 4 tiles, last group has one row
    MatmulTiling(48, 40, 16, 16, 16, 16, group_m=8),   # group taller than the grid; N tail
    MatmulTiling(64, 48, 16, 16, 16, 16, group_m=1),   # row-major
])
def test_program_order_is_the_kernels(tiling):
    assert (tiling.order() == kernel_program_order(tiling)).all()


def test_group_of_one_is_row_major_and_tall_group_is_column_major():
    t = MatmulTiling(64, 96, 32, 16, 16, 16, group_m=1)
    assert (t.order() == np.arange(24).reshape(4, 6)).all()
    tall = dataclasses.replace(t, group_m=4)
    assert (tall.order() == np.arange(24).reshape(6, 4).T).all()


def test_known_grouped_order():
    # The picture of Triton's matmul tutorial: 9 x 9 tiles, GROUP_M=3; programs 0..8 fill a 3 x 3 block.
    t = MatmulTiling(9 * 16, 9 * 16, 16, 16, 16, 16, group_m=3)
    assert (t.order()[:3, :3] == np.array([[0, 3, 6], [1, 4, 7], [2, 5, 8]])).all()
    assert t.blocks_touched(9) == (3, 3)
    assert dataclasses.replace(t, group_m=1).blocks_touched(9) == (1, 9)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 300), bm=st.sampled_from([16, 32, 64]),
       bn=st.sampled_from([16, 32, 64]), group_m=st.integers(1, 9))
def test_every_tile_is_computed_by_exactly_one_program(m, n, bm, bn, group_m):
    t = MatmulTiling(m, n, 32, bm, bn, 32, group_m)
    order = t.order()
    assert order.shape == (-(-m // bm), -(-n // bn))
    assert sorted(order.ravel()) == list(range(t.num_programs))


def test_tiles_read_walk_one_row_of_a_and_one_column_of_b():
    t = MatmulTiling(100, 70, 90, 32, 32, 32, group_m=2)
    assert t.num_k_steps == 3
    pid_m, pid_n = t.tile_of(5)
    reads = t.tiles_read(5)
    assert reads["a"] == [(pid_m, 0), (pid_m, 1), (pid_m, 2)]
    assert reads["b"] == [(0, pid_n), (1, pid_n), (2, pid_n)]


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="block_m"):
        MatmulTiling(64, 64, 64, 0, 16, 16)
    with pytest.raises(TypeError, match="k must be a positive int"):
        MatmulTiling(64, 64, 6.5, 16, 16, 16)
    t = MatmulTiling(64, 64, 64, 32, 32, 32)
    with pytest.raises(ValueError, match=r"pid must be an int in \[0, 4\)"):
        t.tile_of(4)
    with pytest.raises(ValueError, match="pid"):
        plot_matmul_tiles(t, -1)


def _texts(fig):
    return [text.get_text() for ax in fig.axes for text in ax.texts]


def test_tile_picture_marks_the_programs_tile_and_its_reads():
    t = MatmulTiling(176, 144, 80, 32, 32, 32, group_m=4)
    fig = plot_matmul_tiles(t, 7)
    ax_b, ax_a, ax_c = fig.axes[0], fig.axes[1], fig.axes[2]
    assert ax_a.get_title().startswith("A  (176 x 80)") and ax_b.get_title().startswith("B  (80 x 144)")
    # one label per k-step in A and in B, and every program id once in C
    assert [x.get_text() for x in ax_a.texts] == ["k0", "k1", "k2"]
    assert [x.get_text() for x in ax_b.texts] == ["k0", "k1", "k2"]
    assert sorted(int(x.get_text()) for x in ax_c.texts) == list(range(t.num_programs))
    assert "tile C[3, 1]" in " ".join(_texts(fig))  # program 7 with GROUP_M=4 (see the order)
    assert t.tile_of(7) == (3, 1)


def test_program_order_picture_counts_panels():
    t = MatmulTiling(256, 256, 64, 32, 32, 32)
    fig = plot_program_order(t, group_ms=(1, 4), wave=16)
    titles = [ax.get_title() for ax in fig.axes]
    assert "2 A + 8 B panels = 10" in titles[0]
    assert "4 A + 4 B panels = 8" in titles[1]


def test_vector_picture_shows_the_mask_of_the_last_program():
    texts = _texts(plot_vector_blocks(10, 4))
    assert "program 2\nmask: 2/4 lanes on" in texts
    assert [str(i) for i in range(12)] == [x for x in texts if x.isdigit()]


def test_widget_slider_covers_all_programs_and_redraws(capsys):
    pytest.importorskip("ipywidgets", reason="ipywidgets is part of the lab extra")
    t = MatmulTiling(96, 64, 32, 32, 32, 32, group_m=2)
    box = matmul_tile_widget(t)
    slider, dropdown = box.children[0].children
    assert (slider.min, slider.max) == (0, t.num_programs - 1)
    assert 2 in dropdown.options and dropdown.value == 2
    slider.value = 5
    dropdown.value = 1
    # Outside a Jupyter kernel display() prints the figure: one per drawing. As "Figure(900x1140)" or, once another
    # test in the same process has made an IPython shell (pytest-xdist runs notebooks beside it), as its repr.
    assert len(re.findall(r"Figure\(\d+x\d+\)|<Figure size \d+x\d+ with", capsys.readouterr().out)) == 3
