"""The Gluon dK/dV and dQ kernels (flashlib.kernels.attention_bwd_hopper): launch_attention_backward takes them for
plain calls only, by default each where it was measured faster (preferred, dq_preferred), wherever they can run with
use_gluon=True, never with use_gluon=False; they compile for sm_90a with the installed Triton; on a Hopper GPU their
gradients equal float64 autograd's, through the launcher and through the front door, and repeat bitwise."""
import pytest
import torch

from flashlib import flash_attention
from flashlib.kernels import attention_bwd
from flashlib.kernels import attention_bwd_hopper as bwd_hopper
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.kernels.dropout import dropout_mask, effective_dropout_p
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, ODD_SHAPES, UNCOVERED_CASES, as_bhnd, make_inputs, uncovered_call
from support.launch import RecordedLaunch
from support.sass import block_loops, compiled_variants, first_operands, last_product_windows, run_sass_counts


@pytest.mark.parametrize("head_dim, n_q, n_k, scores, expected", [
    (128, 512, 512, 2 ** 27, True), (128, 16384, 4096, 2 ** 30, True), (128, 4096, 512, 2 ** 27, True),
    (128, 511, 4096, 2 ** 30, False), (128, 4096, 511, 2 ** 30, False),
    (64, 1024, 1024, 2 ** 27, True), (64, 16384, 4096, 2 ** 30, True),
    (64, 1023, 4096, 2 ** 30, False), (64, 4096, 1023, 2 ** 30, False),  # 512 rows: not measured at head_dim 64
    (256, 4096, 4096, 2 ** 30, False), (32, 4096, 4096, 2 ** 30, False),
    (128, 2048, 2048, 2 ** 27 - 1, False)])  # too little work: the host's time per launch decides
def test_preferred_where_it_was_measured_faster(head_dim, n_q, n_k, scores, expected):
    assert bwd_hopper.preferred(head_dim, n_q, n_k, scores) is expected


@pytest.mark.parametrize("head_dim, n_q, n_k, scores, expected", [
    (128, 1024, 1024, 2 ** 27, True), (128, 16384, 4096, 2 ** 30, True),
    (128, 1023, 4096, 2 ** 30, False), (128, 4096, 1023, 2 ** 30, False),  # 512 rows: not measured for dQ
    (64, 4096, 4096, 2 ** 30, True), (64, 16384, 4096, 2 ** 30, True),
    (64, 2048, 4096, 2 ** 30, False), (64, 4096, 2048, 2 ** 30, False),  # level with Triton at 1024 rows
    (256, 4096, 4096, 2 ** 30, False), (128, 2048, 2048, 2 ** 27 - 1, False)])
def test_dq_preferred_where_it_was_measured_faster(head_dim, n_q, n_k, scores, expected):
    assert bwd_hopper.dq_preferred(head_dim, n_q, n_k, scores) is expected


@pytest.mark.parametrize("rule", ["preferred", "dq_preferred"])
def test_dropout_is_preferred_only_at_the_head_dims_and_lengths_measured_with_it(rule):
    """With dropout both Gluon kernels run at head_dim 128 from 1024 rows and at 64 from 4096 (session 57, H100:
    faster than the Triton kernels with dropout there, not at 64 and 1024 rows), while without dropout the dK/dV
    kernel takes 64 from 1024 rows and the dQ kernel only from 4096."""
    preferred = getattr(bwd_hopper, rule)
    for head_dim, rows in ((128, 1024), (64, 4096)):
        assert preferred(head_dim, rows, rows, 2 ** 30, dropout=True)
        assert not preferred(head_dim, rows // 2, 4 * rows, 2 ** 30, dropout=True)  # shorter than measured winning
        assert not preferred(head_dim, 4096, 4096, 2 ** 26, dropout=True)  # below MIN_SCORES
    assert not preferred(32, 4096, 4096, 2 ** 30, dropout=True) and not preferred(256, 4096, 4096, 2 ** 30,
                                                                                   dropout=True)
    assert preferred(128, 4096, 4096, 2 ** 30)
    # at 64 and 1024 rows: the Gluon dK/dV kernel without dropout, the Triton one with it; the Triton dQ kernel
    assert preferred(64, 1024, 1024, 2 ** 30) is (rule == "preferred")
    assert not preferred(64, 1024, 1024, 2 ** 30, dropout=True)


@pytest.fixture
def recorded(monkeypatch):
    """Pretend the Gluon kernels can run, and record their launches (kernel name, keywords) instead of running
    them."""
    calls = []
    monkeypatch.setattr(bwd_hopper, "can_run", lambda q, *others, scale: scale > 0)
    monkeypatch.setattr(bwd_hopper, "launch_attention_dkdv_hopper",
                        lambda q, k, v, do, lse, delta, dk, dv, **kwargs: calls.append(("dkdv", kwargs)))
    monkeypatch.setattr(bwd_hopper, "launch_attention_dq_hopper",
                        lambda q, k, v, do, lse, delta, dq, **kwargs: calls.append(("dq", kwargs)))
    return calls


def _backward(spec=AttentionSpec(), head_dim=64, **kwargs):
    """dq, dk, dv of a small call (they start as NaN: the Triton kernels overwrite them, the recorder does not)."""
    q, k, v, do = (torch.randn(1, 2, 64, head_dim, dtype=torch.float16, device=DEVICE) for _ in range(4))
    shared = {name: kwargs.pop(name) for name in ("alibi_slopes", "seq_lens", "dropout_seed") if name in kwargs}
    o, lse = torch.empty_like(q), torch.empty(1, 2, 64, device=DEVICE)
    launch_attention_forward(q, k, v, o, lse, spec, **shared)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    attention_bwd.launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec, **shared, **kwargs)
    return dq, dk, dv


