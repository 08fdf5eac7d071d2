"""flash_attention backward: gradients equal PyTorch autograd through the float64 reference for
every mask, layout, GQA group, dtype and head_dim; key/query blocks outside the mask never visited;
exact zeros past seq_lens; every gradient element written; autograd wiring (partial requires_grad,
no_grad, layouts, double backward refused)."""
import functools

import pytest
import torch
from hypothesis import given, settings, strategies as st

import flashlib  # noqa: F401  (chooses the interpreter before triton is imported)
import triton
import triton.language as tl

from flashlib import ops as attention_module
from flashlib import flash_attention
from flashlib.kernels import attention_bwd, attention_fwd
from flashlib.kernels._common import key_block_range, query_block_range, sample_bounds
from flashlib.reference import attention_mask, naive_attention
from flashlib.spec import window_bounds
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, DTYPES, as_bhnd, make_inputs, pin_blocks

GRADS = ("dq", "dk", "dv")


# ---------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def fixed_blocks_on_the_gpu(request, monkeypatch):
    """On a GPU every new shape would autotune (a dozen compiles per kernel): tests run fixed
    blocks there, except test_gpu_autotuned_backward, which exercises the backward's autotuners."""
    pin_blocks(monkeypatch, [attention_module], backward=not request.node.name.startswith("test_gpu_autotuned"))


make_inputs = functools.partial(make_inputs, grad_out=True)  # q, k, v and an output gradient do


def flash_grads(q, k, v, do, layout="bhnd", requires=GRADS, **mask):
    """flash_attention's gradients (None for an input that does not require grad), in the inputs' layout."""
    leaves = [t.detach().clone().requires_grad_(name in requires) for name, t in zip(GRADS, (q, k, v))]
    out = flash_attention(*leaves, layout="bhnd" if layout == "3d" else layout, **mask)
    out.backward(do)
    return [t.grad for t in leaves]


def reference_grads(q, k, v, do, layout="bhnd", **mask):
    """PyTorch autograd through naive_attention in float64 on the (rounded) inputs, (B, H, N, D)."""
    leaves = [as_bhnd(t, layout).detach().double().cpu().requires_grad_() for t in (q, k, v)]
    if mask.get("seq_lens") is not None:
        mask = {**mask, "seq_lens": mask["seq_lens"].cpu()}
    naive_attention(*leaves, **mask).backward(as_bhnd(do, layout).double().cpu())
    return [t.grad for t in leaves]


def assert_grads_match(grads, ref, dtype, layout="bhnd", inputs=None, do=None, softmax_scale=None):
    """Relative error per gradient: max |grad - ref| / max |ref| <= tolerance(dtype).

    A gradient whose reference is exactly 0 everywhere (dq and dk when every row sees at most
    one key: softmax is then constant, dS = P * (dP - D) = 0 by exact cancellation) has no scale
    of its own: its error is measured against the size of the terms that cancel,
    ``scale * head_dim * max|dO| * max|V| * max|K|`` (for dq; max|Q| for dk).
    """
    for name, grad, expected, t in zip(GRADS, grads, ref, inputs or (None,) * 3):
        if grad is None or grad.numel() == 0:
            continue
        if t is not None:
            assert grad.shape == t.shape and grad.dtype == t.dtype, f"{name}: shape/dtype differ from the input"
        grad = as_bhnd(grad, layout)
        if (expected == 0).all() and name != "dv" and inputs is not None:
            q, k, v = (as_bhnd(x, layout).double().cpu() for x in inputs)
            head_dim = q.shape[-1]
            scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
            terms = scale * head_dim * as_bhnd(do, layout).double().abs().max() * v.abs().max() \
                * (k if name == "dq" else q).abs().max()
            err = (grad.double().cpu() - expected).abs().max().item() / terms.item()
        else:
            err = relative_error(grad, expected)
        assert err <= tolerance(dtype), f"{name}: relative error {err:.2e} > {tolerance(dtype):.0e}"


