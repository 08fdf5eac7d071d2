"""flashlib.kernels.launch: the autotuner chooses once per key; on a GPU the compiled binary is remembered
under a signature of everything Triton specializes on, and a hit launches it directly."""
import inspect

import pytest
import torch
import triton

from flashlib import flash_attention, naive_attention
from triton.tools.tensor_descriptor import TensorDescriptor

from flashlib.kernels import launch as launch_module
from flashlib.kernels.launch import launch, launch_tuned, signature
from flashlib.validation import relative_error, tolerance


class FakeJIT:
    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


class FakeAutotuner:
    """What launch_tuned reads of triton's Autotuner: fn, keys, arg_names, best_config, [grid](...)."""

    def __init__(self):
        self.fn = FakeJIT()
        self.keys = ["N_BUCKET"]
        self.arg_names = ["X", "N_BUCKET"]
        self.runs = 0

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.runs += 1
            self.best_config = triton.Config({"BLOCK": 64 * self.runs}, num_warps=4, num_stages=3)
        return run


class Tensorish:
    def __init__(self, dtype):
        self.dtype = dtype


def test_first_call_tunes_then_the_chosen_config_is_launched_directly():
    tuner, x = FakeAutotuner(), Tensorish("float16")
    launch_tuned(tuner, (1,), x, N_BUCKET=512)
    assert tuner.runs == 1 and tuner.fn.launches == []
    launch_tuned(tuner, (2,), x, N_BUCKET=512)
    assert tuner.runs == 1, "same key: the autotuner is not asked again"
    grid, args, kwargs = tuner.fn.launches[-1]
    assert grid == (2,) and args == (x,)
    assert kwargs["BLOCK"] == 64 and kwargs["num_warps"] == 4 and kwargs["num_stages"] == 3


def test_a_new_key_or_dtype_goes_back_to_the_autotuner():
    tuner = FakeAutotuner()
    launch_tuned(tuner, (1,), Tensorish("float16"), N_BUCKET=512)
    launch_tuned(tuner, (1,), Tensorish("float16"), N_BUCKET=1024)
    launch_tuned(tuner, (1,), Tensorish("bfloat16"), N_BUCKET=512)
    assert tuner.runs == 3 and tuner.fn.launches == []
    launch_tuned(tuner, (1,), Tensorish("float16"), 1024)  # the key passed by position
    assert tuner.fn.launches[-1][2]["BLOCK"] == 128, "the config chosen for N_BUCKET=1024"


def test_the_chosen_configs_pre_hook_runs_before_each_direct_launch():
    """A config's pre_hook (block shapes of host tensor descriptors) must run on the direct
    path too, with the launch's arguments and the config's block sizes."""
    tuner, x = FakeAutotuner(), Tensorish("float16")
    hooked = []
    launch_tuned(tuner, (1,), x, N_BUCKET=512)
    tuner.best_config.pre_hook = lambda nargs: hooked.append(dict(nargs))
    launch_tuned(tuner, (1,), x, N_BUCKET=512)
    assert hooked == [{"X": x, "N_BUCKET": 512, "BLOCK": 64}]
    assert len(tuner.fn.launches) == 1


class DescriptorLike:
    """A host tensor descriptor: no dtype of its own, its tensor in ``base``."""

    def __init__(self, dtype):
        self.base = Tensorish(dtype)


