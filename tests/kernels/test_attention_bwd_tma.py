"""The backward's two tile paths: host tensor descriptors (TMA) for the streamed tiles, and pointers.

dK/dV streams Q and dO, dQ streams K and V; with ``use_tma`` those come through host
descriptors over the whole (B, H, N, D) tensors. Both paths must give the float64
reference's gradients and write every element; padded batches keep the pointer path, whose
loads end at each sample's length.
"""
import pytest
import torch

from flashlib.kernels import attention_bwd
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, as_bhnd, make_inputs


def gradients(q, k, v, do, use_tma, seq_lens=None, blocks=(32, 32), **mask):
    """(dq, dk, dv) from the backward launcher with the descriptor path on or off, outputs pre-filled with NaN."""
    spec = AttentionSpec(**mask)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device)
    launch_attention_forward(q, k, v, o, lse, spec, seq_lens=seq_lens)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    block_m, block_n = blocks
    attention_bwd.launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec, seq_lens=seq_lens,
                                            block_m=block_m, block_n=block_n, use_tma=use_tma)
    return dq, dk, dv


def reference_gradients(q, k, v, do, seq_lens=None, **mask):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = naive_attention(*leaves, seq_lens=seq_lens, **mask)
    out.backward(do.double())
    return [t.grad for t in leaves]


def assert_close(got, want, dtype):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert not g.isnan().any(), f"{name}: an element was never written"
        error = relative_error(g, w)
        assert error < tolerance(dtype), f"{name}: relative error {error:.2e} >= {tolerance(dtype):.0e}"


@pytest.mark.parametrize("n_q, n_k, causal", [(70, 90, True), (64, 256, False), (96, 40, True)],
                         ids=["causal-ragged", "keys-multiple-of-128", "more-queries-than-keys"])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_descriptor_and_pointer_paths_agree_with_the_reference(layout, n_q, n_k, causal):
    """GQA inputs, ragged lengths (tails past N read as zero through the descriptors), both layouts."""
    q, k, v, do = make_inputs(2, 4, 2, n_q, n_k, 48, torch.float32, layout, seed=11, grad_out=True)
    q, k, v, do = (as_bhnd(t, layout) for t in (q, k, v, do))
    want = reference_gradients(q, k, v, do, causal=causal)
    for use_tma in (True, False):
        assert_close(gradients(q, k, v, do, use_tma, causal=causal), want, torch.float32)


def test_window_and_softcap_on_the_descriptor_path():
    q, k, v, do = make_inputs(1, 2, 2, 80, 112, 32, torch.float32, "bhnd", seed=12, grad_out=True)
    mask = dict(window=(24, 8), softcap=5.0)
    want = reference_gradients(q, k, v, do, **mask)
    assert_close(gradients(q, k, v, do, True, **mask), want, torch.float32)


def test_padded_batches_keep_the_pointer_path_and_never_read_the_padding():
    """A host descriptor bounds rows by N only: with seq_lens the launcher must not use it, or the
    NaN past a sample's length would reach the gradients of its valid keys."""
    q, k, v, do = make_inputs(2, 2, 2, 64, 64, 32, torch.float32, "bhnd", seed=13, grad_out=True)
    lens = torch.tensor([40, 64], dtype=torch.int32)
    want = reference_gradients(q, k, v, do, seq_lens=lens, causal=True)
    for t in (q, k, v, do):
        t[0, :, 40:] = float("nan")
    got = gradients(q, k, v, do, True, seq_lens=lens.to(DEVICE), causal=True)
    assert_close(got, want, torch.float32)
    for g in got:
        assert torch.equal(g[0, :, 40:], torch.zeros_like(g[0, :, 40:])), "gradients past seq_len are exactly 0"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_autotuned_descriptor_path_matches_pointers_and_reference(dtype, causal):
    """On Hopper the autotuned configs' pre_hooks give the descriptors their tiles: both paths, every config
    the autotuner picks, against the float64 reference."""
    q, k, v, do = make_inputs(2, 8, 2, 1000, 1000, 128, dtype, "bnhd", seed=14, grad_out=True)
    q, k, v, do = (as_bhnd(t, "bnhd") for t in (q, k, v, do))
    want = reference_gradients(q, k, v, do, causal=causal)
    for use_tma in (True, False):
        assert_close(gradients(q, k, v, do, use_tma, blocks=(None, None), causal=causal), want, dtype)
