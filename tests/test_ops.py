"""The attention op in real use: torch.compile (fullgraph, forward and backward), the custom ops'
registration (opcheck), torch.func, double backward refused on every path, NaN semantics and
padding that is never read, and ``flash_attention_v2``."""
import functools

import pytest
import torch

from flashlib import attention, flash_attention, flash_attention_v2, flash_attention_varlen, naive_attention, ops, runtime
from flashlib.kernels.dropout import dropout_mask
from flashlib.spec import AttentionSpec
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, make_inputs, pin_blocks


@pytest.fixture(autouse=True)
def fixed_blocks_on_the_gpu(monkeypatch):
    pin_blocks(monkeypatch, [ops])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class TinyAttentionBlock(torch.nn.Module):
    """Projections, flashlib attention in (B, N, H, D) with GQA and every score modifier, output projection."""

    def __init__(self, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.out = torch.nn.Linear(dim, dim)
        self.register_buffer("slopes", torch.tensor([2.0 ** -(h + 1) for h in range(heads)]))

    def forward(self, x, seq_lens=None):
        batch, n, dim = x.shape
        q = self.q(x).view(batch, n, self.heads, self.head_dim)
        k, v = self.kv(x).view(batch, n, 2, self.kv_heads, self.head_dim).unbind(2)
        o = flash_attention(q, k, v, causal=True, seq_lens=seq_lens, layout="bnhd", softcap=5.0,
                            alibi_slopes=self.slopes)
        return self.out(o.reshape(batch, n, dim))


# ---------------------------------------------------------------- torch.compile
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_model_matches_eager_forward_and_backward(backend):
    """fullgraph=True: a graph break anywhere (checks reading values, torch.backends, the interpreter) fails."""
    torch.manual_seed(0)
    model = TinyAttentionBlock().to(DEVICE)
    x = torch.randn(2, 24, 64, device=DEVICE)
    lens = torch.tensor([24, 13], dtype=torch.int32, device=DEVICE)
    eager = model(x, lens)
    eager.square().sum().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend=backend)(x, lens)
    compiled.square().sum().backward()
    assert relative_error(compiled, eager) <= tolerance(torch.float32)
    for p, expected in zip(model.parameters(), eager_grads):
        assert relative_error(p.grad, expected) <= 10 * tolerance(torch.float32)  # linear layers fused differently


