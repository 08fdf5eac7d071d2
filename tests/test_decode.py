"""Decoding: flash_attention_with_kvcache (contiguous and paged caches), split-KV, variant choice.

Every result is compared with the float64 reference :func:`flashlib.reference.kvcache_attention`
(each sequence's cached keys gathered plainly, then naive attention), on fresh random inputs.
"""
from __future__ import annotations

import math

import pytest
import torch

import flashlib
import flashlib.decode
from flashlib import flash_attention, flash_attention_with_kvcache, runtime, select_variant
from flashlib.kernels import decode as decode_kernels
from flashlib.reference import kvcache_attention, naive_attention
from flashlib.validation import relative_error

DEVICE = runtime.DEVICE
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _randn(*shape, gen, dtype=torch.float32):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(DEVICE, dtype)


def _problem(batch=3, heads=4, heads_kv=2, n_q=1, n_new=1, capacity=96, head_dim=32, dtype=torch.float32,
             lengths=None, seed=0):
    """q, a contiguous cache with random content everywhere, new k/v, and cache_seqlens (random unless given)."""
    gen = torch.Generator().manual_seed(seed)
    q = _randn(batch, n_q, heads, head_dim, gen=gen, dtype=dtype)
    k_cache = _randn(batch, capacity, heads_kv, head_dim, gen=gen, dtype=dtype)
    v_cache = _randn(batch, capacity, heads_kv, head_dim, gen=gen, dtype=dtype)
    k = _randn(batch, n_new, heads_kv, head_dim, gen=gen, dtype=dtype) if n_new else None
    v = _randn(batch, n_new, heads_kv, head_dim, gen=gen, dtype=dtype) if n_new else None
    if lengths is None:
        lengths = torch.randint(0, capacity - n_new + 1, (batch,), generator=gen).tolist()
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    return q, k_cache, v_cache, k, v, cache_seqlens


def _paged(cache: torch.Tensor, page_size: int, gen: torch.Generator, spare_pages: int = 3):
    """The same tokens as a contiguous cache, in pages shuffled over a pool, and the block table."""
    batch, capacity = cache.shape[:2]
    pages_per_seq = capacity // page_size
    num_pages = batch * pages_per_seq + spare_pages
    table = torch.randperm(num_pages, generator=gen)[:batch * pages_per_seq].view(batch, pages_per_seq)
    pool = torch.randn(num_pages, page_size, *cache.shape[2:], generator=gen, dtype=torch.float64)
    pool = pool.to(DEVICE, cache.dtype)
    for b in range(batch):
        for p in range(pages_per_seq):
            pool[table[b, p]] = cache[b, p * page_size:(p + 1) * page_size]
    return pool, table.to(DEVICE, torch.int32).contiguous()


def _reference(q, k_cache, v_cache, lengths, **kwargs):
    o, lse = kvcache_attention(q.double(), k_cache.double(), v_cache.double(), lengths, return_lse=True, **kwargs)
    return o, lse


def _expected_cache(cache, new, lengths):
    expected = cache.clone()
    for b, n in enumerate(lengths.tolist()):
        expected[b, n:n + new.shape[1]] = new[b]
    return expected


