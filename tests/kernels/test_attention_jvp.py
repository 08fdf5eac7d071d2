"""Forward-mode AD through flash_attention: the JVP kernel (flashlib.kernels.attention_jvp) against torch.func.jvp
of the float64 reference.

Every mask (none, causal, window, causal + window, seq_lens), softcap and ALiBi, both 4D layouts and 3D,
N_q != N_k both ways, GQA, an odd head_dim, 16-bit inputs, packed sequences (a length 0 among them), dropout with
the kernel's own mask; tangents on some inputs only; every output element written. Then what is built on the rule:
``torch.autograd.forward_ad``, ``torch.func.jacfwd`` (vmap over the jvp), and the refusals (a gradient of a
tangent, a tangent of the ALiBi slopes, jacfwd with dropout).
"""
import pytest
import torch
from torch.autograd import forward_ad

from flashlib import flash_attention, flash_attention_varlen, ops
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.kernels.attention_jvp import launch_attention_jvp
from flashlib.kernels.dropout import effective_dropout_p
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, MASK_CASES, alibi_slopes, as_bhnd, make_inputs
from support.sass import compiled_variants, run_sass_counts

MASKS = MASK_CASES
slopes = alibi_slopes


def _on_device(options):
    return {name: (torch.tensor(value, dtype=torch.int32, device=DEVICE) if name == "seq_lens" else value)
            for name, value in options.items()}


def _double_cpu(options):
    return {name: (value.double().cpu() if isinstance(value, torch.Tensor) and value.is_floating_point()
                   else value.cpu() if isinstance(value, torch.Tensor) else value) for name, value in options.items()}


def jvp_both(inputs, tangents, layout="bhnd", **options):
    """(O's tangent from flash_attention, the float64 reference's), both (B, H, N_q, D) on the CPU.

    With dropout, the reference applies the kernel's own mask: the same seed drawn again under torch.manual_seed.
    """
    options = _on_device(options)
    call_layout = "bhnd" if layout == "3d" else layout
    torch.manual_seed(11)
    _, ours = torch.func.jvp(lambda q, k, v: flash_attention(q, k, v, layout=call_layout, **options), inputs, tangents)
    reference = _double_cpu(options)
    if options.get("dropout_p", 0) > 0:
        torch.manual_seed(11)
        reference["dropout_mask"] = flash_attention(*inputs, layout=call_layout, return_dropout_mask=True,
                                                    **options)[1].cpu()
        reference["dropout_p"] = effective_dropout_p(options["dropout_p"])
    as_reference = [as_bhnd(t, layout).double().cpu() for t in inputs]
    as_reference_t = [as_bhnd(t, layout).double().cpu() for t in tangents]
    _, theirs = torch.func.jvp(lambda q, k, v: naive_attention(q, k, v, **reference), tuple(as_reference),
                               tuple(as_reference_t))
    return as_bhnd(ours, layout).cpu(), theirs


def assert_close(ours, theirs, dtype=torch.float32):
    error = relative_error(ours, theirs)
    assert error <= tolerance(dtype), f"O's tangent: relative error {error:.2e} > {tolerance(dtype):.0e}"


def fresh(batch, heads, kv_heads, n_q, n_k, head_dim, dtype=torch.float32, layout="bhnd", seed=0):
    """Inputs and tangents, each drawn afresh (the tangents from another seed)."""
    return (make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout=layout, seed=seed),
            make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout=layout, seed=seed + 100))


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("modifiers", ["plain", "softcap", "alibi (H,)", "alibi (B, H)"])
def test_the_tangent_matches_the_reference_for_every_mask(mask, modifiers):
    inputs, tangents = fresh(2, 4, 2, 30, 30, 16)
    mods = {}
    if modifiers == "softcap":
        mods["softcap"] = 1.5  # scores reach |s| ~ 4: tanh saturates, and its factor in the tangent matters
    elif modifiers.startswith("alibi"):
        mods["alibi_slopes"] = slopes(modifiers[6:], 2, 4)
    assert_close(*jvp_both(inputs, tangents, **MASKS[mask], **mods))