def test_compile_calls_the_custom_op():
    """The compiled graph holds flashlib::attention_forward and _backward as opaque ops (no trace into Triton)."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(node.target) for node in gm.graph.nodes)
        return gm

    q, k, v = (t.requires_grad_() for t in make_inputs(1, 2, 2, 16, 16, 16, torch.float32))
    torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True), fullgraph=True, backend=backend)(q, k, v)
    assert "flashlib.attention_forward.default" in seen


def test_compiled_varlen_and_dropout():
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in make_inputs(1, 2, 2, 30, 30, 16, torch.float32))
    cu = torch.tensor([0, 12, 30], dtype=torch.int32, device=DEVICE)

    def attend(q, k, v):
        return flash_attention_varlen(q, k, v, cu, cu, 18, 18, causal=True, dropout_p=0.25)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    torch.manual_seed(4)
    first = compiled(q, k, v)
    torch.manual_seed(4)
    eager = attend(q, k, v)
    assert torch.equal(first, eager), "compiled and eager draw the same dropout seed from torch's generator"


def test_compiled_fullgraph_with_dynamic_floats_and_shapes():
    """A float argument that changes between calls (a per-layer softcap or scale, a dropout schedule) makes the
    recompile trace it as a SymFloat, as dynamic=True does from the start: the argument checks must trace then."""
    q, k, v = make_inputs(1, 2, 2, 24, 24, 16, torch.float32)

    def attend(q, k, v, softcap, scale):
        return flash_attention(q, k, v, causal=True, softcap=softcap, softmax_scale=scale)

    for dynamic in (None, True):
        torch._dynamo.reset()
        compiled = torch.compile(attend, fullgraph=True, dynamic=dynamic, backend="aot_eager")
        for softcap, scale in ((20.0, 0.25), (30.0, 0.3)):
            assert torch.equal(compiled(q, k, v, softcap, scale), attend(q, k, v, softcap, scale))
    torch._dynamo.reset()


def test_custom_ops_pass_opcheck():
    """Schema, fake tensors, autograd registration and AOT dispatch of both ops agree with the real ones."""
    q, k, v, do = (t.requires_grad_() for t in make_inputs(1, 4, 2, 24, 20, 16, torch.float32, layout="bnhd",
                                                           grad_out=True))
    settings = (0, 0, "bnhd", True, -1, 0, 0.25, 2.0, 0.0)
    forward = (q, k, v, None, None, None, None, *settings)
    torch.library.opcheck(torch.ops.flashlib.attention_forward.default, forward)
    o, lse, rng = torch.ops.flashlib.attention_forward(*forward)
    backward = (do.detach(), q.detach(), k.detach(), v.detach(), o.detach(), lse, None, None, None, None, rng,
                *settings, True, True)
    torch.library.opcheck(torch.ops.flashlib.attention_backward.default, backward,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_op_and_eager_routes_give_identical_results():
    q, k, v, do = make_inputs(2, 4, 2, 33, 41, 16, torch.float32, grad_out=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = flash_attention(*leaves, window=(7, 2), softcap=3.0)
    eager.backward(do)
    op_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, _, _ = torch.ops.flashlib.attention_forward(*op_leaves, None, None, None, None, 0, 0, "bhnd", False, 7, 2,
                                                   0.25, 3.0, 0.0)
    o.backward(do)
    assert torch.equal(o, eager)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(op_leaves, leaves))


# ---------------------------------------------------------------- double backward, torch.func, forward AD
def _first_grads(varlen=False):
    q, k, v = (t.requires_grad_() for t in make_inputs(1, 2, 2, 16, 16, 16, torch.float32))
    if varlen:
        cu = torch.tensor([0, 16], dtype=torch.int32, device=DEVICE)
        o = flash_attention_varlen(*(t[0].transpose(0, 1) for t in (q, k, v)), cu, cu, 16, 16)
    else:
        o = flash_attention(q, k, v, causal=True)
    return (q, k, v), torch.autograd.grad(o.square().sum(), (q, k, v), create_graph=True)


@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
@pytest.mark.parametrize("path", ["autograd.grad", "backward", "through dq only", "through dv only"])
def test_double_backward_raises_on_every_path(path, varlen):
    (q, k, v), grads = _first_grads(varlen)
    with pytest.raises(RuntimeError, match="flash_attention has no double backward"):
        if path == "autograd.grad":
            torch.autograd.grad(sum(g.sum() for g in grads), q)
        elif path == "backward":
            sum(g.square().sum() for g in grads).backward()
        elif path == "through dq only":
            torch.autograd.grad(grads[0].sum(), k)
        else:
            torch.autograd.grad(grads[2].sum(), v)


def test_hessian_and_hvp_raise():
    q, k, v = make_inputs(1, 1, 1, 8, 8, 16, torch.float32)

    def f(x):
        return flash_attention(x, k, v).square().sum()

    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.functional.hessian(f, q)
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.functional.hvp(f, q, torch.ones_like(q))


def test_vmap_folds_into_the_batch():
    q, k, v = (torch.stack(t) for t in zip(*(make_inputs(2, 4, 2, 20, 20, 16, torch.float32, seed=s)
                                            for s in range(3))))
    lens = torch.tensor([[20, 7], [3, 20], [0, 11]], dtype=torch.int32, device=DEVICE)
    mapped = torch.func.vmap(lambda q, k, v, n: flash_attention(q, k, v, causal=True, seq_lens=n))(q, k, v, lens)
    looped = torch.stack([flash_attention(q[i], k[i], v[i], causal=True, seq_lens=lens[i]) for i in range(3)])
    assert torch.equal(mapped, looped)
    shared_kv = torch.func.vmap(lambda q: flash_attention(q, k[0], v[0]))(q)
    assert torch.equal(shared_kv[1], flash_attention(q[1], k[0], v[0]))


def test_vmap_of_one_sample_with_lengths_and_slopes_it_does_not_map():
    """A batch of one whose seq_lens and (B, H) ALiBi slopes are closed over (not mapped): folded, they became
    views of stride 0, which the kernels read as contiguous, so every slice after the first read past them (on a
    GPU out of bounds) and came out wrong by 0.5-1.1."""
    q = torch.stack([make_inputs(1, 2, 2, 24, 24, 16, torch.float32, seed=s)[0] for s in range(4)])
    _, k, v = make_inputs(1, 2, 2, 24, 24, 16, torch.float32, seed=9)
    lens = torch.tensor([7], dtype=torch.int32, device=DEVICE)
    slopes = torch.tensor([[0.5, 0.25]], device=DEVICE)
    call = functools.partial(flash_attention, k=k, v=v, causal=True, seq_lens=lens, alibi_slopes=slopes)
    mapped = torch.func.vmap(lambda x: call(x))(q)
    assert all(torch.equal(mapped[i], call(q[i])) for i in range(4))
    expanded = torch.func.vmap(lambda x, n: flash_attention(x, k, v, seq_lens=n))(q, lens.expand(4, 1))
    assert all(torch.equal(expanded[i], flash_attention(q[i], k, v, seq_lens=lens)) for i in range(4))


def test_vmap_keeps_torchs_randomness_contract_for_dropout():
    """As torch's dropout: vmap's default randomness='error' refuses the draw; 'different' gives every slice its
    own mask (three identical slices come out different); 'same', which one folded launch cannot give, raises."""
    q, k, v = (t.expand(3, *t.shape).clone() for t in make_inputs(1, 1, 1, 16, 16, 16, torch.float32))
    attend = functools.partial(flash_attention, dropout_p=0.5)
    with pytest.raises(RuntimeError, match="randomness error mode"):
        torch.func.vmap(attend)(q, k, v)
    with pytest.raises(NotImplementedError, match="randomness='same'"):
        torch.func.vmap(attend, randomness="same")(q, k, v)
    different = torch.func.vmap(attend, randomness="different")(q, k, v)
    assert not torch.equal(different[0], different[1])
    without = torch.func.vmap(flash_attention)(q, k, v)   # no dropout: nothing random, the default mode is fine
    assert relative_error(without[1], flash_attention(q[1], k[1], v[1])) <= 1e-6


def test_func_grad_and_vjp_match_backward():
    q, k, v, do = make_inputs(1, 2, 2, 16, 24, 16, torch.float32, grad_out=True)
    grad_q = torch.func.grad(lambda x: (flash_attention(x, k, v, causal=True) * do).sum())(q)
    _, vjp = torch.func.vjp(lambda x, y, z: flash_attention(x, y, z, causal=True), q, k, v)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves, causal=True).backward(do)
    assert torch.equal(grad_q, leaves[0].grad)
    assert all(torch.equal(a, b.grad) for a, b in zip(vjp(do), leaves))


@pytest.mark.parametrize("n_q", [12, 64])  # a decoding-shaped call (split-KV when eager has no tangent), and not
def test_forward_mode_ad_inside_torch_compile_never_drops_the_tangent(n_q):
    """Inside a compiled function the call is a custom op (or the split-KV kernel), neither of which has a
    forward-mode rule, and a tangent of zeros came out. It must now fail loudly, or be right."""
    q, k, v = make_inputs(1, 1, 1, n_q, 64, 16, torch.float32)
    tangent = torch.ones_like(q)
    _, expected = torch.func.jvp(lambda x: flash_attention(x, k, v), (q,), (tangent,))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, t: torch.func.jvp(lambda x: flash_attention(x, k, v), (a,), (t,))[1],
                             fullgraph=True)
    try:
        got = compiled(q, tangent)
    except Exception as refusal:  # loud: flashlib's refusal, which dynamo wraps in its own error when tracing
        assert "no forward-mode AD inside torch.compile" in str(refusal), str(refusal)
        return
    assert relative_error(got, expected) < 1e-5


def test_forward_mode_ad_agrees_with_reverse_mode():
    """jacfwd (the JVP kernel, vmapped over a basis of tangents) and jacrev (the backward kernels) are two
    computations of one Jacobian (tests/kernels/test_attention_jvp.py holds each to the float64 reference)."""
    q, k, v = make_inputs(1, 1, 1, 8, 8, 16, torch.float32)
    forward = torch.func.jacfwd(lambda x: flash_attention(x, k, v, causal=True).sum(-1))(q)
    # row by row (jacrev would vmap the backward, which has no vmap rule)
    reverse = torch.autograd.functional.jacobian(lambda x: flash_attention(x, k, v, causal=True).sum(-1), q)
    assert forward.shape == reverse.shape == (1, 1, 8, 1, 1, 8, 16)
    assert relative_error(forward, reverse) < 1e-5


# ---------------------------------------------------------------- NaN
def test_nan_and_inf_in_padding_change_nothing():
    """The issue's reproduction: padding from torch.empty (here NaN and inf) must not reach valid gradients."""
    q, k, v, do = make_inputs(2, 2, 2, 64, 64, 32, torch.float32, grad_out=True)
    lens = torch.tensor([40, 64], dtype=torch.int32, device=DEVICE)

    def run(fill_q, fill_kv, fill_do):
        leaves = [t.clone() for t in (q, k, v)]
        leaves[0][0, :, 40:] = fill_q
        leaves[1][0, :, 40:] = fill_kv
        leaves[2][0, :, 40:] = -fill_kv
        grad_out = do.clone()
        grad_out[0, :, 40:] = fill_do
        leaves = [t.requires_grad_() for t in leaves]
        o, lse = flash_attention(*leaves, causal=True, seq_lens=lens, return_lse=True)
        o.backward(grad_out)
        return [o, lse] + [t.grad for t in leaves]

    clean = run(0.0, 0.0, 0.0)
    dirty = run(float("nan"), float("inf"), float("nan"))
    for name, a, b in zip(("O", "L", "dq", "dk", "dv"), dirty, clean):
        assert torch.equal(a, b), f"{name} changed with garbage in the padding"
    assert (clean[2][0, :, 40:] == 0).all() and (clean[3][0, :, 40:] == 0).all()


