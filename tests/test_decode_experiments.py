"""The decoding experiment scripts of session 38 in Triton's interpreter: what they time must be what they claim.

``benchmarks/decode_head_pairs.py`` times a D = 64 cache read as pairs of heads by the D = 128 launch; that is
only a fair comparison if the paired launch computes the same attention, which is held here for MHA and GQA,
with the outputs and the logsumexps. ``benchmarks/decode_configs.py --hints`` parses the K/V load hints it passes
to the kernel.
"""
import sys
from pathlib import Path

import pytest
import torch

from flashlib import runtime
from flashlib.kernels import decode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import decode_configs  # noqa: E402
import decode_head_pairs  # noqa: E402


@pytest.mark.skipif(not runtime.INTERPRET, reason="the interpreter run; the GPU run is the script's")
@pytest.mark.parametrize("batch, heads, heads_kv, n_k, n_q", [(2, 8, 8, 256, 1), (2, 8, 2, 200, 4), (1, 8, 4, 300, 2)])
def test_two_heads_read_as_one_row_give_the_same_attention(batch, heads, heads_kv, n_k, n_q):
    torch.manual_seed(0)
    head_dim = 64
    q = torch.randn(batch, n_q, heads, head_dim)
    k, v = torch.randn(batch, n_k, heads_kv, head_dim), torch.randn(batch, n_k, heads_kv, head_dim)
    lengths = torch.randint(n_q, n_k + 1, (batch,), dtype=torch.int32)
    o, lse = torch.full_like(q, float("nan")), torch.full((batch, heads, n_q), float("nan"))
    decode.launch_splitkv_attention(q, k, v, o, lse, scale=head_dim ** -0.5, k_lens=lengths)
    q2 = decode_head_pairs.paired_query(q, heads_kv)
    assert q2.shape == (batch, n_q, heads, 2 * head_dim)
    assert (q2.abs().sum(-1) == q.abs().sum(-1)).all()  # each query in one half, zeros in the other
    o2, lse2 = torch.full_like(q2, float("nan")), torch.full_like(lse, float("nan"))
    pairs = (t.view(batch, n_k, heads_kv // 2, 2 * head_dim) for t in (k, v))
    decode.launch_splitkv_attention(q2, *pairs, o2, lse2, scale=head_dim ** -0.5, k_lens=lengths)
    mine = decode_head_pairs.own_half(o2, heads_kv)
    assert torch.allclose(mine, o, rtol=1e-5, atol=1e-6) and torch.allclose(lse2, lse, rtol=1e-5, atol=1e-6)
    assert not o.isnan().any()


def test_load_hints_parse_into_eviction_policy_and_cache_modifier():
    assert decode_configs.parse_hints("evict_first;evict_last;,.cg") == [("evict_first", ""), ("evict_last", ""),
                                                                         ("", ".cg")]
    assert decode_configs.parse_hints("evict_first,.cg") == [("evict_first", ".cg")]
    assert [decode_configs.hints_text(h) for h in decode_configs.parse_hints("evict_first,.cg;,.cg")] == [
        "evict_first+.cg", ".cg"]