@pytest.mark.parametrize("causal", [False, True])
def test_an_asked_plain_call_takes_both_kernels(recorded, causal):
    dq, dk, dv = _backward(AttentionSpec(causal=causal), use_gluon=True)
    asked = dict(scale=AttentionSpec().scale(64), causal=causal)
    assert recorded == [("dkdv", asked), ("dq", asked)]
    assert dq.isnan().all() and dk.isnan().all() and dv.isnan().all()  # left to the (recorded) Gluon kernels
    _backward(AttentionSpec(causal=causal))  # by default, at 64 rows and head_dim 64: not preferred
    _backward(AttentionSpec(causal=causal), use_gluon=False)
    assert len(recorded) == 2


@pytest.mark.parametrize("dkdv, dq", [(True, False), (False, True)])
def test_each_kernel_is_routed_by_its_own_rule(recorded, monkeypatch, dkdv, dq):
    monkeypatch.setattr(bwd_hopper, "preferred", lambda *args, dropout: dkdv)
    monkeypatch.setattr(bwd_hopper, "dq_preferred", lambda *args, dropout: dq)
    got_dq, dk, dv = _backward(AttentionSpec(), head_dim=128)
    assert [name for name, _ in recorded] == (["dkdv"] if dkdv else ["dq"])
    # what the (recorded) Gluon kernel was given stays NaN; the Triton kernel wrote the rest, every element
    for grad, by_gluon in ((dk, dkdv), (dv, dkdv), (got_dq, dq)):
        assert bool(grad.isnan().all()) == by_gluon and bool(grad.isnan().any()) == by_gluon


def test_the_default_routes_only_preferred_sizes_and_counts_the_scores_a_mask_leaves(recorded, monkeypatch):
    asked = []
    monkeypatch.setattr(bwd_hopper, "preferred", lambda *args, dropout: asked.append(("dkdv", *args, dropout)) or True)
    monkeypatch.setattr(bwd_hopper, "dq_preferred", lambda *args, dropout: asked.append(("dq", *args, dropout)) or True)
    _backward(AttentionSpec(causal=True), head_dim=128)
    _backward(AttentionSpec(dropout_p=0.1), head_dim=128, dropout_seed=torch.zeros(1, dtype=torch.int64, device=DEVICE))
    dq, dk, dv = _backward(AttentionSpec(), head_dim=128, use_gluon=False)  # refused: the Triton kernels
    assert len(recorded) == 4 and not dq.isnan().any() and not dk.isnan().any() and not dv.isnan().any()
    # (head_dim, n_q, n_k, scores, dropout): B * H * N_q * N_k scores, half of them under the causal mask
    causal, dropout = (128, 64, 64, 2 * 64 * 64 * 0.5, False), (128, 64, 64, 2 * 64 * 64 * 1.0, True)
    assert asked == [("dkdv", *causal), ("dq", *causal), ("dkdv", *dropout), ("dq", *dropout)]


def test_dropout_is_routed_to_both_kernels_with_the_forwards_p_and_seed(recorded):
    seed = torch.tensor([99], dtype=torch.int64, device=DEVICE)
    _backward(AttentionSpec(dropout_p=0.1), head_dim=128, use_gluon=True, dropout_seed=seed)
    assert [name for name, _ in recorded] == ["dkdv", "dq"]
    for _, kwargs in recorded:
        assert kwargs["dropout_p"] == effective_dropout_p(0.1) and kwargs["dropout_seed"] is seed