def test_a_descriptors_tensor_dtype_is_part_of_the_key():
    tuner = FakeAutotuner()
    launch_tuned(tuner, (1,), DescriptorLike("float16"), N_BUCKET=512)
    launch_tuned(tuner, (1,), DescriptorLike("bfloat16"), N_BUCKET=512)
    assert tuner.runs == 2, "float16 and bfloat16 descriptors are tuned apart"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_second_call_uses_the_chosen_config_and_gives_the_same_bits(causal):
    """Call 1 goes through the autotuners (forward, dK/dV, dQ), call 2 launches their choice
    directly: same kernels, same configs, no atomics, so outputs and gradients are bitwise equal,
    and both match the float64 reference."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 700, 64, device="cuda", dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)
    runs = []
    for _ in range(3):  # autotune; the chosen config through Triton's path; the remembered binary
        o = flash_attention(q, k, v, causal=causal)
        o.backward(do)
        runs.append([o.detach().clone()] + [t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for first, second, third in zip(*runs):
        assert torch.equal(first, second) and torch.equal(first, third)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = naive_attention(qd, kd, vd, causal=causal)
    ref.backward(do.double())
    for got, want in zip(runs[2], (ref, qd.grad, kd.grad, vd.grad)):
        assert relative_error(got, want.detach()) < tolerance(torch.float16)


# ---------------------------------------------------------------- the compiled-binary cache (fakes, on CPU)
class FakeCompiled:
    """What a direct launch uses of Triton's CompiledKernel: run, function, packed_metadata, launch_metadata."""

    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *args):
        return ("launch metadata", grid)

    def run(self, grid_x, grid_y, grid_z, stream, function, packed, metadata, enter_hook, exit_hook, *args):
        self.runs.append(dict(grid=(grid_x, grid_y, grid_z), stream=stream, metadata=metadata, args=args))


def kernel_body(X, n, scale, BLOCK, FLAG=7):
    """The Python function behind the fake kernel: its parameters give the launch order and defaults."""


class FakeCompilingJIT:
    """``fn[grid](...)`` is Triton's own path: it 'compiles' and returns a new binary each time."""

    def __init__(self):
        self.fn = kernel_body
        self.calls = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            compiled = FakeCompiled()
            self.calls.append(dict(grid=grid, args=args, kwargs=kwargs, compiled=compiled))
            return compiled
        return run


@pytest.fixture
def compiled_cache(monkeypatch):
    """The cache switched on as on a GPU, with a fake current stream, and empty."""
    monkeypatch.setattr(launch_module, "COMPILED_CACHE", True)
    monkeypatch.setattr(launch_module, "_current_stream", lambda: (0, 1234))
    monkeypatch.setattr(launch_module, "_COMPILED", {})
    monkeypatch.setattr(launch_module, "_CHOSEN", {})


def test_a_second_launch_with_the_same_signature_runs_the_remembered_binary(compiled_cache):
    jit, x = FakeCompilingJIT(), torch.zeros(64, dtype=torch.float16)
    launch(jit, (3, 2), x, 5, 0.5, BLOCK=32)
    assert len(jit.calls) == 1
    binary = jit.calls[0]["compiled"]
    launch(jit, (3, 2), x, 5, 0.5, BLOCK=32)
    assert len(jit.calls) == 1, "the second launch skipped Triton's path"
    run = binary.runs[-1]
    assert run["grid"] == (3, 2, 1) and run["stream"] == 1234
    assert run["args"] == (x, 5, 0.5, 32, 7), "positional, keywords in parameter order, then defaults"
    assert run["metadata"] == ("launch metadata", (3, 2))


@pytest.mark.parametrize("change", ["one", "divisible", "width", "dtype", "alignment", "float_as_int", "constexpr"])
def test_anything_triton_specializes_on_changes_the_signature(change):
    """Each change could select another binary in Triton: it must never hit the remembered one."""
    x = torch.zeros(64, dtype=torch.float16)
    base = dict(args=(x, 5, 0.5), kwargs=dict(BLOCK=32))
    changed = {
        "one": dict(args=(x, 1, 0.5)),  # Triton makes an integer 1 a constant
        "divisible": dict(args=(x, 16, 0.5)),  # and assumes divisibility by 16
        "width": dict(args=(x, 2**40 + 5, 0.5)),  # and passes large integers as 64-bit
        "dtype": dict(args=(x.to(torch.bfloat16), 5, 0.5)),
        "alignment": dict(args=(x[1:], 5, 0.5)),  # 2 bytes off: not 16-byte aligned
        "float_as_int": dict(args=(x, 5, 1)),
        "constexpr": dict(kwargs=dict(BLOCK=64)),
    }[change]
    other = {**base, **changed}
    assert signature("fn", base["args"], base["kwargs"]) != signature("fn", other["args"], other["kwargs"])


