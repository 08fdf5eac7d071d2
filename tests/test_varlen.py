"""flash_attention_varlen: packed sequences of different lengths against the float64 reference
applied to each sequence alone (forward, L and gradients); the same as flash_attention on a padded
batch when lengths are equal; every output element written; pack/unpack; clear errors."""

import pytest
import torch

from flashlib import flash_attention, flash_attention_varlen, pack_sequences, unpack_sequences
from flashlib import ops as ops_module
from flashlib.reference import naive_attention
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, DTYPES, pin_blocks



# ---------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def fixed_blocks_on_the_gpu(request, monkeypatch):
    """On a GPU every new shape would autotune: tests run fixed blocks there, except
    test_gpu_autotuned_varlen, which exercises the autotuners (the interpreter never autotunes)."""
    if not request.node.name.startswith("test_gpu_autotuned"):
        pin_blocks(monkeypatch, [ops_module])


def make_packed(lens_q, lens_k, heads, kv_heads, head_dim, dtype, seed=0):
    """Fresh random packed q, k, v, an output gradient do, and the offsets of each."""
    gen = torch.Generator().manual_seed(seed)

    def one(lens, h):
        seqs = [torch.randn(n, h, head_dim, generator=gen, dtype=torch.float64).to(DEVICE, dtype) for n in lens]
        return pack_sequences(seqs)

    (q, cu_q, max_q), (k, cu_k, max_k), (v, _, _) = one(lens_q, heads), one(lens_k, kv_heads), one(lens_k, kv_heads)
    do = torch.randn(q.shape, generator=gen, dtype=torch.float64).to(DEVICE, dtype)
    return q, k, v, do, cu_q, cu_k, max_q, max_k


def reference(q, k, v, do, cu_q, cu_k, **mask):
    """naive_attention in float64 on each sequence alone, with autograd: packed O, L (H, total_q), dq, dk, dv."""
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    outs, lses = [], []
    cu_q, cu_k = cu_q.cpu(), cu_k.cpu()
    for qs, ks, vs, dos in zip(unpack_sequences(leaves[0], cu_q), unpack_sequences(leaves[1], cu_k),
                               unpack_sequences(leaves[2], cu_k), unpack_sequences(do.double().cpu(), cu_q)):
        if qs.shape[0] == 0 or ks.shape[0] == 0:  # nothing to attend (naive_attention needs keys): O = 0, L = -inf
            outs.append(torch.zeros_like(qs))
            lses.append(torch.full((qs.shape[1], qs.shape[0]), float("-inf"), dtype=torch.float64))
            continue
        out, lse = naive_attention(*(t.transpose(0, 1)[None] for t in (qs, ks, vs)), return_lse=True, **mask)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
        (out[0].transpose(0, 1) * dos).sum().backward()
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]
    return torch.cat(outs), torch.cat(lses, dim=1), grads


def lse_tolerance(dtype):
    """Scores are summed in float32 whatever the inputs' dtype: L is float32-accurate."""
    return tolerance(torch.float32) if dtype != torch.float32 else tolerance(dtype)


def run_and_check(lens_q, lens_k, heads=2, kv_heads=2, head_dim=16, dtype=torch.float32, seed=0, grads=True,
                  **mask):
    """flash_attention_varlen (and its gradients) on fresh inputs against each sequence alone in float64."""
    q, k, v, do, cu_q, cu_k, max_q, max_k = make_packed(lens_q, lens_k, heads, kv_heads, head_dim, dtype, seed)
    leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
    out, lse = flash_attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, return_lse=True, **mask)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (heads, q.shape[0])
    assert lse.dtype == torch.float32 and not lse.requires_grad
    ref_out, ref_lse, ref_grads = reference(q, k, v, do, cu_q, cu_k, **mask)
    err = relative_error(out, ref_out)
    assert err <= tolerance(dtype), f"O: relative error {err:.2e} > {tolerance(dtype):.0e}"
    no_key = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse.cpu()), no_key), "L is -inf exactly on the rows that see no key"
    assert (out.cpu().transpose(0, 1)[no_key] == 0).all(), "rows that see no key give exactly 0"
    if (~no_key).any():
        lse_err = relative_error(lse.cpu()[~no_key], ref_lse[~no_key])
        assert lse_err <= lse_tolerance(dtype), f"L: relative error {lse_err:.2e}"
    if grads:
        out.backward(do)
        for name, leaf, expected in zip("qkv", leaves, ref_grads):
            assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == dtype
            err = relative_error(leaf.grad, expected)
            assert err <= tolerance(dtype), f"d{name}: relative error {err:.2e} > {tolerance(dtype):.0e}"
    return out, lse, [leaf.grad for leaf in leaves]