def test_nan_in_a_seen_row_propagates_as_in_pytorch():
    """As PyTorch's softmax(Q K^T) V written out (the reference); a diverging run shows NaN, not zeros."""
    q, k, v = make_inputs(1, 1, 1, 12, 12, 16, torch.float32)
    q[0, 0, 3] = float("nan")  # one query row
    k[0, 0, 7] = float("nan")  # one key, seen causally by rows 7..11
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    scores = (q.cpu() @ k.cpu().transpose(-1, -2) / 4).masked_fill(torch.ones(12, 12).triu(1).bool(), float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v.cpu()
    rows_nan = expected.isnan().any(-1)[0, 0]
    assert rows_nan.tolist() == [False] * 3 + [True] + [False] * 3 + [True] * 5
    assert torch.equal(o.isnan().any(-1)[0, 0].cpu(), rows_nan)
    assert torch.equal(lse.isnan()[0, 0].cpu(), rows_nan)
    assert relative_error(o[0, 0, :3], expected[0, 0, :3]) <= tolerance(torch.float32)


def test_fully_masked_rows_still_give_zero():
    """A choice, documented: a row that sees no key gives O = 0 and L = -inf (SDPA would give NaN)."""
    q, k, v = make_inputs(1, 2, 2, 6, 3, 16, torch.float32)
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert (o[:, :, :3] == 0).all() and (lse[:, :, :3] == float("-inf")).all()
    assert torch.isfinite(o).all()


# ---------------------------------------------------------------- torch.autocast
def test_autocast_casts_q_k_and_v_to_its_dtype_as_sdpa_does():
    """float32 q and k (out of RoPE) beside a bfloat16 v: under autocast the three go in autocast's dtype, O comes
    out in it, and each input's gradient in its own dtype; outside autocast mixed dtypes are still refused."""
    q, k, v = make_inputs(2, 4, 2, 24, 40, 16, torch.float32)
    v16 = v.bfloat16()
    leaves = [t.clone().requires_grad_() for t in (q, k, v16)]
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        out = flash_attention(*leaves, causal=True)
        packed = flash_attention_varlen(*(t[0].transpose(0, 1) for t in (q, k, v16)),
                                        *(torch.tensor([0, n], dtype=torch.int32, device=DEVICE) for n in (24, 40)),
                                        24, 40, causal=True)
    assert out.dtype == packed.dtype == torch.bfloat16
    ref = naive_attention(*(t.bfloat16().double() for t in (q, k, v16)), causal=True)
    assert relative_error(out, ref) <= tolerance(torch.bfloat16)
    assert relative_error(packed, ref[0].transpose(0, 1)) <= tolerance(torch.bfloat16)
    out.float().square().sum().backward()
    assert [t.grad.dtype for t in leaves] == [torch.float32, torch.float32, torch.bfloat16]
    with pytest.raises(TypeError, match="q, k, v must have the same dtype"):
        flash_attention(q, k, v16)


def test_a_compiled_training_call_is_not_recompiled_as_the_length_crosses_split_kvs_bound():
    """With a gradient wanted, "auto" is FlashAttention-2 whatever N_q: the choice once read N_q first, so
    torch.compile guarded on N_q <= 16 and compiled a second graph past it."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True), dynamic=True)
    for n in (8, 12, 20, 24):
        leaves = [t.requires_grad_() for t in make_inputs(1, 2, 2, n, n, 16, torch.float32)]
        step(*leaves).sum().backward()
        assert all(t.grad is not None for t in leaves)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


# ---------------------------------------------------------------- flash_attention_v2
def test_flash_attention_v2_is_the_bnhd_entry():
    q, k, v = make_inputs(2, 4, 1, 20, 28, 32, torch.float32, layout="bnhd")
    out = flash_attention_v2(q, k, v, causal=True, softcap=10.0)
    assert out.shape == q.shape
    assert torch.equal(out, flash_attention(q, k, v, causal=True, layout="bnhd", softcap=10.0))
    ref = naive_attention(*(t.transpose(1, 2).double().cpu() for t in (q, k, v)), causal=True, softcap=10.0)
    assert relative_error(out.transpose(1, 2), ref) <= tolerance(torch.float32)
    with pytest.raises(TypeError, match="flash_attention_v2 takes \\(B, N, H, D\\) tensors"):
        flash_attention_v2(q, k, v, layout="bhnd")


def test_return_lse_must_be_a_bool_even_for_a_call_already_checked(monkeypatch):
    """A truthy "no" once returned (O, L): refused as return_dropout_mask=1 is, also where the call's signature is
    remembered (the shortcut that skips the checks)."""
    monkeypatch.setattr(attention, "CHECKED_CALLS", {})
    q, k, v = make_inputs(1, 2, 2, 8, 8, 16, torch.float32, layout="bnhd")
    flash_attention_v2(q, k, v, variant="fa2")
    assert attention.CHECKED_CALLS, "the call's signature is remembered"
    for bad in ("no", 1, None):
        with pytest.raises(TypeError, match=f"return_lse must be a bool; got {bad!r}"):
            flash_attention_v2(q, k, v, variant="fa2", return_lse=bad)


# ---------------------------------------------------------------- host path: checks remembered per call signature
@pytest.fixture
def counted_checks(monkeypatch):
    """Counts the front door's argument checks; starts with no call remembered."""
    monkeypatch.setattr(attention, "CHECKED_CALLS", {})
    calls = []
    checks = attention.check_attention_args

    def counting(*args, **kwargs):
        calls.append(1)
        return checks(*args, **kwargs)

    monkeypatch.setattr(attention, "check_attention_args", counting)
    return calls


def test_a_repeated_call_skips_its_checks_and_gives_the_same_result(counted_checks):
    q, k, v = make_inputs(2, 4, 2, 24, 40, 16, torch.float32, layout="bnhd")
    first = flash_attention(q, k, v, causal=True, window=(9, -1), layout="bnhd", return_lse=True)
    second = flash_attention(q, k, v, causal=True, window=(9, -1), layout="bnhd", return_lse=True)
    assert len(counted_checks) == 1  # the second call was served by the remembered checks
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    ref = naive_attention(*(t.transpose(1, 2).double().cpu() for t in (q, k, v)), causal=True, window=(9, -1))
    assert relative_error(second[0].transpose(1, 2), ref) <= tolerance(torch.float32)
    flash_attention(q, k, v, causal=True, window=(9, 0), layout="bnhd")  # another window: checked anew
    flash_attention(q[:1], k[:1], v[:1], causal=True, window=(9, -1), layout="bnhd")  # another shape
    assert len(counted_checks) == 3


@pytest.mark.parametrize("valid, invalid, error, message", [
    ({"causal": True}, {"causal": 1}, TypeError, "causal must be a bool; got 1"),
    ({"window": (3, 2)}, {"window": (3.0, 2)}, TypeError, "window left bound must be an int"),
    ({"window": (3, 2)}, {"window": [3, 2.5]}, TypeError, "window right bound must be an int"),
    ({"softmax_scale": 1.0}, {"softmax_scale": True}, TypeError, "softmax_scale must be a float or None"),
    ({"dropout_p": 0.0}, {"dropout_p": False}, TypeError, "dropout_p must be a float"),
    ({"softcap": 0.0}, {"softcap": False}, TypeError, "softcap must be a float"),
    ({"layout": "bhnd"}, {"layout": "bhnd", "variant": "fa3"}, ValueError, "variant must be one of"),
], ids=["causal=1", "float window", "list window", "bool scale", "bool dropout", "bool softcap", "variant"])
def test_a_remembered_call_never_lets_an_equal_but_invalid_argument_through(counted_checks, valid, invalid,
                                                                            error, message):
    """Python finds 1 == True and 3.0 == 3 equal: the remembered signature holds each option's type too."""
    q, k, v = make_inputs(1, 2, 2, 40, 40, 16, torch.float32)  # N_q > 16: FlashAttention-2, remembered
    flash_attention(q, k, v, **valid)
    flash_attention(q, k, v, **valid)
    assert len(counted_checks) == 1
    with pytest.raises(error, match=message):
        flash_attention(q, k, v, **invalid)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_a_remembered_call_never_lets_a_sparse_tensor_of_its_shape_through(counted_checks, which):
    """A sparse tensor has the shape, dtype and device of the dense one: the signature holds each tensor's layout
    too (a sparse q after a dense call once failed inside torch.empty_like instead of being told to densify)."""
    tensors = dict(zip("qkv", make_inputs(1, 2, 2, 40, 40, 16, torch.float32)))
    flash_attention(**tensors, variant="fa2")
    flash_attention(**tensors, variant="fa2")
    assert len(counted_checks) == 1
    tensors[which] = tensors[which].to_sparse()
    with pytest.raises(TypeError, match=rf"Expected dense 3D or 4D tensors: {which} has layout torch.sparse_coo"):
        flash_attention(**tensors, variant="fa2")


def test_inference_and_training_calls_agree_and_forward_ad_still_reaches_its_rule(counted_checks):
    """Without a gradient to track the front door calls the forward directly, past autograd; a tangent
    (forward-mode AD) must still reach the op's rule and come out, even for a remembered signature."""
    q, k, v, do = make_inputs(1, 2, 1, 20, 20, 16, torch.float32, grad_out=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    trained = flash_attention(*leaves, causal=True)
    assert trained.grad_fn is not None
    with torch.no_grad():
        inferred = flash_attention(*leaves, causal=True)
    assert inferred.grad_fn is None and torch.equal(inferred, trained)
    assert len(counted_checks) == 1
    trained.backward(do)
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)
    _, expected = torch.func.jvp(lambda x: flash_attention(x, k, v, causal=True), (q,), (torch.ones_like(q),))
    with torch.autograd.forward_ad.dual_level():
        dual_q = torch.autograd.forward_ad.make_dual(q, torch.ones_like(q))
        tangent = torch.autograd.forward_ad.unpack_dual(flash_attention(dual_q, k, v, causal=True)).tangent
    assert tangent is not None and torch.equal(tangent, expected) and tangent.abs().max() > 0


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_compiled_model_matches_eager_in_bfloat16():
    torch.manual_seed(0)
    model = TinyAttentionBlock(dim=256, heads=4, kv_heads=2).to("cuda", torch.bfloat16)
    x = torch.randn(4, 512, 256, device="cuda", dtype=torch.bfloat16)
    eager = model(x)
    eager.float().square().sum().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True)(x)
    compiled.float().square().sum().backward()
    assert relative_error(compiled, eager) <= 4 * tolerance(torch.bfloat16)
    for p, expected in zip(model.parameters(), eager_grads):
        assert relative_error(p.grad, expected) <= 4 * tolerance(torch.bfloat16)
    assert runtime.DEVICE.type == "cuda"


