"""flash_attention forward: equal to the float64 reference for every mask, layout, dtype and
block size; blocks outside the mask never visited; every output element written; clear errors."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashlib import ops as attention_module
from flashlib.spec import AttentionSpec
from flashlib import flash_attention, flash_attention_v2, runtime
from flashlib.kernels import attention_fwd
from flashlib.reference import attention_mask, naive_attention
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, DTYPES, as_bhnd, make_inputs, pin_blocks

LAYOUTS = ["bhnd", "bnhd", "3d"]


# ---------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def fixed_blocks_on_the_gpu(request, monkeypatch):
    """On a GPU every new shape would autotune: tests run fixed blocks there, except
    test_gpu_autotuned, which exercises the autotuner (the interpreter never autotunes)."""
    if not request.node.name.startswith("test_gpu_autotuned"):
        pin_blocks(monkeypatch, [attention_module], backward=False)


def reference(q, k, v, layout="bhnd", **mask):
    """naive_attention in float64 on the inputs (already rounded to their dtype), (B, H, N, D)."""
    q, k, v = (as_bhnd(t, layout).double().cpu() for t in (q, k, v))
    return naive_attention(q, k, v, return_lse=True, **mask)


def lse_tolerance(dtype):
    """Scores are products of the inputs summed in float32 whatever their dtype: L is float32-accurate."""
    return tolerance(torch.float32) if dtype != torch.float32 else tolerance(dtype)


def assert_matches(out, lse, ref_out, ref_lse, dtype, layout="bhnd"):
    out, lse = as_bhnd(out, layout), lse.unsqueeze(1) if layout == "3d" else lse
    err = relative_error(out, ref_out)
    assert err <= tolerance(dtype), f"O: relative error {err:.2e} > {tolerance(dtype):.0e}"
    lse = lse.double().cpu()
    assert not torch.isnan(lse).any(), "L has NaN"
    no_key = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), no_key), "L is -inf exactly on the rows that see no key"
    assert (out.cpu()[no_key] == 0).all(), "rows that see no key give exactly 0"
    if (~no_key).any():
        lse_err = relative_error(lse[~no_key], ref_lse[~no_key])
        assert lse_err <= lse_tolerance(dtype), f"L: relative error {lse_err:.2e}"


def run_and_check(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout, seed=0, seq_lens=None, **mask):
    """flash_attention on fresh inputs in ``layout`` against the float64 reference: O and L."""
    q, k, v = make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout, seed)
    lens = None if seq_lens is None else torch.tensor(seq_lens, dtype=torch.int32)
    out, lse = flash_attention(q, k, v, layout="bhnd" if layout == "3d" else layout, return_lse=True,
                               seq_lens=None if lens is None else lens.to(DEVICE), **mask)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.dtype == torch.float32
    assert lse.shape == ((batch * heads, n_q) if layout == "3d" else (batch, heads, n_q))
    if layout == "bnhd":
        assert out.is_contiguous(), "O is stored in the caller's layout"
    assert_matches(out, lse, *reference(q, k, v, layout, seq_lens=lens, **mask), dtype, layout)


# ---------------------------------------------------------------- a grid against the reference
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_q, n_k", [(48, 48), (20, 70), (70, 20)], ids=["self", "decode-like", "q-longer"])
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grid_matches_float64_reference(causal, layout, heads, kv_heads, n_q, n_k, dtype):
    run_and_check(2, heads, kv_heads, n_q, n_k, 32, dtype, layout, seed=n_q * 7 + n_k, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [16, 64, 128, 256, 24, 40, 80], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_head_dim(head_dim, causal, dtype):
    """Powers of two, and others padded to the next power of two with a mask on d."""
    run_and_check(1, 2, 1, 33, 45, head_dim, dtype, "bhnd", seed=head_dim, causal=causal)


def test_3d_inputs_are_batches_of_one_head():
    q, k, v = make_inputs(2, 3, 3, 40, 40, 32, torch.float32)
    out4, lse4 = flash_attention(q, k, v, causal=True, return_lse=True)
    out3, lse3 = flash_attention(*(t.reshape(6, -1, 32) for t in (q, k, v)), causal=True, return_lse=True)
    assert out3.shape == (6, 40, 32) and lse3.shape == (6, 40)
    assert torch.equal(out3, out4.reshape(6, 40, 32)) and torch.equal(lse3, lse4.reshape(6, 40))


def test_softmax_scale_is_used():
    run_and_check(1, 2, 2, 30, 30, 16, torch.float32, "bhnd", softmax_scale=0.9)
    q, k, v = make_inputs(1, 2, 2, 30, 30, 16, torch.float32)
    assert relative_error(flash_attention(q, k, v, softmax_scale=0.9), flash_attention(q, k, v)) > 1e-2


@pytest.mark.parametrize("softmax_scale", [-0.7, -8.0, 0.0, 8.0], ids=["negative", "large-negative", "zero", "large"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_any_finite_scale_in_masked_and_unmasked_blocks(softmax_scale, causal):
    """Unmasked key blocks take the row max on raw scores and fold the scale into one FMA;
    that is only right for a non-negative scale, so the kernel flips Q's sign for a negative
    one (a wrong row max goes unseen until exp2 overflows: hence the large scales). N spans
    several blocks so that both the masked and the unmasked path run."""
    run_and_check(2, 2, 1, 100, 100, 32, torch.float32, "bhnd", seed=11, causal=causal,
                  softmax_scale=softmax_scale)


# ---------------------------------------------------------------- hypothesis: any shape and mask
@st.composite
def problems(draw, layouts=LAYOUTS, dtypes=DTYPES):
    layout = draw(st.sampled_from(layouts))
    batch = draw(st.integers(1, 3))
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads if layout == "3d" else kv_heads * draw(st.integers(1, 3))
    n_q = draw(st.integers(1, 80))
    n_k = draw(st.one_of(st.just(n_q), st.integers(1, 80)))
    longest = max(n_q, n_k)
    n_lens = batch * heads if layout == "3d" else batch
    seq_len = st.one_of(st.just(0), st.just(longest), st.integers(0, longest))
    bound = st.one_of(st.just(-1), st.integers(0, 40))
    head_dim = draw(st.sampled_from([16, 32, 64]))
    return dict(
        batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q, n_k=n_k, layout=layout,
        head_dim=head_dim, dtype=draw(st.sampled_from(dtypes)),
        causal=draw(st.booleans()),
        window=draw(st.one_of(st.none(), st.tuples(bound, bound))),
        seq_lens=draw(st.one_of(st.none(), st.lists(seq_len, min_size=n_lens, max_size=n_lens))),
        # up to twice the default 1/sqrt(d) (sharper softmax magnifies TF32's error on a GPU)
        softmax_scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0).map(lambda f: f / head_dim ** 0.5))),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=150, deadline=None, derandomize=True)
@given(problem=problems())
def test_any_problem_matches_reference(problem):
    run_and_check(**problem)


def expected_tiles(n_q, n_k, block_m, block_n, batch, heads, causal, window, seq_lens):
    """Which key blocks each query block must visit: 0 none visible, 1 all visible, 2 some."""
    allowed = attention_mask(n_q, n_k, causal=causal, window=window, seq_lens=seq_lens, batch=batch)[:, 0]
    lens = [max(n_q, n_k)] * batch if seq_lens is None else seq_lens.tolist()
    tiles = torch.zeros(batch, -(-n_q // block_m), -(-n_k // block_n), dtype=torch.int8)
    for b, length in enumerate(lens):
        q_len, k_len = min(length, n_q), min(length, n_k)
        for i in range(tiles.shape[1]):
            for j in range(tiles.shape[2]):
                block = allowed[b, i * block_m:min((i + 1) * block_m, q_len), j * block_n:(j + 1) * block_n]
                if block.any():
                    tiles[b, i, j] = 1 if block.all() and (j + 1) * block_n <= k_len else 2
    return tiles.repeat_interleave(heads, dim=0)


def launch_with_tiles(q, k, v, block_m, block_n, **mask):
    """The kernel on (B, H, N, D) float32 inputs with fixed blocks, recording the blocks it visits."""
    batch, heads, n_q, _ = q.shape
    tiles = torch.zeros(batch * heads, -(-n_q // block_m), -(-k.shape[2] // block_n), dtype=torch.int8,
                        device=DEVICE)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, heads, n_q), float("nan"), device=DEVICE)
    seq_lens = mask.pop("seq_lens", None)
    attention_fwd.launch_attention_forward(q, k, v, out, lse, spec=AttentionSpec(**mask), seq_lens=seq_lens,
                                           block_m=block_m, block_n=block_n, tiles=tiles)
    return out, lse, tiles.cpu()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problem=problems(layouts=["bhnd"], dtypes=[torch.float32]),
       block_m=st.sampled_from([16, 32, 64]), block_n=st.sampled_from([16, 32, 64]))
def test_blocks_visited_are_exactly_the_visible_ones(problem, block_m, block_n):
    """Block early exit: a key block no row sees is never loaded; one every row sees whole gets no mask."""
    p = problem
    q, k, v = make_inputs(p["batch"], p["heads"], p["kv_heads"], p["n_q"], p["n_k"], p["head_dim"],
                          torch.float32, seed=p["seed"])
    seq_lens = None if p["seq_lens"] is None else torch.tensor(p["seq_lens"], dtype=torch.int32)
    mask = dict(causal=p["causal"], window=p["window"], softmax_scale=p["softmax_scale"])
    out, lse, tiles = launch_with_tiles(q, k, v, block_m, block_n, **mask,
                                        seq_lens=None if seq_lens is None else seq_lens.to(DEVICE))
    mask.pop("softmax_scale")
    expected = expected_tiles(p["n_q"], p["n_k"], block_m, block_n, p["batch"], p["heads"], seq_lens=seq_lens, **mask)
    assert torch.equal(tiles, expected), f"visited blocks (0 skip, 1 full, 2 masked):\n{tiles}\nexpected\n{expected}"
    ref = reference(q, k, v, softmax_scale=p["softmax_scale"], seq_lens=seq_lens, **mask)
    assert_matches(out, lse, *ref, torch.float32)


def test_causal_skips_blocks_above_the_diagonal():
    q, k, v = make_inputs(1, 1, 1, 64, 64, 16, torch.float32)
    _, _, tiles = launch_with_tiles(q, k, v, 16, 16, causal=True)
    assert tiles[0].tolist() == [[2, 0, 0, 0],
                                 [1, 2, 0, 0],
                                 [1, 1, 2, 0],
                                 [1, 1, 1, 2]]
    _, _, tiles = launch_with_tiles(q, k, v, 32, 16, causal=True)  # a diagonal across two key blocks
    assert tiles[0].tolist() == [[2, 2, 0, 0], [1, 1, 2, 2]]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(n=st.integers(1, 80), lens=st.lists(st.integers(0, 80), min_size=1, max_size=3),
       causal=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 99))
def test_padded_batch_equals_each_sample_alone(n, lens, causal, dtype, seed):
    """seq_lens: a padded sample gives what the unpadded sample gives alone, then exact zeros."""
    lens = [min(length, n) for length in lens]
    q, k, v = make_inputs(len(lens), 2, 1, n, n, 32, dtype, seed=seed)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    out, lse = flash_attention(q, k, v, causal=causal, seq_lens=seq_lens, return_lse=True)
    for b, length in enumerate(lens):
        assert (out[b, :, length:] == 0).all() and torch.isneginf(lse[b, :, length:]).all()
        if length:
            alone, alone_lse = flash_attention(q[b:b + 1, :, :length], k[b:b + 1, :, :length],
                                               v[b:b + 1, :, :length], causal=causal, return_lse=True)
            assert relative_error(out[b:b + 1, :, :length], alone) <= tolerance(dtype)
            assert relative_error(lse[b:b + 1, :, :length], alone_lse) <= lse_tolerance(dtype)


# ---------------------------------------------------------------- rows without keys, poisoned outputs
@pytest.mark.parametrize("n_q, n_k, mask", [
    (40, 10, dict(causal=True)),                 # q longer than k, bottom-right: the first 30 rows see nothing
    (30, 30, dict(window=(0, 0), seq_lens=[0, 13])),  # an empty sample
    (20, 50, dict(window=(3, -1), causal=True)),  # a narrow band
    (25, 25, dict(seq_lens=[25, 1])),
])
def test_rows_without_keys_give_zero_not_nan(n_q, n_k, mask):
    run_and_check(2, 2, 2, n_q, n_k, 16, torch.float32, "bhnd", **mask)


def test_no_keys_at_all_and_no_queries():
    q, k, v = make_inputs(1, 2, 2, 5, 0, 16, torch.float32)
    out, lse = flash_attention(q, k, v, return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    q, k, v = make_inputs(1, 2, 2, 0, 5, 16, torch.float32)
    out, lse = flash_attention(q, k, v, return_lse=True)
    assert out.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_output_element_is_written(nan_empty, layout, dtype):
    n_lens = 4 if layout == "3d" else 2
    run_and_check(2, 2, 2, 37, 21, 16, dtype, layout, causal=True, seq_lens=[0, 37, 9, 20][:n_lens])
    assert len(nan_empty) >= 2, "the outputs must come from torch.empty for this test to mean anything"


#: Window bounds past any sequence of the tests below: the call's own length, just under int32's largest (a kernel
#: adding it to a position in int32 would wrap round), past int32, int64 and uint64 (Triton's widest int argument).
HUGE_BOUNDS = [2**31 - 2, 2**31 - 1, 2**40, 2**63, 2**64]


@pytest.mark.parametrize("variant", ["fa2", "splitkv"])
@pytest.mark.parametrize("n_q, n_k", [(8, 24), (24, 8)])
def test_a_window_bound_past_every_sequence_is_unbounded(n_q, n_k, variant):
    """A bound at least as long as the sequences reaches every key, as -1 does (flash-attn's convention): never an
    all-zero output from a sum that wrapped round in the kernel, nor Triton's OverflowError for the bound."""
    q, k, v = make_inputs(1, 2, 2, n_q, n_k, 16, torch.float32, "bhnd", seed=n_q)
    unbounded = {side: flash_attention(q, k, v, window=side, variant=variant) for side in ((0, -1), (-1, 0))}
    for bound in [max(n_q, n_k)] + HUGE_BOUNDS:
        assert torch.equal(flash_attention(q, k, v, window=(0, bound), variant=variant), unbounded[(0, -1)]), bound
        assert torch.equal(flash_attention(q, k, v, window=(bound, 0), variant=variant), unbounded[(-1, 0)]), bound
    assert torch.equal(flash_attention_v2(*(t.transpose(1, 2) for t in (q, k, v)), window=(0, 2**63)),
                       flash_attention_v2(*(t.transpose(1, 2) for t in (q, k, v)), window=(0, -1)))
    assert AttentionSpec(window=(2**31 - 1, 2**64)).window == (None, None)
    assert AttentionSpec(window=(2**31 - 2, 5)).bounds(longest=100) == (None, 5)


# ---------------------------------------------------------------- layouts: strides, no copies
@pytest.fixture
def launches(monkeypatch):
    """Record the tensors that reach the kernel launcher."""
    seen = []
    real = attention_module.launch_attention_forward

    def spy(q, k, v, o, lse, **kwargs):
        seen.append(dict(q=q, k=k, v=v, o=o, lse=lse))
        return real(q, k, v, o, lse, **kwargs)

    monkeypatch.setattr(attention_module, "launch_attention_forward", spy)
    return seen


def test_bnhd_reaches_the_kernel_through_strides_without_copies(launches):
    q, k, v = make_inputs(2, 4, 2, 40, 24, 32, torch.float32, layout="bnhd")
    out = flash_attention(q, k, v, causal=True, layout="bnhd")
    (seen,) = launches
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert seen[name].data_ptr() == t.data_ptr(), f"{name} was copied"
        assert seen[name].stride() == t.transpose(1, 2).stride() and not seen[name].is_contiguous()
    assert seen["o"].data_ptr() == out.data_ptr() and out.is_contiguous() and out.shape == q.shape
    assert_matches(out, seen["lse"], *reference(q, k, v, "bnhd", causal=True), torch.float32, "bnhd")


def test_packed_qkv_views_are_used_in_place(launches):
    """q, k, v sliced out of one (B, N, 3, H, D) projection: strided views, no copy."""
    qkv = torch.randn(2, 33, 3, 4, 32, device=DEVICE)
    q, k, v = qkv.unbind(2)
    out = flash_attention(q, k, v, layout="bnhd")
    assert launches[0]["q"].data_ptr() == q.data_ptr() and launches[0]["v"].data_ptr() == v.data_ptr()
    ref, _ = reference(q, k, v, "bnhd")
    assert relative_error(out.transpose(1, 2), ref) <= tolerance(torch.float32)


@pytest.mark.skipif(not runtime.INTERPRET, reason="the interpreter's bfloat16 rule")
def test_bfloat16_is_computed_in_float32_in_the_interpreter(launches):
    q, k, v = make_inputs(1, 2, 2, 30, 30, 32, torch.bfloat16)
    out = flash_attention(q, k, v, causal=True)
    assert launches[0]["q"].dtype == torch.float32 and out.dtype == torch.bfloat16
    ref, _ = reference(q, k, v, causal=True)
    assert relative_error(out, ref) <= tolerance(torch.bfloat16)


# ---------------------------------------------------------------- autograd
def test_forward_works_with_grad():
    """The forward under autograd; the gradients are tested in test_attention_bwd.py."""
    q, k, v = (t.requires_grad_() for t in make_inputs(1, 2, 2, 20, 20, 16, torch.float32))
    out = flash_attention(q, k, v, causal=True)
    assert out.requires_grad
    ref, _ = reference(q.detach(), k.detach(), v.detach(), causal=True)
    assert relative_error(out, ref) <= tolerance(torch.float32)
    out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (q, k, v))
    with torch.no_grad():
        assert torch.equal(flash_attention(q, k, v, causal=True), out.detach())