def run_and_check(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout="bhnd", seed=0, seq_lens=None,
                  requires=GRADS, **mask):
    """Gradients of flash_attention on fresh inputs in ``layout`` against float64 autograd."""
    q, k, v, do = make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout, seed)
    if seq_lens is not None:
        mask["seq_lens"] = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    grads = flash_grads(q, k, v, do, layout, requires, **mask)
    for name, grad in zip(GRADS, grads):
        assert (grad is not None) == (name in requires), f"{name}: .grad set iff requires_grad"
    assert_grads_match(grads, reference_grads(q, k, v, do, layout, **mask), dtype, layout, (q, k, v), do,
                       mask.get("softmax_scale"))
    return grads


# ---------------------------------------------------------------- the order of the grid
@pytest.mark.parametrize("mask, longest", [(dict(causal=True), True), (dict(window=(-1, 2)), True),
                                           (dict(window=(3, 0)), False), (dict(), False)],
                         ids=["causal", "right-edge", "window", "full"])
def test_longest_first_is_taken_for_right_bounded_grids_and_changes_no_bit(monkeypatch, mask, longest):
    """With a right bound and no left one (causal), the forward and dQ grids run their query blocks last
    to first (attention_fwd.LONGEST_FIRST; dK/dV's longest blocks come first already). Each program
    computes the same block either way: O and every gradient are bitwise those of grid order."""
    seen = []
    for module in (attention_fwd, attention_bwd):
        def spy(fn, grid, *args, _real=module.launch, **kwargs):
            seen.append((fn, kwargs.get("LONGEST_FIRST")))
            return _real(fn, grid, *args, **kwargs)
        monkeypatch.setattr(module, "launch", spy)
    q, k, v, do = make_inputs(2, 3, 1, 75, 75, 16, torch.float32, seed=11)
    results = {}
    for flag in (True, False):
        monkeypatch.setattr(attention_fwd, "LONGEST_FIRST", flag)
        seen.clear()
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = flash_attention(*leaves, **mask)
        out.backward(do)
        results[flag] = [out.detach(), *(t.grad for t in leaves)]
        orders = {fn: order for fn, order in seen}
        assert orders[attention_fwd.attention_fwd_kernel] is (flag and longest)
        assert orders[attention_bwd.attention_bwd_dq_kernel] is (flag and longest)
        assert orders[attention_bwd.attention_bwd_dkdv_kernel] is None
    for first, second in zip(results[True], results[False]):
        assert torch.equal(first, second)
    assert_grads_match(results[True][1:], reference_grads(q, k, v, do, **mask), torch.float32)


# ---------------------------------------------------------------- the order of dK/dV's products
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window=(5, 3), softcap=4.0),
                                  dict(causal=True, dropout_p=0.3)], ids=["full", "causal", "window-softcap", "dropout"])
def test_dp_after_dv_changes_which_tiles_are_live_not_a_bit(monkeypatch, mask):
    """``DP_AFTER_DV`` issues dP^T = V dO^T after dV's product (DKDV_DP_AFTER_DV_CONFIGS; fixed blocks
    take it from ``dp_after_dv``, forced here both ways for every mask). The products and their
    inputs are the same, so dQ, dK and dV are bitwise those of the usual order, dropout included."""
    seen = []

    def spy(fn, grid, *args, _real=attention_bwd.launch, **kwargs):
        if fn is attention_bwd.attention_bwd_dkdv_kernel:
            seen.append(kwargs["DP_AFTER_DV"])
        return _real(fn, grid, *args, **kwargs)
    monkeypatch.setattr(attention_bwd, "launch", spy)
    q, k, v, do = make_inputs(2, 4, 2, 70, 70, 32, torch.float32, seed=12)
    results = {}
    for after in (True, False):
        monkeypatch.setattr(attention_bwd, "dp_after_dv", lambda block_d, has_right, _after=after: _after)
        seen.clear()
        torch.manual_seed(5)  # the dropout seed: the same draw for both orders
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        flash_attention(*leaves, **mask).backward(do)
        assert seen == [after]
        results[after] = [t.grad for t in leaves]
    for late, usual in zip(results[True], results[False]):
        assert torch.equal(late, usual)
    if "dropout_p" not in mask:
        assert_grads_match(results[True], reference_grads(q, k, v, do, **mask), torch.float32)