# ------------------------------------------------------------------ contiguous cache
@pytest.mark.parametrize("heads_kv", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("n_q", [1, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_contiguous_cache_matches_the_reference(heads_kv, n_q, causal, nan_empty):
    q, k_cache, v_cache, k, v, lengths = _problem(heads_kv=heads_kv, n_q=n_q, n_new=n_q, lengths=[0, 37, 96 - n_q])
    before_k, before_v = k_cache.clone(), v_cache.clone()
    o, lse = flash_attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, causal=causal,
                                          return_lse=True)
    # the append, in place, and nothing else changed
    assert torch.equal(k_cache, _expected_cache(before_k, k, lengths))
    assert torch.equal(v_cache, _expected_cache(before_v, v, lengths))
    ref_o, ref_lse = _reference(q, k_cache, v_cache, lengths + n_q, causal=causal)
    assert not o.isnan().any() and not lse.isnan().any()  # every element written (torch.empty gives NaN here)
    assert relative_error(o, ref_o) < TOL[q.dtype]
    assert torch.allclose(lse.double(), ref_lse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_splits", [1, 2, 5, None])
def test_every_split_count_gives_the_same_answer(num_splits):
    q, k_cache, v_cache, _, _, lengths = _problem(n_new=0, capacity=300, lengths=[300, 1, 129], n_q=2)
    o, lse = flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=num_splits,
                                          return_lse=True)
    ref_o, ref_lse = _reference(q, k_cache, v_cache, lengths)
    assert relative_error(o, ref_o) < TOL[q.dtype]
    assert torch.allclose(lse.double(), ref_lse, atol=1e-5, rtol=0)


def test_split_count_follows_the_grid_and_the_keys(monkeypatch):
    """The heuristic splits only when the grid is short of SMs: into one wave of long chunks, or, where those
    would be short, into up to four waves of 64 KB chunks with few enough partials; never into chunks of < 128
    keys or more than MAX_SPLITS."""
    choose = decode_kernels.choose_num_splits
    assert choose(programs=264, n_k=1 << 17, sms=132) == 1
    assert choose(programs=8, n_k=1 << 17, sms=132) == 16  # one wave: chunks of 8192 keys (4 MB at D = 128)
    assert choose(programs=32, n_k=1 << 17, sms=132) == 4
    assert choose(programs=32, n_k=4096, sms=132) == 4  # one wave of 512 KB chunks: long enough
    assert choose(programs=32, n_k=4096, sms=132, head_dim=64) == 16  # 256 KB: cut into 64 KB chunks
    assert choose(programs=8, n_k=8192, sms=132) == 64  # 4 MB of K/V per head in 64 KB chunks, 512 programs
    assert choose(programs=100, n_k=1024, sms=132, head_dim=64) == 4  # 256 KB a head: four 64 KB chunks
    assert choose(programs=200, n_k=1024, sms=132, head_dim=64) == 1  # a full wave already
    assert choose(programs=64, n_k=1024, sms=132) == 8  # four waves of 128-key chunks
    assert choose(programs=64, n_k=1024, sms=132, rows=32) == 2  # 32 rows: partials would outweigh K/V
    assert choose(programs=8, n_k=512, sms=132) == 4  # never below 128 keys a chunk
    assert choose(programs=1, n_k=1 << 20, sms=132) == decode_kernels.MAX_SPLITS
    seen = []
    real = decode_kernels.merge_splits_kernel
    monkeypatch.setattr(decode_kernels, "merge_splits_kernel",
                        type("Spy", (), {"__getitem__": lambda self, grid: seen.append(grid) or real[grid]})())
    q, k_cache, v_cache, _, _, lengths = _problem(batch=1, heads=2, heads_kv=1, n_new=0, capacity=1024,
                                                  lengths=[1024])
    o = flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    assert seen and seen[0] == (2, 1)  # split (16 SMs in the interpreter), merged: 2 rows of 1 K/V head
    assert relative_error(o, _reference(q, k_cache, v_cache, lengths)[0]) < TOL[q.dtype]


@pytest.mark.parametrize("block_m", [0, 8, 24, 16.0, True])
def test_launch_refuses_a_block_m_that_is_not_a_power_of_two_from_16(block_m):
    q, k_cache, v_cache, _, _, lengths = _problem(batch=1, heads=2, heads_kv=1, n_new=0, capacity=64, lengths=[64])
    o, lse = torch.empty_like(q), torch.empty(1, 2, q.shape[1], device=q.device)
    with pytest.raises(ValueError, match=r"block_m must be None .* power of two >= 16.*got"):
        decode_kernels.launch_splitkv_attention(q, k_cache, v_cache, o, lse, scale=0.25, k_lens=lengths,
                                                block_m=block_m)


@pytest.mark.parametrize("block_m", [16, 32])
def test_an_explicit_block_m_gives_the_same_attention(block_m):
    """The experiments' override of rows per program: 8 packed rows (4 heads x 2 queries) in 16 or 32."""
    q, k_cache, v_cache, _, _, lengths = _problem(batch=2, heads=4, heads_kv=1, n_q=2, n_new=0, lengths=[70, 96])
    o, lse = torch.full_like(q, float("nan")), torch.empty(2, 4, 2, device=q.device)
    decode_kernels.launch_splitkv_attention(q, k_cache, v_cache, o, lse, scale=q.shape[-1] ** -0.5, causal=True,
                                            k_lens=lengths, block_m=block_m)
    assert relative_error(o, _reference(q, k_cache, v_cache, lengths)[0]) < TOL[q.dtype]


@pytest.mark.parametrize("num_splits", [1, 3])
def test_wide_programs_hold_every_row_of_an_mqa_head(num_splits):
    """128 rows per program (32 query heads x 4 queries of one K/V head), split or not, causal, with a
    sample whose cache is shorter than a block: every row, of both samples, against float64."""
    q, k_cache, v_cache, _, _, lengths = _problem(batch=2, heads=32, heads_kv=1, n_q=4, n_new=0, capacity=200,
                                                  head_dim=16, lengths=[200, 23], seed=5)
    o, lse = torch.full_like(q, float("nan")), torch.full((2, 32, 4), float("nan"), device=q.device)
    decode_kernels.launch_splitkv_attention(q, k_cache, v_cache, o, lse, scale=0.25, causal=True, k_lens=lengths,
                                            block_m=decode_kernels.WIDE_ROWS, num_splits=num_splits)
    ref_o, ref_lse = _reference(q, k_cache, v_cache, lengths, softmax_scale=0.25)
    assert relative_error(o, ref_o) < TOL[q.dtype]
    assert torch.allclose(lse.double(), ref_lse, atol=1e-5, rtol=0)


def test_rows_per_program_widen_only_for_long_chunks():
    """128-row programs where a K/V head has 128 rows and each wide program walks long chunks: at least 1k
    keys where 64-row programs split anyway, 8k where they would fill the GPU unsplit (H100: 132 SMs)."""
    choose = decode_kernels.choose_rows_per_program
    assert choose(rows=32, heads=1, n_k=1 << 17, sms=132) == 32  # fewer rows: all of them, as before
    assert choose(rows=64, heads=8, n_k=1 << 17, sms=132) == 64
    assert choose(rows=128, heads=1, n_k=1 << 17, sms=132, head_dim=64) == 128  # 128 chunks of 1024 keys
    assert choose(rows=128, heads=1, n_k=8192, sms=132, head_dim=64) == 64  # 64 chunks of 128 keys: too short
    assert choose(rows=128, heads=8, n_k=16384, sms=132) == 128  # 16 chunks of 1024 keys
    assert choose(rows=128, heads=8, n_k=8192, sms=132) == 64  # 16 chunks of 512 keys
    assert choose(rows=128, heads=64, n_k=16384, sms=132) == 128  # narrow: 128 programs unsplit; wide: 2 x 8k
    assert choose(rows=128, heads=64, n_k=4096, sms=132) == 64  # wide would split 4k keys in 2: narrow wins
    assert choose(rows=256, heads=64, n_k=4096, sms=132) == 64
    assert choose(rows=256, heads=64, n_k=1 << 15, sms=132) == 128  # two wide programs a head, 32k keys unsplit
    config = decode_kernels.launch_config
    assert config(128, 132, 128, 128, 2, chunk=8192) == (64, 3, 8)  # a 128 x 128 accumulator: 8 warps
    assert config(128, 132, 128, 64, 2, chunk=8192) == (64, 3, 4)  # 128 x 64: scores tile 128 x 64, 4 warps
    assert config(128, 132, 64, 64, 2, chunk=8192) == (128, 3, 4)  # narrow programs: 16 KB tiles
    # Wide programs of four warps (128 x 64, 2-byte types) aim at two an SM; every other program at one.
    per_sm = decode_kernels.split_programs_per_sm
    assert (per_sm(128, 64, 2), per_sm(128, 128, 2), per_sm(64, 64, 2), per_sm(128, 64, 4)) == (2, 1, 1, 1)
    assert decode_kernels.choose_num_splits(64, 1 << 14, 132, 64, 2, 128, programs_per_sm=2) == 4
    assert decode_kernels.choose_num_splits(64, 1 << 14, 132, 64, 2, 128) == 2
    assert decode_kernels.choose_num_splits(264, 1 << 14, 132, 64, 2, 128, programs_per_sm=2) == 1
    plan = decode_kernels.plan_splitkv_launch
    for page_size in (0, 64):  # MQA, 4 new queries: one 128-row program a K/V head; paged or not, one config
        assert plan(64, 32, 1, 4, 1 << 14, 64, 2, 132, page_size)[:5] == (128, 1, 4, 4096, (64, 3, 4))
        assert plan(8, 32, 1, 4, 1 << 15, 64, 2, 132, page_size)[:5] == (128, 1, 32, 1024, (64, 3, 4))
        assert plan(64, 32, 1, 4, 1 << 14, 128, 2, 132, page_size)[:5] == (128, 1, 2, 8192, (64, 3, 8))


def test_the_merge_launches_early_only_where_the_switch_and_the_device_allow(monkeypatch):
    """On Hopper the merge is a programmatic dependent launch; never in the interpreter or on the CPU."""
    assert not decode_kernels.merges_early(torch.device("cpu"))
    if runtime.INTERPRET:
        assert not decode_kernels.merges_early(torch.device("cuda", 0))
    monkeypatch.setattr(decode_kernels, "MERGE_LAUNCHES_EARLY", False)
    assert not decode_kernels.merges_early(torch.device("cuda", 0))


def test_an_early_merge_is_launched_with_pdl_and_waits_for_the_split_grid(monkeypatch):
    """The wiring: a split call launches its merge with ``launch_pdl`` and ``EARLY`` (which waits on the GPU);
    the interpreter cannot run griddepcontrol, so the spy strips both before launching there."""
    seen = []
    real_launch = decode_kernels.launch

    def spy(fn, grid, *args, **kwargs):
        seen.append((fn, {k: kwargs.get(k) for k in ("EARLY", "launch_pdl", "EARLY_MERGE")}))
        if runtime.INTERPRET:
            kwargs = {k: v for k, v in kwargs.items() if k not in ("EARLY", "launch_pdl", "EARLY_MERGE")}
        return real_launch(fn, grid, *args, **kwargs)

    monkeypatch.setattr(decode_kernels, "launch", spy)
    monkeypatch.setattr(decode_kernels, "merges_early", lambda device: True)
    q, k_cache, v_cache, _, _, lengths = _problem(batch=1, heads=2, heads_kv=1, n_new=0, capacity=512, lengths=[500])
    o, lse = torch.full_like(q, float("nan")), torch.empty(1, 2, 1, device=q.device)
    decode_kernels.launch_splitkv_attention(q, k_cache, v_cache, o, lse, scale=q.shape[-1] ** -0.5, k_lens=lengths,
                                            num_splits=4)
    merges = [flags for fn, flags in seen if fn is decode_kernels.merge_splits_kernel]
    assert merges == [{"EARLY": True, "launch_pdl": True, "EARLY_MERGE": None}]
    if not runtime.INTERPRET:  # the split kernel, launched through ``launch`` on a GPU, signals its dependents
        assert [flags["EARLY_MERGE"] for fn, flags in seen if fn is decode_kernels.splitkv_attention_kernel] == [True]
    assert relative_error(o, _reference(q, k_cache, v_cache, lengths)[0]) < TOL[q.dtype]


@pytest.mark.parametrize("hints", [("evict_later", ""), ("", ".cs"), ("evict_first",), ["", ""], "evict_first"])
def test_bad_kv_load_hints_are_refused_by_name(hints):
    q, k_cache, v_cache, _, _, lengths = _problem(batch=1, heads=2, heads_kv=1, n_new=0, capacity=64, lengths=[40])
    o, lse = torch.empty_like(q), torch.empty(1, 2, 1, device=q.device)
    with pytest.raises(ValueError, match="kv_load_hints must be a pair"):
        decode_kernels.launch_splitkv_attention(q, k_cache, v_cache, o, lse, scale=0.125, k_lens=lengths,
                                                kv_load_hints=hints)


def test_kv_load_hints_change_nothing_in_the_result():
    q, k_cache, v_cache, _, _, lengths = _problem(batch=1, heads=2, heads_kv=1, n_new=0, capacity=64, lengths=[40])
    outputs = []
    for hints in (decode_kernels.NO_LOAD_HINTS, ("evict_first", ".cg")):
        o, lse = torch.full_like(q, float("nan")), torch.empty(1, 2, 1, device=q.device)
        decode_kernels.launch_splitkv_attention(q, k_cache, v_cache, o, lse, scale=0.125, k_lens=lengths,
                                                kv_load_hints=hints)
        outputs.append(o)
    assert torch.equal(outputs[0], outputs[1]) and not outputs[0].isnan().any()


def test_launch_config_follows_the_grid_and_fits_shared_memory():
    config = decode_kernels.launch_config
    assert config(128, 132, 16, 128, 2, chunk=8192) == (64, 3, 4)  # one wave of long chunks: 16 KB tiles
    assert config(128, 132, 16, 64, 2, chunk=8192) == (128, 3, 4)  # the same tile bytes at D = 64
    assert config(512, 132, 16, 64, 2, chunk=256) == (128, 2, 4)  # short chunks: no more stages than blocks
    assert config(512, 132, 16, 128, 2, chunk=128) == (64, 2, 4)
    assert config(128, 132, 64, 128, 2) == (64, 3, 4)  # not split, one per SM: 16 KB
    assert config(256, 132, 16, 128, 2) == (32, 3, 4)  # about two per SM: 8 KB tiles
    assert config(256, 132, 16, 64, 2) == (64, 3, 4)
    assert config(512, 132, 16, 64, 2) == (32, 3, 4)  # 2 to 8 per SM: 4 KB tiles
    assert config(2048, 132, 16, 64, 2) == (32, 2, 4)  # 1.94 waves of eight an SM: the last one nearly full
    # Narrow programs at two or more an SM: the candidate whose last wave costs least (MANY_PROGRAM_CONFIGS).
    assert config(768, 132, 16, 64, 2) == (32, 3, 4)  # one wave of six an SM: three stages
    assert config(832, 132, 16, 64, 2) == (32, 2, 4)  # six an SM would need a second wave: two stages, eight an SM
    assert config(1088, 132, 16, 64, 2) == (128, 3, 4)  # eight an SM would leave one of 32: 128-key blocks
    assert config(512, 132, 16, 128, 2) == (32, 2, 4)  # D = 128: one wave of six an SM
    assert config(768, 132, 16, 128, 2) == (32, 2, 4)
    assert config(832, 132, 16, 128, 2) == (128, 2, 4)  # 40 programs over six an SM: 32 KB tiles
    assert config(2048, 132, 16, 128, 2) == (128, 2, 4)
    assert config(512, 132, 16, 64, 4) == (32, 2, 4)  # float32 at D = 64 has 256-byte rows too
    assert config(256, 132, 16, 128, 2) == (32, 3, 4)  # below two per SM: as for every head dim
    assert config(2048, 132, 16, 256, 2) == (32, 2, 4)  # 512-byte rows: not measured, the 4 KB rule
    assert config(2048, 132, 32, 128, 2) == (32, 2, 4)  # 32-row programs: not measured, the 4 KB rule


def test_a_partial_last_wave_costs_more_than_its_share():
    cost = decode_kernels.wave_cost
    assert cost(500, 1000) == cost(1000, 1000) == cost(2000, 1000) == 1.0  # one wave, whole waves
    assert cost(1030, 1000) > 1.25  # a second wave of 30 programs: about a third of a wave's time for 3% of the work
    assert cost(1030, 1000) > cost(1500, 1000) > cost(1900, 1000) > 1.0
    assert cost(10300, 1000) < cost(1030, 1000)  # the same tail is a smaller share of more waves
    candidates = (((32, 3, 4), 7, True), ((32, 2, 4), 8, True))
    assert decode_kernels.choose_by_waves(900, 132, candidates) == (32, 3, 4)  # both one wave: the first
    assert decode_kernels.choose_by_waves(1000, 132, candidates) == (32, 2, 4)
    one_wave_first = (((32, 3, 4), 7, False), ((128, 3, 4), 3, True))
    assert decode_kernels.choose_by_waves(900, 132, one_wave_first) == (32, 3, 4)
    assert decode_kernels.choose_by_waves(3 * 7 * 132, 132, one_wave_first) == (128, 3, 4)  # three whole waves: not allowed
    block_n, stages, _ = decode_kernels.launch_config(128, 132, 64, 256, 4)  # float32, D = 256
    assert 4 * 256 * (64 + 2 * block_n * stages) <= decode_kernels.smem_budget() and stages < 3


def test_registers_are_capped_only_where_four_small_two_page_programs_must_share_an_sm():
    cap = decode_kernels.register_cap
    assert decode_kernels.REGISTERS_FOR_MAX_WAVES == 128  # 4 programs x 4 warps x 32 threads x 128 = 65536
    assert cap(512, 132, 16, (128, 2, 4), page_size=64, row_bytes=128) == 128  # a fine split at 3.9 programs per SM
    assert cap(400, 132, 32, (128, 2, 4), page_size=64, row_bytes=128) == 128
    assert cap(396, 132, 16, (128, 2, 4), page_size=64, row_bytes=128) is None  # three per SM fit without a cap
    assert cap(512, 132, 16, (128, 2, 4), row_bytes=128) is None  # a contiguous cache
    assert cap(512, 132, 16, (64, 2, 4), page_size=64, row_bytes=128) is None  # one page a block
    assert cap(2048, 132, 16, (32, 2, 4), page_size=16, row_bytes=128) is None  # short blocks over two pages: not measured
    assert cap(2048, 132, 16, (128, 2, 4), page_size=64, row_bytes=256) is None  # 32 KB tiles (D = 128): not measured
    assert cap(512, 132, 64, (128, 2, 4), page_size=64,
               row_bytes=128) is None  # wgmma programs (240-255 registers) would spill
    assert cap(512, 132, 16, (128, 2, 8), page_size=64, row_bytes=128) is None
    # The plan caps split grids only: an unsplit grid of 128-key blocks over 64-token pages (B = 34, H_kv = 32,
    # D = 64: three programs an SM by their shared memory) keeps the compiler's registers.
    plan = decode_kernels.plan_splitkv_launch(34, 32, 32, 1, 1 << 14, 64, 2, 132, 64)
    assert (plan.num_splits, plan.config, plan.maxnreg) == (1, (128, 3, 4), None)
    assert decode_kernels.plan_splitkv_launch(1, 32, 32, 1, 4096, 64, 2, 132, 64).maxnreg == 128  # split, as measured


@pytest.mark.parametrize("paged, capped", [(True, True), (False, False)], ids=["two-pages", "contiguous"])
def test_the_gpu_launch_passes_the_register_cap_only_to_two_page_launches(monkeypatch, paged, capped):
    """The wiring on a GPU's path, with its launches recorded instead of run: 32 heads of one sequence over 4096
    keys at D = 64 cut into 16 splits (512 programs for 132 SMs), 128-key blocks over 64-token pages."""
    launches = []
    monkeypatch.setattr(decode_kernels.runtime, "INTERPRET", False)
    monkeypatch.setattr(decode_kernels, "multiprocessor_count", lambda index: 132)
    monkeypatch.setattr(decode_kernels, "merges_early", lambda device: False)
    monkeypatch.setattr(decode_kernels, "launch", lambda fn, grid, *args, **kwargs: launches.append((fn, kwargs)))
    q = torch.zeros(1, 1, 32, 64, dtype=torch.float16)
    pool = torch.zeros(64, 64, 32, 64, dtype=torch.float16) if paged else torch.zeros(1, 4096, 32, 64, dtype=torch.float16)
    table = torch.arange(64, dtype=torch.int32).view(1, 64) if paged else None
    decode_kernels.launch_splitkv_attention(q, pool, pool, torch.empty_like(q), torch.empty(1, 32, 1), scale=0.125,
                                            k_lens=torch.tensor([4096], dtype=torch.int32), block_table=table)
    (split_kwargs,) = [kwargs for fn, kwargs in launches if fn is decode_kernels.splitkv_attention_kernel]
    assert split_kwargs["BLOCK_N"] == 128 and split_kwargs["BLOCK_M"] == 16
    assert split_kwargs.get("maxnreg") == (128 if capped else None)


@pytest.mark.parametrize("window", [(7, 0), (20, 3), (0, 0)])
def test_windows_softcap_alibi_and_scale(window):
    q, k_cache, v_cache, k, v, lengths = _problem(n_q=3, n_new=3, lengths=[40, 5, 80], seed=1)
    slopes = torch.rand(3, 4, dtype=torch.float64).to(DEVICE, torch.float32)
    o = flash_attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, causal=False,
                                     window=window, softmax_scale=0.3, softcap=4.0, alibi_slopes=slopes,
                                     num_splits=3)
    ref = kvcache_attention(q.double(), k_cache.double(), v_cache.double(), lengths + 3, causal=False,
                            window=window, softmax_scale=0.3, softcap=4.0, alibi_slopes=slopes.double())
    assert relative_error(o, ref) < TOL[q.dtype]


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_a_window_bound_past_every_cached_sequence_is_unbounded(paged):
    """A bound as long as the cache or past int32 (where the kernel's sums would wrap round, or Triton would refuse
    the int) sees every cached key, as -1 does."""
    q, k_cache, v_cache, _, _, lengths = _problem(n_q=3, n_new=0, capacity=32, lengths=[30, 5, 17], seed=2)
    table = None
    if paged:
        k_cache, table = _paged(k_cache, 8, torch.Generator().manual_seed(0))
        v_cache, _ = _paged(v_cache, 8, torch.Generator().manual_seed(0))
    for side in (0, 1):
        def attend(window):
            return flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table,
                                                causal=False, window=window)
        unbounded = attend((0, -1) if side else (-1, 0))
        for bound in (32, 2**31 - 2, 2**31 - 1, 2**63, 2**64):
            assert torch.equal(attend((0, bound) if side else (bound, 0)), unbounded), bound