# ---------------------------------------------------------------- errors
def t(*shape, dtype=torch.float32, device=DEVICE):
    return torch.randn(shape, dtype=dtype, device=device) if dtype.is_floating_point \
        else torch.zeros(shape, dtype=dtype, device=device)


QKV = (t(2, 4, 8, 16), t(2, 2, 8, 16), t(2, 2, 8, 16))


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((list(range(3)), QKV[1], QKV[2]), {}, TypeError, r"Expected 3D or 4D tensors: q is a list"),
    ((QKV[0], QKV[1].to_sparse(), QKV[2]), {}, TypeError, r"Expected dense 3D or 4D tensors: k has layout "
                                                          r"torch.sparse_coo; convert it with k.to_dense\(\)"),
    ((t(4, 16), t(4, 16), t(4, 16)), {}, ValueError, r"Expected 3D or 4D tensors .*q.shape=\(4, 16\)"),
    ((t(2, 8, 16), QKV[1], QKV[2]), {}, ValueError, r"Expected 3D or 4D .*k.shape=\(2, 2, 8, 16\)"),
    ((QKV[0], t(3, 2, 8, 16), QKV[2]), {}, ValueError, r"Q, K, V shapes must match .*k.shape=\(3, 2, 8, 16\)"),
    ((QKV[0], QKV[1], t(2, 2, 9, 16)), {}, ValueError, r"Q, K, V shapes must match .*v.shape=\(2, 2, 9, 16\)"),
    ((QKV[0], t(2, 2, 8, 32), t(2, 2, 8, 32)), {}, ValueError, r"Q, K, V shapes must match .*head_dim"),
    ((QKV[0], t(2, 3, 8, 16), t(2, 3, 8, 16)), {}, ValueError,
     r"GQA needs q heads \(4\) to be a multiple of k/v heads \(3\)"),
    ((t(2, 8, 4, 16), t(2, 8, 3, 16), t(2, 8, 3, 16)), {"layout": "bnhd"}, ValueError,
     r"GQA needs q heads \(4\) to be a multiple of k/v heads \(3\) \(layout 'bnhd'\)"),
    ((t(6, 8, 16), t(2, 8, 16), t(2, 8, 16)), {}, ValueError, r"Q, K, V shapes must match .*q.shape=\(6, 8, 16\)"),
    ((t(1, 1, 8, 8),) * 3, {}, ValueError, r"Unsupported head_dim 8: .*16 to 256"),
    ((t(1, 1, 4, 512),) * 3, {}, ValueError, r"Unsupported head_dim 512"),
    ((QKV[0], t(2, 2, 8, 16, dtype=torch.float16), QKV[2]), {}, TypeError,
     r"same dtype; got q.dtype=torch.float32, k.dtype=torch.float16, v.dtype=torch.float32"),
    ((t(1, 1, 8, 16, dtype=torch.float64),) * 3, {}, TypeError, r"Unsupported dtype torch.float64 for q, k, v"),
    ((QKV[0], t(2, 2, 8, 16, device="meta"), QKV[2]), {}, ValueError,
     r"q, k, v must be on the same device; got q on [\w:]+, k on meta"),
    ((t(1, 1, 8, 16, device="meta"),) * 3, {}, ValueError, r"q, k, v must be on \w+ .*got meta"),
    (QKV, {"seq_lens": t(2, dtype=torch.int64)}, TypeError, r"seq_lens must be torch.int32; got torch.int64"),
    (QKV, {"seq_lens": [3, 4]}, TypeError, r"seq_lens must be a \(B,\) torch.int32 tensor; got a list"),
    (QKV, {"seq_lens": t(3, dtype=torch.int32)}, ValueError, r"seq_lens must have shape \(B,\) = \(2,\).*got \(3,\)"),
    (QKV, {"seq_lens": torch.tensor([-1, 3], dtype=torch.int32, device=DEVICE)}, ValueError,
     r"seq_lens must lie in \[0, max\(N_q, N_k\)\] = \[0, 8\]; got values from -1 to 3"),
    (QKV, {"seq_lens": torch.tensor([2, 9], dtype=torch.int32, device=DEVICE)}, ValueError,
     r"seq_lens must lie in .*got values from 2 to 9"),
    (QKV, {"seq_lens": t(2, dtype=torch.int32, device="meta")}, ValueError,
     r"seq_lens must be on the same device as q \([\w:]+\); got meta"),
    (QKV, {"window": (3,)}, TypeError, r"window must be a pair \(left, right\) .*got \(3,\)"),
    (QKV, {"window": (-2, 0)}, ValueError, r"window left bound must be >= 0, or -1 for unbounded; got window=\(-2, 0\)"),
    (QKV, {"window": (0, 1.5)}, TypeError, r"window right bound must be an int .*got 1.5"),
    (QKV, {"window": (float("inf"), 0)}, TypeError, r"window left bound must be an int \(-1 or None: unbounded\); "
     r"got inf"),
    (QKV, {"layout": "nhd"}, ValueError, r"layout must be one of \('bhnd', 'bnhd'\); got 'nhd'"),
    ((t(2, 8, 16),) * 3, {"layout": "bnhd"}, ValueError, r"layout='bnhd' needs 4D tensors"),
    (QKV, {"causal": "yes"}, TypeError, r"causal must be a bool; got 'yes'"),
    (QKV, {"return_lse": "no"}, TypeError, r"return_lse must be a bool; got 'no'"),
    (QKV, {"softmax_scale": "0.1"}, TypeError, r"softmax_scale must be a float or None; got '0.1'"),
    (QKV, {"softmax_scale": float("inf")}, ValueError, r"softmax_scale must be finite; got inf"),
])
def test_errors_name_the_argument_and_the_values(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        flash_attention(*args, **kwargs)


def test_autotune_pruning_keeps_configs_that_fit_the_head_dim():
    """The early_config_prune hook, called as Triton documents it (named args, then keywords).

    Tensor-core dots ("tf32"); full float32 ("ieee") has its own test in test_precision.py.
    """
    configs, budget = attention_fwd._gpu_configs(), attention_fwd.smem_budget()
    for dtype in (torch.float16, torch.float32):
        q = torch.empty(1, dtype=dtype)
        for call in (lambda **kw: attention_fwd._prune_configs(configs, {"Q": q}, DOT_PRECISION="tf32", **kw),
                     lambda **kw: attention_fwd._prune_configs(configs, {"Q": q, "DOT_PRECISION": "tf32", **kw})):
            capped = [c for c in configs if c.maxnreg is not None]
            assert capped and all(c.maxnreg == attention_fwd.REGISTER_CAP for c in capped)
            # register-capped configs only for 2-byte types (measured there), every other config at D = 32
            assert len(call(BLOCK_D=32, Q_BUCKET=4096)) == len(configs) - (0 if dtype == torch.float16 else len(capped))
            assert not any(c.maxnreg for c in call(BLOCK_D=128, Q_BUCKET=4096))  # the cap spills at D = 128
            assert not any(c.maxnreg for c in call(BLOCK_D=64, Q_BUCKET=4096, HAS_RIGHT=True))  # causal: no gain
            assert not any(c.maxnreg for c in call(BLOCK_D=64, Q_BUCKET=4096, HAS_LEFT=True))
            assert 0 < len(call(BLOCK_D=256, Q_BUCKET=4096)) < len(configs)
            for head_dim in (128, 256):
                kept = call(BLOCK_D=head_dim, Q_BUCKET=4096)
                assert all(attention_fwd.smem_bytes(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], head_dim,
                                                    c.num_stages, q.element_size()) <= budget for c in kept)
            assert {c.kwargs["BLOCK_M"] for c in call(BLOCK_D=64, Q_BUCKET=1)} == {64}  # decoding


