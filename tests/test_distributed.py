"""flashlib.distributed: ring attention across processes against one flash_attention on the whole sequence.

Worlds of 2 and 4 processes on gloo (CPU tensors, Triton's interpreter), spawned once per world
size, each running every case; the test process compares their shards, put back together, with
flash_attention on the unsharded input (forward and dq, dk, dv: relative error 1e-5 in float32,
float16 and bfloat16 within their tolerances), and with the float64 reference.
A world of one rank runs in the test process itself. Arguments that differ between ranks make
every rank raise, and a rank that never calls is bounded by the group's timeout: the workers
report what each rank raised, and the test process joins them with a deadline, so a hang fails
the test instead of stalling CI.
"""
import datetime
import json
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashlib import flash_attention
from flashlib.distributed import (SCHEMES, merge_partial, ring_attention, ring_attention_of_full,
                                  run_on_cpu_processes, shard_sequence, step_work,
                                  unshard_sequence)
from flashlib.reference import naive_attention
from flashlib.validation import relative_error, tolerance

SHARD, HEAD_DIM, HEADS = 16, 16, 2
#: name: (scheme, causal, kv_heads, dtype); H = 2 query heads, so kv_heads 1 is GQA.
CASES = {
    "contiguous": ("contiguous", False, 2, torch.float32),
    "contiguous-causal": ("contiguous", True, 2, torch.float32),
    "contiguous-causal-gqa": ("contiguous", True, 1, torch.float32),
    "zigzag": ("zigzag", False, 1, torch.float32),
    "zigzag-causal": ("zigzag", True, 2, torch.float32),
    "zigzag-causal-gqa": ("zigzag", True, 1, torch.float32),
    "zigzag-causal-gqa-fp16": ("zigzag", True, 1, torch.float16),
    "zigzag-causal-bf16": ("zigzag", True, 2, torch.bfloat16),
}
JOIN_TIMEOUT_S = 240  # the workers of one world, all cases; a hang fails the test after this
GROUP_TIMEOUT = datetime.timedelta(seconds=60)


# ---------------------------------------------------------------- inputs and the process harness
def full_inputs(name: str, world_size: int, dtype=None, device="cpu"):
    """The unsharded q, k, v and output gradient of a case (in its dtype unless one is given): the same
    in every process (seeded)."""
    _, _, kv_heads, case_dtype = CASES[name]
    dtype = case_dtype if dtype is None else dtype
    gen = torch.Generator().manual_seed(sorted(CASES).index(name) + 100 * world_size)
    n = SHARD * world_size

    def one(heads):
        return torch.randn(1, heads, n, HEAD_DIM, generator=gen, dtype=torch.float64).to(device, dtype)

    return one(HEADS), one(kv_heads), one(kv_heads), one(HEADS)


def init_group(rank: int, world_size: int, store_dir: str, backend: str = "gloo") -> None:
    torch.set_num_threads(1)  # W processes share this machine's cores
    store = dist.FileStore(os.path.join(store_dir, "store"), world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=GROUP_TIMEOUT)