def test_queries_that_see_no_key_get_zero_and_minus_infinity():
    """An empty cache and no append: O = 0 and L = -inf for every query, split or not."""
    q, k_cache, v_cache, _, _, lengths = _problem(n_new=0, lengths=[0, 0, 3], n_q=4)
    for splits in (1, 2):
        o, lse = flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=splits,
                                              return_lse=True)
        assert torch.equal(o[:2], torch.zeros_like(o[:2]))
        assert bool((lse[:2] == float("-inf")).all())
        # sequence 2 has 3 keys and 4 queries: causal leaves query 0 with none
        assert torch.equal(o[2, 0], torch.zeros_like(o[2, 0])) and bool((lse[2, :, 0] == float("-inf")).all())
        assert bool(lse[2, :, 1:].isfinite().all())


def test_nan_in_a_seen_key_propagates_and_one_past_the_length_does_not():
    q, k_cache, v_cache, _, _, lengths = _problem(n_new=0, lengths=[50, 50, 50])
    k_cache[0, 10] = float("nan")  # seen by sequence 0
    k_cache[1, 60] = float("nan")  # past sequence 1's length: never read
    o = flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=1)
    assert o[0].isnan().all() and not o[1:].isnan().any()


def test_splitkv_never_reads_the_padding_past_seq_lens():
    """flash_attention(variant="splitkv", seq_lens=...): NaN and inf past each sample's length change nothing."""
    gen = torch.Generator().manual_seed(16)
    q, k, v = _randn(2, 4, 3, 32, gen=gen), _randn(2, 2, 40, 32, gen=gen), _randn(2, 2, 40, 32, gen=gen)
    lengths = torch.tensor([2, 25], dtype=torch.int32, device=DEVICE)
    clean = flash_attention(q, k, v, causal=True, seq_lens=lengths, variant="splitkv")
    q[0, :, 2:], k[0, :, 2:], v[0, :, 2:] = float("nan"), float("nan"), float("inf")
    k[1, :, 25:], v[1, :, 25:] = float("nan"), float("nan")
    assert torch.equal(flash_attention(q, k, v, causal=True, seq_lens=lengths, variant="splitkv"), clean)