@pytest.mark.gpu
def test_gpu_reduce_overhead_captures_training_with_and_without_dropout():
    """torch.compile(mode="reduce-overhead") captures the forward and backward in CUDA graphs. Without
    dropout the replays equal eager, bit for bit. With dropout the seed is drawn on the device by torch's
    graph-safe generator: each replay draws its own mask (outputs differ from step to step), and a replay
    after ``torch.manual_seed(s)`` equals an eager call after ``torch.manual_seed(s)``, output and gradients."""
    q, k, v = make_inputs(2, 4, 4, 256, 256, 64, torch.float16, seed=3)
    for dropout_p in (0.0, 0.2):
        torch._dynamo.reset()
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        compiled = torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True, dropout_p=dropout_p),
                                 mode="reduce-overhead")
        outs = []
        for step in range(4):  # warm-up, capture, replays
            torch.manual_seed(100 + step)
            out = compiled(*leaves)
            out.float().square().sum().backward()
            grads = [t.grad.clone() for t in leaves]
            for t in leaves:
                t.grad = None
            torch.manual_seed(100 + step)
            eager_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            eager = flash_attention(*eager_leaves, causal=True, dropout_p=dropout_p)
            eager.float().square().sum().backward()
            assert torch.equal(out, eager), (dropout_p, step)
            for got, want in zip(grads, eager_leaves):
                assert torch.equal(got, want.grad), (dropout_p, step)
            outs.append(out.clone())
        if dropout_p > 0:
            assert not any(torch.equal(outs[-1], earlier) for earlier in outs[:-1]), "a replay repeated a mask"
    torch._dynamo.reset()