# ---------------------------------------------------------------- against each sequence alone
LENGTH_MIXES = {  # (lens_q, lens_k): blocks are 32 rows in the interpreter
    "mixed": ([5, 40, 1, 33], [5, 40, 1, 33]),
    "empty-seq": ([7, 0, 45], [7, 0, 45]),
    "one-token": ([1, 1, 2], [1, 1, 2]),
    "cross": ([3, 50, 20, 0], [9, 35, 64, 4]),  # q lengths != k lengths, one sequence with keys only
    "no-keys": ([6, 12], [0, 12]),              # a sequence whose queries see no key at all
}


@pytest.mark.parametrize("mix", LENGTH_MIXES)
@pytest.mark.parametrize("mask", [dict(), dict(causal=True)], ids=["full", "causal"])
def test_matches_each_sequence_alone(mask, mix):
    run_and_check(*LENGTH_MIXES[mix], seed=len(mix), **mask)


@pytest.mark.parametrize("mask", [
    dict(window=(3, 2)),
    dict(window=(10, -1), causal=True),
    dict(window=(-1, 0), softmax_scale=0.7),
    dict(causal=True, softmax_scale=0.05),
], ids=str)
def test_windows_and_softmax_scale(mask):
    run_and_check([17, 2, 40], [30, 5, 40], seed=3, **mask)


def test_a_window_bound_past_every_sequence_is_unbounded():
    """A bound as long as the pack or past int32 (where the kernels' sums would wrap round, or Triton would refuse
    the int) reaches every key of its sequence, as -1 does."""
    q, k, v, _, cu_q, cu_k, max_q, max_k = make_packed([17, 2], [30, 5], 2, 2, 16, torch.float32)
    for side in (0, 1):
        unbounded = flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, window=(0, -1) if side else (-1, 0))
        for bound in (35, 2**31 - 2, 2**31 - 1, 2**63, 2**64):
            out = flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, window=(0, bound) if side else (bound, 0))
            assert torch.equal(out, unbounded), bound


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (3, 1)], ids=["gqa", "mqa"])
def test_gqa(heads, kv_heads):
    run_and_check([13, 0, 35], [20, 4, 35], heads=heads, kv_heads=kv_heads, causal=True, seed=heads)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [24, 64])
def test_dtypes_and_head_dims(dtype, head_dim):
    run_and_check([9, 34], [9, 34], heads=2, kv_heads=1, head_dim=head_dim, dtype=dtype, causal=True, seed=head_dim)


def test_softmax_scale_is_used():
    q, k, v, _, cu_q, cu_k, max_q, max_k = make_packed([10, 20], [10, 20], 2, 2, 16, torch.float32)
    plain = flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    assert relative_error(flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=0.9), plain) > 1e-2


def test_max_seqlen_larger_than_needed_changes_nothing():
    """The grid covers max_seqlen rows per sequence; the extra programs exit without writing."""
    q, k, v, _, cu_q, cu_k, max_q, max_k = make_packed([5, 20], [7, 20], 2, 2, 16, torch.float32)
    exact = flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    assert torch.equal(flash_attention_varlen(q, k, v, cu_q, cu_k, max_q + 70, max_k + 40, causal=True), exact)