@pytest.mark.parametrize("n_new", [0, 1])
def test_lengths_may_be_a_strided_view(n_new):
    """A serving loop keeps per-request fields in one table and passes a column: the kernels read lengths at
    offsets 0, 1, 2, ..., so a view of stride 2 once gave the neighbouring field's values (here 90 and 3)."""
    q, k_cache, v_cache, k, v, _ = _problem(n_q=1, n_new=n_new)
    table = torch.tensor([[37, 90], [5, 3], [60, 90]], dtype=torch.int32, device=DEVICE)
    o = flash_attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=table[:, 0])
    ref_o, _ = _reference(q, k_cache, v_cache, table[:, 0] + n_new)
    assert relative_error(o, ref_o) < TOL[q.dtype]


@pytest.mark.parametrize("variant", ["fa2", "splitkv"])
def test_seq_lens_may_be_a_strided_view(variant):
    gen = torch.Generator().manual_seed(17)
    q, k, v = (_randn(3, 2, 24, 16, gen=gen) for _ in range(3))
    table = torch.tensor([[24, 1], [9, 24], [17, 0]], dtype=torch.int32, device=DEVICE)
    o = flash_attention(q, k, v, causal=True, seq_lens=table[:, 0], variant=variant)
    ref = naive_attention(q.double(), k.double(), v.double(), causal=True, seq_lens=table[:, 0].contiguous())
    assert relative_error(o, ref) < TOL[q.dtype]


