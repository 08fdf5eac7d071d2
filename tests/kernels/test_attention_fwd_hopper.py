"""The Gluon Hopper forward (flashlib.kernels.attention_fwd_hopper): which calls the launcher routes to it, that it
compiles for sm_90a with the installed Triton (warpgroup MMA, the copy engine, per-partition registers, no
spills), and on a Hopper GPU that it equals the float64 reference, writes every output, and agrees with the Triton
forward through the front door, gradients included."""
import pytest
import torch

from flashlib import flash_attention
from flashlib.kernels import attention_fwd
from flashlib.kernels import attention_fwd_hopper as hopper
from flashlib.kernels.dropout import dropout_mask, effective_dropout_p
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, ODD_SHAPES, UNCOVERED_CASES, as_bhnd, make_inputs, uncovered_call
from support.launch import RecordedLaunch
from support.sass import block_loops, compiled_variants, first_operands, run_sass_counts


# ---------------------------------------------------------------- where the launcher takes it (CPU)
@pytest.mark.parametrize("head_dim, n_q, n_k, scores, causal, expected", [
    (128, 2048, 2048, 2 ** 27, True, True), (128, 16384, 4096, 2 ** 30, True, True),
    (128, 1024, 1024, 2 ** 28, False, True), (128, 1024, 4096, 2 ** 30, False, True),
    # head_dim 128 under the causal mask from 1024 rows once the diagonal's first half-tile ran at half width
    (128, 1024, 1024, 2 ** 30, True, True), (128, 4096, 1024, 2 ** 30, True, True),
    (128, 1023, 4096, 2 ** 30, True, False), (128, 1023, 4096, 2 ** 30, False, False),
    (64, 4096, 4096, 2 ** 30, False, False), (256, 4096, 4096, 2 ** 30, False, False),
    (128, 2048, 2048, 2 ** 27 - 1, False, False),  # too little work: the host's time per launch decides
    # head_dim 64 only with three consumers: unmasked, from 8k rows and 2^32 scores (session 69)
    (64, 8192, 8192, 2 ** 32, False, True), (64, 16384, 8192, 2 ** 33, False, True),
    (64, 8191, 16384, 2 ** 33, False, False),
    (64, 8192, 8192, 2 ** 32 - 1, False, False),
    # head_dim 64 with two consumers under the causal mask, from 2048 rows (sessions 69 and 70)
    (64, 2048, 2048, 2 ** 30, True, True), (64, 2047, 8192, 2 ** 30, True, False),
    (64, 4096, 4096, 2 ** 27 - 1, True, False), (32, 8192, 8192, 2 ** 34, True, False)])
def test_preferred_where_it_was_measured_faster(head_dim, n_q, n_k, scores, causal, expected):
    assert hopper.preferred(head_dim, n_q, n_k, scores, causal) is expected


def test_fp8_keeps_its_causal_rows_where_the_half_width_diagonal_does_not_run():
    """16-bit causal calls at head_dim 128 take the Gluon forward from 1024 rows (with the half-width diagonal block
    it measured 1.05-1.06x the Triton forward there); FP8 kernels hold no half block and FP8 was timed from 4096
    rows, so its causal calls keep 2048, and its unmasked ones 1024."""
    assert hopper.preferred(128, 1024, 1024, 2 ** 30, True)
    assert not hopper.preferred(128, 1024, 1024, 2 ** 30, True, fp8=True)
    assert not hopper.preferred(128, 2047, 4096, 2 ** 30, True, fp8=True)
    assert hopper.preferred(128, 2048, 2048, 2 ** 30, True, fp8=True)
    assert hopper.preferred(128, 1024, 1024, 2 ** 30, False, fp8=True)


def test_three_consumers_are_preferred_only_for_16_bit_calls_without_dropout_or_a_mask():
    """Three consumers are chosen only for 16-bit calls without dropout or a mask: under the causal mask they were
    measured slower (two consumers take those calls, by :data:`MIN_ROWS`), with dropout or FP8 they cannot run (the
    launcher refuses ``consumers=3``), and at head_dim 64 FP8 keeps the Triton forward."""
    assert hopper.three_consumers_preferred(64, 8192, 8192, 2 ** 32, False)
    assert not hopper.three_consumers_preferred(64, 8192, 8192, 2 ** 32, True)  # two consumers take it
    for kwargs in (dict(dropout=True), dict(fp8=True)):
        assert not hopper.three_consumers_preferred(64, 8192, 8192, 2 ** 32, False, **kwargs)
    assert not hopper.preferred(64, 8192, 8192, 2 ** 32, False, fp8=True)
    assert not hopper.three_consumers_preferred(128, 16384, 16384, 2 ** 34, False)


def test_cannot_run_off_a_gpu():
    q, k, v = (torch.randn(1, 2, 64, 128, dtype=torch.float16) for _ in range(3))
    assert not hopper.can_run(q, k, v, q, scale=0.1)


@pytest.fixture
def recorded(monkeypatch):
    """Pretend the Gluon kernel can run, and record its launches instead of running them."""
    calls = []
    monkeypatch.setattr(hopper, "can_run", lambda q, k, v, o, *, scale, fp8: scale > 0)
    monkeypatch.setattr(hopper, "launch_attention_forward_hopper",
                        lambda q, k, v, o, lse, **kwargs: calls.append(kwargs))
    return calls