def spawn(worker, world_size: int, *args, timeout: float = JOIN_TIMEOUT_S) -> None:
    """Run ``worker(rank, world_size, *args)`` in ``world_size`` fresh processes; a worker's exception
    is raised here (with its traceback), and workers still running after ``timeout`` are killed."""
    context = mp.start_processes(worker, args=(world_size, *args), nprocs=world_size, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                pytest.fail(f"ring attention workers still running after {timeout} s: a hang")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()


def outputs_and_grads(o, q, k, v) -> dict:
    """O and the gradients of q, k, v, by name."""
    return {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def shard_path(out_dir: str, name: str, rank: int) -> str:
    return os.path.join(out_dir, f"{name}.rank{rank}.pt")


# ---------------------------------------------------------------- workers (module level: spawn pickles them)
def ring_worker(rank: int, world_size: int, store_dir: str, out_dir: str) -> None:
    """Every case on this rank's shards: save O, dq, dk, dv. With 4 ranks, also a ring of 2 over the
    subgroups {0, 2} and {1, 3}, whose ring neighbours are not neighbours in the world."""
    init_group(rank, world_size, store_dir)
    try:
        runs = [(name, dist.group.WORLD, rank, world_size) for name in CASES]
        if world_size == 4:
            evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
            runs.append(("subgroup-zigzag-causal-gqa", evens if rank % 2 == 0 else odds, rank // 2, 2))
        for name, group, group_rank, group_size in runs:
            case = name.removeprefix("subgroup-")
            scheme, causal, _, _ = CASES[case]
            full = full_inputs(case, group_size)
            q, k, v, do = (shard_sequence(t, group_rank, group_size, scheme) for t in full)
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            o = ring_attention(q, k, v, causal=causal, scheme=scheme, group=group)
            o.backward(do)
            torch.save(outputs_and_grads(o, q, k, v), shard_path(out_dir, f"{name}.world{world_size}", rank))
    finally:
        dist.destroy_process_group()


def mismatch_worker(rank: int, world_size: int, store_dir: str, out_dir: str) -> None:
    """Calls with arguments that differ between ranks, then a good call, then a call that rank 1 never
    makes: what each raised (type, message, seconds) goes to a JSON file per rank."""
    init_group(rank, world_size, store_dir)
    gen = torch.Generator().manual_seed(rank)
    results = {}

    def attempt(label, n=SHARD, dtype=torch.float32, group=None, q_grad=False, sparse=False, **kwargs):
        q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, generator=gen).to(dtype) for _ in range(3))
        q = q.to_sparse() if sparse else q.requires_grad_(q_grad)
        start = time.monotonic()
        try:
            ring_attention(q, k, v, group=group, **kwargs)
            results[label] = None
        except Exception as error:  # noqa: BLE001 - reported to the test process, which asserts
            results[label] = [type(error).__name__, str(error), time.monotonic() - start]

    try:
        attempt("length", n=2 * SHARD if rank == 1 else SHARD)
        attempt("dtype", dtype=torch.float16 if rank == 1 else torch.float32)
        attempt("causal", causal=rank == 1)
        attempt("scale", softmax_scale=0.5 if rank == 0 else None)
        attempt("unknown-scheme", scheme="diagonal" if rank == 1 else "contiguous")
        attempt("odd-zigzag", n=SHARD + 1, scheme="zigzag")
        attempt("grad", q_grad=rank == 0)    # rank 1 would never run the backward's ring
        attempt("sparse", sparse=rank == 1)  # not a TypeError/ValueError: rank 0 must learn of it all the same
        attempt("good-after-errors", causal=True, scheme="zigzag")
        short = dist.new_group(list(range(world_size)), timeout=datetime.timedelta(seconds=2))
        if rank == 0:
            attempt("absent-rank", group=short)
        else:
            time.sleep(6)  # never calls: rank 0 must give up after the group's 2 s, not wait for this
    finally:
        with open(os.path.join(out_dir, f"errors.rank{rank}.json"), "w", encoding="utf-8") as handle:
            json.dump(results, handle)
    if rank == 0:
        os._exit(0)  # the short group is broken on rank 0: skip its teardown
    dist.destroy_process_group()


def nccl_one_rank_worker(rank: int, world_size: int, store_dir: str) -> None:
    """A world of one on NCCL: ring attention on the GPU equals flash_attention (forward and gradients)."""
    import functools

    from support.attention import FIXED_BACKWARD, FIXED_FORWARD

    from flashlib import ops
    from flashlib.kernels import attention_bwd, attention_fwd

    ops.launch_attention_forward = functools.partial(attention_fwd.launch_attention_forward, **FIXED_FORWARD)
    ops.launch_attention_backward = functools.partial(attention_bwd.launch_attention_backward, **FIXED_BACKWARD)
    torch.cuda.set_device(0)
    init_group(rank, world_size, store_dir, backend="nccl")
    try:
        for dtype in (torch.float16, torch.float32):
            for name, (scheme, causal, _, _) in CASES.items():
                q, k, v, do = full_inputs(name, 4, dtype=dtype, device="cuda")
                ring = [t.clone().requires_grad_() for t in (q, k, v)]
                single = [t.clone().requires_grad_() for t in (q, k, v)]
                o_ring = ring_attention(*ring, causal=causal, scheme=scheme)
                o_ring.backward(do)
                o_single = flash_attention(*single, causal=causal)
                o_single.backward(do)
                for what, got, want in zip(("O", "dq", "dk", "dv"), (o_ring, *(t.grad for t in ring)),
                                           (o_single, *(t.grad for t in single))):
                    error = relative_error(got, want)
                    assert error <= tolerance(dtype), f"{name} {dtype} {what}: relative error {error:.2e}"
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- worlds of 2 and 4 processes
@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def ring_results(request, tmp_path_factory):
    """Every case run once on ``world_size`` gloo processes: world_size and the folder of their shards."""
    world_size = request.param
    store_dir = tmp_path_factory.mktemp(f"store{world_size}")
    out_dir = tmp_path_factory.mktemp(f"shards{world_size}")
    spawn(ring_worker, world_size, str(store_dir), str(out_dir))
    return world_size, str(out_dir)


def gathered(out_dir, name, world_size, scheme, ranks):
    """The shards of ``ranks`` put back together into full O, dq, dk, dv."""
    shards = [torch.load(shard_path(out_dir, name, r)) for r in ranks]
    return {key: unshard_sequence([s[key] for s in shards], scheme) for key in ("o", "dq", "dk", "dv")}


def single_process(name, world_size):
    """O, dq, dk, dv of one flash_attention on the unsharded inputs."""
    causal = CASES[name][1]
    q, k, v, do = full_inputs(name, world_size)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = flash_attention(q, k, v, causal=causal)
    o.backward(do)
    return outputs_and_grads(o, q, k, v)


def assert_close(got: dict, want: dict, what: str) -> None:
    """Relative error within the dtype's tolerance (1e-5 for float32 here) for O and every gradient."""
    for key in ("o", "dq", "dk", "dv"):
        error = relative_error(got[key], want[key])
        assert error <= tolerance(want[key].dtype), \
            f"{what}: {key} relative error {error:.2e} against flash_attention on one process"


@pytest.mark.parametrize("name", list(CASES))
def test_ring_matches_flash_attention_forward_and_gradients(ring_results, name):
    world_size, out_dir = ring_results
    scheme = CASES[name][0]
    got = gathered(out_dir, f"{name}.world{world_size}", world_size, scheme, range(world_size))
    assert_close(got, single_process(name, world_size), f"{name}, {world_size} ranks")


def test_ring_over_subgroups_with_non_adjacent_ranks(ring_results):
    world_size, out_dir = ring_results
    if world_size != 4:
        pytest.skip("the subgroups {0, 2} and {1, 3} need 4 ranks")
    name = "zigzag-causal-gqa"
    want = single_process(name, 2)
    for ranks in ((0, 2), (1, 3)):
        got = gathered(out_dir, f"subgroup-{name}.world4", 2, "zigzag", ranks)
        assert_close(got, want, f"ring over global ranks {ranks}")


def test_ring_shards_match_float64_reference(ring_results):
    """The ring itself against the float64 ground truth (not only against flash_attention)."""
    world_size, out_dir = ring_results
    name = "zigzag-causal-gqa"
    got = gathered(out_dir, f"{name}.world{world_size}", world_size, "zigzag", range(world_size))
    q, k, v, _ = (t.double() for t in full_inputs(name, world_size))
    want = naive_attention(q, k, v, causal=True)
    assert relative_error(got["o"], want) <= 1e-5


# ---------------------------------------------------------------- bad input across ranks: every rank raises
@pytest.fixture(scope="module")
def mismatch_results(tmp_path_factory):
    store_dir, out_dir = tmp_path_factory.mktemp("store_err"), tmp_path_factory.mktemp("errors")
    spawn(mismatch_worker, 2, str(store_dir), str(out_dir), timeout=120)
    results = []
    for rank in range(2):
        with open(os.path.join(out_dir, f"errors.rank{rank}.json"), encoding="utf-8") as handle:
            results.append(json.load(handle))
    return results


@pytest.mark.parametrize("label, error, words", [
    ("length", "ValueError", ["same shard length N/W", "rank 0: 16, rank 1: 32"]),
    ("dtype", "TypeError", ["same dtype", "rank 0: torch.float32, rank 1: torch.float16"]),
    ("causal", "ValueError", ["same causal", "rank 0: False, rank 1: True"]),
    ("scale", "ValueError", ["same softmax_scale", "rank 0: 0.5, rank 1: 0.25"]),
])
def test_arguments_that_differ_between_ranks_raise_on_every_rank(mismatch_results, label, error, words):
    for rank, results in enumerate(mismatch_results):
        assert results[label] is not None, f"rank {rank} did not raise for {label}"
        kind, message, _ = results[label]
        assert kind == error and all(w in message for w in words), f"rank {rank}: {kind}: {message}"


def test_one_rank_rejected_makes_every_rank_raise(mismatch_results):
    rank0, rank1 = (results["unknown-scheme"] for results in mismatch_results)
    assert rank1[0] == "ValueError" and "scheme must be one of" in rank1[1] and "'diagonal'" in rank1[1]
    assert rank0[0] == "ValueError" and "rank(s) [1]" in rank0[1]
    for results in mismatch_results:  # each rank its own, clear error
        assert results["odd-zigzag"][0] == "ValueError" and "even shard length" in results["odd-zigzag"][1]


def test_autograd_on_some_ranks_only_raises_on_every_rank(mismatch_results):
    """A rank whose call autograd records runs a backward that is a ring too: a rank whose call it does not record
    would never join it, and the first would wait for the group's timeout, in backward, with gloo's words."""
    for rank, results in enumerate(mismatch_results):
        kind, message, seconds = results["grad"]
        assert kind == "ValueError" and "same autograd recording" in message and "rank 0: True, rank 1: False" in \
            message and seconds < 5, f"rank {rank}: {kind}: {message}"


def test_any_local_failure_is_shared_with_the_other_ranks(mismatch_results):
    rank0, rank1 = (results["sparse"] for results in mismatch_results)
    assert rank1 is not None and rank1[2] < 5, rank1
    assert rank0[0] == "ValueError" and "rank(s) [1]" in rank0[1] and rank0[2] < 5, rank0


def test_group_still_usable_after_errors(mismatch_results):
    assert all(results["good-after-errors"] is None for results in mismatch_results)


def test_rank_that_never_calls_is_bounded_by_the_group_timeout(mismatch_results):
    kind, message, seconds = mismatch_results[0]["absent-rank"]
    assert "timed out" in message.lower() and 1.5 < seconds < 5.5, f"{kind} after {seconds:.1f} s: {message}"


# ---------------------------------------------------------------- a world of one, in this process
@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_world_of_one_equals_flash_attention(one_rank, scheme, causal, kv_heads):
    gen = torch.Generator().manual_seed(kv_heads + 2 * causal)
    q, do = (torch.randn(1, HEADS, 2 * SHARD, HEAD_DIM, generator=gen) for _ in range(2))
    k, v = (torch.randn(1, kv_heads, 2 * SHARD, HEAD_DIM, generator=gen) for _ in range(2))
    ring = [t.clone().requires_grad_() for t in (q, k, v)]
    single = [t.clone().requires_grad_() for t in (q, k, v)]
    o_ring = ring_attention(*ring, causal=causal, scheme=scheme, softmax_scale=0.3)
    o_ring.backward(do)
    o_single = flash_attention(*single, causal=causal, softmax_scale=0.3)
    o_single.backward(do)
    assert_close(outputs_and_grads(o_ring, *ring), outputs_and_grads(o_single, *single), "one rank")


def test_only_some_inputs_need_grad(one_rank):
    q, k, v = (torch.randn(1, HEADS, SHARD, HEAD_DIM) for _ in range(3))
    k.requires_grad_()
    ring_attention(q, k, v, causal=True).sum().backward()
    k_single = k.detach().clone().requires_grad_()
    flash_attention(q, k_single, v, causal=True).sum().backward()
    assert q.grad is None and v.grad is None
    assert relative_error(k.grad, k_single.grad) <= 1e-5


@pytest.mark.parametrize("args, kwargs, error, words", [
    ((torch.zeros(2, 16, 16),) * 3, {}, ValueError, ["Expected 4D tensors", "(2, 16, 16)"]),
    ((torch.zeros(1, 2, 16, 16), "k", torch.zeros(1, 2, 16, 16)), {}, TypeError, ["k is a str"]),
    ((torch.zeros(1, 2, 16, 16),) * 3, {"scheme": "striped"}, ValueError, ["scheme must be one of", "'striped'"]),
    ((torch.zeros(1, 2, 15, 16),) * 3, {"scheme": "zigzag"}, ValueError, ["even shard length", "15"]),
    ((torch.zeros(1, 2, 16, 16), torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 16)), {}, ValueError,
     ["same length N/W", "(1, 2, 8, 16)"]),
    ((torch.zeros(1, 3, 16, 16), torch.zeros(1, 2, 16, 16), torch.zeros(1, 2, 16, 16)), {}, ValueError,
     ["multiple of k/v heads"]),
    ((torch.zeros(1, 2, 16, 16), torch.zeros(1, 2, 16, 16, dtype=torch.float64), torch.zeros(1, 2, 16, 16)), {},
     TypeError, ["same dtype"]),
    ((torch.zeros(1, 2, 16, 16),) * 3, {"causal": 1}, TypeError, ["causal must be a bool"]),
])
def test_bad_arguments_on_one_rank(one_rank, args, kwargs, error, words):
    with pytest.raises(error) as raised:
        ring_attention(*args, **kwargs)
    assert all(w in str(raised.value) for w in words), str(raised.value)


def test_double_backward_raises_instead_of_a_silent_first_order_result(one_rank):
    """A gradient penalty through ring_attention: dq must stay connected to q, k, v, and differentiating it
    raise, as flash_attention's does (unconnected, d(penalty)/dq came out as 0 with no error)."""
    from flashlib.distributed import DOUBLE_BACKWARD_MESSAGE

    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, HEADS, SHARD, HEAD_DIM, generator=gen) for _ in range(4))
    q.requires_grad_()
    o = ring_attention(q, k, v, causal=True)
    (dq,) = torch.autograd.grad(o, q, do, create_graph=True)
    assert dq.requires_grad
    with pytest.raises(RuntimeError) as raised:
        ((o * do).sum() + (dq ** 2).sum()).backward()
    assert str(raised.value) == DOUBLE_BACKWARD_MESSAGE
    q_single = q.detach().clone().requires_grad_()   # the first derivative is still right
    (dq_single,) = torch.autograd.grad(flash_attention(q_single, k, v, causal=True), q_single, do)
    assert relative_error(dq.detach(), dq_single) <= 1e-5


