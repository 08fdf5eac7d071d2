"""Softcap, ALiBi and dropout in the attention kernels, forward and backward, against the float64 reference.

Every mask (none, causal, window, causal + window, seq_lens), both 4D layouts and 3D,
N_q != N_k, GQA, and packed sequences. Dropout is checked against a reference that
applies the kernel's own mask (returned by ``return_dropout_mask``), for its gradient
also by finite differences, for its statistics (kept fraction), its reproducibility
under ``torch.manual_seed`` and for p = 0 being exactly the dropout-free kernel.
"""
import warnings

import pytest
import torch

from flashlib import flash_attention, flash_attention_varlen, ops
from flashlib.kernels.dropout import dropout_mask, effective_dropout_p, kept_bytes
from flashlib.reference import dropout_keep_reference, naive_attention
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, MASK_CASES, alibi_slopes, as_bhnd, make_inputs, pin_blocks

MASKS = MASK_CASES


@pytest.fixture(autouse=True)
def fixed_blocks_on_the_gpu(request, monkeypatch):
    """Fixed blocks on a GPU (no autotuning per new shape), except in test_gpu_autotuned_*."""
    if not request.node.name.startswith("test_gpu_autotuned"):
        pin_blocks(monkeypatch, [ops])


slopes = alibi_slopes


