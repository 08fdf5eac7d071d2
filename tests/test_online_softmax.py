"""flashlib.online_softmax: blockwise attention equals the full softmax, -inf safe, merges exactly."""
import math

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashlib.online_softmax import (
    Partial, blockwise_attention, blockwise_states, finalize, initial_state, merge_partials,
    online_softmax_step, online_softmax_stepper, plot_stepper_frame, trace_online_softmax,
)
from flashlib.reference import attention_mask, naive_attention, stable_softmax
from flashlib.validation import relative_error


def qkv(shape_q, n_k, seed=0, dtype=torch.float64, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    *lead, n_q, d = shape_q
    q = torch.randn(*lead, n_q, d, generator=gen, dtype=torch.float64) * scale
    k = torch.randn(*lead, n_k, d, generator=gen, dtype=torch.float64) * scale
    v = torch.randn(*lead, n_k, d, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 40), n_k=st.integers(1, 40), block_n=st.integers(1, 17),
       d=st.sampled_from([1, 4, 16]), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_blockwise_attention_equals_naive_attention(n_q, n_k, block_n, d, causal, seed):
    q, k, v = qkv((2, 2, n_q, d), n_k, seed)
    ref, lse = naive_attention(q, k, v, causal=causal, return_lse=True)
    partial = blockwise_attention(q, k, v, block_n, causal, return_partial=True)
    assert relative_error(partial.o, ref) < 1e-12
    assert torch.equal(torch.isneginf(partial.lse), torch.isneginf(lse))
    finite = torch.isfinite(lse)
    if finite.any():
        assert (partial.lse[finite] - lse[finite]).abs().max().item() < 1e-12


def test_result_does_not_depend_on_block_size():
    q, k, v = qkv((3, 24, 8), 50, seed=1)
    outs = [blockwise_attention(q, k, v, block_n) for block_n in (1, 7, 16, 50, 64)]
    for out in outs[1:]:
        assert relative_error(out, outs[0]) < 1e-13


def test_fully_masked_rows_give_zero_and_no_nan():
    # causal with more queries than keys, bottom-right aligned: the first rows see no key
    q, k, v = qkv((1, 1, 10, 8), 4, seed=2)
    partial = blockwise_attention(q, k, v, 2, causal=True, return_partial=True)
    assert not torch.isnan(partial.o).any()
    assert torch.equal(partial.o[0, 0, :6], torch.zeros(6, 8, dtype=torch.float64))
    assert torch.isneginf(partial.m[0, 0, :6]).all() and (partial.l[0, 0, :6] == 0).all()
    assert torch.isneginf(partial.lse[0, 0, :6]).all()
    assert relative_error(partial.o, naive_attention(q, k, v, causal=True)) < 1e-13


def test_mask_argument_matches_padding_reference():
    q, k, v = qkv((2, 2, 12, 8), 12, seed=3)
    seq_lens = torch.tensor([12, 5])
    allowed = attention_mask(12, 12, seq_lens=seq_lens, batch=2)  # (B, 1, N, N)
    out = blockwise_attention(q, k, v, 4, mask=allowed)
    ref = stable_softmax((q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~allowed, float("-inf"))) @ v
    assert relative_error(out, ref) < 1e-13


def test_large_logits_do_not_overflow():
    q, k, v = qkv((1, 1, 16, 8), 32, seed=4, scale=40.0)  # scores in the thousands
    out = blockwise_attention(q, k, v, 8, causal=True)
    assert torch.isfinite(out).all()
    assert relative_error(out, naive_attention(q, k, v, causal=True)) < 1e-12


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 5e-3)])
def test_lower_precision_keeps_dtype_and_accuracy(dtype, tol):
    q, k, v = qkv((1, 2, 32, 16), 48, seed=5, dtype=dtype)
    out = blockwise_attention(q, k, v, 16, causal=True)
    assert out.dtype == dtype
    assert relative_error(out, naive_attention(q.double(), k.double(), v.double(), causal=True)) < tol