@pytest.mark.parametrize("layout", ["bnhd", "3d"])
@pytest.mark.parametrize("n_q, n_k", [(20, 45), (45, 20)])
def test_other_layouts_and_lengths_align_bottom_right(layout, n_q, n_k):
    heads, kv_heads = (2, 2) if layout == "3d" else (4, 1)
    inputs, tangents = fresh(2, heads, kv_heads, n_q, n_k, 32, layout=layout)
    assert_close(*jvp_both(inputs, tangents, layout, causal=True, softcap=4.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sixteen_bit_inputs_and_an_odd_head_dim(dtype):
    inputs, tangents = fresh(1, 2, 2, 37, 53, 40, dtype=dtype)
    assert_close(*jvp_both(inputs, tangents, causal=True), dtype)


@pytest.mark.parametrize("mask", ["none", "causal", "seq_lens"])
def test_dropout_uses_the_forwards_own_mask(mask):
    inputs, tangents = fresh(2, 2, 1, 30, 30, 16)
    assert_close(*jvp_both(inputs, tangents, dropout_p=0.3, **MASKS[mask]))


def test_a_tangent_on_some_inputs_only_is_the_reference_with_zeros_elsewhere():
    (q, k, v), (q_t, k_t, v_t) = fresh(1, 2, 2, 24, 24, 16)
    _, ours = torch.func.jvp(lambda x: flash_attention(x, k, v, causal=True), (q,), (q_t,))
    _, theirs = jvp_both((q, k, v), (q_t, torch.zeros_like(k), torch.zeros_like(v)), causal=True)
    assert_close(ours.cpu(), theirs)
    _, ours_kv = torch.func.jvp(lambda y, z: flash_attention(q, y, z), (k, v), (k_t, v_t))
    _, theirs_kv = jvp_both((q, k, v), (torch.zeros_like(q), k_t, v_t))
    assert_close(ours_kv.cpu(), theirs_kv)


def test_packed_sequences_match_each_sequence_alone():
    lengths_q, lengths_k = [13, 0, 27], [20, 5, 27]
    gen = torch.Generator().manual_seed(3)
    q, q_t = (torch.randn(sum(lengths_q), 4, 16, generator=gen).to(DEVICE) for _ in range(2))
    k, v, k_t, v_t = (torch.randn(sum(lengths_k), 2, 16, generator=gen).to(DEVICE) for _ in range(4))

    def cumulative(lengths):
        return torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).to(DEVICE)
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    _, ours = torch.func.jvp(lambda a, b, c: flash_attention_varlen(a, b, c, cu_q, cu_k, 27, 27, causal=True),
                             (q, k, v), (q_t, k_t, v_t))
    for b in range(3):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lengths_q[b] == 0:
            continue
        parts = [t[rows].transpose(0, 1)[None].double().cpu() for t in (q, q_t)]
        kv = [t[keys].transpose(0, 1)[None].double().cpu() for t in (k, v, k_t, v_t)]
        _, theirs = torch.func.jvp(lambda a, b_, c: naive_attention(a, b_, c, causal=True), (parts[0], kv[0], kv[1]),
                                   (parts[1], kv[2], kv[3]))
        assert_close(ours[rows].transpose(0, 1)[None].cpu(), theirs)


def test_every_element_is_written_and_rows_that_see_no_key_get_zero():
    """The kernel alone, its output NaN-filled first. 40 queries over 30 keys under a causal mask, aligned
    bottom-right: the first 10 rows see no key. Sample 1 has 23 valid rows and keys (seq_lens): its rows from 23
    on are padding. Both kinds of row get exactly 0; every other row a tangent."""
    (q, k, v), (q_t, k_t, v_t) = fresh(2, 2, 2, 40, 30, 16)
    lens = torch.tensor([40, 23], dtype=torch.int32, device=DEVICE)
    spec = AttentionSpec(causal=True)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=DEVICE)
    launch_attention_forward(q, k, v, o, lse, spec, seq_lens=lens)
    o_t = torch.full_like(q, float("nan"))
    launch_attention_jvp(q, k, v, o, lse, q_t, k_t, v_t, o_t, spec, seq_lens=lens)
    assert not o_t.isnan().any()
    assert (o_t[:, :, :10] == 0).all() and (o_t[1, :, 23:] == 0).all()
    assert (o_t[0, :, 10:] != 0).any(dim=-1).all() and (o_t[1, :, 10:23] != 0).any(dim=-1).all()


def test_a_nan_that_a_row_does_not_see_stays_out_of_its_tangent():
    """PyTorch's semantics, as the forward's: a NaN in a key (or its tangent) that a row's mask hides leaves that row's
    tangent finite, and rows that see no key (causal with N_q > N_k) or lie past seq_lens get exactly 0, even with NaN
    in their own q, q_t or padding. (0 * NaN in the kernel used to spread the NaN to them.)"""
    (q, k, v), (q_t, k_t, v_t) = fresh(2, 2, 2, 16, 12, 16)
    q[0, 0, 1], q_t[0, 1, 2] = float("nan"), float("nan")  # rows 0..3 see no key
    k[0, 0, 9, 5], k_t[0, 1, 10, 3] = float("nan"), float("nan")  # rows 4..12 never see keys 9 and 10
    for t in (q, k, v, q_t, k_t, v_t):
        t[1, :, 7:] = float("nan")  # sample 1's padding past seq_lens = 7
    lens = torch.tensor([16, 7], dtype=torch.int32, device=DEVICE)
    _, ours = torch.func.jvp(lambda a, b, c: flash_attention(a, b, c, causal=True, seq_lens=lens), (q, k, v),
                             (q_t, k_t, v_t))
    ours = ours.cpu()
    assert (ours[0, :, :4] == 0).all() and (ours[1, :, 7:] == 0).all()
    assert ours[0, :, :13].isfinite().all() and ours[0, 1, 13].isfinite().all()  # row 13 sees key 9, not 10
    assert ours[0, 0, 13:].isnan().any(dim=-1).all() and ours[0, 1, 14:].isnan().any(dim=-1).all()
    clean = [t.nan_to_num() for t in (q, k, v, q_t, k_t, v_t)]
    _, theirs = jvp_both(tuple(clean[:3]), tuple(clean[3:]), causal=True, seq_lens=[16, 7])
    assert_close(ours[1], theirs[1])
    assert_close(ours[0, :, :13], theirs[0, :, :13])