def test_equal_lengths_match_flash_attention_on_the_batch():
    """B sequences of the same length packed = a (B, N, H, D) batch: bitwise the same O and L."""
    batch, n, heads, kv_heads, head_dim = 3, 37, 4, 2, 16
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch, n, heads, head_dim, generator=gen).to(DEVICE)
    k, v = (torch.randn(batch, n, kv_heads, head_dim, generator=gen).to(DEVICE) for _ in range(2))
    cu = torch.arange(0, (batch + 1) * n, n, dtype=torch.int32, device=DEVICE)
    for mask in (dict(), dict(causal=True, window=(5, -1))):
        out, lse = flash_attention(q, k, v, layout="bnhd", return_lse=True, **mask)
        packed, packed_lse = flash_attention_varlen(*(t.reshape(batch * n, -1, head_dim) for t in (q, k, v)),
                                                    cu, cu, n, n, return_lse=True, **mask)
        assert torch.equal(packed, out.reshape(batch * n, heads, head_dim))
        assert torch.equal(packed_lse, lse.permute(1, 0, 2).reshape(heads, batch * n))


# ---------------------------------------------------------------- every element written, no copies
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_output_and_gradient_element_is_written(nan_empty, dtype):
    """Length-0 sequences, keys no query sees (window), rows that see no key: all written."""
    out, lse, grads = run_and_check([0, 37, 9, 0], [3, 45, 0, 0], heads=2, kv_heads=1, dtype=dtype, window=(3, 0))
    assert len(nan_empty) >= 5, "outputs and gradients must come from torch.empty for this test to mean anything"
    for name, t in (("O", out), ("L", lse), *zip(("dq", "dk", "dv"), grads)):
        assert not torch.isnan(t).any(), f"{name} has unwritten (NaN) elements"


def test_strided_inputs_reach_the_kernel_without_copies(monkeypatch):
    """q, k, v sliced out of one packed (total, 3, H, D) projection are read in place."""
    seen = []
    real = ops_module.launch_attention_forward

    def spy(q, k, v, o, lse, **kwargs):
        seen.append((q, k, v))
        return real(q, k, v, o, lse, **kwargs)

    monkeypatch.setattr(ops_module, "launch_attention_forward", spy)
    qkv = torch.randn(50, 3, 2, 16, device=DEVICE)
    q, k, v = qkv.unbind(1)
    cu = torch.tensor([0, 20, 50], dtype=torch.int32, device=DEVICE)
    out = flash_attention_varlen(q, k, v, cu, cu, 30, 30, causal=True)
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(seen[0], (q, k, v)))
    ref, _, _ = reference(q, k, v, torch.zeros_like(q), cu, cu, causal=True)
    assert relative_error(out, ref) <= tolerance(torch.float32)


# ---------------------------------------------------------------- autograd
def test_only_some_inputs_require_grad_and_no_grad():
    q, k, v, do, cu_q, cu_k, max_q, max_k = make_packed([8, 21], [12, 21], 2, 1, 16, torch.float32)
    _, _, ref = reference(q, k, v, do, cu_q, cu_k, causal=True)
    for requires in ("q", "kv", "v"):
        leaves = [t.clone().requires_grad_(name in requires) for name, t in zip("qkv", (q, k, v))]
        flash_attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, causal=True).backward(do)
        for name, leaf, expected in zip("qkv", leaves, ref):
            assert (leaf.grad is not None) == (name in requires)
            if leaf.grad is not None:
                assert relative_error(leaf.grad, expected) <= tolerance(torch.float32)
    with torch.no_grad():
        out = flash_attention_varlen(*(t.requires_grad_() for t in (q, k, v)), cu_q, cu_k, max_q, max_k)
    assert not out.requires_grad