# ---------------------------------------------------------------- GPU only
GPU_CASES = [  # (dtype, head_dim, mask) on GPU-sized problems
    (dtype, head_dim, mask)
    for dtype in DTYPES
    for head_dim in (16, 32, 64, 128, 256, 80)
    for mask in ("none", "causal")
] + [(torch.float16, 64, mask) for mask in ("window", "seq_lens", "gqa-bnhd", "cross")] \
  + [(torch.bfloat16, 128, mask) for mask in ("window", "seq_lens", "gqa-bnhd", "cross")]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, head_dim, mask", GPU_CASES, ids=str)
def test_gpu_matches_reference(dtype, head_dim, mask):
    batch, heads, kv_heads, n_q, n_k, layout, kwargs = 2, 4, 4, 1000, 1000, "bhnd", {}
    if mask == "causal":
        kwargs = dict(causal=True)
    elif mask == "window":
        kwargs = dict(window=(200, 17), causal=False)
    elif mask == "seq_lens":
        kwargs = dict(causal=True, seq_lens=[1000, 333])
    elif mask == "gqa-bnhd":
        kv_heads, layout, kwargs = 2, "bnhd", dict(causal=True)
    elif mask == "cross":
        n_q, n_k, kwargs = 300, 1100, dict(causal=True)
    run_and_check(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout, seed=head_dim, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, head_dim, mask", [
    (torch.float16, 64, "causal"), (torch.float16, 128, "none"), (torch.bfloat16, 128, "causal"),
    (torch.float16, 256, "causal"), (torch.bfloat16, 256, "none"), (torch.float32, 64, "causal"),
    (torch.float16, 80, "none"), (torch.float16, 64, "cross"), (torch.bfloat16, 64, "seq_lens"),
], ids=str)
def test_gpu_autotuned(dtype, head_dim, mask):
    """The autotuned kernel (pruned configs per head_dim) on GPU-sized problems."""
    test_gpu_matches_reference(dtype, head_dim, mask)


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", [(128, 64), (64, 128), (128, 32), (64, 32)])
def test_gpu_fixed_blocks_visit_the_visible_blocks(blocks):
    q, k, v = make_inputs(1, 2, 1, 700, 900, 64, torch.float16)
    seq_lens = torch.tensor([650], dtype=torch.int32, device=DEVICE)
    mask = dict(causal=True, window=(300, -1))
    out, lse, tiles = launch_with_tiles(q, k, v, *blocks, seq_lens=seq_lens, **mask)
    assert torch.equal(tiles, expected_tiles(700, 900, *blocks, 1, 2, seq_lens=seq_lens.cpu(), **mask))
    assert_matches(out, lse, *reference(q, k, v, seq_lens=seq_lens.cpu(), **mask), torch.float16)