@pytest.mark.parametrize("case", UNCOVERED_CASES)
def test_calls_it_does_not_cover_stay_on_the_triton_kernels(recorded, case):
    spec, kwargs = uncovered_call(case)
    dq, dk, dv = _backward(spec, use_gluon=True, **kwargs)
    assert recorded == []
    assert not dq.isnan().any() and not dk.isnan().any() and not dv.isnan().any()  # the Triton kernels wrote them


def test_rows_descriptor_reads_l_and_d_flattened_in_query_blocks():
    """The dK/dV kernel's copy engine reads a query block's L (or D) of one head at (b H + h) stride + m of the
    tensor flattened: one dimension over every row, unit stride, tiles of BLOCK_M rows, the tensor itself (no copy),
    and refuses rows whose blocks could start at an address that is not 16-byte aligned."""
    lse = torch.randn(2, 3, 80)[..., :77]
    descriptor = bwd_hopper.rows_descriptor(lse, 64)
    assert (list(descriptor.shape), list(descriptor.strides), list(descriptor.block_shape)) == ([477], [1], [64])
    assert descriptor.base.data_ptr() == lse.data_ptr()
    unaligned_heads, unaligned_base = torch.randn(2, 3, 77), torch.randn(2 * 3 * 80 + 1)[1:].view(2, 3, 80)
    for bad in (lse.transpose(1, 2), lse.double(), lse[0], unaligned_heads, unaligned_base):
        with pytest.raises(ValueError, match="rows: expected L or D as a float32 .* 16-byte aligned address"):
            bwd_hopper.rows_descriptor(bad, 64)


@pytest.mark.parametrize("case, copied", [("whole heads", False), ("odd heads", True), ("shifted", True),
                                          ("wide heads", False), ("only D shifted", True), ("D wider", True)])
def test_rows_in_aligned_heads_copies_l_and_d_only_where_the_copy_engine_cannot_read_them(case, copied):
    """L and D go to the copy engine as they are where every query block starts 16-byte aligned (heads a multiple
    of 4 rows apart, the same for both, from aligned addresses); else both are copied into heads padded to a
    multiple of 4 rows, with the same values."""
    n_q, head_stride = {"odd heads": (77, 77), "wide heads": (77, 128)}.get(case, (80, 80))
    shifts = {"shifted": (1, 1), "only D shifted": (0, 1)}.get(case, (0, 0))
    strides = (head_stride, 96 if case == "D wider" else head_stride)
    lse, delta = (torch.randn(2 * 3 * stride + shift)[shift:].as_strided((2, 3, n_q), (3 * stride, stride, 1))
                  for stride, shift in zip(strides, shifts))
    got_lse, got_delta, stride = bwd_hopper.rows_in_aligned_heads(lse, delta)
    want = 80 if copied else head_stride
    assert stride == want and got_lse.stride() == got_delta.stride() == (3 * want, want, 1)
    for got, given in ((got_lse, lse), (got_delta, delta)):
        assert (got.data_ptr() != given.data_ptr()) is copied
    assert torch.equal(got_lse, lse) and torch.equal(got_delta, delta)
    for rows in (got_lse, got_delta):
        bwd_hopper.rows_descriptor(rows, 64)  # accepted