@pytest.mark.gpu
def test_gpu_dropout_never_syncs_and_a_captured_graph_redraws_its_mask(monkeypatch):
    """A training step with dropout makes no host-device sync (the seed stays on the device), and a
    ``torch.cuda.graph`` of a dropout call drops other weights on every replay: each replay's O is the
    eager O of the seed that replay drew, and replays after the same ``torch.manual_seed`` draw the same.

    The first replay of a fresh graph is checked for the first two only: under load (16 processes on a
    cold compile cache) torch 2.11 let 29 of 64 first replays draw with the generator's seed of capture
    time at the new offset, not the seed just set (``benchmarks/dropout_graph_seed_race.py``; TUNING.md,
    twenty-third finding). That is torch's replay, not flashlib's draw: the later replays were right."""
    drawn = []
    draw = ops.draw_dropout_seed

    def recording(device):
        drawn.append(draw(device))
        return drawn[-1]

    monkeypatch.setattr(ops, "draw_dropout_seed", recording)
    q, k, v = make_inputs(2, 4, 2, 256, 256, 64, torch.float16, seed=4)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves, causal=True, dropout_p=0.1).sum().backward()  # compile and tune first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        flash_attention(*leaves, causal=True, dropout_p=0.1).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attention(q, k, v, dropout_p=0.3)  # warm up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flash_attention(q, k, v, dropout_p=0.3)
    captured_seed = drawn[-1]
    replays = []
    for s in (None, 7, 8, 7):  # None: the fresh graph's first replay
        if s is not None:
            torch.manual_seed(s)
        graph.replay()
        replays.append((captured.clone(), captured_seed.clone()))

    def eager_with(seed):  # the kernels' O for a given seed tensor: the draw replaced by that seed
        monkeypatch.setattr(ops, "draw_dropout_seed", lambda device: seed.clone())
        try:
            return flash_attention(q, k, v, dropout_p=0.3)
        finally:
            monkeypatch.setattr(ops, "draw_dropout_seed", recording)

    for out, seed in replays:
        assert torch.equal(out, eager_with(seed)), f"a replay's O is not the O of its own seed {int(seed[0])}"
    torch.manual_seed(7)
    eager = flash_attention(q, k, v, dropout_p=0.3)
    eager_seed = int(drawn[-1][0])
    seeds = [int(seed[0]) for _, seed in replays[1:]]
    assert seeds[0] == seeds[2] == eager_seed != seeds[1], f"seeds: of the replays {seeds}, eager {eager_seed}"
    assert torch.equal(replays[1][0], eager) and torch.equal(replays[3][0], eager)
    assert not torch.equal(replays[1][0], replays[2][0])