def test_dp_after_dv_configs_are_tried_only_where_they_were_measured_to_win():
    """The autotuner tries the DP_AFTER_DV configs only from DP_AFTER_DV_MIN_BLOCK_D and without a right
    bound (no causal mask); elsewhere the usual order only."""
    prune = attention_bwd._pruner("dkdv")
    configs = attention_bwd.attention_bwd_dkdv_kernel_autotuned.configs
    late = [c for c in configs if c.kwargs.get("DP_AFTER_DV")]
    assert late and len(late) == len(attention_bwd.DKDV_DP_AFTER_DV_CONFIGS)
    q, tf32, d = torch.empty(1, dtype=torch.float16), {"DOT_PRECISION": "tf32"}, attention_bwd.DP_AFTER_DV_MIN_BLOCK_D
    for block_d, has_right, wanted in ((d // 2, False, False), (d, True, False), (d, False, True)):
        kept = prune(configs, {"Q": q}, BLOCK_D=block_d, HAS_RIGHT=has_right, **tf32)
        assert kept and any(c.kwargs.get("DP_AFTER_DV") for c in kept) is wanted, (block_d, has_right)
    assert attention_bwd.dp_after_dv(d, False) and not attention_bwd.dp_after_dv(d, True)
    assert not attention_bwd.dp_after_dv(d // 2, False)


# ---------------------------------------------------------------- a grid against autograd
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_q, n_k", [(48, 48), (20, 70), (70, 20)], ids=["self", "decode-like", "q-longer"])
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grid_matches_float64_autograd(causal, layout, heads, kv_heads, n_q, n_k, dtype):
    run_and_check(1, heads, kv_heads, n_q, n_k, 32, dtype, layout, seed=n_q * 7 + n_k, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [16, 24, 40, 64, 80, 128, 256], ids=lambda d: f"d{d}")
def test_every_head_dim(head_dim, dtype):
    """Powers of two, and others padded to the next power of two with a mask on d."""
    run_and_check(1, 2, 1, 33, 45, head_dim, dtype, seed=head_dim, causal=head_dim % 32 == 0)


def test_softmax_scale_is_used():
    run_and_check(1, 2, 2, 30, 30, 16, torch.float32, softmax_scale=0.9, causal=True)


# ---------------------------------------------------------------- hypothesis: any shape and mask
@st.composite
def problems(draw, layouts=("bhnd", "bnhd", "3d"), dtypes=DTYPES):
    layout = draw(st.sampled_from(layouts))
    batch = draw(st.integers(1, 2))
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads if layout == "3d" else kv_heads * draw(st.integers(1, 3))
    n_q = draw(st.integers(1, 70))
    n_k = draw(st.one_of(st.just(n_q), st.integers(1, 70)))
    longest = max(n_q, n_k)
    n_lens = batch * heads if layout == "3d" else batch
    seq_len = st.one_of(st.just(0), st.just(longest), st.integers(0, longest))
    bound = st.one_of(st.just(-1), st.integers(0, 40))
    head_dim = draw(st.sampled_from([16, 32]))
    return dict(
        batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q, n_k=n_k, layout=layout,
        head_dim=head_dim, dtype=draw(st.sampled_from(dtypes)),
        causal=draw(st.booleans()),
        window=draw(st.one_of(st.none(), st.tuples(bound, bound))),
        seq_lens=draw(st.one_of(st.none(), st.lists(seq_len, min_size=n_lens, max_size=n_lens))),
        softmax_scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0).map(lambda f: f / head_dim ** 0.5))),
        requires=draw(st.sampled_from([GRADS, GRADS, ("dq",), ("dk", "dv"), ("dv",)])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=100, deadline=None, derandomize=True)
@given(problem=problems())
def test_any_problem_matches_autograd(problem):
    run_and_check(**problem)


# ---------------------------------------------------------------- block skipping: the band bounds
@triton.jit
def band_probe_kernel(OUT, SEQ_LENS, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, N_BLOCKS,
                      HAS_SEQ_LENS: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                      PER_QUERY_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT[b, block] = (lo, full_lo, full_hi, hi) as the dQ kernel (PER_QUERY_BLOCK) or the dK/dV
    kernel computes them, with the kernels' own q_len, k_len and offset."""
    block = tl.program_id(0)
    b = tl.program_id(1)
    _, n_q, q_len, _, n_k, k_len = sample_bounds(b, SEQ_LENS, SEQ_LENS, SEQ_LENS, N_CTX_Q, N_CTX_K,
                                                 HAS_SEQ_LENS, False)  # a padded batch: no cu_seqlens read
    offset = n_k - n_q
    if PER_QUERY_BLOCK:
        lo, full_lo, full_hi, hi = key_block_range(block * BLOCK_M, q_len, k_len, offset, WINDOW_LEFT,
                                                    WINDOW_RIGHT, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    else:
        lo, full_lo, full_hi, hi = query_block_range(block * BLOCK_N, q_len, k_len, offset, WINDOW_LEFT,
                                                      WINDOW_RIGHT, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    out = OUT + (b * N_BLOCKS + block) * 4
    tl.store(out, lo)
    tl.store(out + 1, full_lo)
    tl.store(out + 2, full_hi)
    tl.store(out + 3, hi)


def visited_blocks(n_q, n_k, block_m, block_n, per_query_block, causal, window, seq_lens, batch):
    """(B, query blocks, key blocks) int8: 1 visited without mask, 2 with mask, 0 skipped, as the
    kernels' three loops over [lo, full_lo), [full_lo, full_hi), [full_hi, hi) visit them."""
    left, right = window_bounds(causal, window)
    n_mb, n_nb = -(-n_q // block_m), -(-n_k // block_n)
    n_blocks, step = (n_mb, block_n) if per_query_block else (n_nb, block_m)
    bounds = torch.zeros(batch, n_blocks, 4, dtype=torch.int32, device=DEVICE)
    band_probe_kernel[(n_blocks, batch)](
        bounds, None if seq_lens is None else seq_lens.to(DEVICE), n_q, n_k, left or 0, right or 0, n_blocks,
        HAS_SEQ_LENS=seq_lens is not None, HAS_LEFT=left is not None, HAS_RIGHT=right is not None,
        PER_QUERY_BLOCK=per_query_block, BLOCK_M=block_m, BLOCK_N=block_n)
    tiles = torch.zeros(batch, n_mb, n_nb, dtype=torch.int8)
    for b in range(batch):
        for block in range(n_blocks):
            lo, full_lo, full_hi, hi = bounds[b, block].cpu().tolist()
            for start, end, kind in ((lo, full_lo, 2), (full_lo, full_hi, 1), (full_hi, hi, 2)):
                for other in range(start, end, step):
                    i, j = (block, other // block_n) if per_query_block else (other // block_m, block)
                    assert tiles[b, i, j] == 0, f"block ({i}, {j}) visited twice"
                    tiles[b, i, j] = kind
    return tiles


def needed_blocks(n_q, n_k, block_m, block_n, per_query_block, causal, window, seq_lens, batch):
    """Blocks a kernel must visit: 0 no visible (query, key) pair, 1 every pair visible and no
    element mask needed, 2 otherwise. The dQ kernel (per query block) computes rows past q_len
    without a mask and zeroes them at the end, as the forward does; the dK/dV kernel needs every
    row of an unmasked block to be valid."""
    allowed = attention_mask(n_q, n_k, causal=causal, window=window, seq_lens=seq_lens, batch=batch)[:, 0]
    lens = [max(n_q, n_k)] * batch if seq_lens is None else seq_lens.tolist()
    tiles = torch.zeros(batch, -(-n_q // block_m), -(-n_k // block_n), dtype=torch.int8)
    for b, length in enumerate(lens):
        q_len, k_len = min(length, n_q), min(length, n_k)
        for i in range(tiles.shape[1]):
            for j in range(tiles.shape[2]):
                block = allowed[b, i * block_m:min((i + 1) * block_m, q_len), j * block_n:(j + 1) * block_n]
                if block.any():
                    whole = (j + 1) * block_n <= k_len and (per_query_block or (i + 1) * block_m <= q_len)
                    tiles[b, i, j] = 1 if block.all() and whole else 2
    return tiles


@settings(max_examples=300, deadline=None, derandomize=True)
@given(problem=problems(layouts=["bhnd"], dtypes=[torch.float32]),
       block_m=st.sampled_from([16, 32, 64]), block_n=st.sampled_from([16, 32, 64]))
def test_blocks_visited_are_exactly_the_visible_ones(problem, block_m, block_n):
    """Block skipping in both kernels: a block with no visible pair is never loaded, one with
    every pair visible gets no mask."""
    p = problem
    lens = None if p["seq_lens"] is None else torch.tensor(p["seq_lens"], dtype=torch.int32)
    shape = (p["n_q"], p["n_k"], block_m, block_n)
    mask = dict(causal=p["causal"], window=p["window"], seq_lens=lens, batch=p["batch"])
    for per_query_block in (True, False):
        got = visited_blocks(*shape, per_query_block, **mask)
        expected = needed_blocks(*shape, per_query_block, **mask)
        assert torch.equal(got, expected), f"visited (0 skip, 1 full, 2 masked):\n{got}\nexpected\n{expected}"


def test_causal_skips_blocks_in_both_kernels():
    mask = dict(causal=True, window=None, seq_lens=None, batch=1)
    expected = [[2, 0, 0, 0],
                [1, 2, 0, 0],
                [1, 1, 2, 0],
                [1, 1, 1, 2]]
    for per_query_block in (True, False):
        assert visited_blocks(64, 64, 16, 16, per_query_block, **mask)[0].tolist() == expected
    # no mask, N_k = 56: the dK/dV program of the key block cut by N_k masks every query block
    no_mask = dict(mask, causal=False)
    assert visited_blocks(64, 56, 16, 16, False, **no_mask)[0].tolist() == [[1, 1, 1, 2]] * 4


# ---------------------------------------------------------------- padding, rows without keys, poisoned outputs
@pytest.mark.parametrize("n_q, n_k", [(40, 40), (30, 50), (50, 30)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_past_seq_lens_are_exactly_zero(causal, n_q, n_k):
    lens = [0, 17, max(n_q, n_k) - 3]
    dq, dk, dv = run_and_check(3, 4, 2, n_q, n_k, 16, torch.float32, seq_lens=lens, causal=causal)
    for b, length in enumerate(lens):
        assert (dq[b, :, min(length, n_q):] == 0).all(), "dq of padding queries"
        assert (dk[b, :, min(length, n_k):] == 0).all() and (dv[b, :, min(length, n_k):] == 0).all(), \
            "dk, dv of padding keys"
    assert all(g[2].abs().sum() > 0 for g in (dq, dk, dv)), "the long sample has gradients"
    assert (dq[0] == 0).all() and (dk[0] == 0).all() and (dv[0] == 0).all(), "an empty sample has none"


def test_dq_past_seq_lens_is_zero_even_when_a_valid_value_is_infinite():
    """dQ of the rows past seq_len is selected to 0, not left to the product: an infinite value at a
    valid key makes every row's dP NaN there (the valid rows' gradients are NaN, as in PyTorch), and a
    padding row, whose P is 0, would get 0 * NaN."""
    q, k, v, do = make_inputs(2, 2, 2, 40, 40, 16, torch.float32, seed=3, grad_out=True)
    v[0, :, 5, 3] = float("inf")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves, seq_lens=torch.tensor([17, 40], dtype=torch.int32, device=q.device)).backward(do)
    dq = leaves[0].grad
    assert (dq[0, :, 17:] == 0).all(), "dq of padding queries"
    assert dq[0, :, :17].isnan().any(), "the valid rows see the infinity"


@pytest.mark.parametrize("n_q, n_k, mask", [
    (40, 10, dict(causal=True)),                       # the first 30 rows see no key: their dq is 0
    (20, 50, dict(window=(0, 0))),                     # keys 0..29 seen by nobody: their dk, dv are 0
    (30, 30, dict(window=(2, -1), causal=True, seq_lens=[30, 0])),
])
def test_rows_and_keys_outside_the_mask_get_exact_zeros(n_q, n_k, mask):
    dq, dk, dv = run_and_check(2, 2, 1, n_q, n_k, 16, torch.float32, **mask)
    if n_q > n_k:
        assert (dq[:, :, :n_q - n_k] == 0).all()
    if n_k > n_q:
        assert (dk[:, :, :n_k - n_q] == 0).all() and (dv[:, :, :n_k - n_q] == 0).all()


@pytest.mark.parametrize("layout", ["bhnd", "bnhd", "3d"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_gradient_element_is_written(nan_empty, layout, dtype):
    """Key blocks no query sees (window), padding (seq_lens, one sample empty): all written."""
    heads, kv_heads = (2, 2) if layout == "3d" else (4, 2)
    lens = [0, 37, 9, 20][:4 if layout == "3d" else 2]
    run_and_check(2, heads, kv_heads, 37, 70, 16, dtype, layout, window=(3, 0), seq_lens=lens)
    assert len(nan_empty) >= 5, "outputs and gradients must come from torch.empty for this test to mean anything"


def test_no_keys_and_no_queries_give_zero_gradients():
    q, k, v, do = make_inputs(1, 2, 2, 5, 0, 16, torch.float32)
    dq, dk, dv = flash_grads(q, k, v, do)
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape
    q, k, v, do = make_inputs(1, 2, 2, 0, 5, 16, torch.float32)
    dq, dk, dv = flash_grads(q, k, v, do)
    assert dq.shape == q.shape and (dk == 0).all() and (dv == 0).all()


# ---------------------------------------------------------------- autograd wiring
@pytest.mark.parametrize("requires", [("dq",), ("dk",), ("dv",), ("dk", "dv"), ("dq", "dv")], ids="+".join)
def test_only_some_inputs_require_grad(requires, monkeypatch):
    """Inputs without requires_grad get no .grad, and kernels they alone need are not run."""
    seen = []
    real = attention_module.launch_attention_backward

    def spy(q, k, v, o, lse, do, dq, dk, dv, **kwargs):
        seen.append((dq is not None, dk is not None))
        return real(q, k, v, o, lse, do, dq, dk, dv, **kwargs)

    monkeypatch.setattr(attention_module, "launch_attention_backward", spy)
    run_and_check(2, 4, 2, 30, 40, 16, torch.float32, "bnhd", requires=requires, causal=True)
    assert seen == [("dq" in requires, "dk" in requires or "dv" in requires)]


def test_no_grad_and_inputs_without_grad_give_plain_outputs():
    q, k, v, _ = make_inputs(1, 2, 2, 20, 20, 16, torch.float32)
    plain = flash_attention(q, k, v, causal=True)
    assert not plain.requires_grad and plain.grad_fn is None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.no_grad():
        out = flash_attention(*leaves, causal=True)
    assert not out.requires_grad and torch.equal(out, plain)
    out, lse = flash_attention(*leaves, causal=True, return_lse=True)
    assert out.requires_grad and not lse.requires_grad, "L is returned without gradient"


@pytest.mark.parametrize("layout", ["bhnd", "bnhd", "3d", "packed"])
def test_loss_backward_fills_grad_in_each_layout(layout):
    """.grad has the input's shape, dtype and strides, and the reference's values."""
    if layout == "packed":  # q, k, v sliced out of one (B, N, 3, H, D) projection
        qkv = torch.randn(2, 33, 3, 4, 32, device=DEVICE, requires_grad=True)
        out = flash_attention(*qkv.unbind(2), layout="bnhd", causal=True)
        do = torch.randn_like(out)
        out.backward(do)
        ref = reference_grads(*qkv.detach().unbind(2), do, "bnhd", causal=True)
        assert qkv.grad.shape == qkv.shape
        assert_grads_match([g.transpose(1, 2) for g in qkv.grad.unbind(2)], ref, torch.float32)
        return
    q, k, v, do = make_inputs(2, 4, 4 if layout == "3d" else 2, 40, 24, 32, torch.float32, layout)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    loss = (flash_attention(*leaves, causal=True, layout="bhnd" if layout == "3d" else layout) * do).sum()
    loss.backward()
    for t in leaves:
        assert t.grad.shape == t.shape and t.grad.stride() == t.stride() and t.grad.dtype == t.dtype
    assert_grads_match([t.grad for t in leaves], reference_grads(q, k, v, do, layout, causal=True),
                       torch.float32, layout)


def test_double_backward_is_refused_with_a_clear_error():
    q, k, v, do = make_inputs(1, 2, 1, 20, 20, 16, torch.float32)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    for loss_of in (lambda out: (out * do).sum(), lambda out: (out ** 2).sum()):
        grads = torch.autograd.grad(loss_of(flash_attention(*leaves, causal=True)), leaves, create_graph=True)
        assert all(g.requires_grad for g in grads)
        with pytest.raises(RuntimeError, match="flash_attention has no double backward"):
            sum(g.sum() for g in grads).backward()
    # the first-order gradients under create_graph are the ordinary ones
    grads = torch.autograd.grad((flash_attention(*leaves, causal=True) * do).sum(), leaves, create_graph=True)
    assert_grads_match(grads, reference_grads(q, k, v, do, causal=True), torch.float32)


def test_forward_over_reverse_is_refused_with_the_double_backward_error():
    """A tangent of a gradient (torch.func.jvp of torch.func.grad, a Hessian-vector product; or a dual tensor's
    gradient taken with create_graph) raises flash_attention's own message, not torch's generic "You must implement
    the jvp function for custom autograd.Function"."""
    q, k, v, _ = make_inputs(1, 2, 1, 20, 20, 16, torch.float32)

    def loss(q):
        return flash_attention(q, k, v, causal=True).square().sum()

    with pytest.raises(RuntimeError, match="flash_attention has no double backward"):
        torch.func.jvp(torch.func.grad(loss), (q,), (torch.randn_like(q),))
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(q, torch.randn_like(q)).requires_grad_()
        with pytest.raises(RuntimeError, match="flash_attention has no double backward"):
            torch.autograd.grad(loss(dual), dual, create_graph=True)


def test_a_window_bound_past_every_sequence_gives_the_unbounded_gradients():
    """A bound as long as the sequences or past int32 (where the kernels' sums would wrap round) means unbounded, as
    -1 does, in both backward kernels."""
    q, k, v, do = make_inputs(1, 2, 1, 24, 8, 16, torch.float32)
    for side in (0, 1):
        unbounded = flash_grads(q, k, v, do, window=(0, -1) if side else (-1, 0))
        for bound in (24, 2**31 - 2, 2**31 - 1, 2**63):
            window = (0, bound) if side else (bound, 0)
            assert all(torch.equal(a, b) for a, b in zip(flash_grads(q, k, v, do, window=window), unbounded)), window


def test_gradients_are_deterministic():
    """No atomics: the same inputs give bitwise the same gradients (GQA sums included)."""
    q, k, v, do = make_inputs(2, 6, 2, 50, 60, 16, torch.float16, "bnhd")
    first = flash_grads(q, k, v, do, "bnhd", causal=True)
    second = flash_grads(q, k, v, do, "bnhd", causal=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def gradcheck_problem(mask, seed=3):
    """A float64 function of three 6-vectors (one per input) through flash_attention in float32.

    flash_attention takes float16/bfloat16/float32 only, so gradcheck cannot feed it float64.
    Instead q, k, v = base + lift @ x (float64, rounded to float32) and the output is projected
    on 8 random directions in float64: gradcheck then compares a 8 x 18 Jacobian, a random
    slice of the full one, with finite differences. Their noise is float32's rounding over eps,
    6e-8 / 1e-3 = 6e-5: atol=1e-4, rtol=1e-3 sit above it, and a gradient wrong by 0.5% fails
    (test_gradcheck_catches_a_gradient_off_by_half_a_percent).
    """
    gen = torch.Generator().manual_seed(seed)
    shapes = [(2, 2, 7, 16), (2, 1, 9, 16), (2, 1, 9, 16)]  # GQA, N_q != N_k
    base = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    lifts = [torch.randn(*s, 6, generator=gen, dtype=torch.float64) / 6 ** 0.5 for s in shapes]
    n_out = 2 * 2 * 7 * 16
    project = torch.randn(n_out, 8, generator=gen, dtype=torch.float64) / n_out ** 0.5
    if "seq_lens" in mask:
        mask = {**mask, "seq_lens": torch.tensor(mask["seq_lens"], dtype=torch.int32, device=DEVICE)}

    def fn(*xs):
        q, k, v = ((b + lift @ x).to(DEVICE, torch.float32) for b, lift, x in zip(base, lifts, xs))
        return flash_attention(q, k, v, **mask).double().cpu().reshape(-1) @ project

    xs = [torch.zeros(6, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    return fn, xs


def gradcheck(fn, xs):
    return torch.autograd.gradcheck(fn, xs, eps=1e-3, atol=1e-4, rtol=1e-3, raise_exception=False)


@pytest.mark.parametrize("mask", [dict(causal=True, seq_lens=[7, 4]), dict(window=(2, 1))],
                         ids=["causal-lens", "window"])
def test_gradcheck(mask):
    assert gradcheck(*gradcheck_problem(mask))


def test_gradcheck_catches_a_gradient_off_by_half_a_percent(monkeypatch):
    real = attention_module.launch_attention_backward

    def off(q, k, v, o, lse, do, dq, dk, dv, **kwargs):
        delta = real(q, k, v, o, lse, do, dq, dk, dv, **kwargs)
        dk.mul_(1.005)
        return delta

    monkeypatch.setattr(attention_module, "launch_attention_backward", off)
    assert not gradcheck(*gradcheck_problem(dict(causal=True)))


# ---------------------------------------------------------------- autotune configs
def test_autotune_pruning_keeps_configs_that_fit_the_head_dim():
    """The early_config_prune hooks, called as Triton documents it (named args, then keywords).

    Tensor-core dots ("tf32"); full float32 ("ieee") has its own test in test_precision.py.
    """
    budget = attention_fwd.smem_budget()
    for name, configs in (("dkdv", attention_bwd.DKDV_GPU_CONFIGS), ("dq", attention_bwd.DQ_GPU_CONFIGS)):
        configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=s, num_warps=w)
                   for bm, bn, s, w in configs]
        prune = attention_bwd._pruner(name)
        for dtype in (torch.float16, torch.float32):
            q = torch.empty(1, dtype=dtype)
            tf32 = {"DOT_PRECISION": "tf32"}
            assert len(prune(configs, {"Q": q}, BLOCK_D=32, **tf32)) == len(configs)
            assert len(prune(configs, {"Q": q, "BLOCK_D": 32, **tf32})) == len(configs)
            for head_dim in (128, 256):
                kept = prune(configs, {"Q": q}, BLOCK_D=head_dim, **tf32)
                assert kept and all(attention_bwd.smem_bytes(name, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"],
                                                             head_dim, c.num_stages, q.element_size()) <= budget
                                    for c in kept)
            assert 0 < len(prune(configs, {"Q": q}, BLOCK_D=256, **tf32)) < len(configs)


# ---------------------------------------------------------------- GPU only
GPU_CASES = [  # (dtype, head_dim, mask) on GPU-sized problems
    (dtype, head_dim, mask)
    for dtype in DTYPES
    for head_dim in (16, 64, 128, 256, 80)
    for mask in ("none", "causal")
] + [(torch.float16, 64, mask) for mask in ("window", "seq_lens", "gqa-bnhd", "cross", "decode", "one-key")] \
  + [(torch.bfloat16, 128, mask) for mask in ("window", "seq_lens", "gqa-bnhd", "cross")]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, head_dim, mask", GPU_CASES, ids=str)
def test_gpu_matches_autograd(dtype, head_dim, mask):
    batch, heads, kv_heads, n_q, n_k, layout, kwargs = 2, 4, 4, 700, 700, "bhnd", {}
    if mask == "causal":
        kwargs = dict(causal=True)
    elif mask == "window":
        kwargs = dict(window=(200, 17))
    elif mask == "seq_lens":
        kwargs = dict(causal=True, seq_lens=[700, 333])
    elif mask == "gqa-bnhd":
        kv_heads, layout, kwargs = 2, "bnhd", dict(causal=True)
    elif mask == "cross":
        n_q, n_k, kwargs = 300, 900, dict(causal=True)
    elif mask == "decode":  # one query (N_q = 1 is a compile-time constant for Triton)
        n_q, n_k, kwargs = 1, 513, dict(causal=True)
    elif mask == "one-key":
        n_q, n_k = 300, 1
    run_and_check(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout, seed=head_dim, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, head_dim, mask", [
    (torch.float16, 64, "causal"), (torch.bfloat16, 128, "gqa-bnhd"), (torch.float16, 256, "seq_lens"),
], ids=str)
def test_gpu_autotuned_backward(dtype, head_dim, mask):
    """The autotuned backward kernels (pruned configs per head_dim) on GPU-sized problems."""
    test_gpu_matches_autograd(dtype, head_dim, mask)