@pytest.mark.parametrize("n_q", [77, 80])
def test_dkdv_launcher_hands_the_kernel_l_and_d_in_heads_16_bytes_apart(monkeypatch, n_q):
    """The launcher's wiring, on the CPU: every block of L and D that the kernel's copy engine reads, at
    ``(b H + h) ROWS_STRIDE + m`` of their descriptors, starts 16-byte aligned and holds that head's values (L and
    D padded only where N_q is not a multiple of 4)."""
    kernel = RecordedLaunch(bwd_hopper.attention_bwd_dkdv_hopper_kernel)
    monkeypatch.setattr(bwd_hopper, "attention_bwd_dkdv_hopper_kernel", kernel)
    batch, heads, kv_heads, n_k, head_dim = 2, 4, 2, 300, 128
    q, do = (torch.randn(batch, heads, n_q, head_dim, dtype=torch.float16) for _ in range(2))
    k, v, dk, dv = (torch.randn(batch, kv_heads, n_k, head_dim, dtype=torch.float16) for _ in range(4))
    lse, delta = torch.randn(batch, heads, n_q), torch.randn(batch, heads, n_q)
    bwd_hopper.launch_attention_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, scale=0.1, causal=False)
    [(grid, args)] = kernel.calls
    assert grid == (3, batch * kv_heads) and (args["H"], args["N_Q"], args["N_K"]) == (heads, n_q, n_k)
    stride, block = args["ROWS_STRIDE"], args["BLOCK_M"]
    for desc, rows in ((args["lse_desc"], lse), (args["delta_desc"], delta)):
        assert list(desc.block_shape) == [block]
        assert (desc.base.data_ptr() != rows.data_ptr()) is (n_q % 4 != 0)  # copied only where it must be
        flat = desc.base.as_strided((batch * heads * stride,), (1,))
        for b in range(batch):
            for h in range(heads):
                for m in range(0, n_q, block):
                    start = (b * heads + h) * stride + m
                    assert (desc.base.data_ptr() + 4 * start) % 16 == 0, (b, h, m)
                    kept = min(block, n_q - m)
                    assert torch.equal(flat[start:start + kept], rows[b, h, m:m + kept]), (b, h, m)


@pytest.mark.parametrize("head_dim, dropout_p, blocks, registers", [
    (64, 0.0, (128, 64, 2), False), (64, 0.1, (64, 64, 3), True), (128, 0.0, (64, 64, 2), False),
    (128, 0.1, (64, 64, 2), False)])
def test_dkdv_launcher_takes_the_measured_blocks_and_operand_placement(monkeypatch, head_dim, dropout_p, blocks,
                                                                       registers):
    """The dK/dV kernel's measured defaults: at head_dim 64, 128 query rows a step with K and V in shared memory
    (1.00-1.03x 64 rows with them in registers on the H100, fifty-fifth finding), but with dropout, whose draws
    would spill with 128 rows, 64 rows and three slots with K and V in registers (session 61's route); at 128, 64
    rows and two slots, K and V in shared memory (they would spill in registers). ``register_operands`` overrides
    the placement."""
    kernel = RecordedLaunch(bwd_hopper.attention_bwd_dkdv_hopper_kernel)
    monkeypatch.setattr(bwd_hopper, "attention_bwd_dkdv_hopper_kernel", kernel)
    q, k, v, do, dk, dv = (torch.randn(1, 2, 128, head_dim, dtype=torch.float16) for _ in range(6))
    lse, delta = torch.randn(1, 2, 128), torch.randn(1, 2, 128)
    for asked in (None, not registers):
        bwd_hopper.launch_attention_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, scale=0.1, causal=False,
                                                dropout_p=dropout_p, register_operands=asked)
    assert [args["REGISTER_OPERANDS"] for _, args in kernel.calls] == [registers, not registers]
    for _, args in kernel.calls:
        assert (args["BLOCK_M"], args["BLOCK_N"], args["STAGES"]) == blocks
        assert args["DROPOUT"] is (dropout_p > 0)
        assert args["DRAWS_AHEAD"] is (dropout_p > 0 and head_dim in bwd_hopper.DKDV_DRAWS_AHEAD)


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
@pytest.mark.parametrize("kernel_name, setting", [("dkdv", "DKDV_DRAWS_AHEAD"), ("dq", "DQ_DRAWS_AHEAD")])
def test_launchers_draw_ahead_only_with_dropout_and_where_asked(monkeypatch, dropout_p, kernel_name, setting):
    """``draws_ahead`` (or, when it is None, whether the head dim is in the kernel's setting) draws each block's
    dropout mask a step ahead; without dropout there is nothing to draw, so the kernel never gets the flag."""
    kernel = RecordedLaunch(getattr(bwd_hopper, f"attention_bwd_{kernel_name}_hopper_kernel"))
    monkeypatch.setattr(bwd_hopper, f"attention_bwd_{kernel_name}_hopper_kernel", kernel)
    q, k, v, do, dq, dk, dv = (torch.randn(1, 2, 128, 64, dtype=torch.float16) for _ in range(7))
    lse, delta = torch.randn(1, 2, 128), torch.randn(1, 2, 128)
    common = dict(scale=0.1, causal=True, dropout_p=dropout_p)

    def call(**kwargs):
        if kernel_name == "dkdv":
            bwd_hopper.launch_attention_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, **common, **kwargs)
        else:
            bwd_hopper.launch_attention_dq_hopper(q, k, v, do, lse, delta, dq, **common, **kwargs)
    for asked in (True, False):
        call(draws_ahead=asked)
    for chosen in ((), (64,)):
        monkeypatch.setattr(bwd_hopper, setting, chosen)
        call()
    assert [args["DRAWS_AHEAD"] for _, args in kernel.calls] == [dropout_p > 0, False, False, dropout_p > 0]