def test_the_ops_seed_output_lives_on_qs_device():
    """The fake (what torch.compile plans with) and the op agree: the seed output is an int64 (1,) on q's
    device, with or without dropout, so no CPU tensor enters a compiled graph (CUDA-graph capture would
    split around it) and the backward reads the seed where the kernels run."""
    meta = torch.empty(1, 2, 16, 32, device="meta")
    real = make_inputs(1, 2, 2, 16, 16, 32, torch.float32, seed=1)
    for dropout_p in (0.0, 0.25):
        settings = ops.op_settings(AttentionSpec(dropout_p=dropout_p), "bhnd", 32)
        _, _, planned = ops.attention_forward_op(meta, meta, meta, None, None, None, None, *settings)
        _, _, seed = ops.attention_forward_op(*real, None, None, None, None, *settings)
        assert planned.shape == seed.shape == (1,) and planned.dtype == seed.dtype == torch.int64
        assert planned.device.type == "meta" and seed.device == real[0].device


def test_dropout_draws_its_seed_with_the_generator_of_qs_device_and_the_kernels_read_it_there(monkeypatch):
    """The seed comes from torch's generator of q's device (reproducible under torch.manual_seed), is
    handed to the kernels as that tensor, and the backward recomputes the mask from the very tensor the
    forward returned: overwriting it between forward and backward changes the gradients."""
    q, k, v, do = make_inputs(1, 2, 2, 32, 32, 32, torch.float32, seed=5, grad_out=True)
    torch.manual_seed(11)
    expected = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=q.device)
    torch.manual_seed(11)
    settings = ops.op_settings(AttentionSpec(dropout_p=0.25), "bhnd", 32)
    o, _, seed = ops.attention_forward_op(q, k, v, None, None, None, None, *settings)
    assert torch.equal(seed, expected) and seed.device == q.device
    mask = dropout_mask(int(seed[0]), 0.25, 1, 2, 32, 32, q.device)
    reference = naive_attention(*(t.double() for t in (q, k, v)), dropout_mask=mask, dropout_p=0.25)
    assert relative_error(o, reference) <= tolerance(torch.float32)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    seen = []
    real_launch = ops.launch_attention_backward
    monkeypatch.setattr(ops, "launch_attention_backward",
                        lambda *a, **kw: seen.append(kw["dropout_seed"]) or real_launch(*a, **kw))
    torch.manual_seed(11)
    out = flash_attention(*leaves, dropout_p=0.25)
    assert torch.equal(out, o)
    out.backward(do)
    assert len(seen) == 1 and torch.equal(seen[0], expected)
    first = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    torch.manual_seed(11)
    out = flash_attention(*leaves, dropout_p=0.25)
    seen[-1] = None
    out.grad_fn.saved_tensors[-1].data.fill_(12345)  # the seed the backward will read (.data: no version bump)
    out.backward(do)
    assert torch.equal(seen[-1], torch.tensor([12345]))
    assert not torch.equal(leaves[0].grad, first[0])


@pytest.mark.parametrize("preserve", [True, False])
def test_activation_checkpointing_recomputes_the_same_dropout_mask(preserve):
    """torch.utils.checkpoint runs the forward again in the backward. The seed is drawn from the generator of
    q's device, whose state checkpoint saves and restores (``preserve_rng_state=True``, its default): the
    recomputed forward drops the same weights and the gradients equal those without checkpointing. Without
    that restore the recomputation draws another seed, and the gradients differ: the test can tell."""
    q, k, v, do = make_inputs(1, 2, 2, 32, 32, 32, torch.float32, seed=6, grad_out=True)
    grads = {}
    for name in ("plain", "checkpointed"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(21)
        if name == "plain":
            out = flash_attention(*leaves, dropout_p=0.3)
        else:
            out = torch.utils.checkpoint.checkpoint(lambda *t: flash_attention(*t, dropout_p=0.3), *leaves,
                                                    use_reentrant=False, preserve_rng_state=preserve)
        out.backward(do)
        grads[name] = [t.grad for t in leaves]
    same = all(torch.equal(a, b) for a, b in zip(grads["plain"], grads["checkpointed"]))
    assert same == preserve