def test_a_tangent_of_another_dtype_than_its_primal_is_taken_in_the_primals():
    """Forward-mode AD accepts a float32 tangent for a float16 primal; the kernel's products need one dtype (they
    failed with an interpreter assertion, "Both operands must be same dtype")."""
    inputs, tangents = fresh(1, 2, 2, 20, 24, 16, dtype=torch.float16)
    wide = tuple(t.float() for t in tangents)
    _, ours = torch.func.jvp(lambda a, b, c: flash_attention(a, b, c, causal=True), inputs, wide)
    assert ours.dtype == torch.float16
    assert_close(ours.cpu(), jvp_both(inputs, tangents, causal=True)[1], torch.float16)


def test_forward_ad_dual_tensors_give_the_same_tangent():
    (q, k, v), (q_t, k_t, v_t) = fresh(1, 2, 1, 20, 28, 16)
    _, expected = torch.func.jvp(lambda a, b, c: flash_attention(a, b, c, causal=True), (q, k, v), (q_t, k_t, v_t))
    with forward_ad.dual_level():
        duals = [forward_ad.make_dual(t, t_t) for t, t_t in ((q, q_t), (k, k_t), (v, v_t))]
        out = flash_attention(*duals, causal=True)
        primal, tangent = forward_ad.unpack_dual(out)
    assert torch.equal(primal, flash_attention(q, k, v, causal=True))
    assert torch.equal(tangent, expected)


def test_a_window_bound_past_every_sequence_gives_the_unbounded_tangent():
    """A bound as long as the sequences or past int32 (where the kernel's sums would wrap round) means unbounded."""
    inputs, tangents = fresh(1, 2, 1, 24, 8, 16)
    for side in (0, 1):
        def tangent(window):
            return torch.func.jvp(lambda q, k, v: flash_attention(q, k, v, window=window), inputs, tangents)[1]
        unbounded = tangent((0, -1) if side else (-1, 0))
        for bound in (24, 2**31 - 2, 2**31 - 1, 2**63):
            assert torch.equal(tangent((0, bound) if side else (bound, 0)), unbounded), bound


@pytest.mark.parametrize("alibi", [None, "(B, H)"])
def test_jacfwd_maps_the_jvp_over_its_basis(alibi):
    (q, k, v), _ = fresh(2, 2, 2, 5, 7, 16)
    options = dict(causal=True, alibi_slopes=slopes(alibi, 2, 2))
    ours = torch.func.jacfwd(lambda a, b: flash_attention(a, b, v, **options), argnums=(0, 1))(q, k)
    reference = _double_cpu(options)
    theirs = torch.func.jacfwd(lambda a, b: naive_attention(a, b, v.double().cpu(), **reference),
                               argnums=(0, 1))(q.double().cpu(), k.double().cpu())
    for a, b in zip(ours, theirs):
        assert_close(a.cpu(), b)


def test_a_gradient_of_a_tangent_raises():
    (q, k, v), (q_t, _, _) = fresh(1, 1, 1, 12, 12, 16)
    leaf = q.clone().requires_grad_()
    _, tangent = torch.func.jvp(lambda a: flash_attention(a, k, v), (leaf,), (q_t,))
    with pytest.raises(RuntimeError, match="forward-mode derivative .* is not differentiable"):
        tangent.sum().backward()
    with pytest.raises(RuntimeError, match="forward-mode derivative .* is not differentiable"):
        torch.func.jacrev(torch.func.jacfwd(lambda a: flash_attention(a, k, v).sum()))(q)


