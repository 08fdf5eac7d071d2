"""flashlib.io_model: the byte counts by hand on small cases, their growth in N and M, and the
FlashAttention-2 count equal to what the real kernel loads according to its own tile record."""
import pytest
import torch

from flashlib import io_model, runtime
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.spec import AttentionSpec

DEVICE = runtime.DEVICE
H100 = io_model.SRAM_PER_SM["H100"]


def test_naive_by_hand():
    # N = 4, d = 2, 2 bytes: reads Q, K (8 + 8), S (16), P (16), V (8); writes S, P (16 + 16), O (8)
    t = io_model.naive_traffic(4, 2, dtype_bytes=2)
    assert (t.reads, t.writes, t.total) == (112, 80, 192)
    assert io_model.naive_traffic(4, 2, batch=3, heads=5).total == 15 * 192


def test_flash2_by_hand():
    # N = 64, d = 16, 4 bytes, 16-row query blocks: Q once (64 rows), K and V once per query block (4 x 64 rows)
    t = io_model.flash2_traffic(64, 16, block_m=16, block_n=32, dtype_bytes=4)
    assert t.reads == (64 + 2 * 4 * 64) * 16 * 4
    assert t.writes == 64 * 16 * 4 + 64 * 4  # O, and L in float32


def test_flash1_matches_algorithm_1_counted_loop_by_loop():
    n, d, s, block_n = 96, 16, 2, 32
    reads = writes = 0
    writes += n * d * s + 2 * n * 4  # O = 0, l = 0, m = -inf in HBM
    for _ in range(0, n, block_n):  # outer loop: K_j, V_j
        reads += 2 * block_n * d * s
        for _ in range(0, n, 16):  # inner loop: Q_i, O_i, l_i, m_i in, O_i, l_i, m_i out
            reads += 2 * 16 * d * s + 2 * 16 * 4
            writes += 16 * d * s + 2 * 16 * 4
    assert io_model.flash1_traffic(n, d, block_n=block_n, dtype_bytes=s) == io_model.Traffic(reads, writes)


def test_paper_block_sizes():
    assert io_model.paper_block_sizes(H100, 64) == (456, 64)  # floor(228 KiB / (4 * 64 * 2 bytes)), min(., d)
    assert io_model.paper_block_sizes(H100, 128) == (228, 128)
    assert io_model.paper_block_sizes(1024, 64) == (2, 2)
    with pytest.raises(ValueError, match="cannot hold one row"):
        io_model.paper_block_sizes(100, 64)