def test_double_backward_is_refused():
    q, k, v, do, cu_q, cu_k, max_q, max_k = make_packed([8, 21], [12, 21], 2, 1, 16, torch.float32)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = flash_attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, causal=True)
    grads = torch.autograd.grad((out * do).sum(), leaves, create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward"):
        sum(g.sum() for g in grads).backward()


def test_gradcheck():
    """As tests/kernels/test_attention_bwd.py: flash_attention_varlen takes no float64, so gradcheck sees a float64
    function of three 3-vectors (q, k, v = base + lift @ x, rounded to float32), projected on 8 directions."""
    gen = torch.Generator().manual_seed(3)
    cu_q = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 7, 9, 18], dtype=torch.int32, device=DEVICE)
    shapes = [(12, 2, 16), (18, 1, 16), (18, 1, 16)]
    base = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    lifts = [torch.randn(*s, 3, generator=gen, dtype=torch.float64) / 3 ** 0.5 for s in shapes]
    project = torch.randn(12 * 2 * 16, 8, generator=gen, dtype=torch.float64) / (12 * 2 * 16) ** 0.5

    def fn(*xs):
        q, k, v = ((b + lift @ x).to(DEVICE, torch.float32) for b, lift, x in zip(base, lifts, xs))
        return flash_attention_varlen(q, k, v, cu_q, cu_k, 7, 9, causal=True).double().cpu().reshape(-1) @ project

    xs = [torch.zeros(3, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    assert torch.autograd.gradcheck(fn, xs, eps=1e-3, atol=1e-4, rtol=1e-3)


# ---------------------------------------------------------------- pack / unpack
def test_pack_unpack_round_trip():
    seqs = [torch.randn(n, 3, 8, device=DEVICE) for n in (4, 0, 9, 1)]
    packed, cu_seqlens, max_seqlen = pack_sequences(seqs)
    assert packed.shape == (14, 3, 8) and max_seqlen == 9
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 4, 4, 13, 14]
    back = unpack_sequences(packed, cu_seqlens)
    assert len(back) == 4 and all(torch.equal(a, b) for a, b in zip(back, seqs))
    assert back[2].data_ptr() == packed[4:].data_ptr(), "unpacked sequences are views"


# ---------------------------------------------------------------- errors
def t(*shape, dtype=torch.float32, device=DEVICE):
    return torch.randn(shape, dtype=dtype, device=device)


def cu(*values, dtype=torch.int32, device=DEVICE):
    return torch.tensor(values, dtype=dtype, device=device)


Q, K, V = t(10, 4, 16), t(12, 2, 16), t(12, 2, 16)
GOOD = dict(cu_seqlens_q=cu(0, 4, 10), cu_seqlens_k=cu(0, 5, 12), max_seqlen_q=6, max_seqlen_k=7)


def test_an_overestimated_max_seqlen_sizes_no_larger_grid_than_the_pack(monkeypatch):
    """max_seqlen only bounds the lengths: 2**40 (an overestimate a caller may pass) gives the same result, with
    the grid stopped at total_q and total_k (it used to size 2**40 rows and run for minutes)."""
    cu_q, cu_k = cu(0, 4, 10), cu(0, 5, 12)
    want = flash_attention_varlen(Q, K, V, cu_q, cu_k, 6, 7, causal=True)
    launched = ops_module.attention

    def bounded(*args):
        assert args[7:9] == (Q.shape[0], K.shape[0]), f"max_seqlen_q, max_seqlen_k = {args[7:9]}"
        return launched(*args)

    monkeypatch.setattr(ops_module, "attention", bounded)
    assert torch.equal(flash_attention_varlen(Q, K, V, cu_q, cu_k, 2**40, 2**40, causal=True), want)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((list(range(3)), K, V), {}, TypeError, r"Expected 3D packed tensors: q is a list"),
    ((Q.to_sparse(), K, V), {}, TypeError, r"Expected dense 3D packed tensors: q has layout torch.sparse_coo"),
    ((t(1, 10, 4, 16), K, V), {}, ValueError, r"Expected 3D packed tensors.*q.shape=\(1, 10, 4, 16\)"),
    ((Q, K, t(11, 2, 16)), {}, ValueError, r"Q, K, V shapes must match.*v.shape=\(11, 2, 16\)"),
    ((Q, t(12, 2, 32), t(12, 2, 32)), {}, ValueError, r"Q, K, V shapes must match.*head_dim"),
    ((Q, t(12, 3, 16), t(12, 3, 16)), {}, ValueError, r"GQA needs q heads \(4\) to be a multiple of k/v heads \(3\)"),
    ((t(10, 1, 8), t(12, 1, 8), t(12, 1, 8)), {}, ValueError, r"Unsupported head_dim 8"),
    ((Q, t(12, 2, 16, dtype=torch.float16), V), {}, TypeError, r"same dtype; got q.dtype=torch.float32, k.dtype"),
    ((t(10, 4, 16, dtype=torch.float64), t(12, 2, 16, dtype=torch.float64), t(12, 2, 16, dtype=torch.float64)),
     {}, TypeError, r"Unsupported dtype torch.float64"),
    ((Q, t(12, 2, 16, device="meta"), V), {}, ValueError, r"q, k, v must be on the same device"),
    ((Q, K, V), dict(cu_seqlens_q=[0, 4, 10]), TypeError, r"cu_seqlens_q must be a \(B \+ 1,\) torch.int32 tensor"),
    ((Q, K, V), dict(cu_seqlens_q=cu(0, 4, 10, dtype=torch.int64)), TypeError,
     r"cu_seqlens_q must be torch.int32; got torch.int64"),
    ((Q, K, V), dict(cu_seqlens_k=cu(0, 5, 12, dtype=torch.int64)), TypeError, r"cu_seqlens_k must be torch.int32"),
    ((Q, K, V), dict(cu_seqlens_q=cu(0)), ValueError, r"cu_seqlens_q must have shape \(B \+ 1,\) with B >= 1.*\(1,\)"),
    ((Q, K, V), dict(cu_seqlens_q=cu(0, 4, 10, device="meta")), ValueError,
     r"cu_seqlens_q must be on the same device as the packed tensors"),
    ((Q, K, V), dict(cu_seqlens_q=cu(1, 4, 10)), ValueError,
     r"cu_seqlens_q must start at 0; got cu_seqlens_q\[0\] = 1"),
    ((Q, K, V), dict(cu_seqlens_k=cu(0, 8, 5, 12)), ValueError,
     r"cu_seqlens_k must be nondecreasing; got cu_seqlens_k\[1\] = 8 > cu_seqlens_k\[2\] = 5"),
    ((Q, K, V), dict(cu_seqlens_q=cu(0, 4, 9)), ValueError,
     r"cu_seqlens_q must end at total_q \(q.shape\[0\]\) = 10; got cu_seqlens_q\[-1\] = 9"),
    ((Q, K, V), dict(cu_seqlens_k=cu(0, 5, 13)), ValueError, r"cu_seqlens_k must end at total_k .* = 12; got .* = 13"),
    ((Q, K, V), dict(cu_seqlens_k=cu(0, 2, 5, 12)), ValueError,
     r"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; got 2 and 3"),
    ((Q, K, V), dict(max_seqlen_q=5), ValueError,
     r"max_seqlen_q must be >= every sequence length in cu_seqlens_q; got max_seqlen_q = 5, longest sequence 6"),
    ((Q, K, V), dict(max_seqlen_k=6), ValueError,
     r"max_seqlen_k must be >= every sequence length .* longest sequence 7"),
    ((Q, K, V), dict(max_seqlen_q=6.0), TypeError, r"max_seqlen_q must be an int; got 6.0"),
    ((Q, K, V), dict(causal=1), TypeError, r"causal must be a bool; got 1"),
    ((Q, K, V), dict(return_lse=1), TypeError, r"return_lse must be a bool; got 1"),
    ((Q, K, V), dict(window=(-2, 0)), ValueError, r"window left bound must be >= 0"),
    ((Q, K, V), dict(softmax_scale="0.1"), TypeError, r"softmax_scale must be a float or None; got '0.1'"),
    ((Q, K, V), dict(softmax_scale=float("nan")), ValueError, r"softmax_scale must be finite"),
])
def test_errors_name_the_argument_and_the_values(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        flash_attention_varlen(*args, **{**GOOD, **kwargs})


@pytest.mark.parametrize("call, error, message", [
    (lambda: pack_sequences([]), ValueError, r"seqs must be a non-empty list"),
    (lambda: pack_sequences([t(3, 2, 8), t(3, 8)]), ValueError,
     r"seqs\[1\] must be a 3D \(n_i, H, D\) tensor; got shape"),
    (lambda: pack_sequences([t(3, 2, 8), t(3, 4, 8)]), ValueError, r"seqs must share \(H, D\).*seqs\[1\] is \(4, 8\)"),
    (lambda: unpack_sequences(t(10, 2, 8), cu(0, 4, 9)), ValueError,
     r"cu_seqlens must end at packed.shape\[0\] = 10; got cu_seqlens\[-1\] = 9"),
    (lambda: unpack_sequences(t(10, 2, 8), cu(0, 4, 10, dtype=torch.int64)), TypeError,
     r"cu_seqlens must be torch.int32"),
])
def test_pack_unpack_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ---------------------------------------------------------------- GPU only
def random_lengths(count, longest, seed):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, longest + 1, (count,), generator=gen).tolist()
    return lens[:-3] + [0, 1, longest]  # always an empty sequence, a single token and the longest