def test_compiles_for_hopper_with_warpgroup_mma_the_copy_engine_and_partition_registers():
    """The installed Triton compiles the kernel for sm_90a (Triton 3.6, the GPU machine's, without spills; 3.9
    spills a little under the causal mask). The dK/dV kernel loads nothing from global memory itself: L and D come
    with Q through the copy engine (benchmarks/TUNING.md, fifty-second finding)."""
    done = run_sass_counts("--kernel", "gluon_dkdv,gluon_dq", "--d", "128,64", "--causal", "no,yes", "--top", "300")
    assert done.returncode == 0, done.stderr[-3000:]
    variants = compiled_variants(done.stdout, "gluon_dkdv") + compiled_variants(done.stdout, "gluon_dq")
    assert len(variants) == 8, done.stdout
    for header, _, opcodes in variants:
        assert opcodes.get("HGMMA", 0) > 0 and opcodes.get("UTMALDG", 0) > 0, header
        assert opcodes.get("USETMAXREG", 0) > 0, "the partitions' registers must be set (setmaxnreg)"
    for header, _, opcodes in compiled_variants(done.stdout, "gluon_dkdv"):  # without dropout: no seed to load
        assert opcodes.get("LDG", 0) == 0, f"{header}: L and D come through the copy engine, never loaded per step"


def _assert_no_stack_stores(header: str, variant_loops) -> None:
    """No loop over blocks of one compiled variant (``block_loops``' rows) stores to the stack: no spill there."""
    assert all(stores == 0 for _, _, stores, _ in variant_loops), (header, variant_loops)


def test_dkdv_defaults_compile_with_no_spill_in_the_loops():
    """The dK/dV kernel's default blocks and operand placement (:data:`CONFIGS`, and :data:`DROPOUT_CONFIGS` and
    :data:`DKDV_DROPOUT_REGISTER_OPERANDS` with dropout) keep every loop over blocks off the stack at both head
    dims: 128 query rows a step at 64 without dropout, 64 with it and K and V in registers (128 rows with dropout's
    draws store 12-33 words to the stack a step). With Triton 3.6, the GPU machine's, under either mask and with
    dropout; with later versions, which spill a little under the causal mask or with dropout at head_dim 128,
    without either."""
    done = run_sass_counts("--kernel", "gluon_dkdv", "--d", "64,128", "--causal", "no,yes", "--dropout", "0,0.1")
    assert done.returncode == 0, done.stderr[-3000:]
    variants, loops = compiled_variants(done.stdout, "gluon_dkdv"), block_loops(done.stdout, "gluon_dkdv")
    assert len(variants) == len(loops) == 8, done.stdout
    gpu_machines_triton = done.stdout.startswith("triton 3.6.")
    for (header, _, _), variant_loops in zip(variants, loops):
        assert variant_loops, f"{header}: no loop over blocks found in the SASS"
        if gpu_machines_triton or "causal=no dropout=0.0 " in header:
            _assert_no_stack_stores(header, variant_loops)
    assert sum("causal=no dropout=0.0 " in header for header, _, _ in variants) == 2, done.stdout


@pytest.mark.parametrize("kernel, head_dims, dropouts", [("gluon_dq", "64,128", "0,0.1"), ("gluon_dkdv", "64", "0.1")])
def test_register_operands_compile_with_every_product_reading_registers_and_no_spill_in_the_loops(kernel, head_dims,
                                                                                                  dropouts):
    """Where the loop-invariant first operands (Q and dO, or K and V) can be held in registers, every warpgroup
    product reads its first operand from registers, and no loop over blocks stores to the stack: with Triton 3.6
    (the GPU machine's) with or without the causal mask or dropout; with later versions, which spill a few
    registers in the causal mask's loops whichever way the operands come, without the mask. (Not the dK/dV kernel
    at head_dim 128, where K and V spill 55 registers a block, benchmarks/TUNING.md, thirty-ninth finding; nor at
    64 without dropout, whose 128 query rows a step leave no room for them.) Read from shared memory, half the
    products at least do."""
    done = run_sass_counts("--kernel", kernel, "--d", head_dims, "--causal", "no,yes", "--dropout", dropouts,
                           "--register-operands", "yes,no")
    assert done.returncode == 0, done.stderr[-3000:]
    variants = compiled_variants(done.stdout, kernel)
    loops = block_loops(done.stdout, kernel)
    first = first_operands(done.stdout)
    assert len(variants) == len(loops) == len(first) == 4 * len(head_dims.split(",")) * len(dropouts.split(",")), \
        done.stdout
    gpu_machines_triton = done.stdout.startswith("triton 3.6.")
    for (header, _, _), variant_loops, (from_registers, from_shared) in zip(variants, loops, first):
        if "register operands yes" in header:
            assert from_registers > 0 and from_shared == 0, (header, from_registers, from_shared)
            if gpu_machines_triton or "causal=no" in header:
                _assert_no_stack_stores(header, variant_loops)
        else:
            assert from_shared >= from_registers > 0, (header, from_registers, from_shared)
    assert not bwd_hopper.DKDV_REGISTER_OPERANDS, "K and V spill in registers at head_dim 128 and at 64's 128 rows"