def test_a_tangent_of_a_tangent_raises_naming_flash_attention():
    """Forward over forward mode (jvp of a jvp, jacfwd of jacfwd) raises the op's own message, not torch's generic
    "You must implement the jvp function for custom autograd.Function"."""
    (q, k, v), (q_t, _, _) = fresh(1, 1, 1, 4, 4, 16)
    with pytest.raises(RuntimeError, match="forward-mode derivative .* is not differentiable"):
        torch.func.jvp(lambda a: torch.func.jvp(lambda x: flash_attention(x, k, v), (a,), (q_t,))[1], (q,), (q_t,))
    with pytest.raises(RuntimeError, match="forward-mode derivative .* is not differentiable"):
        torch.func.jacfwd(torch.func.jacfwd(lambda a: flash_attention(a, k, v).sum()))(q[..., :1, :])


def test_alibi_slopes_being_differentiated_are_refused_in_either_mode():
    """The slopes are constants to flash_attention (no gradient, no tangent): differentiating with respect to them
    must fail loudly, not give zero."""
    (q, k, v), _ = fresh(1, 2, 2, 12, 12, 16)
    slopes_ = slopes("(H,)", 1, 2)
    message = "alibi_slopes is being differentiated"
    with pytest.raises(ValueError, match=message):
        torch.func.jvp(lambda s: flash_attention(q, k, v, alibi_slopes=s), (slopes_,), (torch.ones_like(slopes_),))
    with pytest.raises(ValueError, match=message):
        torch.func.grad(lambda s: flash_attention(q, k, v, alibi_slopes=s).sum())(slopes_)
    with pytest.raises(ValueError, match=message):
        flash_attention(q, k, v, alibi_slopes=slopes_.clone().requires_grad_())
    with forward_ad.dual_level(), pytest.raises(ValueError, match=message):
        flash_attention(q, k, v, alibi_slopes=forward_ad.make_dual(slopes_, torch.ones_like(slopes_)))
    with torch.no_grad():  # a learnable slope in an inference call is a constant again
        flash_attention(q, k, v, alibi_slopes=slopes_.clone().requires_grad_())


def test_constant_alibi_slopes_made_inside_a_transform_are_accepted():
    """A model that builds its slopes in forward() (BLOOM, MPT) makes them inside torch.func.grad or jvp, where
    every new tensor is wrapped: a constant there is no derivative of the slopes, and is not refused."""
    (q, k, v), (q_t, _, _) = fresh(1, 2, 2, 12, 12, 16)

    def attend(x):
        return flash_attention(x, k, v, causal=True, alibi_slopes=2.0 ** -torch.arange(1, 3, dtype=torch.float32))

    leaf = q.clone().requires_grad_()
    attend(leaf).sum().backward()
    assert relative_error(torch.func.grad(lambda x: attend(x).sum())(q), leaf.grad) <= 1e-5
    with forward_ad.dual_level():
        eager_tangent = forward_ad.unpack_dual(attend(forward_ad.make_dual(q, q_t))).tangent
    assert relative_error(torch.func.jvp(attend, (q,), (q_t,))[1], eager_tangent) <= 1e-5


def test_jacfwd_with_dropout_is_refused_rather_than_drawing_other_masks():
    (q, k, v), _ = fresh(1, 1, 1, 8, 8, 16)
    with pytest.raises(NotImplementedError, match="jvp with dropout is not supported"):
        torch.func.jacfwd(lambda a: flash_attention(a, k, v, dropout_p=0.2))(q)


def test_the_kernel_compiles_for_hopper_without_a_spill():
    """The interpreter runs no compiler: compiled for sm_90a (benchmarks/sass_counts.py --kernel jvp) with the
    launcher's own blocks, every head_dim band, mask and dropout compiles, spills nothing, and at D <= 128 runs its
    products on the warpgroup tensor cores (HGMMA)."""
    result = run_sass_counts("--kernel", "jvp", "--d", "64,128,256", "--causal", "no,yes", "--dropout", "0,0.1",
                             "--top", "200")
    assert result.returncode == 0, result.stderr[-2000:]
    variants = compiled_variants(result.stdout, "jvp")
    assert len(variants) == 12
    for header, among_products, opcodes in variants:
        assert "stack 0 B (0 STL/LDL" in header and among_products == 0, header
        assert "D=256" in header or "HGMMA" in opcodes, header


def test_the_op_module_documents_no_refusal_of_forward_mode():
    assert not hasattr(ops, "FORWARD_AD_MESSAGE") and ops.FlashAttentionFunction.jvp is ops.jvp


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gpu_the_tangent_matches_the_reference(dtype, head_dim):
    """On the GPU, at lengths of several blocks, GQA, causal and a window, every layout the front door takes."""
    for layout, options in (("bhnd", dict(causal=True)), ("bnhd", dict(window=(100, 20), softcap=20.0))):
        inputs, tangents = fresh(2, 8, 2, 300, 517, head_dim, dtype=dtype, layout=layout, seed=head_dim)
        assert_close(*jvp_both(inputs, tangents, layout, **options), dtype)