def test_pointers_differing_only_in_address_share_a_signature():
    a, b = torch.zeros(64, dtype=torch.float16), torch.ones(64, dtype=torch.float16)
    assert signature("fn", (a, 3), {}) == signature("fn", (b, 3), {})


def test_an_unknown_argument_type_takes_tritons_path_every_time(compiled_cache):
    jit = FakeCompilingJIT()
    for _ in range(2):
        launch(jit, (1,), object(), 5, 0.5, BLOCK=32)
    assert len(jit.calls) == 2


def test_a_tuned_launch_remembers_the_chosen_configs_binary_and_descriptor_tiles(compiled_cache):
    """Call 1 tunes, call 2 launches the choice through Triton's path (pre_hook sets the descriptor's
    tile), call 3 runs that binary directly: a fresh descriptor gets the remembered tile, the callable
    grid sees the config's block size, and the autotuner and pre_hook are not asked again."""
    base = torch.zeros(4, 128, dtype=torch.float16)
    tuner = FakeAutotuner()
    tuner.fn = FakeCompilingJIT()
    tuner.fn.fn = lambda X, N_BUCKET, BLOCK: None  # the tuned kernel's parameters
    hooks = []

    def pre_hook(nargs):
        hooks.append(nargs["BLOCK"])
        nargs["X"].block_shape = [nargs["BLOCK"], 128]

    def descriptor():
        return TensorDescriptor(base, list(base.shape), list(base.stride()), [1, 16])

    def grid(meta):
        return (4 // meta["BLOCK"] + 1,)

    launch_tuned(tuner, grid, descriptor(), N_BUCKET=512)
    tuner.best_config.pre_hook = pre_hook
    launch_tuned(tuner, grid, descriptor(), N_BUCKET=512)
    assert tuner.runs == 1 and hooks == [64] and len(tuner.fn.calls) == 1
    fresh = descriptor()
    launch_tuned(tuner, grid, fresh, N_BUCKET=512)
    assert tuner.runs == 1 and hooks == [64] and len(tuner.fn.calls) == 1
    run = tuner.fn.calls[0]["compiled"].runs[-1]
    assert run["args"] == (fresh, 512, 64) and fresh.block_shape == [64, 128]
    assert run["grid"] == (1, 1, 1)


def test_forget_sends_the_next_launch_back_to_the_autotuner_and_tritons_path(compiled_cache):
    """launch.forget() drops the chosen configs, the remembered binaries and the autotuner's own cache:
    what a benchmark needs after changing an autotuner's configs."""
    base = torch.zeros(4, 128, dtype=torch.float16)
    tuner = FakeAutotuner()
    tuner.cache = {"a key": "a config"}
    tuner.fn = FakeCompilingJIT()
    tuner.fn.fn = lambda X, N_BUCKET, BLOCK: None
    for _ in range(3):
        launch_tuned(tuner, (1,), base, N_BUCKET=512)
    assert tuner.runs == 1 and len(tuner.fn.calls) == 1, "tuned once, then Triton's path once, then remembered"
    launch_module.forget()
    assert tuner.cache == {}
    launch_tuned(tuner, (1,), base, N_BUCKET=512)
    assert tuner.runs == 2, "the autotuner is asked again"
    launch_tuned(tuner, (1,), base, N_BUCKET=512)
    assert len(tuner.fn.calls) == 2, "the binary is looked up through Triton's path again"


def test_the_cache_is_off_in_the_interpreter():
    import flashlib.runtime as runtime
    assert launch_module.COMPILED_CACHE is (not runtime.INTERPRET)


def test_integers_beyond_32_bits_count_by_what_triton_specializes_on():
    """A dropout seed is new on every call: seeds must share a binary, yet never cross the lines Triton
    draws between 64-bit signed and unsigned integers or between divisible by 16 and not."""
    x = torch.zeros(64, dtype=torch.float16)

    def key(n):
        return signature("fn", (x, n), {})
    assert key(2**40 + 5) == key(2**61 + 977) == key(-(2**40) - 3)
    assert key(2**40 + 16) == key(2**62)
    assert key(2**40 + 5) != key(2**40 + 16), "divisibility by 16"
    assert key(2**63 + 5) != key(2**40 + 5), "unsigned 64-bit"
    assert key(2**31 - 1) != key(2**31 + 1), "32-bit and 64-bit"
    assert key(7) != key(9), "within 32 bits an integer counts by value"


# ---------------------------------------------------------------- the direct launcher (a model of Triton 3.6)
class Descriptorish:
    """What a launch reads of a host TensorDescriptor: base, shape, strides, padding."""

    def __init__(self, tensor, padding="zero"):
        self.base, self.shape, self.strides, self.padding = tensor, list(tensor.shape), list(tensor.stride()), padding


@pytest.fixture
def model():
    from support import triton36_launcher as model
    model.ENCODED.clear()
    model.LAUNCHED.clear()
    return model


META = [dict(swizzle=3, elem_size=2, elem_type=9, block_size=[1, 1, 64, 64], fp4_padded=False),
        dict(swizzle=2, elem_size=2, elem_type=10, block_size=[1, 1, 32, 64], fp4_padded=False)]
KINDS = ["tensordesc", "i32", "tensordesc", "*fp32", "i32", "constexpr"]


def test_the_direct_launcher_passes_the_c_launcher_what_tritons_wrapper_does(model, monkeypatch):
    from flashlib.kernels import direct_launch
    monkeypatch.setattr(direct_launch, "fill_tensor_map", model.fill_tma_descriptor)
    compiled = model.compiled_kernel(KINDS, META)
    direct = direct_launch.direct_launcher(compiled)
    assert direct is not None
    q, k, lse = torch.zeros(2, 3, 128, 64), torch.zeros(2, 1, 96, 64)[..., :64], torch.zeros(6)
    args = (Descriptorish(q), 128, Descriptorish(k, padding="nan"), lse, 96, 64)
    compiled.run(4, 6, 1, 77, compiled.function, compiled.packed_metadata, "meta", "enter", "exit", *args)
    direct(4, 6, 1, 77, "meta", "enter", "exit", args)
    assert len(model.LAUNCHED) == 2 and model.LAUNCHED[0] == model.LAUNCHED[1]
    assert model.LAUNCHED[1][:13] == (4, 6, 1, 77, 0xF00, False, True, None, None, ("packed",), "meta", "enter",
                                      "exit")


def test_a_tensor_map_is_encoded_once_per_address_shape_and_strides(model, monkeypatch):
    from flashlib.kernels import direct_launch
    monkeypatch.setattr(direct_launch, "fill_tensor_map", model.fill_tma_descriptor)
    compiled = model.compiled_kernel(KINDS, META)
    direct = direct_launch.direct_launcher(compiled)
    q, k, other = torch.zeros(2, 3, 128, 64), torch.zeros(2, 1, 96, 64), torch.zeros(2, 3, 128, 64)

    def call(first, second):
        direct(1, 1, 1, 0, None, None, None, (Descriptorish(first), 128, Descriptorish(second), q, 96, 64))
        return model.LAUNCHED[-1]
    first = call(q, k)
    assert len(model.ENCODED) == 2
    assert call(q, k) == first and len(model.ENCODED) == 2, "the same tensors: the remembered maps"
    call(other, k)
    assert model.ENCODED[2:] == [other.data_ptr()], "a new address: a new map, the other one remembered"
    call(q, k[:, :, :64])
    assert model.ENCODED[3:] == [k.data_ptr()], "the same address with another shape: a new map"
    # the remembered maps are keyed by position too: q's map is not k's, though both start at q's address
    direct(1, 1, 1, 0, None, None, None, (Descriptorish(q), 128, Descriptorish(q), q, 96, 64))
    launched = model.LAUNCHED[-1]
    second_map = 13 + 1 + 4 + 4 + 1  # after the first map, its shape and strides, and the integer
    assert launched[13][5] == (1, 1, 64, 64) and launched[second_map][5] == (1, 1, 32, 64)


@pytest.mark.parametrize("change", ["scratch", "fp4", "frontend_descriptors", "other_wrapper", "other_format"])
def test_anything_but_triton_36s_launcher_keeps_tritons_own_path(model, monkeypatch, change):
    from flashlib.kernels import direct_launch
    metas = [dict(m) for m in META]
    if change == "fp4":
        metas[1]["fp4_padded"] = True
    if change == "frontend_descriptors":
        metas = [None, None]
    compiled = model.compiled_kernel(KINDS, metas, global_scratch_size=128 if change == "scratch" else 0)
    if change == "other_wrapper":
        compiled.run.launch = lambda *args: None
    if change == "other_format":
        monkeypatch.setattr(model, "_BASE_ARGS_FORMAT", "iiiKKOOOOOO")
    assert direct_launch.direct_launcher(compiled) is None
    assert direct_launch.direct_launcher(FakeCompiled()) is None


@pytest.mark.gpu
def test_gpu_remembered_launches_follow_each_new_seed_address_and_content():
    """The forward with dropout, fixed blocks and host descriptors, called again and again: after the first
    call every launch runs the remembered binary (on Triton 3.6 through the direct launcher), and each new
    64-bit seed, each tensor at a new address and new contents at an old address give the reference's O."""
    from flashlib.kernels.attention_fwd import launch_attention_forward
    from flashlib.kernels.dropout import dropout_mask, effective_dropout_p
    from flashlib.spec import AttentionSpec

    torch.manual_seed(0)
    shape, p = (2, 3, 200, 64), 0.25

    def fresh():
        return [torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3)]

    def check(q, k, v, seed):
        o, lse = torch.empty_like(q), torch.empty(shape[:3], device="cuda")
        launch_attention_forward(q, k, v, o, lse, AttentionSpec(causal=True, dropout_p=p, dropout_seed=seed),
                                 block_m=64, block_n=64)
        mask = dropout_mask(seed, p, *shape[:2], shape[2], shape[2], q.device).cpu()
        ref = naive_attention(*(t.double().cpu() for t in (q, k, v)), causal=True,
                              dropout_p=effective_dropout_p(p), dropout_mask=mask)
        assert relative_error(o.cpu(), ref) < tolerance(torch.float16), f"seed {seed}"
        return o

    q, k, v = fresh()
    first = check(q, k, v, 2**40 + 1)
    assert torch.equal(check(q, k, v, 2**40 + 1), first)
    assert not torch.equal(check(q, k, v, 2**61 + 977), first), "a new seed draws a new mask"
    check(*fresh(), 2**50 + 3)  # new addresses
    q.copy_(torch.randn_like(q))  # new contents at the same address
    check(q, k, v, 2**40 + 1)
    if triton.__version__.startswith("3.6."):
        assert any(entry[4] is not None for entry in launch_module._COMPILED.values()), "the direct launcher"