def test_step_from_empty_state_with_masked_block_stays_empty():
    m, l, acc = initial_state((3,), 4)
    scores = torch.tensor([[float("-inf")] * 5, [0.5, float("-inf"), 2.0, 1.0, -1.0],
                           [float("-inf")] * 5], dtype=torch.float64)
    v = torch.randn(5, 4, dtype=torch.float64)
    m, l, acc = online_softmax_step(m, l, acc, scores, v)
    assert not (torch.isnan(m).any() or torch.isnan(l).any() or torch.isnan(acc).any())
    assert torch.isneginf(m[[0, 2]]).all() and (l[[0, 2]] == 0).all() and (acc[[0, 2]] == 0).all()
    assert m[1].item() == 2.0
    p = torch.exp(scores[1] - 2.0)
    assert abs(l[1].item() - p.sum().item()) < 1e-15
    assert torch.allclose(acc[1], p @ v, rtol=0, atol=1e-15)


def test_masked_block_after_real_keys_leaves_state_unchanged():
    gen = torch.Generator().manual_seed(6)
    m, l, acc = initial_state((4,), 3)
    m, l, acc = online_softmax_step(m, l, acc, torch.randn(4, 6, generator=gen, dtype=torch.float64),
                                    torch.randn(6, 3, generator=gen, dtype=torch.float64))
    masked = torch.full((4, 6), float("-inf"), dtype=torch.float64)
    m2, l2, acc2 = online_softmax_step(m, l, acc, masked, torch.randn(6, 3, generator=gen, dtype=torch.float64))
    assert torch.equal(m2, m) and torch.equal(l2, l) and torch.equal(acc2, acc)


def test_rescale_when_max_grows():
    # one key at 0, then one at 3: after the second block l = exp(0 - 3) + 1, acc likewise
    m, l, acc = initial_state((1,), 1)
    m, l, acc = online_softmax_step(m, l, acc, torch.tensor([[0.0]], dtype=torch.float64),
                                    torch.tensor([[10.0]], dtype=torch.float64))
    m, l, acc = online_softmax_step(m, l, acc, torch.tensor([[3.0]], dtype=torch.float64),
                                    torch.tensor([[20.0]], dtype=torch.float64))
    assert m.item() == 3.0
    assert l.item() == pytest.approx(math.exp(-3) + 1, rel=1e-15)
    assert acc.item() == pytest.approx(10 * math.exp(-3) + 20, rel=1e-15)
    weights = torch.softmax(torch.tensor([0.0, 3.0], dtype=torch.float64), dim=0)
    expected = (weights @ torch.tensor([10.0, 20.0], dtype=torch.float64)).item()
    assert finalize(m, l, acc).o.item() == pytest.approx(expected, rel=1e-15)


