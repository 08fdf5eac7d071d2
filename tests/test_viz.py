"""flashlib.viz: the figures show what the notebooks say they show, and the widget reacts."""
import math

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

from flashlib import viz


def _lines_by_label(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_format_bytes_uses_binary_units():
    assert viz.format_bytes(0) == "0 B"
    assert viz.format_bytes(1023) == "1023 B"
    assert viz.format_bytes(1536) == "1.5 KiB"
    assert viz.format_bytes(3 * 2**30) == "3.0 GiB"
    assert viz.format_bytes(2**50) == "1.0 PiB"
    assert viz.format_bytes(2**60) == "1024.0 PiB"


def test_plots_are_closed_for_pyplot_so_they_show_once():
    before = set(plt.get_fignums())
    fig = viz.plot_memory_vs_seq_len([64, 128], [1e4, 4e4], [2e4, 8e4])
    viz.plot_time_vs_seq_len([64, 128], [1.0, 3.0])
    viz.plot_dot_product_variance([4, 8], [4.1, 7.9], [1.0, 1.0])
    viz.plot_softmax_saturation(8)
    assert isinstance(fig, matplotlib.figure.Figure)
    assert set(plt.get_fignums()) == before


def test_memory_plot_draws_prediction_line_and_measured_points_on_log_log_axes():
    ns, predicted, measured, qkvo = [64, 128, 256], [1e4, 4e4, 1.6e5], [1.5e4, 6e4, 2.4e5], [8e3, 1.6e4, 3.2e4]
    fig = viz.plot_memory_vs_seq_len(ns, predicted, measured, qkvo=qkvo)
    (ax,) = fig.axes
    lines = _lines_by_label(ax)
    pred = lines["predicted: S + P + O"]
    meas = lines["measured peak"]
    assert list(pred.get_xdata()) == ns and list(pred.get_ydata()) == predicted
    assert pred.get_linestyle() == "-" and pred.get_marker() in ("None", "", None)
    assert list(meas.get_ydata()) == measured and meas.get_linestyle() == "None"
    assert meas.get_marker() == "o"
    assert list(lines["Q, K, V, O alone: O(N·d)"].get_ydata()) == qkvo
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "sequence length N" and ax.get_ylabel() == "bytes"
    assert "N²" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(lines)
    # the y ticks are written in bytes
    assert ax.yaxis.get_major_formatter()(2**20, 0) == "1.0 MiB"


def test_memory_plot_without_qkvo_has_two_lines_and_a_custom_label():
    fig = viz.plot_memory_vs_seq_len([64, 128], [1, 4], [2, 8], predicted_label="model")
    assert set(_lines_by_label(fig.axes[0])) == {"model", "measured peak"}


@pytest.mark.parametrize("kwargs, name", [
    (dict(ns=[64, 128], predicted=[1, 4], measured=[2]), "measured"),
    (dict(ns=[64, 128], predicted=[1], measured=[2, 8]), "predicted"),
    (dict(ns=[64, 128], predicted=[1, 4], measured=[2, 8], qkvo=[1, 2, 3]), "qkvo"),
])
def test_memory_plot_names_the_sequence_of_the_wrong_length(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must have one value per entry of ns \(2 values\)"):
        viz.plot_memory_vs_seq_len(**kwargs)


def test_plots_refuse_empty_input():
    with pytest.raises(ValueError, match="ns is empty"):
        viz.plot_time_vs_seq_len([], [])


def test_time_plot_guide_is_quadratic_through_the_last_point():
    ns, times = [64, 128, 256, 512], [0.1, 0.2, 0.5, 1.6]
    fig = viz.plot_time_vs_seq_len(ns, times, label="mine")
    (ax,) = fig.axes
    lines = _lines_by_label(ax)
    assert list(lines["mine"].get_ydata()) == times
    guide = lines["∝ N² (guide)"].get_ydata()
    assert guide[-1] == pytest.approx(1.6)
    assert guide[0] == pytest.approx(1.6 / 64)  # (64 / 512)^2 of the last point
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_ylabel() == "time (ms)"


def test_variance_plot_shows_measurements_against_the_theory():
    ds, unscaled, scaled = [4, 16, 64], [4.2, 15.5, 66.0], [1.05, 0.97, 1.03]
    fig = viz.plot_dot_product_variance(ds, unscaled, scaled)
    (ax,) = fig.axes
    lines = _lines_by_label(ax)
    assert list(lines["theory: Var(q·k) = d"].get_ydata()) == ds
    assert list(lines["theory: Var(q·k/√d) = 1"].get_ydata()) == [1.0, 1.0, 1.0]
    assert list(lines["measured Var(q·k)"].get_ydata()) == unscaled
    assert list(lines["measured Var(q·k/√d)"].get_ydata()) == scaled
    assert ax.get_xlabel() == "head dimension d"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "16", "64"]


def test_softmax_saturation_rows_are_distributions_and_deterministic():
    stats = viz.softmax_saturation(32, scaled=True, n_queries=5, n_keys=7, seed=3)
    assert stats.probs.shape == (5, 7) and stats.entropy.shape == (5,)
    assert torch.allclose(stats.probs.sum(dim=-1), torch.ones(5, dtype=torch.float64))
    again = viz.softmax_saturation(32, scaled=True, n_queries=5, n_keys=7, seed=3)
    assert torch.equal(stats.probs, again.probs)
    other = viz.softmax_saturation(32, scaled=True, n_queries=5, n_keys=7, seed=4)
    assert not torch.equal(stats.probs, other.probs)


def test_entropy_matches_its_definition():
    stats = viz.softmax_saturation(16, scaled=False, n_queries=4, n_keys=9, seed=1)
    p = stats.probs
    assert torch.allclose(stats.entropy, -(p * p.log()).sum(dim=-1))


def test_unscaled_logits_saturate_and_the_scale_prevents_it():
    n_keys = 64
    scaled = viz.softmax_saturation(1024, scaled=True, n_keys=n_keys)
    unscaled = viz.softmax_saturation(1024, scaled=False, n_keys=n_keys)
    assert scaled.logit_std == pytest.approx(1.0, rel=0.1)
    assert unscaled.logit_std == pytest.approx(math.sqrt(1024), rel=0.1)
    assert scaled.entropy.mean() > 0.8 * math.log(n_keys)   # close to uniform
    assert unscaled.entropy.mean() < 0.1 * math.log(n_keys)  # close to one-hot
    assert unscaled.max_prob > 0.9 > 0.2 > scaled.max_prob
    assert unscaled.grad_norm < 0.5 * scaled.grad_norm      # the gradient vanishes
    # with the scale, d hardly matters
    small = viz.softmax_saturation(8, scaled=True, n_keys=n_keys)
    assert small.entropy.mean().item() == pytest.approx(scaled.entropy.mean().item(), rel=0.1)


def test_softmax_saturation_rejects_a_bad_head_dim():
    with pytest.raises(ValueError, match="head_dim must be a positive integer; got 0"):
        viz.softmax_saturation(0)


def test_saturation_figure_has_heat_map_and_one_entropy_bar_per_query():
    fig = viz.plot_softmax_saturation(64, scaled=False, n_queries=6, n_keys=10, seed=2)
    ax_p, ax_h = fig.axes[:2]  # the third axes is the colour bar
    stats = viz.softmax_saturation(64, scaled=False, n_queries=6, n_keys=10, seed=2)
    (image,) = ax_p.get_images()
    assert image.get_array().shape == (6, 10)
    assert torch.allclose(torch.as_tensor(image.get_array()), stats.probs)
    heights = [bar.get_height() for bar in ax_h.patches]
    assert heights == pytest.approx(stats.entropy.tolist())
    assert ax_h.get_lines()[0].get_ydata()[0] == pytest.approx(math.log(10))  # uniform line
    assert "d = 64" in fig._suptitle.get_text() and "unscaled" in fig._suptitle.get_text()


def test_describe_saturation_reports_the_numbers():
    stats = viz.softmax_saturation(256, scaled=False)
    text = viz.describe_saturation(256, False, stats)
    assert text.startswith("d = 256, unscaled: ")
    assert f"logit std {stats.logit_std:.1f}" in text
    assert f"mean row entropy {stats.entropy.mean().item():.2f} nats (uniform: 4.16)" in text


def _explorer_parts(box):
    (controls, readout, out) = box.children
    slider, checkbox = controls.children
    return slider, checkbox, readout, out


def test_explorer_starts_with_the_readout_of_its_initial_state():
    pytest.importorskip("ipywidgets")
    box = viz.softmax_saturation_explorer(head_dim=32, scaled=True)
    slider, checkbox, readout, _ = _explorer_parts(box)
    assert slider.value == 32 and checkbox.value is True
    assert readout.value == viz.describe_saturation(32, True, viz.softmax_saturation(32, True))


def test_explorer_callbacks_update_the_readout():
    pytest.importorskip("ipywidgets")
    box = viz.softmax_saturation_explorer(d_values=(8, 64, 1024), head_dim=64)
    slider, checkbox, readout, _ = _explorer_parts(box)
    slider.value = 1024
    assert readout.value == viz.describe_saturation(1024, True, viz.softmax_saturation(1024, True))
    checkbox.value = False
    assert readout.value == viz.describe_saturation(1024, False, viz.softmax_saturation(1024, False))
    assert "unscaled" in readout.value
    slider.value = 8
    assert readout.value.startswith("d = 8, unscaled")


def test_explorer_replaces_its_picture_instead_of_stacking_them():
    pytest.importorskip("ipywidgets")
    box = viz.softmax_saturation_explorer(d_values=(8, 64), head_dim=8)
    slider, checkbox, _, out = _explorer_parts(box)
    assert len(out.outputs) == 1
    first = out.outputs[0]
    assert first["output_type"] == "display_data"
    assert first["data"]["text/plain"].startswith("<Figure size")
    slider.value = 64
    checkbox.value = False
    assert len(out.outputs) == 1 and out.outputs[0] is not first


def test_explorer_rejects_a_start_value_off_the_slider():
    pytest.importorskip("ipywidgets")
    with pytest.raises(ValueError, match=r"head_dim must be one of d_values \(4, 8\); got 64"):
        viz.softmax_saturation_explorer(d_values=(4, 8), head_dim=64)


def test_roofline_puts_each_point_on_the_roof_and_marks_the_ridge():
    before = set(plt.get_fignums())
    fig = viz.plot_roofline({"decode": 1.0, "prefill": 2048.0}, peak_tflops=1000.0, hbm_gb_per_s=4000.0, title="t")
    assert set(plt.get_fignums()) == before
    (ax,) = fig.axes
    lines = _lines_by_label(ax)
    decode, prefill = lines["decode: 1 FLOP/byte"], lines["prefill: 2048 FLOP/byte"]
    assert list(decode.get_xdata()) == [1.0] and list(decode.get_ydata()) == [pytest.approx(4.0)]  # 1 · 4 TB/s
    assert list(prefill.get_ydata()) == [1000.0]                                                    # the flat roof
    assert list(lines["ridge point: 250 FLOP/byte"].get_xdata()) == [250.0, 250.0]
    roof = lines["roofline"]
    assert max(roof.get_ydata()) == 1000.0 and min(roof.get_xdata()) <= 0.5
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and ax.get_title() == "t"


@pytest.mark.parametrize("points, words", [
    ({}, "points is empty"),
    ({"x": 0.0}, r"points\['x'\] must be a positive intensity"),
])
def test_roofline_refuses_bad_points(points, words):
    with pytest.raises(ValueError, match=words):
        viz.plot_roofline(points, 1.0, 1.0)


def test_block_table_figure_colours_owned_pages_and_draws_one_arrow_per_used_page():
    from matplotlib.patches import FancyArrowPatch

    table = torch.tensor([[3, 0, -1], [1, 4, 2]], dtype=torch.int32)
    fig = viz.plot_block_table(table, [5, 9], page_size=4, num_pages=6)
    (ax,) = fig.axes
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(arrows) == 2 + 3  # ceil(5 / 4) + ceil(9 / 4) used pages
    texts = [t.get_text() for t in ax.texts]
    assert "0..3\n→ page 3" in texts and "4..4\n→ page 0" in texts and "8..8\n→ page 2" in texts
    assert [str(p) for p in range(6)] == [t for t in texts if t.isdigit()]
    dashed = [p for p in ax.patches if not isinstance(p, FancyArrowPatch) and p.get_linestyle() == "--"]
    assert len(dashed) == 1  # page 5 is the only free one


@pytest.mark.parametrize("table, lens, words", [
    ([[0, 1]], [9], "sequence 0 has 9 tokens, 3 pages of 4, but its row of block_table has 2 entries"),
    ([[0, 7]], [8], r"block_table\[0, 1\] = 7 is not a page of the pool \(0 to 5\)"),
    ([[0, 1]], [4, 4], "seq_lens must have one value per entry of block_table"),
])
def test_block_table_figure_names_what_is_wrong(table, lens, words):
    with pytest.raises(ValueError, match=words):
        viz.plot_block_table(table, lens, page_size=4, num_pages=6)


# --- across devices (notebook 10) -------------------------------------------------------

def test_memory_lines_draw_each_series_and_the_limit_with_token_ticks():
    before = set(plt.get_fignums())
    ns = [4096, 65536, 2 ** 20]
    fig = viz.plot_memory_lines(ns, {"kv": [1.0, 16.0, 256.0], "act": [2.0, 32.0, 512.0]}, {"one GPU": 80.0},
                                title="t")
    assert set(plt.get_fignums()) == before
    (ax,) = fig.axes
    lines = _lines_by_label(ax)
    assert list(lines["kv"].get_ydata()) == [1.0, 16.0, 256.0] and list(lines["act"].get_xdata()) == ns
    assert list(lines["one GPU"].get_ydata()) == [80.0, 80.0] and lines["one GPU"].get_linestyle() == "--"
    assert [ax.xaxis.get_major_formatter()(n, 0) for n in (512, 4096, 2 ** 20)] == ["512", "4k", "1M"]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and ax.get_title() == "t"
    with pytest.raises(ValueError, match="series is empty"):
        viz.plot_memory_lines(ns, {})
    with pytest.raises(ValueError, match="kv must have one value per entry of ns"):
        viz.plot_memory_lines(ns, {"kv": [1.0]})


def test_ring_step_kinds_follow_step_work():
    contiguous = viz.ring_step_kinds(4, causal=True, scheme="contiguous")
    assert contiguous[2] == [(2, "diagonal"), (1, "full"), (0, "full"), (3, "skip")]
    assert [kind for _, kind in contiguous[0]] == ["diagonal", "skip", "skip", "skip"]
    zigzag = viz.ring_step_kinds(4, causal=True, scheme="zigzag")
    assert all(row[0][1] == "diagonal" and all(kind == "half" for _, kind in row[1:]) for row in zigzag)
    assert [source for source, _ in zigzag[1]] == [1, 0, 3, 2]
    assert all(kind == "full" for row in viz.ring_step_kinds(3, causal=False) for _, kind in row)


def test_ring_schedule_names_each_shard_and_its_work():
    fig = viz.plot_ring_schedule(4, causal=True)
    contiguous, zigzag = fig.axes[:2]
    texts = [t.get_text() for t in contiguous.texts]
    assert texts[:4] == ["K/V 0\ndiagonal", "K/V 3\nskipped", "K/V 2\nskipped", "K/V 1\nskipped"]
    assert "busiest rank 3.5 blocks" in contiguous.get_title() and "busiest rank 2 blocks" in zigzag.get_title()
    assert contiguous.get_images()[0].get_array().tolist()[3] == [0.5, 1.0, 1.0, 1.0]
    assert len(viz.plot_ring_schedule(2, schemes=("zigzag",)).axes) == 2  # one panel and its colour bar


def test_work_per_rank_stacks_the_steps_and_marks_the_mean():
    fig = viz.plot_work_per_rank(4)
    for ax, totals in zip(fig.axes, ([0.5, 1.5, 2.5, 3.5], [2.0, 2.0, 2.0, 2.0])):
        tops = [0.0] * 4
        for bar in ax.patches:
            rank = round(bar.get_x() + bar.get_width() / 2)
            tops[rank] = max(tops[rank], bar.get_y() + bar.get_height())
        assert tops == totals
        assert list(_lines_by_label(ax)["mean: 2"].get_ydata()) == [2.0, 2.0]
    assert "busiest rank 3.5" in fig.axes[0].get_title() and "busiest rank 2" in fig.axes[1].get_title()


def test_ring_timeline_waits_only_for_transfers_longer_than_the_compute():
    assert viz.ring_timeline(3.0, 1.0, 3) == [(0.0, 3.0, 1.0), (3.0, 6.0, 4.0), (6.0, 9.0, 6.0)]
    assert viz.ring_timeline(1.0, 3.0, 3) == [(0.0, 1.0, 3.0), (3.0, 4.0, 6.0), (6.0, 7.0, 6.0)]
    assert viz.ring_timeline(2.0, 5.0, 1) == [(0.0, 2.0, 0.0)]  # a world of one sends nothing
    with pytest.raises(ValueError, match="must be >= 0"):
        viz.ring_timeline(-1.0, 1.0, 2)


def test_ring_timeline_figure_hatches_the_waits():
    fig = viz.plot_ring_timeline({"fast link": (3.0, 1.0), "slow link": (1.0, 3.0)}, world_size=4)
    fast, slow = fig.axes
    assert not any(p.get_hatch() for p in fast.patches) and "the transfers hide behind the compute" in fast.get_title()
    assert sum(1 for p in slow.patches if p.get_hatch()) == 3
    assert slow.get_title() == "slow link: 10 µs for 4 steps; the compute waits 6 µs (60%)"
    assert fast.get_title().startswith("fast link: 12 µs for 4 steps")
    with pytest.raises(ValueError, match="panels is empty"):
        viz.plot_ring_timeline({}, 2)


def test_overlap_condition_draws_compute_transfers_and_where_they_cross():
    fig = viz.plot_overlap_condition([256, 1024], [1.0, 16.0], {"NVLink": [2.0, 8.0]}, {"NVLink": 512.0})
    (ax,) = fig.axes
    lines = _lines_by_label(ax)
    assert list(lines["compute (attention of one block)"].get_ydata()) == [1.0, 16.0]
    assert list(lines["transfer over NVLink"].get_ydata()) == [2.0, 8.0]
    assert list(lines["NVLink: hides from N/W ≈ 512"].get_xdata()) == [512.0, 512.0]
    assert ax.xaxis.get_major_formatter()(1024, 0) == "1k"
    with pytest.raises(ValueError, match="NVLink must have one value per entry of shard_lens"):
        viz.plot_overlap_condition([256, 1024], [1.0, 16.0], {"NVLink": [2.0]})