def run(q, k, v, do, layout, mask, **modifiers):
    """O, L and the gradients of flash_attention, and the float64 reference's, both (B, H, N, D)."""
    mask = dict(mask)
    if "seq_lens" in mask:
        mask["seq_lens"] = torch.tensor(mask["seq_lens"], dtype=torch.int32, device=DEVICE)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention(*leaves, layout="bhnd" if layout == "3d" else layout, return_lse=True,
                          return_dropout_mask=modifiers.get("dropout_p", 0) > 0, **mask, **modifiers)
    o, lse = out[0], out[1]
    dropout_mask = out[2] if len(out) == 3 else None
    o.backward(do)
    ref_leaves = [as_bhnd(t, layout).detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref_mods = {name: (value.double().cpu() if isinstance(value, torch.Tensor) else value)
                for name, value in modifiers.items()}
    if dropout_mask is not None:  # the kernel's own mask, and the p it really drops with (a multiple of 2^-8)
        ref_mods["dropout_mask"] = dropout_mask.cpu()
        ref_mods["dropout_p"] = effective_dropout_p(modifiers["dropout_p"])
    ref_mask = {name: (value.cpu() if isinstance(value, torch.Tensor) else value) for name, value in mask.items()}
    ref_o, ref_lse = naive_attention(*ref_leaves, return_lse=True, **ref_mask, **ref_mods)
    ref_o.backward(as_bhnd(do, layout).double().cpu())
    ours = [as_bhnd(o, layout), lse if layout != "3d" else lse.unsqueeze(1)] + [as_bhnd(t.grad, layout)
                                                                               for t in leaves]
    theirs = [ref_o, ref_lse] + [t.grad for t in ref_leaves]
    return ours, theirs


def assert_close(ours, theirs, dtype):
    for name, a, b in zip(("O", "L", "dq", "dk", "dv"), ours, theirs):
        if name == "L":
            finite = torch.isfinite(b)
            assert torch.equal(torch.isfinite(a.cpu()), finite), "L is -inf exactly where no key is seen"
            a, b = a.cpu()[finite], b[finite]
        err = relative_error(a, b)
        assert err <= tolerance(dtype), f"{name}: relative error {err:.2e} > {tolerance(dtype):.0e}"


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("modifiers", ["softcap", "alibi (H,)", "alibi (B, H)", "softcap+alibi"])
def test_softcap_and_alibi_match_the_reference_for_every_mask(mask, modifiers):
    q, k, v, do = make_inputs(2, 4, 2, 30, 30, 16, torch.float32, grad_out=True, spread=2.0)
    mods = {}
    if "softcap" in modifiers:
        mods["softcap"] = 1.5  # scores of spread 2 reach |s| ~ 8: tanh saturates, the gradient's factor matters
    if "alibi" in modifiers:
        mods["alibi_slopes"] = slopes("(B, H)" if "(B, H)" in modifiers else "(H,)", 2, 4)
    assert_close(*run(q, k, v, do, "bhnd", MASKS[mask], **mods), torch.float32)


@pytest.mark.parametrize("softcap", [0.3, 50.0, 1e4, 1e8])
def test_a_softcap_of_any_size_keeps_float32s_precision(softcap):
    """tanh(s / softcap) near 0, where a large softcap puts every score, must keep its relative precision:
    1 - 2/(e^2x + 1) alone kept only 6e-8 absolute, and lost 4.6e-4 of the output at softcap 1e4, all of it at
    1e8 (uniform attention). Forward and gradients within 4e-6 of float64 at every size."""
    q, k, v, do = make_inputs(1, 2, 2, 40, 40, 32, torch.float32, grad_out=True, spread=2.0)
    ours, theirs = run(q, k, v, do, "bhnd", dict(causal=True), softcap=softcap)
    for name, a, b in zip(("O", "L", "dq", "dk", "dv"), ours, theirs):
        assert relative_error(a, b) <= 4e-6, f"{name}: relative error {relative_error(a, b):.2e}"


@pytest.mark.parametrize("layout", ["bnhd", "3d"])
@pytest.mark.parametrize("n_q, n_k", [(20, 45), (45, 20)])
def test_modifiers_in_other_layouts_and_lengths(layout, n_q, n_k):
    """Bottom-right alignment of the ALiBi distance with N_q != N_k, read through strides."""
    heads, kv_heads = (2, 2) if layout == "3d" else (4, 1)
    q, k, v, do = make_inputs(2, heads, kv_heads, n_q, n_k, 32, torch.float32, layout=layout, grad_out=True)
    mods = dict(softcap=4.0, alibi_slopes=slopes("(H,)", 2, heads if layout != "3d" else 1))
    assert_close(*run(q, k, v, do, layout, dict(causal=True), **mods), torch.float32)


def test_alibi_slopes_are_not_a_constant_shift():
    """A test that could pass with the bias applied per row only (softmax ignores row constants) is no test:
    the outputs with and without ALiBi must differ."""
    q, k, v = make_inputs(1, 2, 2, 24, 24, 16, torch.float32)
    plain = flash_attention(q, k, v)
    biased = flash_attention(q, k, v, alibi_slopes=torch.tensor([0.5, 0.25], device=DEVICE))
    assert relative_error(biased, plain) > 1e-2


def test_alibi_slopes_of_a_model_cast_to_bfloat16_are_used_in_float32():
    """model.to(torch.bfloat16) casts a slope buffer too; powers of two survive the cast exactly."""
    q, k, v = make_inputs(1, 2, 2, 24, 24, 16, torch.float32)
    as_float = torch.tensor([0.5, 0.0625], device=DEVICE)
    assert torch.equal(flash_attention(q, k, v, alibi_slopes=as_float.bfloat16()),
                       flash_attention(q, k, v, alibi_slopes=as_float))


# ---------------------------------------------------------------- dropout
@pytest.mark.parametrize("mask", ["none", "causal", "window", "seq_lens"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_dropout_matches_the_reference_with_the_kernels_own_mask(mask, layout):
    q, k, v, do = make_inputs(2, 2, 1, 30, 30, 16, torch.float32, layout=layout, grad_out=True)
    torch.manual_seed(1)
    assert_close(*run(q, k, v, do, layout, MASKS[mask], dropout_p=0.3, softcap=3.0), torch.float32)


def test_effective_dropout_p_is_p_rounded_to_eight_bits():
    assert effective_dropout_p(0.25) == 0.25 and effective_dropout_p(0.0) == 0.0
    assert abs(effective_dropout_p(0.1) - 0.1) <= 2 ** -9 and effective_dropout_p(0.1) * 256 == 26
    assert effective_dropout_p(0.9999999) == 1 - 2 ** -8  # never 1: the scale 1 / (1 - p) stays finite


def test_a_dropout_p_that_rounds_to_zero_is_said_so():
    """A model's attention_dropout of 0.0015 once turned dropout off without a word."""
    q, k, v = make_inputs(1, 1, 1, 8, 8, 16, torch.float32)
    with pytest.warns(UserWarning, match=r"dropout_p=0.0015 rounds to 0 .* no attention weight is dropped"):
        out = flash_attention(q, k, v, dropout_p=0.0015)
    assert torch.equal(out, flash_attention(q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flash_attention(q, k, v, dropout_p=2 ** -8)  # the smallest p the kernels draw with: no warning


@pytest.mark.parametrize("seed", [0, 1234, 2 ** 61 + 977])
def test_the_kernels_keep_exactly_the_reference_draw(seed):
    """flashlib.reference.dropout_keep_reference spells the draw out in PyTorch: the kernels' mask is that,
    bit for bit, for every stream, at lengths that end inside a 16 x 16 square, and for both halves of a
    64-bit seed."""
    p = effective_dropout_p(0.3)
    mask = dropout_mask(seed, 0.3, 2, 3, 40, 72, torch.device(DEVICE)).cpu()
    for stream in range(6):
        expected = dropout_keep_reference(seed, stream, 40, 72, p)
        assert torch.equal(mask[stream // 3, stream % 3], expected), f"stream {stream}"
    assert not torch.equal(dropout_mask(seed ^ (1 << 40), 0.3, 1, 1, 40, 72, torch.device(DEVICE)).cpu()[0, 0],
                           mask[0, 0]), "the seed's high half must change the mask"


def test_kept_bytes_marks_exactly_the_bytes_that_reach_the_threshold():
    """The Gluon kernels compare a square's four draws with the keep threshold in three word operations
    (:func:`flashlib.kernels.dropout.kept_bytes`, the source they compile): bit 7 of each byte of the result is that
    byte's compare, for every threshold, every byte value in every position, and random words; a majority that
    forgot thresholds of 128 and more, or a subtraction that borrows across bytes, fails it."""
    values = torch.arange(256, dtype=torch.int64)
    every_byte = values | (values.roll(85) << 8) | (values.roll(170) << 16) | (values.flip(0) << 24)
    words = torch.cat([every_byte, torch.randint(0, 2 ** 32, (4096,), generator=torch.Generator().manual_seed(3))])
    for threshold in range(256):
        marked = kept_bytes(words, threshold)
        for byte in range(4):
            expected = ((words >> (8 * byte)) & 0xFF) >= threshold
            assert torch.equal(((marked >> (8 * byte + 7)) & 1).bool(), expected), (threshold, byte)


def test_the_draw_is_fair_and_has_no_correlation_a_square_could_leave():
    """4096 x 4096 weights of one stream (16.8M draws; one standard deviation of a mean of +-1 values is
    2.4e-4): rates at several p, correlations at the lags a square or a Weyl sequence could couple, the
    four-point parity of the XOR that combines the groups, and two streams against each other."""
    n, bound = 4096, 2e-3  # about 8 standard deviations: deterministic draws, no flaky margin needed
    for p in (1 / 256, 0.1, 0.5, 0.9):
        rate = dropout_keep_reference(99, 5, n, n, effective_dropout_p(p)).double().mean().item()
        assert abs(rate - (1 - effective_dropout_p(p))) < bound, (p, rate)
    s = dropout_keep_reference(99, 5, n, n, 0.5).double() * 2 - 1
    for dq, dk in [(0, 1), (0, 8), (1, 0), (8, 0), (8, 8), (1, 1), (0, 16), (16, 0), (16, 16)]:
        correlation = (s[:n - dq, :n - dk] * s[dq:, dk:]).mean().item()
        assert abs(correlation) < bound, f"lag ({dq}, {dk}): {correlation:.2e}"
    for dq, dk in [(1, 1), (8, 8), (16, 16), (1, 16), (16, 1)]:
        parity = (s[:n - dq, :n - dk] * s[dq:, dk:] * s[:n - dq, dk:] * s[dq:, :n - dk]).mean().item()
        assert abs(parity) < bound, f"four-point parity ({dq}, {dk}): {parity:.2e}"
    other = dropout_keep_reference(99, 6, n, n, 0.5).double() * 2 - 1
    assert abs((s * other).mean().item()) < bound


def test_dropout_zero_is_exactly_the_dropout_free_kernel():
    q, k, v = make_inputs(2, 2, 2, 40, 40, 16, torch.float32)
    assert torch.equal(flash_attention(q, k, v, causal=True, dropout_p=0.0), flash_attention(q, k, v, causal=True))


def test_dropout_is_seeded_by_torch_and_differs_between_calls():
    q, k, v = make_inputs(1, 2, 2, 32, 32, 16, torch.float32)
    torch.manual_seed(7)
    first = flash_attention(q, k, v, dropout_p=0.5)
    second = flash_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(7)
    again = flash_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(first, again), "the same torch seed gives the same dropout mask"
    assert not torch.equal(first, second), "the next call draws a new mask"


def test_dropout_mask_statistics_and_independence_from_the_layout():
    q, k, v = make_inputs(2, 4, 4, 64, 64, 16, torch.float32)
    torch.manual_seed(3)
    out, mask = flash_attention(q, k, v, dropout_p=0.25, return_dropout_mask=True)
    kept = mask.float().mean().item()
    # 32768 Bernoulli(0.75) draws: the standard deviation of the mean is 0.0024
    assert abs(kept - 0.75) < 0.01, f"kept fraction {kept:.4f}, expected 0.75"
    assert mask.float().mean(dim=(0, 1, 2)).std() < 0.1 and mask[0, 0].float().mean() != mask[0, 1].float().mean()
    # One word serves a square of four weights, (i, j), (i + 8, j), (i, j + 8), (i + 8, j + 8): each of
    # the four places must be a fair draw, independent of the others and of its neighbours.
    squares = mask.float().reshape(2, 4, 4, 2, 8, 4, 2, 8)  # (b, h, i // 16, row + 8, i % 8, j // 16, ...)
    by_place = squares.mean(dim=(0, 1, 2, 4, 5, 7))
    assert (by_place - 0.75).abs().max() < 0.03, by_place
    for name, (a, b) in {"key + 1": (mask[..., :-1], mask[..., 1:]), "key + 8": (mask[..., :-8], mask[..., 8:]),
                         "query + 1": (mask[..., :-1, :], mask[..., 1:, :]),
                         "query + 8": (mask[..., :-8, :], mask[..., 8:, :])}.items():
        correlation = torch.corrcoef(torch.stack([a.float().flatten(), b.float().flatten()]))[0, 1]
        assert correlation.abs() < 0.03, f"draws of weights at {name} are correlated ({correlation:.3f})"
    torch.manual_seed(3)
    other = flash_attention(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), dropout_p=0.25, layout="bnhd")
    assert torch.equal(other.transpose(1, 2), out)


@pytest.mark.parametrize("wrt", ["q", "k", "v"])
def test_dropout_gradient_by_finite_differences(wrt):
    """d/de loss(x + e u) at e = 0 by central differences with the same mask (the same torch seed), along a
    fixed random direction u of one input: against the backward kernels' directional derivative."""
    inputs = list(make_inputs(1, 2, 2, 24, 24, 16, torch.float32, grad_out=True))
    do = inputs.pop()
    index = "qkv".index(wrt)
    direction = torch.randn(inputs[index].shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def loss(eps):
        torch.manual_seed(11)
        moved = [t + eps * direction if i == index else t for i, t in enumerate(inputs)]
        return (flash_attention(*moved, causal=True, dropout_p=0.4) * do).sum().double().item()

    leaves = [t.clone().requires_grad_() for t in inputs]
    torch.manual_seed(11)
    (flash_attention(*leaves, causal=True, dropout_p=0.4) * do).sum().backward()
    analytic = (leaves[index].grad * direction).sum().item()
    eps = 1e-2  # float32 round-off and the O(eps^2) truncation stay below 1e-4 of the slope here
    numeric = (loss(eps) - loss(-eps)) / (2 * eps)
    assert abs(analytic - numeric) <= 1e-3 * max(1.0, abs(numeric)), (analytic, numeric)


def test_varlen_with_every_modifier_matches_each_sequence_alone():
    """Packed sequences: ALiBi distances and dropout positions are those within each sequence."""
    lens = [9, 0, 23, 1]
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randn(n, 3, 2, 16, generator=gen).to(DEVICE) for n in lens]
    packed = torch.cat(seqs)
    q, k, v = (packed[:, i].clone().requires_grad_() for i in range(3))
    cu = torch.tensor([0, 9, 9, 32, 33], dtype=torch.int32, device=DEVICE)
    alibi = slopes("(B, H)", 2, 2).repeat(2, 1)
    out = flash_attention_varlen(q, k, v, cu, cu, 23, 23, causal=True, softcap=2.0, alibi_slopes=alibi)
    do = torch.randn_like(out)
    out.backward(do)
    for b, (start, end) in enumerate(zip(cu.tolist(), cu.tolist()[1:])):
        if end == start:
            continue
        one = [t.detach()[start:end].transpose(0, 1)[None].double().cpu().requires_grad_() for t in (q, k, v)]
        ref = naive_attention(*one, causal=True, softcap=2.0, alibi_slopes=alibi[b:b + 1].double().cpu())
        ref.backward(do[start:end].transpose(0, 1)[None].double().cpu())
        assert relative_error(out[start:end].transpose(0, 1)[None], ref) <= tolerance(torch.float32)
        for t, r in zip((q, k, v), one):
            grad = t.grad[start:end].transpose(0, 1)[None]
            if (r.grad == 0).all():  # one key: softmax is constant, dq = dk = 0 by exact cancellation
                assert grad.abs().max() <= tolerance(torch.float32) * do.abs().max()
            else:
                assert relative_error(grad, r.grad) <= tolerance(torch.float32)


def test_varlen_dropout_equals_the_padded_kernel_on_equal_lengths():
    """Same seed, same positions: packed sequences of equal length drop exactly what the padded batch drops."""
    q, k, v = make_inputs(2, 2, 2, 20, 20, 16, torch.float32, layout="bnhd")
    cu = torch.tensor([0, 20, 40], dtype=torch.int32, device=DEVICE)
    torch.manual_seed(5)
    padded = flash_attention(q, k, v, layout="bnhd", dropout_p=0.3, causal=True)
    torch.manual_seed(5)
    packed = flash_attention_varlen(*(t.reshape(40, 2, 16) for t in (q, k, v)), cu, cu, 20, 20, dropout_p=0.3,
                                    causal=True)
    assert relative_error(packed.reshape(2, 20, 2, 16), padded) <= tolerance(torch.float32)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, error, message", [
    (dict(softcap=-1.0), ValueError, r"softcap must be finite, >= 0"),
    (dict(softcap="big"), TypeError, r"softcap must be a float"),
    (dict(dropout_p=1.0), ValueError, r"dropout_p must be finite, >= 0.0 and < 1.0.*got 1.0"),
    (dict(dropout_p=-0.1), ValueError, r"dropout_p must be finite"),
    (dict(alibi_slopes=[0.5, 0.5]), TypeError, r"alibi_slopes must be a floating-point tensor .* got a list"),
    (dict(alibi_slopes=torch.ones(2, dtype=torch.int64)), TypeError, r"alibi_slopes must be floating-point .*"
                                                                     r"got torch.int64"),
    (dict(alibi_slopes=torch.ones(3)), ValueError, r"alibi_slopes must have shape \(H,\) = \(2,\) or \(B, H\) = "
                                                  r"\(1, 2\); got \(3,\)"),
    (dict(return_dropout_mask=1), TypeError, r"return_dropout_mask must be a bool"),
])
def test_bad_modifiers_get_clear_errors(kwargs, error, message):
    q, k, v = make_inputs(1, 2, 2, 8, 8, 16, torch.float32)
    if isinstance(kwargs.get("alibi_slopes"), torch.Tensor):
        kwargs = {**kwargs, "alibi_slopes": kwargs["alibi_slopes"].to(DEVICE)}
    with pytest.raises(error, match=message):
        flash_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(softcap=-2.0), ValueError, r"softcap must be finite, >= 0"),
    (dict(dropout_p=1.5), ValueError, r"dropout_p must be finite, >= 0.0 and < 1.0.*got 1.5"),
    (dict(alibi_slopes=torch.ones(2, 3)), ValueError, r"alibi_slopes must have shape \(H,\) = \(2,\) or \(B, H\) = "
                                                    r"\(2, 2\); got \(2, 3\)"),
])
def test_bad_modifiers_of_packed_sequences_get_the_same_clear_errors(kwargs, error, message):
    q, k, v = (torch.randn(12, 2, 16, device=DEVICE) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=DEVICE)
    if isinstance(kwargs.get("alibi_slopes"), torch.Tensor):
        kwargs = {**kwargs, "alibi_slopes": kwargs["alibi_slopes"].to(DEVICE)}
    with pytest.raises(error, match=message):
        flash_attention_varlen(q, k, v, cu, cu, 7, 7, **kwargs)


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_modifiers_in_16_bit(dtype):
    q, k, v, do = make_inputs(2, 8, 2, 300, 300, 64, dtype, layout="bnhd", grad_out=True)
    torch.manual_seed(0)
    mods = dict(softcap=20.0, alibi_slopes=slopes("(H,)", 2, 8), dropout_p=0.1)
    assert_close(*run(q, k, v, do, "bnhd", dict(causal=True, seq_lens=[300, 211]), **mods), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_autotuned_dropout_and_modifiers(head_dim):
    """Every config the autotuners pick (BLOCK_N from 16 to 128) recomputes the same dropout mask."""
    q, k, v, do = make_inputs(2, 4, 2, 1000, 1000, head_dim, torch.float16, layout="bnhd", grad_out=True)
    torch.manual_seed(0)
    mods = dict(softcap=30.0, alibi_slopes=slopes("(B, H)", 2, 4), dropout_p=0.2)
    assert_close(*run(q, k, v, do, "bnhd", dict(causal=True), **mods), torch.float16)