@pytest.mark.parametrize("transform", ["grad", "vmap", "forward_ad"])
def test_torch_func_and_forward_mode_get_a_clear_error(one_rank, transform):
    q, k, v = (torch.randn(1, HEADS, SHARD, HEAD_DIM) for _ in range(3))
    with pytest.raises(ValueError, match="supports neither torch.func transforms"):
        if transform == "grad":
            torch.func.grad(lambda x: ring_attention(x, k, v).sum())(q)
        elif transform == "vmap":
            torch.func.vmap(lambda x: ring_attention(x, k, v))(q[None])
        else:
            import torch.autograd.forward_ad as fwAD
            with fwAD.dual_level():
                ring_attention(fwAD.make_dual(q, torch.ones_like(q)), k, v)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float8_e4m3fn])
def test_unsupported_dtypes_are_named_without_flash_attentions_fp8_advice(one_rank, dtype):
    q = torch.zeros(1, HEADS, SHARD, HEAD_DIM).to(dtype)
    with pytest.raises(TypeError) as raised:
        ring_attention(q, q, q)
    assert "float16, bfloat16 or float32" in str(raised.value) and str(dtype) in str(raised.value)
    assert "descale" not in str(raised.value)


def test_a_group_that_is_not_a_process_group_is_named(one_rank):
    with pytest.raises(TypeError, match="group must be a torch.distributed ProcessGroup .* got a list"):
        ring_attention(*(torch.zeros(1, HEADS, SHARD, HEAD_DIM) for _ in range(3)), group=[0])