GPU_CASES = [(dtype, head_dim, mask) for dtype in (torch.float16, torch.bfloat16) for head_dim in (64, 128)
             for mask in ("none", "causal")] \
    + [(torch.float16, 64, mask) for mask in ("window", "gqa", "cross", "q-longer")] \
    + [(torch.float32, 64, "causal"), (torch.bfloat16, 256, "causal")]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, head_dim, mask", GPU_CASES, ids=str)
def test_gpu_matches_each_sequence_alone(dtype, head_dim, mask):
    """Many sequences (40), lengths 0 to 1100 (not multiples of any block), forward and gradients."""
    lens = random_lengths(40, 1100, seed=head_dim)
    lens_q, lens_k, heads, kv_heads, kwargs = lens, lens, 4, 4, {}
    if mask == "causal":
        kwargs = dict(causal=True)
    elif mask == "window":
        kwargs = dict(window=(200, 17))
    elif mask == "gqa":
        kv_heads, kwargs = 1, dict(causal=True)
    elif mask == "cross":  # queries shorter than keys (chunked prefill): bottom-right causal
        lens_q, kwargs = [n // 3 for n in lens], dict(causal=True)
    elif mask == "q-longer":  # more queries than keys: the first rows of each sequence see no key
        lens_k, kwargs = [n // 3 for n in lens], dict(causal=True)
    run_and_check(lens_q, lens_k, heads, kv_heads, head_dim, dtype, seed=head_dim, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, head_dim, mask", [(torch.float16, 64, "causal"), (torch.bfloat16, 128, "gqa")],
                         ids=str)
def test_gpu_autotuned_varlen(dtype, head_dim, mask):
    """The autotuned kernels (keyed on max_seqlen buckets and IS_VARLEN) on GPU-sized problems."""
    test_gpu_matches_each_sequence_alone(dtype, head_dim, mask)


@pytest.mark.gpu
def test_gpu_every_element_written_and_deterministic(nan_empty):
    lens = random_lengths(64, 1500, seed=7)
    out, lse, grads = run_and_check(lens, lens, 8, 2, 64, torch.float16, causal=True, seed=7)
    for name, x in (("O", out), ("L", lse), *zip(("dq", "dk", "dv"), grads)):
        assert not torch.isnan(x).any(), f"{name} has unwritten (NaN) elements"
    q, k, v, do, cu_q, cu_k, max_q, max_k = make_packed(lens, lens, 8, 2, 64, torch.float16, seed=7)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    again = flash_attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, causal=True)
    again.backward(do)
    assert torch.equal(again, out) and all(torch.equal(t.grad, g) for t, g in zip(leaves, grads)), \
        "the same inputs give bitwise the same outputs and gradients (no atomics)"


@pytest.mark.gpu
def test_gpu_offsets_past_2_to_the_31_elements():
    """Packed tensors of more than 2**31 elements: the last sequence starts past any int32 offset
    (q, k, v, O and the gradients), so the kernels' 64-bit sequence offsets are needed."""
    heads, head_dim, n, count = 32, 128, 613, 870
    total = n * count
    assert (total - n) * heads * head_dim > 2 ** 31
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v, do = (torch.randn(total, heads, head_dim, device=DEVICE, dtype=torch.float16, generator=gen)
                   for _ in range(4))
    cu = torch.arange(0, total + 1, n, dtype=torch.int32, device=DEVICE)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = flash_attention_varlen(*leaves, cu, cu, n, n, causal=True)
    out.backward(do)
    one = torch.tensor([0, n], dtype=torch.int32)
    for b in (0, count // 2, count - 1):
        rows = slice(b * n, (b + 1) * n)
        ref_out, _, ref_grads = reference(q[rows], k[rows], v[rows], do[rows], one, one, causal=True)
        assert relative_error(out[rows], ref_out) <= tolerance(torch.float16), f"O of sequence {b}"
        for name, leaf, expected in zip("qkv", leaves, ref_grads):
            assert relative_error(leaf.grad[rows], expected) <= tolerance(torch.float16), f"d{name} of sequence {b}"