@settings(max_examples=30, deadline=None)
@given(n_k=st.integers(2, 40), split=st.floats(0.0, 1.0), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_merge_of_two_key_halves_is_exact(n_k, split, causal, seed):
    q, k, v = qkv((2, 9, 8), n_k, seed, scale=3.0)
    cut = int(split * n_k)
    visible = attention_mask(9, n_k, causal=causal)[0, 0]
    a = blockwise_attention(q, k[..., :cut, :], v[..., :cut, :], 4, mask=visible[:, :cut], return_partial=True)
    b = blockwise_attention(q, k[..., cut:, :], v[..., cut:, :], 4, mask=visible[:, cut:], return_partial=True)
    merged = merge_partials(a, b)
    full = blockwise_attention(q, k, v, 4, causal, return_partial=True)
    assert relative_error(merged.o, full.o) < 1e-12
    assert torch.equal(torch.isneginf(merged.m), torch.isneginf(full.m))
    finite = torch.isfinite(full.lse)
    if finite.any():
        assert (merged.lse[finite] - full.lse[finite]).abs().max().item() < 1e-12
    swapped = merge_partials(b, a)
    assert relative_error(swapped.o, merged.o) < 1e-14


def test_merge_is_associative_and_empty_partial_is_identity():
    q, k, v = qkv((5, 8), 30, seed=7, scale=2.0)
    parts = [blockwise_attention(q, k[i:i + 10], v[i:i + 10], 4, return_partial=True) for i in (0, 10, 20)]
    left = merge_partials(merge_partials(parts[0], parts[1]), parts[2])
    right = merge_partials(parts[0], merge_partials(parts[1], parts[2]))
    assert relative_error(left.o, right.o) < 1e-14
    assert relative_error(left.o, naive_attention(q[None, None], k[None, None], v[None, None])[0, 0]) < 1e-13
    m, l, o = initial_state((5,), 8)
    empty = Partial(m, l, o)
    same = merge_partials(parts[0], empty)
    assert torch.equal(same.m, parts[0].m) and relative_error(same.o, parts[0].o) < 1e-15
    both_empty = merge_partials(empty, empty)
    assert torch.isneginf(both_empty.m).all() and (both_empty.l == 0).all() and (both_empty.o == 0).all()


def test_blockwise_states_yields_one_state_per_block_with_growing_max():
    q, k, v = qkv((6, 8), 21, seed=8)
    states = list(blockwise_states(q, k, v, 5))
    assert [(s.block, s.start, s.stop) for s in states] == [(0, 0, 5), (1, 5, 10), (2, 10, 15), (3, 15, 20), (4, 20, 21)]
    for before, after in zip(states, states[1:]):
        assert (after.m >= before.m).all()


def test_argument_errors_name_the_argument():
    q, k, v = qkv((4, 8), 4)
    with pytest.raises(ValueError, match="Block sizes must be positive"):
        blockwise_attention(q, k, v, 0)
    with pytest.raises(TypeError, match="block_n must be an int"):
        blockwise_attention(q, k, v, 2.0)
    with pytest.raises(ValueError, match="Q, K, V shapes must match"):
        blockwise_attention(q, k[:, :4], v[:, :4], 2)
    with pytest.raises(ValueError, match="k and v shapes must match"):
        blockwise_attention(q, k, v[:3], 2)
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        blockwise_attention(q.long(), k, v, 2)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        blockwise_attention(q, k.tolist(), v, 2)
    with pytest.raises(ValueError, match="Block sizes must be positive"):
        blockwise_states(q, k, v, -1)  # checked at the call, not at the first block


# ---------------------------------------------------------------- the stepper widget

def test_trace_is_exact_over_keys_read_and_converges_at_the_end():
    q, k, v = qkv((8, 16), 48, seed=9, scale=1.5)
    trace = trace_online_softmax(q, k, v, 8, row=2)
    assert trace.n_blocks == 6
    assert (trace.error_vs_seen < 1e-13).all()
    assert trace.error_vs_final[-1] < 1e-13
    assert trace.error_vs_final[0] > 1e-3  # after one block of six the output is not the final one yet
    assert (trace.m[1:] >= trace.m[:-1]).all()


def test_stepper_widget_redraws_when_the_slider_moves(capsys):
    import ipywidgets as widgets

    stepper = online_softmax_stepper(block_n=8, row=3, seed=1)
    assert isinstance(stepper, widgets.VBox)
    assert isinstance(stepper.slider, widgets.IntSlider)
    assert stepper.slider.max == stepper.trace.n_blocks == 8
    assert "block 1 of 8" in stepper.figure._suptitle.get_text()
    stepper.slider.value = 5
    assert "block 5 of 8 (query row 3)" in stepper.figure._suptitle.get_text()
    capsys.readouterr()  # outside a kernel the Output widget prints the figure's repr


def test_stepper_handles_fully_masked_rows_and_rejects_bad_steps():
    q, k, v = qkv((12, 8), 6, seed=10)  # causal, 12 queries over 6 keys: rows 0..5 see nothing
    trace = trace_online_softmax(q, k, v, 2, row=0, causal=True)
    assert torch.isneginf(trace.m[:, 0]).all() and (trace.l[:, 0] == 0).all()
    fig = plot_stepper_frame(trace, trace.n_blocks)
    assert len(fig.axes) == 4  # scores, m, l (twin axis), errors
    with pytest.raises(ValueError, match="step must be in"):
        plot_stepper_frame(trace, 0)
    with pytest.raises(ValueError, match="row must be in"):
        trace_online_softmax(q, k, v, 2, row=12)