# ---------------------------------------------------------------- tensor descriptors (TMA) and pointers
def launch_mode(q, k, v, use_tma, seq_lens=None, **mask):
    """The forward launcher on (B, H, N, D) tensors with the descriptor path on or off: (O, L)."""
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    attention_fwd.launch_attention_forward(q, k, v, o, lse, AttentionSpec(**mask), seq_lens=seq_lens,
                                           use_tma=use_tma, block_m=32, block_n=32)
    return o, lse


@pytest.mark.parametrize("n_q, n_k, causal", [(70, 90, True), (64, 256, False), (33, 100, False)],
                         ids=["causal-ragged", "keys-multiple-of-128", "ragged"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_descriptor_and_pointer_paths_agree_with_the_reference(layout, n_q, n_k, causal):
    """Host descriptors (whole tensors), device descriptors (per sample, with seq_lens) and
    pointers give the float64 reference's O and L, on GQA inputs in either layout."""
    q, k, v = make_inputs(2, 4, 2, n_q, n_k, 48, torch.float32, layout, seed=3)
    q, k, v = (as_bhnd(t, layout) for t in (q, k, v))  # strided views for bnhd
    ref_out, ref_lse = reference(q, k, v, causal=causal)
    assert attention_fwd.descriptor_mode(True, padded=False) == "host"
    for use_tma in (True, False):
        out, lse = launch_mode(q, k, v, use_tma, causal=causal)
        assert_matches(out, lse, ref_out, ref_lse, torch.float32)
    lens = torch.tensor([min(n_q, n_k) // 2, n_q], dtype=torch.int32)
    ref_out, ref_lse = reference(q, k, v, causal=causal, seq_lens=lens)
    assert attention_fwd.descriptor_mode(True, padded=True) == "device"
    for use_tma in (True, False):
        out, lse = launch_mode(q, k, v, use_tma, seq_lens=lens.to(DEVICE), causal=causal)
        assert_matches(out, lse, ref_out, ref_lse, torch.float32)


def test_device_descriptors_never_read_the_padding():
    """NaN past a sample's length stays out of its output: descriptors end at seq_len."""
    q, k, v = make_inputs(2, 2, 2, 64, 64, 32, torch.float32, "bhnd", seed=4)
    lens = torch.tensor([40, 64], dtype=torch.int32)
    ref_out, ref_lse = reference(q, k, v, causal=True, seq_lens=lens)
    for t in (q, k, v):
        t[0, :, 40:] = float("nan")
    out, lse = launch_mode(q, k, v, True, seq_lens=lens.to(DEVICE), causal=True)
    assert_matches(out, lse, ref_out, ref_lse, torch.float32)


@pytest.mark.parametrize("scale", [-0.7, 0.0, 0.5], ids=["negative", "zero", "positive"])
def test_negative_scale_on_both_paths(scale):
    """The row max of unmasked blocks is taken on raw scores: a negative scale takes the min."""
    q, k, v = make_inputs(1, 2, 2, 64, 128, 32, torch.float32, "bhnd", seed=5)
    ref_out, ref_lse = reference(q, k, v, softmax_scale=scale)
    for use_tma in (True, False):
        out, lse = launch_mode(q, k, v, use_tma, softmax_scale=scale)
        assert_matches(out, lse, ref_out, ref_lse, torch.float32)


def test_descriptor_ready_needs_16_byte_rows():
    """The copy engine's rule: unit last stride, 16-byte aligned base and row strides."""
    from flashlib.kernels._common import descriptor_ready

    x = torch.zeros(2, 3, 64, 32, dtype=torch.float16)
    assert descriptor_ready(x) and descriptor_ready(x.transpose(1, 2))
    assert not descriptor_ready(torch.zeros(2, 3, 64, 20, dtype=torch.float16)), "40-byte rows"
    assert not descriptor_ready(x[..., 1:17]), "a base 2 bytes off"
    assert not descriptor_ready(x.transpose(2, 3)), "D not contiguous"


def test_unaligned_inputs_take_the_pointer_path_and_stay_correct(monkeypatch):
    """Tensors whose rows start 4 bytes off cannot go through descriptors: the launcher
    falls back to pointers by itself and the result is still the reference's."""
    from flashlib.kernels._common import descriptor_ready

    modes = []
    real = attention_fwd.descriptor_mode
    monkeypatch.setattr(attention_fwd, "descriptor_mode", lambda use, **kw: modes.append(use) or real(use, **kw))
    q, k, v = make_inputs(1, 2, 2, 40, 40, 20, torch.float32, "bhnd", seed=6)
    q, k, v = (t[..., 1:17] for t in (q, k, v))  # 4 bytes off: not 16-byte aligned
    assert not descriptor_ready(q)
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert modes == [False], "the pointer path was chosen"
    assert_matches(out, lse, *reference(q, k, v, causal=True), torch.float32)


def test_pruning_and_block_shapes_accept_host_descriptors():
    """With host descriptors the autotuner's arguments Q, K, V, O are TensorDescriptors: the
    pruner reads their tensor's dtype, and each config's pre_hook gives them its tile."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from flashlib.kernels._common import tile_sources

    q = torch.zeros(1, 2, 256, 64, dtype=torch.float16)
    sources = tile_sources("host", (q, q, q, q))
    assert all(isinstance(s, TensorDescriptor) for s in sources)
    args = dict(zip("QKVO", sources), BLOCK_D=64, Q_BUCKET=256, DOT_PRECISION="tf32")
    kept = attention_fwd._prune_configs(attention_fwd._gpu_configs(), args)
    assert kept, "some config fits"
    config = kept[0]
    config.pre_hook({**args, **config.kwargs})
    bm, bn = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    assert sources[0].block_shape == [1, 1, bm, 64] and sources[3].block_shape == [1, 1, bm, 64]
    assert sources[1].block_shape == [1, 1, bn, 64] and sources[2].block_shape == [1, 1, bn, 64]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("dims", [3, 4])
def test_fast_host_descriptors_equal_tritons_own(dtype, dims):
    """host_descriptor skips Triton's validating constructor after the first descriptor of a dtype
    and rank: every field must still equal what the constructor makes, for each new tensor."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from flashlib.kernels._common import host_descriptor

    for shape in [(2, 3, 256, 64), (1, 5, 128, 32)]:
        t = torch.zeros(shape[-dims:], dtype=dtype).transpose(-3 % dims, -2) if dims == 4 else \
            torch.zeros(shape[-dims:], dtype=dtype)
        made = host_descriptor(t)
        want = TensorDescriptor(t, list(t.shape), list(t.stride()), [1] * (dims - 1) + [16])
        assert type(made) is TensorDescriptor and made.base is t
        assert vars(made) == vars(want), f"fields differ for shape {tuple(t.shape)}, strides {t.stride()}"


def test_fast_host_descriptors_do_not_keep_a_tensor_alive():
    """The template a dtype's descriptors copy must not hold the first tensor it was made from."""
    import gc
    import weakref

    from flashlib.kernels._common import host_descriptor

    t = torch.zeros(1, 2, 64, 32, dtype=torch.float64)  # a dtype no other test makes descriptors of
    alive = weakref.ref(t)
    made = host_descriptor(t)
    del t, made
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("block_n", [128, 256])
def test_key_blocks_wider_than_128_still_reach_the_tail(block_n):
    """The empty third stage is left out only when BLOCK_N divides 128: with 384 keys and
    256-key blocks the last 128 keys are a masked tail, and they count."""
    q, k, v = make_inputs(1, 1, 1, 32, 384, 16, torch.float32, "bhnd", seed=7)
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    attention_fwd.launch_attention_forward(q, k, v, o, lse, AttentionSpec(), block_m=32, block_n=block_n)
    assert_matches(o, lse, *reference(q, k, v), torch.float32)