# ------------------------------------------------------------------ paged cache
@pytest.mark.parametrize("page_size", [16, 8, 48, 64], ids=["16", "8", "48", "64-one-page-per-block"])
def test_paged_cache_matches_the_contiguous_one(page_size):
    """Pages smaller than a key block, not dividing it, and holding whole blocks (one table read per block)."""
    gen = torch.Generator().manual_seed(3)
    q, k_cache, v_cache, k, v, lengths = _problem(n_q=2, n_new=2, capacity=192, lengths=[0, 45, 150], seed=2)
    k_pool, table = _paged(k_cache, page_size, gen)
    v_pool, _ = _paged(v_cache, page_size, torch.Generator().manual_seed(3))
    before_k = k_pool.clone()
    o = flash_attention_with_kvcache(q, k_pool, v_pool, k, v, cache_seqlens=lengths, block_table=table)
    # the append lands in the right page and row, and nowhere else
    expected = before_k.clone()
    for b, n in enumerate(lengths.tolist()):
        for t in range(2):
            pos = n + t
            expected[table[b, pos // page_size], pos % page_size] = k[b, t]
    assert torch.equal(k_pool, expected)
    ref_o, _ = _reference(q, k_pool, v_pool, lengths + 2, block_table=table)
    assert relative_error(o, ref_o) < TOL[q.dtype]
    o_contiguous = flash_attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths)
    assert relative_error(o, o_contiguous.double()) < TOL[q.dtype]


def test_paged_decoding_over_many_steps_matches_attention_over_the_whole_sequence():
    """Append one token per step through a shuffled block table; each step's output is the last row of
    causal attention over everything so far."""
    gen = torch.Generator().manual_seed(4)
    batch, heads, heads_kv, head_dim, page_size, steps = 2, 4, 2, 16, 4, 10
    table = torch.randperm(12, generator=gen)[:2 * 5].view(2, 5).to(DEVICE, torch.int32)
    k_pool = torch.zeros(12, page_size, heads_kv, head_dim, device=DEVICE)
    v_pool = torch.zeros_like(k_pool)
    qs = _randn(batch, steps, heads, head_dim, gen=gen)
    ks = _randn(batch, steps, heads_kv, head_dim, gen=gen)
    vs = _randn(batch, steps, heads_kv, head_dim, gen=gen)
    lengths = torch.tensor([0, 0], dtype=torch.int32, device=DEVICE)
    for t in range(steps):
        o = flash_attention_with_kvcache(qs[:, t:t + 1], k_pool, v_pool, ks[:, t:t + 1], vs[:, t:t + 1],
                                         cache_seqlens=lengths, block_table=table)
        lengths += 1
        full = flash_attention(qs[:, :t + 1], ks[:, :t + 1], vs[:, :t + 1], causal=True, layout="bnhd",
                               variant="fa2")
        assert relative_error(o, full[:, t:t + 1].double()) < TOL[torch.float32]


# ------------------------------------------------------------------ flash_attention's variants
@pytest.mark.parametrize("layout", ["bhnd", "bnhd", "3d"])
@pytest.mark.parametrize("kwargs", [dict(causal=True), dict(window=(5, 2)), dict(softcap=5.0),
                                    dict(causal=True, seq_lens="yes")], ids=["causal", "window", "softcap",
                                                                                "seq_lens"])
def test_splitkv_variant_matches_fa2(layout, kwargs):
    gen = torch.Generator().manual_seed(5)
    heads, heads_kv = (2, 2) if layout == "3d" else (4, 2)
    shape_q, shape_k = [2, heads, 3, 32], [2, heads_kv, 50, 32]
    q, k, v = _randn(*shape_q, gen=gen), _randn(*shape_k, gen=gen), _randn(*shape_k, gen=gen)
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    if layout == "3d":
        q, k, v = (t.flatten(0, 1) for t in (q, k, v))
    if kwargs.get("seq_lens"):
        kwargs = dict(kwargs, seq_lens=torch.tensor([2, 40, 7, 50][:q.shape[0]], dtype=torch.int32, device=DEVICE))
    layout_arg = "bhnd" if layout == "3d" else layout
    o_fa2, lse_fa2 = flash_attention(q, k, v, layout=layout_arg, variant="fa2", return_lse=True, **kwargs)
    o_split, lse_split = flash_attention(q, k, v, layout=layout_arg, variant="splitkv", return_lse=True, **kwargs)
    assert o_split.shape == o_fa2.shape and o_split.stride() == o_fa2.stride()
    assert relative_error(o_split, o_fa2.double()) < TOL[q.dtype]
    assert torch.allclose(lse_split, lse_fa2, atol=1e-5, rtol=0)  # -inf where a row sees no key, in both


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_decoding(dtype):
    q, k_cache, v_cache, k, v, lengths = _problem(n_new=1, dtype=dtype, lengths=[10, 60, 94], seed=6)
    o = flash_attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths)
    assert o.dtype == dtype
    assert relative_error(o, _reference(q, k_cache, v_cache, lengths + 1)[0]) < TOL[dtype]


def _count_splitkv_launches(monkeypatch):
    calls = []
    real = flashlib.decode.launch_splitkv_attention
    monkeypatch.setattr(flashlib.decode, "launch_splitkv_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def test_auto_picks_splitkv_for_decoding_and_fa2_for_training(monkeypatch):
    calls = _count_splitkv_launches(monkeypatch)
    gen = torch.Generator().manual_seed(7)
    q, k, v = _randn(1, 4, 1, 32, gen=gen), _randn(1, 2, 64, 32, gen=gen), _randn(1, 2, 64, 32, gen=gen)
    with torch.no_grad():
        flash_attention(q, k, v, causal=True)
    assert calls == [1]
    q.requires_grad_(True)
    o = flash_attention(q, k, v, causal=True)  # a gradient is needed: FlashAttention-2 (and its backward)
    o.sum().backward()
    assert calls == [1] and q.grad is not None
    with torch.no_grad():
        flash_attention(q, k, v, dropout_p=0.1)  # dropout: FlashAttention-2
        long_q = _randn(1, 4, 64, 32, gen=gen)
        flash_attention(long_q, k, v)  # 64 queries: FlashAttention-2
    assert calls == [1]


def test_auto_leaves_transforms_and_forward_ad_to_fa2(monkeypatch):
    """vmap, torch.func and forward-mode AD go through FlashAttention-2's op, which has their rules: a
    decoding-shaped call under them must neither crash nor drop a tangent."""
    calls = _count_splitkv_launches(monkeypatch)
    gen = torch.Generator().manual_seed(14)
    q, k, v = _randn(3, 1, 2, 2, 16, gen=gen), _randn(3, 1, 2, 9, 16, gen=gen), _randn(3, 1, 2, 9, 16, gen=gen)
    mapped = torch.func.vmap(lambda a, b, c: flash_attention(a, b, c, causal=True))(q, k, v)
    looped = torch.stack([flash_attention(q[i], k[i], v[i], causal=True, variant="fa2") for i in range(3)])
    assert torch.equal(mapped, looped)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(q[0], torch.ones_like(q[0]))
        tangent = torch.autograd.forward_ad.unpack_dual(flash_attention(dual, k[0], v[0])).tangent
    _, expected = torch.func.jvp(lambda a: flash_attention(a, k[0], v[0], variant="fa2"), (q[0],),
                                 (torch.ones_like(q[0]),))
    assert tangent is not None and torch.equal(tangent, expected)
    assert calls == []
    with pytest.raises(ValueError, match="torch.func transform"):
        torch.func.vmap(lambda a, b, c: flash_attention(a, b, c, variant="splitkv"))(q, k, v)


def test_the_kvcache_entry_refuses_transforms_and_forward_ad_by_name():
    """The split-KV kernel has no rules for them: a dual q's tangent was dropped silently (None), and torch.func.jvp
    or vmap failed inside Triton ("Cannot access storage of TensorWrapper"). Refused as flash_attention's
    variant="splitkv" is, whichever argument carries the transform."""
    q, k_cache, v_cache, _, _, lengths = _problem(batch=1, n_new=0, capacity=30, lengths=[20], seed=17)
    message = "flash_attention_with_kvcache is forward only .* no rules for a torch.func transform"
    with torch.no_grad(), torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(q, torch.randn_like(q))
        with pytest.raises(ValueError, match=message):
            flash_attention_with_kvcache(dual, k_cache, v_cache, cache_seqlens=20)
    with pytest.raises(ValueError, match=message):
        torch.func.jvp(lambda c: flash_attention_with_kvcache(q, c, v_cache, cache_seqlens=lengths), (k_cache,),
                       (torch.randn_like(k_cache),))
    with pytest.raises(ValueError, match=message):
        torch.func.vmap(lambda a: flash_attention_with_kvcache(a, k_cache, v_cache, cache_seqlens=20))(
            q[None].expand(2, -1, -1, -1, -1))
    with pytest.raises(ValueError, match=message):
        torch.func.vmap(lambda n: flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=n))(lengths[None])
    with torch.no_grad():  # plain calls still go through
        assert flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths).shape == q.shape