def test_naive_grows_as_n_squared_flash_as_n_squared_over_m():
    n, d = 16384, 64
    assert io_model.naive_traffic(2 * n, d).total / io_model.naive_traffic(n, d).total == pytest.approx(4, rel=0.01)
    small = io_model.flash2_traffic(n, d, sram_bytes=H100 // 2).total
    big = io_model.flash2_traffic(n, d, sram_bytes=H100).total
    assert small / big == pytest.approx(2, rel=0.02)  # twice the SRAM, half the K/V re-reads
    fa1_small = io_model.flash1_traffic(n, d, sram_bytes=H100 // 2).total
    fa1_big = io_model.flash1_traffic(n, d, sram_bytes=H100).total
    assert fa1_small / fa1_big == pytest.approx(2, rel=0.02)
    # at the H100's SRAM, flash moves an order of magnitude fewer bytes than naive attention
    assert io_model.naive_traffic(n, d).total / big > 10


def test_fa1_order_moves_more_than_fa2_order_with_the_same_blocks():
    for n in (1024, 8192):
        fa1 = io_model.flash1_traffic(n, 64, block_n=128)
        fa2 = io_model.flash2_traffic(n, 64, block_m=128, block_n=128)
        assert 1.4 < fa1.total / fa2.total < 1.7  # O is read and written once per K/V block
        assert fa1.writes > 8 * fa2.writes


def test_causal_reads_about_half_the_keys():
    full = io_model.flash2_traffic(8192, 64, block_m=128, block_n=64)
    causal = io_model.flash2_traffic(8192, 64, block_m=128, block_n=64, causal=True)
    assert causal.writes == full.writes
    assert 0.5 < causal.reads / full.reads < 0.52


def test_programs():
    assert io_model.programs("fa2", 8192, block_m=128, batch=2, heads=16) == 64 * 32
    assert io_model.programs("fa1", 8192, block_m=128, batch=2, heads=16) == 32
    with pytest.raises(ValueError, match="loop_order must be 'fa1' or 'fa2'"):
        io_model.programs("fa3", 8192, block_m=128)


def record(n_q, n_k, block_m, block_n, batch=1, heads=1, kv_heads=None, seq_lens=None, **mask):
    """The real kernel's tile record (B*H, T_r, T_c)."""
    gen = torch.Generator().manual_seed(0)
    kv_heads = kv_heads or heads
    q = torch.randn(batch, heads, n_q, 16, generator=gen).to(DEVICE)
    k, v = (torch.randn(batch, kv_heads, n_k, 16, generator=gen).to(DEVICE) for _ in range(2))
    tiles = torch.zeros(batch * heads, -(-n_q // block_m), -(-n_k // block_n), dtype=torch.int8, device=DEVICE)
    lens = None if seq_lens is None else torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    launch_attention_forward(q, k, v, torch.empty_like(q), torch.empty(batch, heads, n_q, device=DEVICE),
                             spec=AttentionSpec(**mask), block_m=block_m, block_n=block_n, tiles=tiles,
                             seq_lens=lens)
    return tiles


@pytest.mark.parametrize("n_q, n_k, block_m, block_n, causal", [
    (128, 128, 32, 32, False),
    (128, 128, 32, 32, True),
    (100, 75, 32, 16, True),   # more queries than keys: the first rows see no key
    (75, 100, 16, 32, True),
    (70, 90, 32, 32, False),   # tails
])
def test_flash2_count_equals_the_kernels_record(n_q, n_k, block_m, block_n, causal):
    tiles = record(n_q, n_k, block_m, block_n, batch=2, heads=2, kv_heads=1, causal=causal)
    counted = io_model.kernel_traffic(tiles, n_q, n_k, 16, block_m, block_n, dtype_bytes=4)
    model = io_model.flash2_traffic(n_q, 16, n_k=n_k, block_m=block_m, block_n=block_n, causal=causal,
                                    batch=2, heads=2, dtype_bytes=4)
    assert counted == model


def test_kernel_traffic_with_padding_reads_only_the_valid_keys():
    tiles = record(64, 64, 16, 16, batch=2, heads=1, seq_lens=[64, 20])
    counted = io_model.kernel_traffic(tiles, 64, 64, 16, 16, 16, dtype_bytes=2, seq_lens=[64, 20])
    # sample 0: 4 query blocks x 64 keys; sample 1: 2 query blocks (rows < 20) x 20 keys (2 blocks, 16 + 4)
    keys = 4 * 64 + 2 * 20
    assert counted.reads == (2 * 64 + 2 * keys) * 16 * 2
    assert counted.writes == 2 * 64 * (16 * 2 + 4)


def test_kernel_traffic_refuses_a_record_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"tiles must have shape \(B\*H, cdiv\(n_q, block_m\)"):
        io_model.kernel_traffic(torch.zeros(1, 3, 3), 64, 64, 16, 16, 16)


@pytest.mark.parametrize("call, error, message", [
    (lambda: io_model.naive_traffic(64, 0), ValueError, "head_dim must be >= 1, got head_dim=0"),
    (lambda: io_model.naive_traffic(64.0, 16), TypeError, "n_q must be an int"),
    (lambda: io_model.flash2_traffic(64, 16), ValueError, "give block_m and block_n, or sram_bytes"),
    (lambda: io_model.flash1_traffic(64, 16, block_n=-1), ValueError, "block_n must be >= 1"),
])
def test_errors_name_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ---------------------------------------------------------------- backward, and model against measurement

def test_naive_backward_by_hand():
    # N = 4, d = 2, 2 bytes (the paper's Algorithm 3): reads P, dO | dO, V | P, dP | dS, K | dS, Q
    #   = (16 + 8) + (8 + 8) + (16 + 16) + (16 + 8) + (16 + 8) = 120 elements;
    # writes dV, dP, dS, dQ, dK = 8 + 16 + 16 + 8 + 8 = 56 elements
    t = io_model.naive_backward_traffic(4, 2, dtype_bytes=2)
    assert (t.reads, t.writes) == (240, 112)
    assert io_model.naive_backward_traffic(4, 2, batch=2, heads=3).total == 6 * 352


def test_flash2_backward_by_hand():
    # N = 64, d = 16, 2 bytes (32 bytes a row), 32 x 32 blocks, one head
    row, stats = 16 * 2, 4
    preprocess = (2 * 64 * row, 64 * stats)  # reads O, dO; writes D
    # dK/dV: K, V once; each of the 2 key blocks streams Q, dO, L, D of all 64 query rows
    dkdv = (2 * 64 * row + 2 * 64 * (2 * row + 2 * stats), 2 * 64 * row)
    # dQ: Q, dO, L, D once; each of the 2 query blocks streams K, V of all 64 keys
    dq = (2 * 64 * row + 2 * 64 * stats + 2 * 64 * 2 * row, 64 * row)
    t = io_model.flash2_backward_traffic(64, 16, block_m=32, block_n=32)
    assert t.reads == preprocess[0] + dkdv[0] + dq[0] == 30208
    assert t.writes == preprocess[1] + dkdv[1] + dq[1] == 6400
    # causal: key block 32 starts at query block 32 (32 + 64 query rows); query block 0 reads keys 0..31
    c = io_model.flash2_backward_traffic(64, 16, block_m=32, block_n=32, causal=True)
    assert c.reads == 30208 - 32 * (2 * row + 2 * stats) - 32 * 2 * row
    assert c.writes == t.writes


def test_attention_hbm_bytes_and_flops():
    n, d = 1024, 64
    assert io_model.attention_hbm_bytes("naive", 2, 4, n, d) == io_model.naive_traffic(n, d, batch=2, heads=4).total
    assert io_model.attention_hbm_bytes("naive", 1, 1, n, d, mode="train") == (
        io_model.naive_traffic(n, d).total + io_model.naive_backward_traffic(n, d).total)
    assert io_model.attention_hbm_bytes("flash", 1, 1, n, d, causal=True, block_m=128, block_n=64) == (
        io_model.flash2_traffic(n, d, block_m=128, block_n=64, causal=True).total)
    assert io_model.attention_hbm_bytes("flash", 1, 1, n, d, mode="bwd") == (
        io_model.flash2_backward_traffic(n, d).total)
    with pytest.raises(ValueError, match="impl must be 'naive' or 'flash'"):
        io_model.attention_hbm_bytes("sdpa", 1, 1, n, d)
    with pytest.raises(ValueError, match="mode must be one of"):
        io_model.attention_hbm_bytes("flash", 1, 1, n, d, mode="both")
    assert io_model.attention_flops(1, 2, 8, 4, causal=True, mode="bwd") == 4 * 2 * 64 * 4 / 2 * 2.5


def test_implied_bytes_intensity_roofline():
    assert io_model.implied_bytes(2.0, 3000) == pytest.approx(6e9)  # 2 ms at 3 TB/s
    assert io_model.arithmetic_intensity(1e12, 4e9) == 250
    # 1 TFLOP at 500 TFLOP/s = 2 ms; 1 GB at 2000 GB/s = 0.5 ms: compute bound, 2 ms
    assert io_model.roofline_ms(1e12, 1e9, 500, 2000) == pytest.approx(2.0)
    assert io_model.roofline_ms(1e9, 1e10, 500, 2000) == pytest.approx(5.0)  # memory bound
    with pytest.raises(ValueError, match="hbm_gb_per_s > 0"):
        io_model.implied_bytes(1.0, 0)


def test_io_analysis_of_a_row():
    row = dict(impl="naive", mode="fwd", dtype="fp16", causal=False, N=1024, D=64, batch=1, heads=1, ms=0.01)
    a = io_model.io_analysis(row, hbm_gb_per_s=2000, peak_tflops=500)
    predicted = io_model.naive_traffic(1024, 64).total
    assert a["predicted_bytes"] == predicted
    assert a["implied_bytes"] == pytest.approx(2e7)  # 0.01 ms at 2000 GB/s
    assert a["predicted_fraction"] == pytest.approx(predicted / 2e7)
    assert a["intensity"] == pytest.approx(4 * 1024 ** 2 * 64 / predicted)
    assert a["bound"] == "memory"  # about 30 FLOP/byte, below the ridge at 500e12 / 2000e9 = 250
    flash = io_model.io_analysis(dict(row, impl="flashlib", ms=None), hbm_gb_per_s=2000)
    assert flash["predicted_bytes"] == io_model.flash2_traffic(1024, 64, block_m=128, block_n=64).total
    assert flash["implied_bytes"] is None and flash["bound"] is None


def test_flash2_backward_kernels_per_kernel_blocks():
    # N = 64, d = 16, 2 bytes (32 bytes a row); dK/dV with 16 x 32 blocks, dQ with 32 x 16 blocks
    row, stats = 16 * 2, 4
    k = io_model.flash2_backward_kernels(64, 16, dkdv_blocks=(16, 32), dq_blocks=(32, 16))
    assert list(k) == list(io_model.BACKWARD_KERNELS)
    assert k["preprocess"] == io_model.Traffic(2 * 64 * row, 64 * stats)
    # 2 key blocks, each streams all 64 query rows (Q, dO, L, D)
    assert k["dkdv"] == io_model.Traffic(2 * 64 * row + 2 * 64 * (2 * row + 2 * stats), 2 * 64 * row)
    # 2 query blocks, each streams all 64 keys (K, V)
    assert k["dq"] == io_model.Traffic(2 * 64 * row + 2 * 64 * stats + 2 * 64 * 2 * row, 64 * row)
    # the same blocks for both kernels sum to flash2_backward_traffic
    same = io_model.flash2_backward_kernels(1000, 64, dkdv_blocks=(128, 64), dq_blocks=(128, 64), causal=True,
                                            batch=2, heads=3)
    total = io_model.flash2_backward_traffic(1000, 64, block_m=128, block_n=64, causal=True, batch=2, heads=3)
    assert sum(t.total for t in same.values()) == total.total
    assert sum(t.writes for t in same.values()) == total.writes


def test_whole_sequence_blocks_give_the_compulsory_traffic():
    n, d, row, stats = 256, 32, 32 * 2, 4
    for causal in (False, True):
        fwd = io_model.flash2_traffic(n, d, block_m=n, block_n=n, causal=causal)
        assert fwd == io_model.Traffic(3 * n * row, n * row + n * stats)  # Q, K, V in; O, L out
        k = io_model.flash2_backward_kernels(n, d, dkdv_blocks=(n, n), dq_blocks=(n, n), causal=causal)
        assert k["dkdv"] == io_model.Traffic(4 * n * row + 2 * n * stats, 2 * n * row)  # K, V, Q, dO, L, D
        assert k["dq"] == io_model.Traffic(4 * n * row + 2 * n * stats, n * row)
    with pytest.raises(ValueError, match="block_n must be >= 1"):
        io_model.flash2_backward_kernels(64, 16, dq_blocks=(32, 0))