def test_needs_an_initialised_process_group(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(*(torch.zeros(1, 2, 16, 16) for _ in range(3)))


# ---------------------------------------------------------------- shards, steps and the merge (no processes)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("dim", [1, 2])
def test_shard_unshard_round_trip(scheme, world_size, dim):
    x = torch.randn(2, 24, 24, 3)
    shards = [shard_sequence(x, r, world_size, scheme, dim=dim) for r in range(world_size)]
    assert all(s.is_contiguous() and s.shape[dim] == 24 // world_size for s in shards)
    assert torch.equal(unshard_sequence(shards, scheme, dim=dim), x)


def test_zigzag_holds_chunks_r_and_2w_minus_1_minus_r():
    x = torch.arange(16).view(1, 1, 16, 1)
    got = [shard_sequence(x, r, 2, "zigzag").flatten().tolist() for r in range(2)]
    assert got == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]]
    assert shard_sequence(x, 1, 2).flatten().tolist() == list(range(8, 16))


@pytest.mark.parametrize("call, error, words", [
    (lambda: shard_sequence(torch.zeros(1, 2, 12, 4), 0, 4, "zigzag"), ValueError, ["multiple of 8", "got 12"]),
    (lambda: shard_sequence(torch.zeros(1, 2, 10, 4), 0, 4), ValueError, ["multiple of 4", "got 10"]),
    (lambda: shard_sequence(torch.zeros(1, 2, 8, 4), 0, 2, "ring"), ValueError, ["scheme must be one of"]),
    (lambda: shard_sequence(torch.zeros(1, 2, 8, 4), 2, 2), ValueError, ["rank must be", "got 2"]),
    (lambda: shard_sequence(torch.zeros(1, 2, 8, 4), 0, 0), ValueError, ["world_size must be", "got 0"]),
    (lambda: shard_sequence(torch.zeros(1, 2, 8, 4), 0, 2, dim=4), ValueError, ["dim must index"]),
    (lambda: shard_sequence([1, 2], 0, 2), TypeError, ["x must be a torch.Tensor"]),
    (lambda: unshard_sequence([torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 6, 4)]), ValueError, ["same shape"]),
    (lambda: unshard_sequence([torch.zeros(1, 2, 3, 4)] * 2, "zigzag"), ValueError, ["must be even", "got 3"]),
    (lambda: unshard_sequence([]), TypeError, ["non-empty list"]),
])
def test_shard_errors(call, error, words):
    with pytest.raises(error) as raised:
        call()
    assert all(w in str(raised.value) for w in words), str(raised.value)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_step_work_is_exactly_the_visible_block(scheme, world_size):
    """For every (rank, source) the block step_work names holds exactly the causally visible pairs of
    global positions, and no visible pair lies outside it."""
    shard = 8
    positions = [shard_sequence(torch.arange(shard * world_size), r, world_size, scheme, dim=0)
                 for r in range(world_size)]
    for rank in range(world_size):
        for source in range(world_size):
            visible = positions[rank][:, None] >= positions[source][None, :]
            work = step_work(rank, source, shard, True, scheme)
            covered = torch.zeros_like(visible)
            if work is not None:
                block = torch.ones(shard, shard, dtype=torch.bool)[work.q_rows, work.kv_rows]
                covered[work.q_rows, work.kv_rows] = block.tril() if work.causal else block
            assert torch.equal(covered, visible), (rank, source)