def test_variant_errors_name_the_reason():
    gen = torch.Generator().manual_seed(8)
    q, k, v = _randn(1, 2, 1, 16, gen=gen), _randn(1, 2, 8, 16, gen=gen), _randn(1, 2, 8, 16, gen=gen)
    with pytest.raises(ValueError, match="variant must be one of"):
        flash_attention(q, k, v, variant="fa3")
    with pytest.raises(ValueError, match="split-KV has no dropout"):
        flash_attention(q, k, v, variant="splitkv", dropout_p=0.5)
    with pytest.raises(ValueError, match="forward only"):
        flash_attention(q.requires_grad_(True), k, v, variant="splitkv")


def test_select_variant_gives_a_choice_and_a_reason():
    choice = select_variant(1, 32, 8, 1, 131072, 128)
    assert choice.variant == "splitkv" and "4 query heads" in choice.reason and "131072" in choice.reason
    assert select_variant(8, 32, 32, 4096, 4096, 128).variant == "fa2"
    with pytest.raises(ValueError, match="multiple of heads_kv"):
        select_variant(1, 32, 5, 1, 10, 64)
    with pytest.raises(TypeError, match="n_k must be an int"):
        select_variant(1, 32, 8, 1, 10.0, 64)
    # problems no kernel takes were once given a variant (head_dim 0 or 1000, no query head), and a negative size
    # a TypeError
    for args, message in (((1, 4, 4, 1, 100, 0), "head_dim must be an int >= 16; got 0"),
                          ((1, 4, 4, 1, 100, 1000), "head_dim must be at most 256"),
                          ((1, 0, 1, 1, 100, 64), "heads_q must be an int >= 1; got 0"),
                          ((-2, 4, 4, 1, 100, 64), "batch must be an int >= 0; got -2"),
                          ((1, 4, 4, -1, 100, 64), "n_q must be an int >= 0; got -1")):
        with pytest.raises(ValueError, match=message):
            select_variant(*args)


def test_torch_compile_fullgraph_matches_eager():
    q, k_cache, v_cache, k, v, lengths = _problem(n_new=1, lengths=[3, 50, 20], seed=9)
    cache_eager = (k_cache.clone(), v_cache.clone())

    def step(q, k_cache, v_cache, k, v, lengths):
        return flash_attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths) * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(q, k_cache, v_cache, k, v, lengths)
    expected = step(q, *cache_eager, k, v, lengths)
    assert torch.equal(got, expected)
    assert torch.equal(k_cache, cache_eager[0]) and torch.equal(v_cache, cache_eager[1])  # the append happened


def test_torch_compile_fullgraph_of_a_decoding_shaped_flash_attention():
    """No grad and two queries: auto picks split-KV, and the compiled call traces through its custom op."""
    gen = torch.Generator().manual_seed(15)
    q, k, v = _randn(1, 2, 2, 16, gen=gen), _randn(1, 2, 9, 16, gen=gen), _randn(1, 2, 9, 16, gen=gen)
    compiled = torch.compile(lambda a, b, c: flash_attention(a, b, c, causal=True) * 2, fullgraph=True,
                             backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(q, k, v), flash_attention(q, k, v, causal=True, variant="splitkv") * 2)


# ------------------------------------------------------------------ bad input
def _args(**changes):
    q, k_cache, v_cache, k, v, lengths = _problem(n_new=1, lengths=[3, 50, 20], seed=10)
    args = dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_seqlens=lengths)
    args.update({name: (value(args) if callable(value) else value) for name, value in changes.items()})
    return args


@pytest.mark.parametrize("changes, error, message", [
    (dict(cache_seqlens=lambda a: a["cache_seqlens"] + 76), ValueError, "overflow the cache: sequence 1"),
    (dict(cache_seqlens=lambda a: a["cache_seqlens"].long()), TypeError, "cache_seqlens must be torch.int32"),
    (dict(cache_seqlens=lambda a: a["cache_seqlens"][:2]), ValueError, r"cache_seqlens must have shape \(B,\)"),
    (dict(cache_seqlens=lambda a: a["cache_seqlens"] - 4), ValueError, "cache_seqlens must be >= 0"),
    (dict(cache_seqlens=None), ValueError, "appending k, v needs cache_seqlens"),
    (dict(v=None), ValueError, "pass both or neither"),
    (dict(k=lambda a: a["k"].half(), v=lambda a: a["v"].half()), TypeError, "must have the cache's dtype"),
    (dict(k_cache=lambda a: a["k_cache"].half(), v_cache=lambda a: a["v_cache"].half()), TypeError,
     "same dtype"),
    (dict(k=lambda a: a["k"][:, :, :1], v=lambda a: a["v"][:, :, :1]), ValueError, r"\(B, N_new, H_kv, D\)"),
    (dict(k_cache=lambda a: a["k_cache"][:, :, :1], v_cache=lambda a: a["v_cache"][:, :, :1].clone()),
     ValueError, r"k must have shape \(B, N_new, H_kv, D\) = \(3, N_new, 1, 32\)"),
    (dict(k_cache=lambda a: torch.zeros(3, 96, 3, 32, device=DEVICE),
          v_cache=lambda a: torch.zeros(3, 96, 3, 32, device=DEVICE)), ValueError, "multiple of k/v heads"),
    (dict(q=lambda a: a["q"][0]), ValueError, r"q must be a 4D \(B, N_q, H, D\)"),
    (dict(k_cache=lambda a: a["k_cache"][:2], v_cache=lambda a: a["v_cache"][:2]), ValueError,
     "a paged cache needs block_table"),
    # the append's total is summed in int64: 2^31 - 1 + 1 once wrapped round to a negative length that "fit"
    (dict(cache_seqlens=lambda a: torch.tensor([2**31 - 1, 3, 3], dtype=torch.int32, device=DEVICE)), ValueError,
     r"overflow the cache: sequence 0 has 2147483647 cached tokens \+ 1 new = 2147483648 > the cache's capacity of 96"),
    (dict(cache_seqlens=2**40), ValueError, r"cache_seqlens must be >= 0 and fit an int32 .*; got 1099511627776"),
    (dict(cache_seqlens=-1), ValueError, r"cache_seqlens must be >= 0 and fit an int32 .*; got -1"),
    (dict(k=None, v=None, cache_seqlens=lambda a: a["cache_seqlens"] + 60), ValueError,
     r"cache_seqlens\[1\] = 110 is more than the cache holds: 96 tokens"),
    (dict(q=lambda a: a["q"].to_sparse()), TypeError, r"q must be a dense tensor; got layout torch.sparse_coo"),
    (dict(return_lse="no"), TypeError, r"return_lse must be a bool; got 'no'"),
    (dict(k_cache=lambda a: a["k_cache"].to_sparse()), TypeError, r"k_cache must be a dense tensor"),
    (dict(v=lambda a: a["v"].to_sparse()), TypeError, r"v must be a dense tensor; got layout torch.sparse_coo"),
])
def test_bad_input_gets_a_clear_error(changes, error, message):
    args = _args(**changes)
    with pytest.raises(error, match=message):
        flash_attention_with_kvcache(**args)