def _launch(n=64, head_dim=128, spec=AttentionSpec(), **kwargs):
    q, k, v = (torch.randn(1, 2, n, head_dim, dtype=torch.float16, device=DEVICE) for _ in range(3))
    o, lse = torch.zeros_like(q), torch.zeros(1, 2, n, device=DEVICE)
    attention_fwd.launch_attention_forward(q, k, v, o, lse, spec, **kwargs)
    return o


@pytest.mark.parametrize("causal", [False, True])
def test_a_plain_call_is_routed_with_its_mask_and_schedule(recorded, causal):
    _launch(spec=AttentionSpec(causal=causal), use_gluon=True)
    assert recorded == [dict(scale=AttentionSpec().scale(128), causal=causal, descale=None)]


def test_dropout_is_routed_with_its_effective_p_and_the_seeds_tensor(recorded):
    """The Gluon forward draws what the Triton forward draws: it gets p rounded as the Triton kernels get it
    (0.3 -> 77/256) and the very seed tensor that ``flashlib.ops`` drew on the device."""
    seed = torch.tensor([12345], dtype=torch.int64, device=DEVICE)
    _launch(spec=AttentionSpec(causal=True, dropout_p=0.3), use_gluon=True, dropout_seed=seed)
    assert len(recorded) == 1
    assert recorded[0]["dropout_p"] == effective_dropout_p(0.3) == 77 / 256
    assert recorded[0]["dropout_seed"] is seed and recorded[0]["causal"] is True


def test_the_default_routes_only_preferred_sizes_and_counts_the_scores_a_mask_leaves(recorded, monkeypatch):
    _launch(spec=AttentionSpec(causal=True))  # 64 rows: not preferred, the Triton forward runs
    assert recorded == []
    asked = []
    monkeypatch.setattr(hopper, "preferred", lambda *args, dropout, fp8: asked.append((*args, dropout, fp8)) or True)
    _launch(spec=AttentionSpec(causal=True))
    _launch(spec=AttentionSpec(dropout_p=0.1), dropout_seed=torch.zeros(1, dtype=torch.int64, device=DEVICE))
    assert len(recorded) == 2
    # (head_dim, n_q, n_k, scores, causal, dropout, fp8): B * H * N_q * N_k scores, half of them under the causal mask
    assert asked == [(128, 64, 64, 2 * 64 * 64 * 0.5, True, False, False),
                     (128, 64, 64, 2 * 64 * 64 * 1.0, False, True, False)]