@pytest.mark.parametrize("world_size", [2, 4])
def test_zigzag_balances_causal_work_and_contiguous_does_not(world_size):
    """Visible pairs per rank: equal across ranks with the zigzag, rank r does 2r + 1 units contiguously."""
    shard = 8

    def work_per_rank(scheme):
        totals = []
        for rank in range(world_size):
            total = 0
            for source in range(world_size):
                work = step_work(rank, source, shard, True, scheme)
                if work is not None:
                    rows = work.q_rows.stop - work.q_rows.start
                    keys = work.kv_rows.stop - work.kv_rows.start
                    total += rows * (rows + 1) // 2 if work.causal else rows * keys
            totals.append(total)
        return totals

    assert len(set(work_per_rank("zigzag"))) == 1
    contiguous = work_per_rank("contiguous")
    assert contiguous == sorted(contiguous) and contiguous[-1] > contiguous[0]


def test_merge_partial_equals_attention_over_all_keys():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 12, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    scores = q @ k.transpose(-1, -2)

    def partial(keys):
        s = scores[..., keys]
        return torch.softmax(s, -1) @ v[..., keys, :], torch.logsumexp(s, -1)

    o, lse = merge_partial(*partial(slice(0, 5)), *partial(slice(5, 12)))
    assert relative_error(o, torch.softmax(scores, -1) @ v) <= 1e-12
    assert relative_error(lse, torch.logsumexp(scores, -1)) <= 1e-12


