"""flashlib.masks: the block ranges and tile classes agree with the element mask of
flashlib.reference and with the blocks the forward kernel records as visited."""
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from flashlib import masks, runtime, tiles
from flashlib.reference import attention_mask, naive_attention
from flashlib.tiles import TILE_COMPUTED, TILE_MASKED, TILE_SKIPPED


def cdiv(a, b):
    return -(-a // b)


def visible(n_q, n_k, causal=False, window=None, seq_len=None):
    """(n_q, n_k) numpy mask of flashlib.reference, padding queries seeing nothing."""
    lens = None if seq_len is None else torch.tensor([seq_len])
    allowed = attention_mask(n_q, n_k, causal=causal, window=window, seq_lens=lens)[0, 0].numpy()
    if seq_len is not None:
        allowed = allowed & (np.arange(n_q) < seq_len)[:, None]
    return allowed


def blocks_seen(allowed, start_m, block_m, block_n):
    """Key blocks holding at least one key that a row of query block start_m sees."""
    rows = allowed[start_m * block_m:(start_m + 1) * block_m]
    return sorted({int(j) // block_n for j in np.flatnonzero(rows.any(axis=0))})


# ------------------------------------------------------------------ causal_block_range
@pytest.mark.parametrize("args, expected", [
    ((0, 32, 32, 128, 128), (0, 1)),    # the diagonal block only
    ((3, 32, 32, 128, 128), (0, 4)),    # the last block sees every key block
    ((1, 32, 16, 128, 128), (0, 4)),    # rows 32..63: the diagonal spans key blocks 2 and 3
    ((0, 16, 32, 64, 64), (0, 1)),      # rows 0..15 end inside key block 0
    ((2, 32, 32, 70, 70), (0, 3)),      # the query tail: rows 64..69 see keys 0..69
    ((0, 32, 32, 3, 6), (0, 1)),        # bottom-right: rows 0..2 see keys up to 5
    ((0, 16, 16, 1, 100), (0, 7)),      # decoding: the one query sees all 100 keys
    ((0, 32, 32, 64, 16), (0, 0)),      # rows 0..31 of 64 over 16 keys: i + 16 - 64 < 0, no key
    ((1, 32, 32, 64, 16), (0, 1)),
])
def test_causal_block_range_by_hand(args, expected):
    assert masks.causal_block_range(*args) == expected


@settings(max_examples=300, deadline=None, derandomize=True)
@given(n_q=st.integers(1, 200), n_k=st.integers(1, 200), block_m=st.sampled_from([16, 32, 64]),
       block_n=st.sampled_from([16, 32, 64]), data=st.data())
def test_causal_block_range_is_exactly_the_blocks_with_a_visible_key(n_q, n_k, block_m, block_n, data):
    start_m = data.draw(st.integers(0, cdiv(n_q, block_m) - 1))
    lo, hi = masks.causal_block_range(start_m, block_m, block_n, n_q, n_k)
    assert list(range(lo, hi)) == blocks_seen(visible(n_q, n_k, causal=True), start_m, block_m, block_n)
    general = masks.block_range(start_m, block_m, block_n, n_q, n_k, causal=True)
    assert (general.lo, general.hi) == (lo, hi) and general.visited == range(lo, hi)


@pytest.mark.parametrize("args, error, words", [
    ((4, 32, 32, 128, 128), ValueError, r"start_m must be a query block index in \[0, cdiv\(n_q, block_m\)\) "
                                        r"= \[0, 4\), got start_m=4"),
    ((-1, 32, 32, 128, 128), ValueError, "start_m must be >= 0, got start_m=-1"),
    ((0, 0, 32, 128, 128), ValueError, "block_m must be a positive int, got block_m=0"),
    ((0, 32, 32.0, 128, 128), TypeError, r"block_n must be an int, got 32.0 \(float\)"),
    ((0, 32, 32, 0, 128), ValueError, "n_q must be a positive int"),
])
def test_causal_block_range_errors_name_the_argument(args, error, words):
    with pytest.raises(error, match=words):
        masks.causal_block_range(*args)


# ------------------------------------------------------------------ any mask: ranges and tiles
mask_problems = dict(
    n_q=st.integers(1, 100), n_k=st.integers(0, 100), block_m=st.sampled_from([8, 16, 32]),
    block_n=st.sampled_from([8, 16, 32]), causal=st.booleans(),
    window=st.one_of(st.none(), st.tuples(st.integers(-1, 40), st.integers(-1, 40))),
    seq_len=st.one_of(st.none(), st.integers(0, 100)))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(**mask_problems)
def test_block_ranges_give_the_tiles_of_the_element_mask(n_q, n_k, block_m, block_n, causal, window, seq_len):
    """Visited = the blocks some valid row sees; unmasked = the blocks every valid row sees whole."""
    allowed = visible(n_q, n_k, causal, window, seq_len)
    predicted = masks.predicted_tiles(n_q, n_k, block_m, block_n, causal=causal, window=window, seq_len=seq_len)
    from_mask = masks.tile_status(allowed, block_m, block_n, q_len=seq_len)
    assert np.array_equal(predicted, from_mask), f"{predicted}\n{from_mask}"
    for i in range(predicted.shape[0]):
        r = masks.block_range(i, block_m, block_n, n_q, n_k, causal=causal, window=window, seq_len=seq_len)
        assert list(r.visited) == blocks_seen(allowed, i, block_m, block_n)
        assert r.masked == [j for j in r.visited if predicted[i, j] == TILE_MASKED]


def test_tile_status_by_hand():
    allowed = attention_mask(6, 6, causal=True)[0, 0]
    assert masks.tile_status(allowed, 2, 2).tolist() == [[2, 0, 0], [1, 2, 0], [1, 1, 2]]
    assert masks.tile_status(allowed, 4, 4).tolist() == [[2, 0], [1, 2]]  # rows 4, 5: keys 0..3 whole
    # padding queries do not count: rows 3 and 4 (q_len = 3) would make the second block masked
    assert masks.tile_status(np.ones((5, 4), dtype=bool), 4, 4, q_len=3).tolist() == [[1], [0]]
    assert masks.tile_status(np.ones((4, 5), dtype=bool), 4, 4).tolist() == [[1, 2]]  # the key tail
    with pytest.raises(TypeError, match=r"allowed must be a 2-D boolean mask \(N_q, N_k\), got int64"):
        masks.tile_status(np.ones((4, 4), dtype=np.int64), 4, 4)


@pytest.mark.skipif(not runtime.INTERPRET, reason="the kernel's record is compared on the interpreter's run")
@settings(max_examples=40, deadline=None, derandomize=True)
@given(**mask_problems)
def test_predicted_tiles_are_the_kernels_record(n_q, n_k, block_m, block_n, causal, window, seq_len):
    assume(n_k > 0 and block_m >= 16 and block_n >= 16)  # the kernel's smallest blocks are 16
    record = tiles.record_attention_tiles(n_q, n_k, block_m=block_m, block_n=block_n, causal=causal,
                                          window=window, seq_len=seq_len)
    predicted = masks.predicted_tiles(n_q, n_k, block_m, block_n, causal=causal, window=window, seq_len=seq_len)
    assert np.array_equal(record.status, predicted), f"kernel\n{record.status}\npredicted\n{predicted}"


def test_kernel_skips_a_block_whose_keys_are_all_past_the_window_and_the_length():
    # rows 0..9 sit at key positions 50..59 (bottom right), see keys >= 45 (window 5) and < 35 (seq_len):
    # no row sees any key, and the key block 32..47 that holds both edges must not be loaded either.
    record = tiles.record_attention_tiles(10, 60, block_m=16, block_n=16, causal=True, window=(5, 0), seq_len=35)
    assert not record.visible.any()
    assert (record.status == TILE_SKIPPED).all(), record.status


def test_causal_skips_about_half_the_tiles():
    for n, expected in ((256, 28 / 64), (4096, (128 * 127 / 2) / 128 ** 2)):
        status = masks.predicted_tiles(n, n, 32, 32, causal=True)
        assert (status == TILE_SKIPPED).mean() == pytest.approx(expected)
        assert (status == TILE_MASKED).sum() == n // 32  # the diagonal
        assert (status == TILE_COMPUTED).sum() == status.size - (n // 32) - (status == TILE_SKIPPED).sum()


# ------------------------------------------------------------------ padding_mask
@settings(max_examples=100, deadline=None, derandomize=True)
@given(n_q=st.integers(0, 40), n_k=st.integers(0, 40), data=st.data())
def test_padding_mask_is_the_references_keys_and_valid_queries(n_q, n_k, data):
    lens = data.draw(st.lists(st.integers(0, max(n_q, n_k)), min_size=1, max_size=4))
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    mask = masks.padding_mask(seq_lens, n_q, n_k)
    assert mask.dtype == torch.bool and mask.shape == (len(lens), 1, n_q, n_k)
    keys = attention_mask(n_q, n_k, seq_lens=seq_lens, batch=len(lens))
    queries = torch.arange(n_q).view(1, 1, -1, 1) < seq_lens.view(-1, 1, 1, 1)
    assert torch.equal(mask, keys & queries)


def test_padding_mask_gives_the_references_attention():
    """Scores masked with it, softmaxed (empty rows give 0) and times V: naive_attention(seq_lens=...)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 20, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    seq_lens = torch.tensor([20, 7, 0], dtype=torch.int32)
    scores = (q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(~masks.padding_mask(seq_lens, 20, 20), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows: 0/0 here, 0 by the rule
    out = probs @ v
    assert torch.allclose(out, naive_attention(q, k, v, seq_lens=seq_lens), rtol=0, atol=1e-12)
    assert (out[1, :, 7:] == 0).all() and (out[2] == 0).all()


def test_padding_mask_errors():
    with pytest.raises(TypeError, match=r"seq_lens must be a 1-D tensor of lengths \(B,\)"):
        masks.padding_mask([3, 4], 5, 5)
    with pytest.raises(ValueError, match="n_k must be >= 0, got n_k=-1"):
        masks.padding_mask(torch.tensor([3]), 5, -1)