def test_a_binary_without_host_descriptors_keeps_tritons_launcher(model):
    """Triton calls the C launcher itself there: nothing for a direct launch to save."""
    from flashlib.kernels import direct_launch
    compiled = model.compiled_kernel(["i32", "*fp16"], [])
    compiled.run.launch = model.c_launcher
    assert direct_launch.direct_launcher(compiled) is None


# ---------------------------------------------------------------- Gluon host descriptors (the Gluon Hopper kernels)
def gluon_descriptor(t, block, swizzle=128, padding="zero"):
    """A Gluon host descriptor of the 2-D ``t`` in ``block`` tiles, with a shared-memory layout of ``swizzle`` bytes."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=t.element_size() * 8, rank=2)
    return GluonDescriptor(t, list(t.shape), list(t.stride()), block, layout, padding)


def test_gluon_descriptors_take_tritons_path_when_switched_off(compiled_cache, monkeypatch):
    """With GLUON_DESCRIPTORS off every launch with one goes through Triton's own path; switched on (the default
    since a GPU ran the Gluon binaries from the cache), the second launch runs the remembered binary."""
    x = torch.zeros(64, 64, dtype=torch.float16)
    assert launch_module.GLUON_DESCRIPTORS is True
    monkeypatch.setattr(launch_module, "GLUON_DESCRIPTORS", False)
    jit = FakeCompilingJIT()
    for _ in range(2):
        launch(jit, (1,), gluon_descriptor(x, [64, 64]), 5, 0.5, BLOCK=32)
    assert len(jit.calls) == 2 and signature("fn", (gluon_descriptor(x, [64, 64]),), {}) is None
    monkeypatch.setattr(launch_module, "GLUON_DESCRIPTORS", True)
    jit = FakeCompilingJIT()
    for _ in range(2):
        descriptor = gluon_descriptor(x, [64, 64])
        launch(jit, (1,), descriptor, 5, 0.5, BLOCK=32)
    assert len(jit.calls) == 1, "the second launch skipped Triton's path"
    assert jit.calls[0]["compiled"].runs[-1]["args"] == (descriptor, 5, 0.5, 32, 7)


@pytest.mark.parametrize("change", ["dtype", "block", "layout", "padding", "shape", "strides"])
def test_anything_a_gluon_descriptor_is_specialized_on_changes_the_signature(monkeypatch, change):
    """Triton compiles a Gluon descriptor's dtype, tile and layout into the binary; its padding goes into the tensor
    map, and the signature keeps it with the shape and strides. A descriptor of another tensor with all of these the
    same shares the signature: the tensor map of a new address is encoded at launch."""
    monkeypatch.setattr(launch_module, "GLUON_DESCRIPTORS", True)
    x = torch.zeros(128, 64, dtype=torch.float16)
    base = gluon_descriptor(x, [64, 64])
    other = {
        "dtype": lambda: gluon_descriptor(x.to(torch.bfloat16), [64, 64]),
        "block": lambda: gluon_descriptor(x, [32, 64]),
        "layout": lambda: gluon_descriptor(x, [64, 64], swizzle=64),
        "padding": lambda: gluon_descriptor(x, [64, 64], padding="nan"),
        "shape": lambda: gluon_descriptor(x[:64], [64, 64]),
        "strides": lambda: gluon_descriptor(torch.zeros(128, 128, dtype=torch.float16)[:, :64], [64, 64]),
    }[change]()
    assert signature("fn", (base, 3), {}) != signature("fn", (other, 3), {})
    assert signature("fn", (base, 3), {}) == signature("fn", (gluon_descriptor(torch.ones_like(x), [64, 64]), 3), {})


@pytest.mark.gpu
def test_gpu_gluon_kernels_from_the_cache_give_triton_paths_bits(monkeypatch):
    """The Gluon forward, dK/dV and dQ kernels (head_dim 128, 1024 rows, 2^27 scores: all three routed) launched
    from the cache give bitwise the outputs and gradients of their launches through Triton's path, and match float64
    at the first and last heads; the cache holds a binary of each."""
    from flashlib.kernels import attention_bwd_hopper, attention_fwd_hopper
    if not (attention_fwd_hopper.HAVE_GLUON and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("the Gluon kernels run on Hopper (sm_90) only")
    torch.manual_seed(0)
    q, k, v = (torch.randn(8, 16, 1024, 128, device="cuda", dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)

    def step():
        o = flash_attention(q, k, v)
        o.backward(do)
        grads = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        return [o.detach().clone(), *grads]

    monkeypatch.setattr(launch_module, "_COMPILED", {})
    monkeypatch.setattr(launch_module, "GLUON_DESCRIPTORS", False)
    tritons = step()
    monkeypatch.setattr(launch_module, "GLUON_DESCRIPTORS", True)
    runs = [step() for _ in range(3)]  # Triton's path once, remembering; then the cache twice
    kernels = {key[1][0] for key in launch_module._COMPILED}
    assert {attention_fwd_hopper.attention_fwd_hopper_kernel, attention_bwd_hopper.attention_bwd_dkdv_hopper_kernel,
            attention_bwd_hopper.attention_bwd_dq_hopper_kernel} <= kernels
    for run in runs:
        for got, want in zip(run, tritons):
            assert torch.equal(got, want)
    for heads in ((slice(0, 1), slice(0, 2)), (slice(7, 8), slice(14, 16))):  # heads are independent
        qd, kd, vd = (t.detach()[heads].double().requires_grad_() for t in (q, k, v))
        ref = naive_attention(qd, kd, vd)
        ref.backward(do[heads].double())
        for got, want in zip(runs[-1], (ref, qd.grad, kd.grad, vd.grad)):
            assert relative_error(got[heads], want.detach()) < tolerance(torch.float16)


def _gluon_launches():
    """(module, kernel's name, a call of its launcher on CPU tensors) for each Gluon Hopper kernel."""
    from flashlib.kernels import attention_bwd_hopper as bwd, attention_fwd_hopper as fwd
    q, k, v, do, dq, dk, dv = (torch.randn(1, 2, 256, 128, dtype=torch.float16) for _ in range(7))
    lse, delta = torch.randn(1, 2, 256), torch.randn(1, 2, 256)
    return [
        (fwd, "attention_fwd_hopper_kernel",
         lambda: fwd.launch_attention_forward_hopper(q, k, v, dq, lse, scale=0.1, causal=True, persistent=False)),
        (bwd, "attention_bwd_dkdv_hopper_kernel",
         lambda: bwd.launch_attention_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, scale=0.1, causal=False)),
        (bwd, "attention_bwd_dq_hopper_kernel",
         lambda: bwd.launch_attention_dq_hopper(q, k, v, do, lse, delta, dq, scale=0.1, causal=True)),
    ]