def test_merge_partial_with_rows_that_saw_no_key():
    o_a, o_b = torch.full((3, 4), 2.0), torch.full((3, 4), 5.0)
    lse_a = torch.tensor([float("-inf"), float("-inf"), 1.0])
    lse_b = torch.tensor([float("-inf"), 0.5, float("-inf")])
    o, lse = merge_partial(torch.zeros(3, 4), lse_a, o_b, lse_b)
    assert not o.isnan().any()
    assert torch.equal(o[0], torch.zeros(4)) and lse[0] == float("-inf")
    assert torch.equal(o[1], o_b[1]) and lse[1] == 0.5
    o, lse = merge_partial(o_a, lse_a, torch.zeros(3, 4), lse_b)
    assert torch.equal(o[2], o_a[2]) and lse[2] == 1.0


# ---------------------------------------------------------------- one GPU
@pytest.mark.gpu
def test_gpu_world_of_one_on_nccl(tmp_path):
    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    spawn(nccl_one_rank_worker, 1, str(tmp_path), timeout=300)


# ---------------------------------------------------------------- the launcher: W CPU processes, one gloo group
def rank_report(x: torch.Tensor) -> dict:
    """What a launched rank sees: its rank and group, the sum of x * rank over the group, its environment."""
    total = x * dist.get_rank()
    dist.all_reduce(total)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": dist.get_backend(),
            "sum": total, "threads": torch.get_num_threads(), "interpret": os.environ.get("TRITON_INTERPRET"),
            "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def raise_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank one says no")
    dist.barrier()  # rank 0 would wait here for ever: the launcher must stop it