@pytest.mark.parametrize("kernel", ["gluon_dkdv", "gluon_dq"])
def test_draws_ahead_compile_beside_the_last_product_with_no_spill_in_the_loops(kernel):
    """With dropout at head_dim 64, each backward kernel's draws drawn a step ahead land where the consumer waits for
    its last product (dK, or dQ): over 60 instructions sit between the issue of each loop's last products and their
    wait (3-7 without them with Triton 3.6, up to 14 with 3.9; under 30 asserted), and no loop over blocks stores
    to the stack either way, with or without the causal mask."""
    done = run_sass_counts("--kernel", kernel, "--d", "64", "--causal", "no,yes", "--dropout", "0.1",
                           "--draws-ahead", "no,yes")
    assert done.returncode == 0, done.stderr[-3000:]
    variants, loops = compiled_variants(done.stdout, kernel), block_loops(done.stdout, kernel)
    windows = last_product_windows(done.stdout)
    assert len(variants) == len(loops) == len(windows) == 4, done.stdout
    for (header, _, _), variant_loops, beside in zip(variants, loops, windows):
        assert variant_loops and len(beside) == len(variant_loops), header
        _assert_no_stack_stores(header, variant_loops)
        if "draws ahead yes" in header:
            assert min(beside) > 60, (header, beside)
        else:
            assert max(beside) < 30, (header, beside)
    assert sum("draws ahead yes" in header for header, _, _ in variants) == 2, done.stdout