@pytest.mark.parametrize("which", range(3), ids=["forward", "dkdv", "dq"])
def test_a_remembered_gluon_launch_passes_every_kernel_parameter_in_order(compiled_cache, monkeypatch, which):
    """With GLUON_DESCRIPTORS on, each Gluon launcher's second call runs the binary remembered from its first, with
    every parameter of the real kernel in order: the positional arguments, then the constexprs it passed by keyword
    (JITFunction.run's order, ``num_warps`` among them: these kernels take it as a constexpr too); the launch option
    ``maxnreg`` stays in the signature, not the arguments."""
    monkeypatch.setattr(launch_module, "GLUON_DESCRIPTORS", True)
    module, name, call = _gluon_launches()[which]
    real = getattr(module, name)
    jit = FakeCompilingJIT()
    jit.fn = real.fn
    monkeypatch.setattr(module, name, jit)
    call()
    call()
    assert len(jit.calls) == 1, "the second launch ran the remembered binary"
    first = jit.calls[0]
    passed = dict(zip(real.arg_names, first["args"])) | first["kwargs"]
    remembered = first["compiled"].runs[-1]["args"]
    params = list(inspect.signature(real.fn).parameters)
    assert len(remembered) == len(params)
    for param, value in zip(params, remembered):
        if param in first["kwargs"]:
            assert value == passed[param], param
        else:
            assert type(value) is type(passed[param]), param  # a fresh descriptor or tensor of the second call
    assert set(first["kwargs"]) - set(params) == {"maxnreg"}