def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


def test_launcher_returns_each_ranks_result_in_rank_order():
    saved = {name: os.environ.get(name) for name in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")}
    results = run_on_cpu_processes(rank_report, 3, torch.ones(2))
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world_size"] == 3 and r["backend"] == "gloo" and r["threads"] == 1 for r in results)
    assert all(torch.equal(r["sum"], torch.full((2,), 3.0)) for r in results)  # 0 + 1 + 2, all-reduced
    assert all(r["interpret"] == "1" and r["cuda_visible"] == "" for r in results)  # CPU processes on any machine
    assert {name: os.environ.get(name) for name in saved} == saved  # this process's environment is back


def test_launcher_runs_ring_attention_of_full_like_one_flash_attention():
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 4 * SHARD, HEAD_DIM, generator=gen)
    k, v = (torch.randn(1, 2, 4 * SHARD, HEAD_DIM, generator=gen) for _ in range(2))
    shards = run_on_cpu_processes(ring_attention_of_full, 2, q, k, v, causal=True, scheme="zigzag",
                                  softmax_scale=0.2)
    assert [tuple(s.shape) for s in shards] == [(1, 4, 2 * SHARD, HEAD_DIM)] * 2
    assert not any(s.requires_grad for s in shards)
    want = flash_attention(q, k, v, causal=True, softmax_scale=0.2)
    assert relative_error(unshard_sequence(shards, "zigzag"), want) <= tolerance(torch.float32)


def test_launcher_raises_what_a_rank_raised_and_stops_the_others():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 raised in .*raise_on_rank_one(.|\n)*rank one says no"):
        run_on_cpu_processes(raise_on_rank_one, 2, timeout_s=60)
    assert time.monotonic() - start < 45, "rank 0 was left waiting at its barrier"


def test_launcher_stops_processes_that_run_past_the_timeout():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="still running after 8 s; they were stopped"):
        run_on_cpu_processes(sleep_for, 2, 120.0, timeout_s=8)
    assert time.monotonic() - start < 30


def _nested():
    def inner():
        return None
    return inner


@pytest.mark.parametrize("fn, world_size, error, words", [
    (lambda: None, 2, ValueError, "is a lambda or a function defined inside another one"),
    (_nested(), 2, ValueError, "is a lambda or a function defined inside another one"),
    (type("Main", (), {"__call__": lambda self: None, "__module__": "__main__"})(), 2, ValueError,
     "defined in __main__ (a notebook or a script run directly)"),
    ("rank_report", 2, TypeError, "fn must be a function; got a str"),
    (rank_report, 0, ValueError, "world_size must be an int >= 1; got 0"),
])
def test_launcher_refuses_what_it_cannot_run(fn, world_size, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        run_on_cpu_processes(fn, world_size)
