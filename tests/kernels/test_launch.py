"""flashlib.kernels.launch: the autotuner chooses once per key; on a GPU the compiled binary is remembered
under a signature of everything Triton specializes on, and a hit launches it directly."""
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


def test_the_cache_is_off_in_the_interpreter():
    import flashlib.runtime as runtime
    assert launch_module.COMPILED_CACHE is (not runtime.INTERPRET)