def test_block_table_errors():
    gen = torch.Generator().manual_seed(11)
    q, k_cache, v_cache, k, v, lengths = _problem(n_new=1, lengths=[3, 50, 20], seed=11)
    pool, table = _paged(k_cache, 16, gen)
    bad = table.clone()
    bad[1, 3] = pool.shape[0]  # sequence 1 uses page slots 0-3 (51 tokens)
    with pytest.raises(ValueError, match=r"block_table\[1, 3\] = 21 is out of range: the paged cache has 21 pages"):
        flash_attention_with_kvcache(q, pool, pool.clone(), k, v, cache_seqlens=lengths, block_table=bad)
    unused = table.clone()
    unused[0, 5] = -7  # sequence 0 never reaches page slot 5: not an error
    flash_attention_with_kvcache(q, pool, pool.clone(), k, v, cache_seqlens=lengths, block_table=unused)
    with pytest.raises(TypeError, match="block_table must be torch.int32"):
        flash_attention_with_kvcache(q, pool, pool.clone(), k, v, cache_seqlens=lengths, block_table=table.long())
    with pytest.raises(ValueError, match=r"block_table must have shape \(B, max_pages\)"):
        flash_attention_with_kvcache(q, pool, pool.clone(), k, v, cache_seqlens=lengths, block_table=table[:2])


def test_a_paged_append_past_the_table_gets_the_overflow_error_not_a_gather_error():
    """The checks read the slots of the appended tokens in the same sync as the lengths: an append past the block
    table, or from a negative length, once failed that gather ("index 2 is out of bounds for dimension 1") before
    the capacity check could name it, as it does for a contiguous cache."""
    gen = torch.Generator().manual_seed(16)
    q, k_cache, v_cache, k, v, _ = _problem(n_new=2, capacity=32, lengths=[0, 0, 0], seed=16)
    pool, table = _paged(k_cache, 8, gen)
    for lengths, message in (([3, 31, 20], r"overflow the cache: sequence 1 has 31 cached tokens \+ 2 new = 33 > the "
                                           r"cache's capacity of 32 tokens \(4 pages of 8 in block_table\)"),
                             ([3, -9, 20], r"cache_seqlens must be >= 0; got a minimum of -9")):
        with pytest.raises(ValueError, match=message):
            flash_attention_with_kvcache(q, pool, pool.clone(), k, v, block_table=table,
                                         cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"overflow the cache: .* capacity of 0 tokens \(0 pages of 8"):
        flash_attention_with_kvcache(q, pool, pool.clone(), k, v, block_table=table[:, :0], cache_seqlens=0)


def test_a_paged_cache_of_empty_pages_is_refused():
    q, k_cache, v_cache, k, v, lengths = _problem(n_new=0, lengths=[0, 0, 0], seed=12)
    table = torch.zeros(3, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"page_size >= 1; got k_cache \(3, 0, 2, 32\)"):  # was a ZeroDivisionError
        flash_attention_with_kvcache(q, k_cache[:, :0], v_cache[:, :0], cache_seqlens=0, block_table=table)


def test_an_append_into_memory_that_two_places_share_is_refused():
    """Appending writes in place: an expanded cache (one prompt for every sequence, stride 0) took every sequence's
    new token in one slot, one tensor passed as both caches lost its keys, and two sequences appending into a page
    they share overwrote each other. Each gave a wrong answer without an error."""
    q, k_cache, v_cache, k, v, lengths = _problem(n_new=1, lengths=[4, 4, 4], seed=13)
    expanded_k, expanded_v = k_cache[:1].expand(3, -1, -1, -1), v_cache[:1].expand(3, -1, -1, -1)
    with pytest.raises(ValueError, match=r"k_cache is appended to in place, .* strides \(0, 64, 32, 1\)"):
        flash_attention_with_kvcache(q, expanded_k, expanded_v, k, v, cache_seqlens=lengths)
    with pytest.raises(ValueError, match="k_cache and v_cache are the same memory"):
        flash_attention_with_kvcache(q, k_cache, k_cache, k, v, cache_seqlens=lengths)
    with torch.no_grad():  # without an append nothing is written: a shared prompt is fine to read
        read = flash_attention_with_kvcache(q, expanded_k, expanded_v, cache_seqlens=lengths)
    ref, _ = _reference(q, expanded_k, expanded_v, lengths)
    assert relative_error(read, ref) <= 1e-5
    gen = torch.Generator().manual_seed(13)
    pool, table = _paged(k_cache, 16, gen)
    shared = table.clone()
    shared[2, 0] = shared[0, 0]  # sequences 0 and 2 both append at token 4 of one page
    with pytest.raises(ValueError, match=r"block_table gives 1 slot\(s\) of the pages being appended to more than "
                                         r"one sequence"):
        flash_attention_with_kvcache(q, pool, pool.clone(), k, v, cache_seqlens=lengths, block_table=shared)
    with torch.no_grad():  # shared pages that are only read (a common prefix) are fine
        flash_attention_with_kvcache(q, pool, pool.clone(), cache_seqlens=lengths + 1, block_table=shared)


def test_caches_that_are_views_of_one_buffer_without_overlap_take_the_append():
    """K and V interleaved in one buffer (B, N, 2, H_kv, D), and a cache sliced out of a longer one, own every
    element: the overlap check must let them through, and the append and the attention must be right."""
    q, k_cache, v_cache, k, v, lengths = _problem(n_new=2, lengths=[3, 50, 20], seed=14)
    kv = torch.stack([k_cache, v_cache], dim=2)  # (B, N, 2, H_kv, D)
    wide = torch.cat([k_cache, torch.randn_like(k_cache)], dim=1)[:, :k_cache.shape[1]]
    for kc, vc in ((kv[:, :, 0], kv[:, :, 1]), (wide, v_cache.clone())):
        before_k, before_v = kc.clone(), vc.clone()
        out = flash_attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lengths)
        assert torch.equal(kc, _expected_cache(before_k, k, lengths))
        assert torch.equal(vc, _expected_cache(before_v, v, lengths))
        ref, _ = _reference(q, kc, vc, lengths + 2)
        assert relative_error(out, ref) <= 1e-5


def test_may_overlap_itself_reads_the_strides():
    t = torch.zeros(2, 3, 4, 8)
    assert not any(flashlib.decode.may_overlap_itself(x) for x in (t, t.transpose(1, 2), t[:, :, :, :5], t[:, ::2],
                                                                  t[:1], t.new_zeros(0, 3)))
    assert flashlib.decode.may_overlap_itself(t[:1].expand(2, -1, -1, -1))
    assert flashlib.decode.may_overlap_itself(torch.zeros(16).as_strided((3, 4), (2, 1)))  # rows overlap by 2