def test_dropout_is_preferred_at_the_head_dims_measured_with_it_causal_or_not():
    """With dropout the Gluon forward beat the Triton one at head_dim 128 from 1024 rows, causal too, and at 64 from
    1024 rows without a mask and 4096 causal (session 57, H100); without dropout the rows of :data:`MIN_ROWS` (and
    three consumers') decide."""
    for head_dim, causal, rows in ((128, False, 1024), (128, True, 1024), (64, False, 1024), (64, True, 4096)):
        assert hopper.preferred(head_dim, rows, rows, 2 ** 30, causal, dropout=True)
        assert not hopper.preferred(head_dim, rows // 2, 4 * rows, 2 ** 30, causal, dropout=True)
        assert not hopper.preferred(head_dim, 4096, 4096, 2 ** 26, causal, dropout=True)  # below MIN_SCORES
    assert not hopper.preferred(32, 4096, 4096, 2 ** 30, False, dropout=True)
    assert not hopper.preferred(128, 4096, 4096, 2 ** 30, False, dropout=True, fp8=True)  # dropout is 16-bit only
    assert not hopper.preferred(64, 4096, 4096, 2 ** 30, False) and not hopper.preferred(128, 512, 512, 2 ** 30, True)


def test_a_causal_call_with_dropout_takes_its_own_config(monkeypatch):
    """At head_dim 128 a causal call with dropout runs 64-key blocks (DROPOUT_CAUSAL_CONFIGS, measured faster there),
    every other call the head_dim's CONFIGS."""
    kernel = RecordedLaunch(hopper.attention_fwd_hopper_kernel)
    monkeypatch.setattr(hopper, "attention_fwd_hopper_kernel", kernel)
    monkeypatch.setattr(hopper, "tile_descriptor", lambda t, *shape: t)
    q = torch.zeros(1, 2, 256, 128)
    seed = torch.zeros(1, dtype=torch.int64)
    for causal, p in ((True, 0.1), (False, 0.1), (True, 0.0)):
        hopper.launch_attention_forward_hopper(q, q, q, q, q[..., 0], scale=1.0, causal=causal, dropout_p=p,
                                               dropout_seed=seed if p else None, persistent=False)
    launched = [(args["BLOCK_M"], args["BLOCK_N"], args["STAGES"]) for _, args in kernel.calls]
    assert launched == [hopper.DROPOUT_CAUSAL_CONFIGS[128], hopper.CONFIGS[128], hopper.CONFIGS[128]]
    assert hopper.DROPOUT_CAUSAL_CONFIGS[128] != hopper.CONFIGS[128]


@pytest.mark.parametrize("n, causal, dropout_p, asked, expected", [
    (8192, False, 0.0, {}, (3, 0)), (16384, False, 0.0, {}, (3, 0)),      # the measured route: no turns
    (4096, False, 0.0, {}, (2, 1)), (8192, True, 0.0, {}, (2, 1)), (8192, False, 0.1, {}, (2, 1)),
    (8192, True, 0.0, dict(consumers=3), (3, 1)),                          # causal: turns help three consumers
    (8192, False, 0.0, dict(consumers=2), (2, 1)), (8192, False, 0.0, dict(pingpong=True), (3, 1))])
def test_the_launcher_runs_three_consumers_without_turns_by_default_where_they_were_measured_faster(
        monkeypatch, n, causal, dropout_p, asked, expected):
    """What the launcher passes the kernel when ``consumers`` and ``pingpong`` are not given, at head_dim 64 with 2
    sequences of 32 heads (2^32 scores at 8k rows, as timed): three consumers without turns only where
    :func:`three_consumers_preferred`; given values win."""
    kernel = RecordedLaunch(hopper.attention_fwd_hopper_kernel)
    monkeypatch.setattr(hopper, "attention_fwd_hopper_kernel", kernel)
    monkeypatch.setattr(hopper, "tile_descriptor", lambda t, *shape: t)
    q = torch.zeros(1, 1, 1, 64).expand(2, 32, n, 64)  # no memory: the descriptors are stand-ins
    seed = torch.zeros(1, dtype=torch.int64)
    hopper.launch_attention_forward_hopper(q, q, q, q, q[..., 0], scale=1.0, causal=causal, dropout_p=dropout_p,
                                           dropout_seed=seed if dropout_p else None, persistent=False, **asked)
    (grid, args), = kernel.calls
    assert (args["CONSUMERS"], args["pingpong"]) == expected
    tiles = n // (64 * expected[0]) + (n % (64 * expected[0]) > 0)  # 192-row tiles with three consumers
    assert grid == (2 * 32 * ((tiles + 1) // 2 if causal else tiles), )


def test_fp8_is_preferred_only_where_it_was_measured_faster():
    """Timed on an H100 (session 52, TUNING.md forty-first finding): the Gluon FP8 forward beats the Triton one at
    head_dim 128 (1.05-1.16x), not at 64 (0.92-0.99x); with the 16-bit route's size thresholds."""
    assert hopper.FP8_HEAD_DIMS == (128,)
    assert hopper.preferred(128, 4096, 4096, 2 ** 30, False, fp8=True)
    assert not hopper.preferred(64, 4096, 4096, 2 ** 30, False, fp8=True)
    assert not hopper.preferred(128, 4096, 4096, 2 ** 25, False, fp8=True)   # below MIN_SCORES


def test_an_fp8_call_is_routed_with_its_descale_factors_and_v_read_keys_innermost(monkeypatch):
    """An FP8 call reaches the Gluon forward with ``use_gluon=True``: with the very (3, B, H_kv) factors, and with
    V handed to ``can_run`` as V^T, whose descriptor then reads the keys contiguous. By default a call this small
    (2^25 scores, under MIN_SCORES) stays on the Triton forward (its launch is recorded instead, as the
    interpreter runs no FP8)."""
    seen, gluon, triton_forward = [], [], []
    monkeypatch.setattr(hopper, "can_run", lambda q, k, v, o, *, scale, fp8: seen.append((v.stride(), fp8)) or True)
    monkeypatch.setattr(hopper, "launch_attention_forward_hopper",
                        lambda q, k, v, o, lse, **kwargs: gluon.append(kwargs))
    monkeypatch.setattr(attention_fwd, "launch_tuned", lambda *args, **kwargs: triton_forward.append(kwargs))
    monkeypatch.setattr(attention_fwd, "launch", lambda *args, **kwargs: triton_forward.append(kwargs))
    q, k = (torch.randn(1, 2, 4096, 128, device=DEVICE).to(torch.float8_e4m3fn) for _ in range(2))
    v = torch.randn(1, 2, 128, 4096, device=DEVICE).to(torch.float8_e4m3fn).transpose(2, 3)  # keys innermost
    o, lse = torch.empty(1, 2, 4096, 128, dtype=torch.bfloat16, device=DEVICE), torch.empty(1, 2, 4096, device=DEVICE)
    descale = torch.rand(3, 1, 2, device=DEVICE) + 0.5
    attention_fwd.launch_attention_forward(q, k, v, o, lse, AttentionSpec(causal=True), descale=descale,
                                           use_gluon=True)
    assert len(gluon) == 1 and gluon[0]["descale"] is descale and gluon[0]["causal"] is True
    assert seen == [((2 * 128 * 4096, 128 * 4096, 4096, 1), True)]
    attention_fwd.launch_attention_forward(q, k, v, o, lse, AttentionSpec(causal=True), descale=descale)
    assert len(gluon) == 1 and len(triton_forward) == 1 and triton_forward[0]["FP8"] is True


@pytest.mark.parametrize("case", UNCOVERED_CASES + ["right_window", "refused", "negative_scale"])
def test_calls_it_does_not_cover_stay_on_the_triton_forward(recorded, case):
    if case == "right_window":
        spec, kwargs = AttentionSpec(window=(None, 8)), {}
    elif case == "refused":
        spec, kwargs = AttentionSpec(), dict(use_gluon=False)
    elif case == "negative_scale":
        spec, kwargs = AttentionSpec(softmax_scale=-0.1), {}
    else:
        spec, kwargs = uncovered_call(case)
    out = _launch(spec=spec, **{"use_gluon": True, **kwargs})
    assert recorded == []
    assert out.abs().sum() > 0  # the Triton forward filled it


#: Spill instructions the causal kernel's consumers may keep between their products at head_dim 128: a few of a
#: tile's scalars held on the stack across the key-block loops since the decision of
#: :data:`.attention_fwd_hopper.HALF_LAST_BLOCK` joined them, reloaded once a tile, never inside a loop. Compiled for
#: sm_90a: 4 loads with Triton 3.6 (the GPU machine's; 1 before the half block), 2 stores and 5 loads with 3.9 (0
#: before). The half block's first form ran 1.05x the kernel before it at 1024 rows on an H100 (session 70, TUNING.md
#: sixty-ninth finding); this form, with these spills, passed the GPU suite and ran 1.05-1.06x the Triton forward
#: there (session 71, seventieth finding).
CAUSAL_TILE_SCALAR_SPILLS = 8


def test_compiles_for_hopper_with_warpgroup_mma_the_copy_engine_and_no_spills_among_the_products():
    """The installed Triton compiles the kernel for sm_90a (its Gluon API as this module uses it); D = 128, the
    routed head_dim, without and with the causal mask. No consumer spills inside its key-block loops, nor between
    its products without a mask (a consumer short of registers, e.g. at 232, spills its tiles there); the loading
    warp and the partitions' entries may keep a few scalars on the stack (benchmarks/TUNING.md, thirty-second
    finding), and under the causal mask the consumers a few of a tile's (:data:`CAUSAL_TILE_SCALAR_SPILLS`)."""
    done = run_sass_counts("--kernel", "gluon_fwd", "--d", "128", "--causal", "no,yes", "--top", "300")
    assert done.returncode == 0, done.stderr[-3000:]
    variants = compiled_variants(done.stdout, "gluon_fwd")
    assert len(variants) == 2, done.stdout
    for (header, among_products, opcodes), loops in zip(variants, block_loops(done.stdout, "gluon_fwd")):
        assert loops and all(stores == loads == 0 for _, _, stores, loads in loops), header
        assert among_products <= (CAUSAL_TILE_SCALAR_SPILLS if "causal=yes" in header else 0), header
        assert opcodes.get("HGMMA", 0) > 0 and opcodes.get("UTMALDG", 0) > 0, header
        assert opcodes.get("USETMAXREG", 0) > 0, "the partitions' registers must be set (setmaxnreg)"


def test_q_in_registers_compiles_with_every_product_reading_registers_and_no_spill_in_the_loops():
    """16-bit Q held in registers for the tile (``q_in_registers=True``; thirty-ninth and fortieth findings): at
    head_dim 64 without a mask every product reads its first operand from registers (Q for S, P for P V) and no loop
    stores to the stack, with Triton 3.6 and 3.9 alike. (At 128, or with dropout, a masked loop spills a little;
    the A/B times it before any head dim takes it by default.)"""
    done = run_sass_counts("--kernel", "gluon_fwd", "--d", "64", "--register-operands", "yes,no")
    assert done.returncode == 0, done.stderr[-3000:]
    variants = compiled_variants(done.stdout, "gluon_fwd")
    loops = block_loops(done.stdout, "gluon_fwd")
    first = first_operands(done.stdout)
    assert len(variants) == len(loops) == len(first) == 2, done.stdout
    (registers_header, _, _), (shared_header, _, _) = variants
    assert "register operands yes" in registers_header and "register operands no" in shared_header
    assert first[0][0] > 0 and first[0][1] == 0, (registers_header, first[0])
    assert first[1][1] > 0, (shared_header, first[1])  # by default S reads Q from shared memory
    assert all(stores == 0 for _, _, stores, _ in loops[0]), (registers_header, loops[0])


def test_three_consumers_compile_with_six_block_loops_and_none_spilled_in_the_whole_blocks():
    """Three consumer warpgroups (``consumers=3``, head_dim 64, FlashAttention-3's 192-row tiles): each runs its
    loop of whole blocks and its loop of masked ones (six loops, 12 products a block: 4 steps of 16 head dims for S
    and 8 of 16 keys for P V), the registers are set per partition (four warpgroups share the SM's 64K: the kernel
    starts at 128) and Q is read from shared memory by default (160 registers leave it no room). No loop over whole
    blocks touches the stack (Triton 3.6 and 3.9); with Triton 3.9 a masked block reloads a few values (its key
    indices and visibility tests), a block or two a tile at the diagonal."""
    done = run_sass_counts("--kernel", "gluon_fwd", "--d", "64", "--causal", "no,yes", "--consumers", "3",
                           "--top", "300")
    assert done.returncode == 0, done.stderr[-3000:]
    variants = compiled_variants(done.stdout, "gluon_fwd")
    loops = block_loops(done.stdout, "gluon_fwd")
    first = first_operands(done.stdout)
    assert len(variants) == len(loops) == len(first) == 2, done.stdout
    for (header, _, opcodes), variant_loops, (_, from_shared) in zip(variants, loops, first):
        assert "consumers 3" in header and "registers 128" in header and "register operands default" in header
        assert opcodes.get("HGMMA", 0) > 0 and opcodes.get("USETMAXREG", 0) > 0, header
        assert from_shared > 0, (header, first)  # S reads Q from shared memory
        assert len(variant_loops) == 6, (header, variant_loops)
        assert all(products == 64 // 16 + 128 // 16 for _, products, _, _ in variant_loops), variant_loops
        whole_blocks = variant_loops[0::2]
        assert all(stores == loads == 0 for _, _, stores, loads in whole_blocks), (header, variant_loops)


@pytest.mark.parametrize("consumers, dropout_p, dtype, head_dim", [
    (4, 0.0, torch.float16, 64), (1, 0.0, torch.float16, 64), (3, 0.1, torch.float16, 64),
    (3, 0.0, torch.float8_e4m3fn, 64), (3, 0.0, torch.float16, 128)])
def test_three_consumers_are_refused_by_name_where_the_kernel_has_no_such_variant(consumers, dropout_p, dtype,
                                                                                   head_dim):
    """Three consumers take 16-bit inputs without dropout at head_dim 64 (compiled and checked there only); any
    other count, or three with dropout, FP8 or another head_dim, stops the launcher before any descriptor or
    launch, naming ``consumers``, what it takes and what came in."""
    q, k, v, o = (torch.randn(1, 2, 64, head_dim).to(dtype) for _ in range(4))
    lse = torch.empty(1, 2, 64)
    fp8 = dict(descale=torch.ones(3, 1, 2)) if dtype == torch.float8_e4m3fn else {}
    drop = dict(dropout_p=dropout_p, dropout_seed=torch.zeros(1, dtype=torch.int64)) if dropout_p else {}
    with pytest.raises(ValueError, match=rf"consumers: expected 2, or 3 for 16-bit inputs without dropout at "
                                         rf"head_dim 64; got {consumers} .*head_dim={head_dim}"):
        hopper.launch_attention_forward_hopper(q, k, v, o.to(torch.float16), lse, scale=0.125, causal=False,
                                               consumers=consumers, **fp8, **drop)


def test_fp8_compiles_for_hopper_with_e4m3_products_and_no_tile_spilled_in_its_loops():
    """The FP8 path compiles for sm_90a (D = 128 and 64, causal or not, P entering P V from shared memory or from
    registers): both products run on FP8 tensor cores (``QGMMA ... E4M3.E4M3``, 32 keys or head dims a step), K,
    V^T and Q arrive through the copy engine, and each consumer's loops over key blocks (without and with the mask's
    test) store nothing to the stack: no value that changes every block is spilled. (Triton 3.6, the H200 machine's,
    spills nothing among the products with P from shared memory; Triton 3.9 reloads one loop-invariant scalar per
    masked block with P from registers: benchmarks/TUNING.md, thirty-sixth and thirty-eighth findings.)

    P from shared memory is the point of that path: its stores replace the byte packing and shuffles that move P
    into the operand's layout, so each loop is shorter by at least 150 instructions a block (Triton 3.6 and 3.9:
    189-209; at D = 128 without the mask's test 486 against 682), with hardly a byte permute (``PRMT``) left. Q stays
    in registers for the tile by default: S reads it there (thirty-ninth and fortieth findings)."""
    done = run_sass_counts("--kernel", "gluon_fwd", "--d", "128,64", "--causal", "no,yes", "--dtype", "fp8",
                           "--fp8-weights", "shared,registers", "--top", "300")
    assert done.returncode == 0, done.stderr[-3000:]
    variants = compiled_variants(done.stdout, "gluon_fwd")
    loops = block_loops(done.stdout, "gluon_fwd")
    products = [line for line in done.stdout.splitlines() if line.strip().startswith("products:")]
    assert len(variants) == len(loops) == len(products) == 8, done.stdout
    places = [header.split(" P from ")[1].split()[0] for header, _, _ in variants]
    assert places == ["shared", "registers"] * 4, places
    first = first_operands(done.stdout)
    for (header, _, _), (from_registers, from_shared) in zip(variants, first):
        # Q in registers (FP8's default): S reads registers; P V reads P from shared memory or registers
        assert from_registers > 0 and (from_shared > 0) == ("P from shared" in header), (header, first)
    for shared, registers in zip(range(0, 8, 2), range(1, 8, 2)):
        header, _, shared_opcodes = variants[shared]
        assert shared_opcodes.get("STS", 0) >= 32 and shared_opcodes.get("PRMT", 0) < 64, (header, shared_opcodes)
        assert variants[registers][2].get("PRMT", 0) >= 500, variants[registers][0]
        for short, long in zip(loops[shared], loops[registers]):
            assert short[0] <= long[0] - 150, (header, loops[shared], loops[registers])
    for (header, _, opcodes), variant_loops, used in zip(variants, loops, products):
        head_dim = int(header.split("D=")[1].split()[0])
        assert opcodes.get("QGMMA", 0) > 0 and opcodes.get("HGMMA", 0) == 0, header
        assert opcodes.get("UTMALDG", 0) > 0 and opcodes.get("USETMAXREG", 0) > 0, header
        assert "QGMMA.64x128x32.F32.E4M3.E4M3" in used, used  # S = Q K^T over 128 keys
        assert f"QGMMA.64x{head_dim}x32.F32.E4M3.E4M3" in used, used  # O += P V over head_dim columns
        # two consumers, each with a loop of whole blocks and one of masked blocks; per block the products step
        # 32 of head_dim (S) and 32 of the 128 keys (P V)
        assert len(variant_loops) == 4, (header, variant_loops)
        for instructions, block_products, stores, loads in variant_loops:
            assert block_products == head_dim // 32 + 128 // 32, (header, variant_loops)
            assert stores == 0, (header, variant_loops)


# ---------------------------------------------------------------- on a Hopper GPU
def _reference(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    return naive_attention(q.double(), k64, v64, causal=causal, return_lse=True)


def _count_launches(monkeypatch):
    calls = []
    real = hopper.launch_attention_forward_hopper

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(hopper, "launch_attention_forward_hopper", counted)
    return calls


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ODD_SHAPES)
def test_gpu_gluon_forward_matches_float64_and_writes_every_output(monkeypatch, dtype, head_dim, causal, shape):
    if not hopper.can_run(*(torch.empty(1, 1, 16, head_dim, device="cuda", dtype=dtype) for _ in range(4)),
                          scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    batch, heads, kv_heads, n_q, n_k, layout = shape
    q, k, v = (as_bhnd(t, layout) for t in make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout,
                                                       seed=n_q + head_dim))
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device="cuda")
    launches = _count_launches(monkeypatch)
    attention_fwd.launch_attention_forward(q, k, v, o, lse, AttentionSpec(causal=causal), use_gluon=True)
    assert len(launches) == 1
    ref_o, ref_lse = _reference(q, k, v, causal)
    assert relative_error(o, ref_o) <= tolerance(dtype)  # also fails on a NaN: every element written
    seen = torch.isfinite(ref_lse)  # rows that see no key (causal, N_q > N_k): O = 0 and L = -inf
    assert bool((lse[~seen] == float("-inf")).all()) and bool((o[~seen] == 0).all())
    assert relative_error(lse[seen], ref_lse[seen]) <= tolerance(torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_programs_that_walk_many_tiles_match_float64(causal, persistent):
    """More work items than SMs (4 samples x 48 heads x 5 query tiles of 128 rows): a persistent program walks
    several, its K/V ring, ping-pong turns and Q and O slots running on from tile to tile; GQA, N_q != N_k, and
    an odd tile count (under the causal mask, tiles 4 and 0, 3 and 1 pair up and tile 2 is alone)."""
    q, k, v = make_inputs(4, 48, 12, 600, 700, 128, torch.float16, seed=11)
    if not hopper.can_run(q, k, v, q, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device="cuda")
    hopper.launch_attention_forward_hopper(q, k, v, o, lse, scale=128 ** -0.5, causal=causal, persistent=persistent)
    ref_o, ref_lse = _reference(q, k, v, causal)
    assert relative_error(o, ref_o) <= tolerance(torch.float16)  # also fails on a NaN: every element written
    assert relative_error(lse, ref_lse) <= tolerance(torch.float32)


def _record_schedules(monkeypatch):
    """Run the Gluon forward as ever, recording each launch's (consumers, turns)."""
    schedules = []
    real_launch = hopper.launch

    def recorded(kernel, grid, *args, **kwargs):
        schedules.append((kwargs["CONSUMERS"], dict(zip(kernel.arg_names, args))["pingpong"]))
        return real_launch(kernel, grid, *args, **kwargs)
    monkeypatch.setattr(hopper, "launch", recorded)
    return schedules


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim, n, causal", [(128, 2048, False), (128, 1024, True), (64, 2048, True)])
def test_gpu_front_door_takes_it_where_routed_and_gradients_follow(monkeypatch, dtype, head_dim, n, causal):
    """Where :data:`.attention_fwd_hopper.MIN_ROWS` routes a call with two consumers (head_dim 128 from 1024 rows,
    causal or not; 64 causal from 2048): the front door runs the Gluon forward once, O and the gradients match
    float64, and O and L match the Triton forward's."""
    q, k, v, do = make_inputs(1, 2, 2, n, n, head_dim, dtype, seed=5, grad_out=True)
    if not hopper.can_run(q, k, v, q, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    monkeypatch.setattr(hopper, "MIN_SCORES", 0)  # this small batch is below the eager threshold of work
    launches = _count_launches(monkeypatch)
    schedules = _record_schedules(monkeypatch)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attention(q, k, v, causal=causal)
    out.backward(do)
    assert len(launches) == 1 and schedules == [(2, int(hopper.PINGPONG))]  # two consumers, turns as set
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = naive_attention(q64, k64, v64, causal=causal)
    ref.backward(do.double())
    assert relative_error(out, ref) <= tolerance(dtype)
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert relative_error(got, want) <= tolerance(dtype)
    with torch.no_grad():  # the Triton forward on the same inputs: the same O and L within rounding
        o_triton, lse_triton = torch.empty_like(out), torch.empty(1, 2, n, device="cuda")
        attention_fwd.launch_attention_forward(q, k, v, o_triton, lse_triton, AttentionSpec(causal=causal),
                                               use_gluon=False)
        o_gluon, lse_gluon = torch.empty_like(out), torch.empty(1, 2, n, device="cuda")
        attention_fwd.launch_attention_forward(q, k, v, o_gluon, lse_gluon, AttentionSpec(causal=causal))
    assert relative_error(o_gluon, o_triton) <= tolerance(dtype)
    assert relative_error(lse_gluon, lse_triton) <= tolerance(torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_front_door_takes_three_consumers_at_d64_long_unmasked_rows_and_gradients_follow(monkeypatch, dtype):
    """At head_dim 64 an unmasked call of 8192 rows (GQA 2/1) runs the Gluon forward with three consumer warpgroups
    and no turns by default (:func:`.attention_fwd_hopper.three_consumers_preferred`; the work threshold lowered for
    this small batch): O and the gradients match float64, and O and L match the Triton forward's. The float64
    reference's (B, H, N, N) matrices (1 GiB each) make this one of the suite's heaviest tests, about 8 GiB."""
    q, k, v, do = make_inputs(1, 2, 1, 8192, 8192, 64, dtype, seed=7, grad_out=True)
    if not hopper.can_run(q, k, v, q, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    monkeypatch.setattr(hopper, "THREE_CONSUMER_MIN_SCORES", 0)
    schedules = _record_schedules(monkeypatch)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attention(q, k, v)
    out.backward(do)
    assert schedules == [(3, 0)]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = naive_attention(q64, k64, v64)
    ref.backward(do.double())
    assert relative_error(out, ref) <= tolerance(dtype)  # also fails on a NaN: every element written
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert relative_error(got, want) <= tolerance(dtype)
    with torch.no_grad():
        o_triton, lse_triton = torch.empty_like(out), torch.empty(1, 2, 8192, device="cuda")
        attention_fwd.launch_attention_forward(q, k, v, o_triton, lse_triton, use_gluon=False)
        o_gluon, lse_gluon = torch.full_like(out, float("nan")), torch.full_like(lse_triton, float("nan"))
        attention_fwd.launch_attention_forward(q, k, v, o_gluon, lse_gluon)
    assert schedules == [(3, 0), (3, 0)]
    assert relative_error(o_gluon, o_triton) <= tolerance(dtype)
    assert relative_error(lse_gluon, lse_triton) <= tolerance(torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("persistent", [True, False])
def test_gpu_gluon_dropout_drops_the_triton_kernels_weights(dtype, head_dim, causal, persistent):
    """Dropout in the Gluon forward against the float64 reference given the mask that ``dropout_mask`` writes
    for the seed (the Triton kernels' draws), and against the Triton forward with the same seed: GQA, N_q != N_k,
    lengths that end inside a square of draws, a seed above 2^32, and work items walked by persistent programs."""
    q, k, v = make_inputs(2, 6, 3, 600, 700, head_dim, dtype, seed=head_dim + causal)
    if not hopper.can_run(q, k, v, q, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    p, seed = 0.2, (7 << 33) + 12345
    seed_tensor = torch.tensor([seed], dtype=torch.int64, device="cuda")
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device="cuda")
    hopper.launch_attention_forward_hopper(q, k, v, o, lse, scale=head_dim ** -0.5, causal=causal,
                                           persistent=persistent, dropout_p=effective_dropout_p(p),
                                           dropout_seed=seed_tensor)
    mask = dropout_mask(seed, p, 2, 6, 600, 700, q.device)
    assert 0.75 < mask.float().mean() < 0.85
    group = q.shape[1] // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    ref_o, ref_lse = naive_attention(q.double(), k64, v64, causal=causal, return_lse=True,
                                     dropout_p=effective_dropout_p(p), dropout_mask=mask)
    assert relative_error(o, ref_o) <= tolerance(dtype)  # also fails on a NaN: every element written
    seen = torch.isfinite(ref_lse)
    assert relative_error(lse[seen], ref_lse[seen]) <= tolerance(torch.float32)
    o_triton, lse_triton = torch.empty_like(o), torch.empty_like(lse)
    attention_fwd.launch_attention_forward(q, k, v, o_triton, lse_triton, AttentionSpec(causal=causal, dropout_p=p),
                                           dropout_seed=seed_tensor, use_gluon=False)
    assert relative_error(o, o_triton) <= tolerance(dtype)
    # a mask the kernel did not draw is far off: the test can tell masks apart
    other = naive_attention(q.double(), k64, v64, causal=causal, dropout_p=effective_dropout_p(p),
                            dropout_mask=dropout_mask(seed + 1, p, 2, 6, 600, 700, q.device))
    assert relative_error(o, other) > 10 * tolerance(dtype)


def test_dropouts_draws_reach_the_accumulators_layout_without_shared_memory():
    """:mod:`flashlib.kernels.dropout_hopper` builds each tile of draws in a layout whose final conversion to the
    tensor cores' accumulator moves no data: with dropout, none of the three Gluon kernels (the dK/dV kernel has keys
    along rows) stores to or loads from shared memory more than without it; they still issue warpgroup products.
    And the draws are applied as written (benchmarks/TUNING.md, forty-sixth finding): in the forward the dropped
    weights are zeroed by an AND as P is packed, so dropout adds no select and no compare a weight (a word's four
    compares are one majority); in the dK/dV kernel the kept flags are not packed into registers across the products
    (no SEL). As selects, the forward took 381 SELs and 366 ISETPs more, the dK/dV kernel 128 SELs."""
    done = run_sass_counts("--kernel", "gluon_fwd,gluon_dkdv,gluon_dq", "--d", "128", "--dropout", "0,0.1",
                           "--top", "300")
    assert done.returncode == 0, done.stderr[-3000:]
    for kernel in ("gluon_fwd", "gluon_dkdv", "gluon_dq"):
        (plain_header, _, plain), (header, _, dropped) = compiled_variants(done.stdout, kernel)
        assert "dropout=0.0" in plain_header and "dropout=0.1" in header
        assert dropped.get("HGMMA", 0) > 0 and dropped["HGMMA"] == plain["HGMMA"], header
        for shared_op in ("STS", "LDS", "STSM", "LDSM"):
            assert dropped.get(shared_op, 0) == plain.get(shared_op, 0), (header, shared_op)
        assert sum(dropped.values()) > sum(plain.values()) + 500, "the draws' integer work is there"
        if kernel == "gluon_fwd":
            for select_or_compare in ("SEL", "FSEL", "ISETP"):
                assert dropped.get(select_or_compare, 0) <= plain.get(select_or_compare, 0), (header, select_or_compare)
        if kernel == "gluon_dkdv":
            assert dropped.get("SEL", 0) <= plain.get("SEL", 0), header


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("persistent", [True, False])
def test_gpu_q_in_registers_gives_the_same_output_bitwise(dtype, head_dim, causal, persistent):
    """Q held in registers for each tile (its slot released to the loader at once) feeds the same products in the
    same order as Q read from shared memory: O and L equal bit for bit, over programs that walk several tiles
    (GQA 48/12, N_q = 600, N_k = 700), and match float64."""
    q, k, v = make_inputs(4, 48, 12, 600, 700, head_dim, dtype, seed=head_dim + causal)
    if not hopper.can_run(q, k, v, q, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    outputs = {}
    for in_registers in (False, True):
        o = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:3], float("nan"), device="cuda")
        hopper.launch_attention_forward_hopper(q, k, v, o, lse, scale=head_dim ** -0.5, causal=causal,
                                               persistent=persistent, q_in_registers=in_registers)
        outputs[in_registers] = (o, lse)
    assert torch.equal(outputs[True][0], outputs[False][0]) and torch.equal(outputs[True][1], outputs[False][1])
    ref_o, ref_lse = _reference(q, k, v, causal)
    o, lse = outputs[True]
    assert relative_error(o, ref_o) <= tolerance(dtype)  # also fails on a NaN: every element written
    seen = torch.isfinite(ref_lse)
    assert relative_error(lse[seen], ref_lse[seen]) <= tolerance(torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("persistent, pingpong", [(True, True), (False, True), (True, False)])
def test_gpu_three_consumers_match_float64_and_two_consumers_bitwise_without_a_mask(dtype, causal, persistent,
                                                                                    pingpong):
    """Three consumer warpgroups (192-row tiles, turns taken round robin) over programs that walk several tiles
    (GQA 48/12, N_q = 600 and N_k = 700: four tiles, the last cut short, two causal pairs; N_q = 451: three tiles,
    a pair and a tile alone), and over odd lengths and N_q != N_k both ways: O and L match float64 and every
    element is written. Without a mask a row's key blocks and their order do not depend on the tile's height, so O
    and L equal two consumers' bit for bit (under the causal mask a taller tile moves where the masked blocks
    begin, and rounding with it)."""
    shapes = [(4, 48, 12, 600, 700), (1, 2, 2, 1, 300), (2, 3, 1, 451, 97), (1, 4, 2, 97, 451)]
    for batch, heads, kv_heads, n_q, n_k in shapes:
        q, k, v = make_inputs(batch, heads, kv_heads, n_q, n_k, 64, dtype, seed=n_q + causal)
        if not hopper.can_run(q, k, v, q, scale=1.0):
            pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
        outputs = {}
        for consumers in (2, 3):
            o = torch.full_like(q, float("nan"))
            lse = torch.full(q.shape[:3], float("nan"), device="cuda")
            hopper.launch_attention_forward_hopper(q, k, v, o, lse, scale=64 ** -0.5, causal=causal,
                                                   persistent=persistent, pingpong=pingpong, consumers=consumers)
            outputs[consumers] = (o, lse)
        o, lse = outputs[3]
        ref_o, ref_lse = _reference(q, k, v, causal)
        assert relative_error(o, ref_o) <= tolerance(dtype), (batch, heads, n_q, n_k)  # NaN fails: all written
        seen = torch.isfinite(ref_lse)  # rows that see no key (causal, N_q > N_k): O = 0 and L = -inf
        assert bool((lse[~seen] == float("-inf")).all()) and bool((o[~seen] == 0).all())
        assert relative_error(lse[seen], ref_lse[seen]) <= tolerance(torch.float32)
        if not causal:
            assert torch.equal(o, outputs[2][0]) and torch.equal(lse, outputs[2][1]), (batch, heads, n_q, n_k)
