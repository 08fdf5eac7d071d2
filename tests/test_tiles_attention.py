"""flashlib.tiles attention maps: the record is the kernel's, it agrees with the element mask, and the
picture draws it."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from flashlib import tiles
from flashlib.reference import attention_mask
from flashlib.tiles import TILE_COMPUTED, TILE_MASKED


def status_from_mask(visible: np.ndarray, block_m: int, block_n: int, q_len: int) -> np.ndarray:
    """What a tile should be, from the element mask alone: skipped if no valid row sees any of its
    keys, computed whole if every valid row sees all of them (inside N_k), masked otherwise."""
    n_q, n_k = visible.shape
    rows, cols = -(-n_q // block_m), -(-n_k // block_n)
    padded = np.zeros((rows * block_m, cols * block_n), dtype=bool)
    padded[:n_q, :n_k] = visible
    valid = np.arange(rows * block_m) < min(q_len, n_q)
    status = np.zeros((rows, cols), dtype=int)
    for i in range(rows):
        for j in range(cols):
            r = slice(i * block_m, (i + 1) * block_m)
            tile = padded[r, j * block_n:(j + 1) * block_n][valid[r]]
            if tile.size and tile.any():
                status[i, j] = TILE_COMPUTED if tile.all() else TILE_MASKED
    return status


def test_no_mask_masks_only_the_key_tail():
    t = tiles.record_attention_tiles(100, 100, block_m=32, block_n=32)
    assert t.status.shape == (4, 4) and t.label == "no mask"
    assert (t.status[:, :3] == TILE_COMPUTED).all() and (t.status[:, 3] == TILE_MASKED).all()
    assert t.counts() == {"computed": 12, "masked": 4, "skipped": 0}
    assert t.visible.all() and t.visible.shape == (100, 100)


def test_causal_computes_below_masks_on_and_skips_above_the_diagonal():
    t = tiles.record_attention_tiles(128, 128, block_m=32, block_n=32, causal=True)
    assert t.status.tolist() == [[2, 0, 0, 0], [1, 2, 0, 0], [1, 1, 2, 0], [1, 1, 1, 2]]
    assert t.visited(2) == [0, 1, 2]
    assert np.array_equal(t.visible, attention_mask(128, 128, causal=True)[0, 0].numpy())
    with pytest.raises(ValueError, match=r"query_block must be in \[0, 4\)"):
        t.visited(4)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(n_q=st.integers(1, 96), n_k=st.integers(1, 96), block_m=st.sampled_from([16, 32]),
       block_n=st.sampled_from([16, 32]), causal=st.booleans(),
       window=st.one_of(st.none(), st.tuples(st.integers(-1, 40), st.integers(-1, 40))),
       seq_len=st.one_of(st.none(), st.integers(0, 96)))
def test_the_record_follows_the_element_mask(n_q, n_k, block_m, block_n, causal, window, seq_len):
    t = tiles.record_attention_tiles(n_q, n_k, block_m=block_m, block_n=block_n, causal=causal,
                                     window=window, seq_len=seq_len)
    q_len = n_q if seq_len is None else seq_len
    assert np.array_equal(t.status, status_from_mask(t.visible, block_m, block_n, q_len)), t.status


def _texts(fig):
    return [text.get_text() for ax in fig.axes for text in ax.texts]


def test_the_picture_titles_counts_and_numbers_one_programs_walk():
    plain = tiles.record_attention_tiles(128, 128, block_m=32, block_n=32)
    causal = tiles.record_attention_tiles(128, 128, block_m=32, block_n=32, causal=True)
    fig = tiles.plot_attention_tiles(plain, causal, program=2)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["no mask: 16 computed, 0 masked,\n0 skipped of 16 tiles",
                      "causal: 6 computed, 4 masked,\n6 skipped of 16 tiles"]
    assert _texts(fig) == ["0", "1", "2", "3", "0", "1", "2"]  # program 2 visits 4 key blocks, then 3
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert legend[:3] == ["computed, no mask", "computed with an element mask", "skipped: never loaded"]


def test_the_picture_refuses_what_is_not_a_record():
    with pytest.raises(TypeError, match="expected one or more AttentionTiles"):
        tiles.plot_attention_tiles(np.zeros((4, 4)))
    with pytest.raises(TypeError, match="expected one or more AttentionTiles"):
        tiles.plot_attention_tiles()