def test_training_through_the_cache_is_refused():
    args = _args(q=lambda a: a["q"].requires_grad_(True))
    with pytest.raises(ValueError, match="forward only"):
        flash_attention_with_kvcache(**args)
    with torch.no_grad():
        flash_attention_with_kvcache(**args)


def test_unchecked_values_give_the_same_answer_and_the_flag_is_checked():
    args = _args()
    expected = flash_attention_with_kvcache(**_args())
    assert torch.equal(flash_attention_with_kvcache(**args, check_values=False), expected)
    with pytest.raises(TypeError, match="check_values must be a bool"):
        flash_attention_with_kvcache(**_args(), check_values="no")


@pytest.mark.parametrize("num_splits", [0, -1, 2.0, True])
def test_num_splits_must_be_a_positive_int(num_splits):
    with pytest.raises(ValueError, match="num_splits must be None"):
        flash_attention_with_kvcache(**_args(num_splits=num_splits))


# ------------------------------------------------------------------ GPU
def _appended_contiguous_and_paged_match(q, k_cache, v_cache, k, v, lengths, seed):
    """Append k, v and attend, on the contiguous cache and on the same tokens in shuffled 64-token pages;
    both against float64. Returns the contiguous O and the reference's L (the cache holds the appended tokens)."""
    pool, table = _paged(k_cache, 64, torch.Generator().manual_seed(seed))
    v_pool, _ = _paged(v_cache, 64, torch.Generator().manual_seed(seed))
    o = flash_attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths)
    o_paged = flash_attention_with_kvcache(q, pool, v_pool, k, v, cache_seqlens=lengths, block_table=table)
    ref, ref_lse = _reference(q, k_cache, v_cache, lengths + k.shape[1])
    assert relative_error(o, ref) < TOL[q.dtype]
    assert relative_error(o_paged, ref) < TOL[q.dtype]
    return o, ref_lse


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads_kv", [32, 8, 1])
def test_gpu_decoding_matches_the_reference(dtype, head_dim, heads_kv):
    batch, heads, capacity = 3, 32, 4096
    q, k_cache, v_cache, k, v, lengths = _problem(batch, heads, heads_kv, n_q=4, n_new=4, capacity=capacity,
                                                  head_dim=head_dim, dtype=dtype, lengths=[0, 1000, capacity - 4],
                                                  seed=12)
    _appended_contiguous_and_paged_match(q, k_cache, v_cache, k, v, lengths, 12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_wide_programs_match_the_reference(dtype, head_dim):
    """MQA with 4 new queries (128 rows a K/V head) over 16k keys: the rule picks 128-row programs of 64-key
    blocks (8 warps at D = 128; 4 warps and two programs an SM at D = 64); contiguous and paged against
    float64, and the 64-row programs' result to rounding."""
    batch, heads, capacity = 8, 32, 16384
    sms = decode_kernels.multiprocessor_count(0)
    assert decode_kernels.choose_rows_per_program(heads * 4, batch, capacity, sms, head_dim, 2) == decode_kernels.WIDE_ROWS
    paged_plan = decode_kernels.plan_splitkv_launch(batch, heads, 1, 4, capacity, head_dim, 2, sms, page_size=64)
    assert paged_plan.block_m == decode_kernels.WIDE_ROWS
    assert paged_plan.config[:3:2] == (64, 4 if head_dim == 64 else 8)
    q, k_cache, v_cache, k, v, lengths = _problem(batch, heads, 1, n_q=4, n_new=4, capacity=capacity,
                                                  head_dim=head_dim, dtype=dtype,
                                                  lengths=[capacity - 4, 9000, 5, 16000, 12345, 0, 700, 8192],
                                                  seed=21)
    o, ref_lse = _appended_contiguous_and_paged_match(q, k_cache, v_cache, k, v, lengths, 21)
    o64, lse64 = torch.full_like(q, float("nan")), torch.empty(batch, heads, 4, device=q.device)
    decode_kernels.launch_splitkv_attention(q, k_cache, v_cache, o64, lse64, scale=head_dim ** -0.5, causal=True,
                                            k_lens=lengths + 4, block_m=64)
    assert relative_error(o, o64.double()) < TOL[dtype]
    assert torch.allclose(lse64.double(), ref_lse, atol=1e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_two_pages_per_block_in_a_finely_split_grid_match_the_reference(dtype):
    """D = 64, 128-key blocks over 64-token pages (two table entries a block), 16 splits of 32 heads: 512
    programs, which run with their registers capped so that four share an SM."""
    batch, heads, capacity = 1, 32, 4096
    sms = decode_kernels.multiprocessor_count(0)
    assert decode_kernels.choose_num_splits(batch * heads, capacity, sms, 64, 2) * batch * heads > 3 * sms
    assert decode_kernels.launch_config(512, sms, 16, 64, 2, chunk=256)[0] == 2 * 64
    q, k_cache, v_cache, k, v, lengths = _problem(batch, heads, heads, n_q=1, n_new=1, capacity=capacity,
                                                  head_dim=64, dtype=dtype, lengths=[capacity - 1], seed=22)
    _appended_contiguous_and_paged_match(q, k_cache, v_cache, k, v, lengths, 22)


@pytest.mark.gpu
@pytest.mark.parametrize("n_k", [1000, 70000])
def test_gpu_splitkv_matches_fa2(n_k):
    gen = torch.Generator().manual_seed(13)
    q = _randn(2, 32, 1, 128, gen=gen, dtype=torch.float16)
    k, v = (_randn(2, 8, n_k, 128, gen=gen, dtype=torch.float16) for _ in range(2))
    with torch.no_grad():
        o_fa2 = flash_attention(q, k, v, causal=True, variant="fa2")
        o_split = flash_attention(q, k, v, causal=True, variant="splitkv")
    assert relative_error(o_split, o_fa2.double()) < TOL[torch.float16]
    assert math.isfinite(float(o_split.float().sum()))


@pytest.mark.gpu
def test_gpu_the_early_merge_gives_the_same_bits_eagerly_and_from_a_cuda_graph(monkeypatch):
    """PDL changes only when the merge starts: O and L bitwise equal with it, without it, and replayed."""
    gen = torch.Generator().manual_seed(17)
    q = _randn(1, 1, 32, 128, gen=gen, dtype=torch.float16)
    k, v = (_randn(1, 8192, 8, 128, gen=gen, dtype=torch.float16) for _ in range(2))
    results = {}
    for early in (True, False):
        monkeypatch.setattr(decode_kernels, "MERGE_LAUNCHES_EARLY", early)
        o, lse = torch.full_like(q, float("nan")), torch.empty(1, 32, 1, device=q.device)
        decode_kernels.launch_splitkv_attention(q, k, v, o, lse, scale=128 ** -0.5)
        results[early] = (o, lse)
    assert torch.equal(results[True][0], results[False][0]) and torch.equal(results[True][1], results[False][1])
    monkeypatch.setattr(decode_kernels, "MERGE_LAUNCHES_EARLY", True)
    o, lse = torch.full_like(q, float("nan")), torch.empty(1, 32, 1, device=q.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_kernels.launch_splitkv_attention(q, k, v, o, lse, scale=128 ** -0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, results[True][0]) and torch.equal(lse, results[True][1])
    ref = flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), variant="fa2").transpose(1, 2)
    assert relative_error(o, ref.double()) < TOL[torch.float16]