def _count_launches(monkeypatch) -> list[str]:
    """The names of the Gluon kernels launched (and run) from now on."""
    calls = []
    for name in ("dkdv", "dq"):
        real = getattr(bwd_hopper, f"launch_attention_{name}_hopper")
        monkeypatch.setattr(bwd_hopper, f"launch_attention_{name}_hopper",
                            lambda *a, name=name, real=real, **kw: calls.append(name) or real(*a, **kw))
    return calls


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ODD_SHAPES)
def test_gpu_gluon_dkdv_and_dq_match_float64(monkeypatch, dtype, head_dim, causal, shape):
    batch, heads, kv_heads, n_q, n_k, layout = shape
    q, k, v, do = (as_bhnd(t, layout) for t in make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype,
                                                           layout, seed=n_k + head_dim, grad_out=True))
    if not bwd_hopper.can_run(q, k, v, do, k, v, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    calls = _count_launches(monkeypatch)
    spec = AttentionSpec(causal=causal)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    launch_attention_forward(q, k, v, o, lse, spec)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    attention_bwd.launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec, use_gluon=True)
    assert calls == ["dkdv", "dq"]
    group = heads // kv_heads
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    naive_attention(q64, k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1),
                    causal=causal).backward(do.double())
    for got, want in ((dq, q64.grad), (dk, k64.grad), (dv, v64.grad)):
        assert relative_error(got, want) <= tolerance(dtype)  # also fails on a NaN: every element written


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(2048, 2048), (1025, 1299)])
@pytest.mark.parametrize("head_dim, kernels", [(128, ["dkdv", "dq"]), (64, ["dkdv"])])
def test_gpu_front_door_takes_it_with_gradients_that_match_and_repeat_bitwise(monkeypatch, dtype, causal, n_q, n_k,
                                                                              head_dim, kernels):
    """A plain call takes the Gluon kernels its head_dim is routed to at these lengths (both at 128; at 64 the
    dK/dV kernel, 128 query rows a step with K and V in shared memory, and Triton's dQ kernel below 4096 rows), at
    lengths of whole blocks and at odd ones (N_q = 1025: L and D go to the copy engine in padded heads), with
    gradients within tolerance of float64 that repeat bit for bit."""
    q, k, v, do = make_inputs(1, 4, 2, n_q, n_k, head_dim, dtype, seed=7, grad_out=True)
    if not bwd_hopper.can_run(q, k, v, do, k, v, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    monkeypatch.setattr(bwd_hopper, "MIN_SCORES", 0)  # this small batch is below the default's threshold of work
    calls = _count_launches(monkeypatch)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    grads = []
    for _ in range(2):
        torch.autograd.backward(flash_attention(q, k, v, causal=causal), do)
        grads.append([t.grad for t in (q, k, v)])
        q.grad = k.grad = v.grad = None
    assert calls == kernels * 2
    assert all(torch.equal(a, b) for a, b in zip(*grads))  # deterministic: no atomics, the same order each time
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    naive_attention(q64, k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1), causal=causal).backward(do.double())
    for got, want in zip(grads[0], (q64.grad, k64.grad, v64.grad)):
        assert relative_error(got, want) <= tolerance(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gluon_dropout_gradients_match_float64_with_the_kernels_mask(monkeypatch, dtype, head_dim, causal):
    """Both Gluon kernels recompute the forward's dropout: gradients equal float64 autograd's through the mask that
    ``dropout_mask`` writes for the seed (GQA, N_q != N_k, lengths inside a square of draws, a seed above 2^32),
    and equal the Triton kernels' within rounding."""
    q, k, v, do = make_inputs(2, 6, 3, 600, 700, head_dim, dtype, seed=head_dim + 3 * causal, grad_out=True)
    if not bwd_hopper.can_run(q, k, v, do, k, v, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    p, seed = 0.2, (5 << 33) + 777
    seed_tensor = torch.tensor([seed], dtype=torch.int64, device="cuda")
    spec = AttentionSpec(causal=causal, dropout_p=p)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    launch_attention_forward(q, k, v, o, lse, spec, dropout_seed=seed_tensor, use_gluon=True)
    calls = _count_launches(monkeypatch)
    grads = {}
    for use_gluon in (True, False):
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        attention_bwd.launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec, dropout_seed=seed_tensor,
                                                use_gluon=use_gluon)
        grads[use_gluon] = (dq, dk, dv)
    assert calls == ["dkdv", "dq"]
    mask = dropout_mask(seed, p, 2, 6, 600, 700, q.device)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    naive_attention(q64, k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1), causal=causal,
                    dropout_p=effective_dropout_p(p), dropout_mask=mask).backward(do.double())
    for got, triton_got, want in zip(grads[True], grads[False], (q64.grad, k64.grad, v64.grad)):
        assert relative_error(got, want) <= tolerance(dtype)  # also fails on a NaN: every element written
        assert relative_error(got, triton_got) <= tolerance(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_gpu_register_operands_give_the_same_gradients_bitwise(dtype, head_dim, causal, dropout_p):
    """Q and dO (dQ kernel) and, at head_dim 64, K and V (dK/dV kernel) read from registers instead of shared
    memory feed the same products in the same order: dQ, dK and dV equal the shared-memory path's bit for bit
    (GQA 6/3, N_q = 600 / N_k = 700, outputs NaN-filled first), and match float64 autograd."""
    q, k, v, do = make_inputs(2, 6, 3, 600, 700, head_dim, dtype, seed=head_dim + causal, grad_out=True)
    if not bwd_hopper.can_run(q, k, v, do, k, v, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    seed = torch.tensor([12345], dtype=torch.int64, device="cuda")
    spec = AttentionSpec(causal=causal, dropout_p=effective_dropout_p(dropout_p))
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    launch_attention_forward(q, k, v, o, lse, spec, dropout_seed=seed)
    delta = attention_bwd.launch_attention_backward(q, k, v, o, lse, do, None, None, None, spec, dropout_seed=seed)
    scale, grads = spec.scale(head_dim), {}
    for in_registers in (False, True):
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        common = dict(scale=scale, causal=causal, dropout_p=spec.dropout_p, dropout_seed=seed,
                      register_operands=in_registers)
        bwd_hopper.launch_attention_dq_hopper(q, k, v, do, lse, delta, dq, **common)
        bwd_hopper.launch_attention_dkdv_hopper(q, k, v, do, lse, delta, dk, dv,
                                                **{**common, "register_operands": in_registers and head_dim == 64})
        grads[in_registers] = (dq, dk, dv)
    for name, shared, registers in zip("qkv", grads[False], grads[True]):
        assert torch.equal(shared, registers), f"d{name}"
    if dropout_p == 0:
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        naive_attention(q64, k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1), causal=causal).backward(
            do.double())
        for got, want in zip(grads[True], (q64.grad, k64.grad, v64.grad)):
            assert relative_error(got, want) <= tolerance(dtype)  # also fails on a NaN: every element written


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_draws_ahead_give_the_same_gradients_bitwise(dtype, head_dim, causal):
    """Both backward kernels' dropout draws drawn a step ahead (``draws_ahead``) drop the same weights from the
    same products: dQ, dK and dV equal the default path's bit for bit (GQA 6/3 so that each dK/dV program walks two
    query heads, N_q = 600 / N_k = 700 with every loop of the causal mask, dropout 0.2, outputs NaN-filled first:
    every element written). The default path is checked against float64 through the kernels' own mask elsewhere
    (test_gpu_gluon_dropout_gradients_match_float64_with_the_kernels_mask)."""
    q, k, v, do = make_inputs(2, 6, 3, 600, 700, head_dim, dtype, seed=head_dim + causal, grad_out=True)
    if not bwd_hopper.can_run(q, k, v, do, k, v, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    seed = torch.tensor([2026], dtype=torch.int64, device="cuda")
    spec = AttentionSpec(causal=causal, dropout_p=effective_dropout_p(0.2))
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    launch_attention_forward(q, k, v, o, lse, spec, dropout_seed=seed)
    delta = attention_bwd.launch_attention_backward(q, k, v, o, lse, do, None, None, None, spec, dropout_seed=seed)
    grads = {}
    for ahead in (False, True):
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        common = dict(scale=spec.scale(head_dim), causal=causal, dropout_p=spec.dropout_p, dropout_seed=seed,
                      draws_ahead=ahead)
        bwd_hopper.launch_attention_dq_hopper(q, k, v, do, lse, delta, dq, **common)
        bwd_hopper.launch_attention_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, **common)
        grads[ahead] = (dq, dk, dv)
    assert not any(t.isnan().any() for t in grads[False])
    for name, now, ahead in zip("qkv", grads[False], grads[True]):
        assert torch.equal(now, ahead), f"d{name}"


@pytest.mark.gpu
@pytest.mark.parametrize("n_q", [77, 80])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_dkdv_kernel_takes_l_and_d_at_any_address(causal, n_q):
    """The copy engine reads L and D only from 16-byte aligned addresses, and each block of them too. dK and dV
    equal the contiguous call's bit for bit when L and D are views that start 4 bytes into their buffers (as a slice
    of a larger LSE would; copied first), and when they are the first N_q rows of heads 128 rows apart whose other
    rows hold NaN (read in place: the kernel must drop every row past N_q). N_q = 77: heads are not a multiple of 4
    rows apart, so the contiguous and shifted calls copy them into padded heads (read in place, they were an illegal
    instruction); N_q = 80: only the shifted call copies."""
    q, k, v, do = make_inputs(2, 4, 2, n_q, 300, 128, torch.float16, seed=7 + causal, grad_out=True)
    if not bwd_hopper.can_run(q, k, v, do, k, v, scale=1.0):
        pytest.skip("needs a Hopper GPU (sm_90) and Gluon")
    spec = AttentionSpec(causal=causal)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    launch_attention_forward(q, k, v, o, lse, spec)
    delta = attention_bwd.launch_attention_backward(q, k, v, o, lse, do, None, None, None, spec)

    def shifted(t):
        buffer = torch.empty(t.numel() + 1, device="cuda")
        return buffer[1:].view_as(t).copy_(t)

    def in_wide_heads(t):
        buffer = torch.full((*t.shape[:2], 128), float("nan"), device="cuda")
        return buffer[..., :n_q].copy_(t)

    grads = []
    for place in (lambda t: t, shifted, in_wide_heads):
        dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        bwd_hopper.launch_attention_dkdv_hopper(q, k, v, do, place(lse), place(delta), dk, dv,
                                                scale=spec.scale(128), causal=causal)
        grads.append((dk, dv))
    assert shifted(lse).data_ptr() % 16 == 4 and in_wide_heads(lse).stride(1) == 128
    for name, contiguous, *others in zip("kv", *grads):
        assert not contiguous.isnan().any(), f"d{name}"
        assert all(torch.equal(contiguous, other) for other in others), f"d{name}"

