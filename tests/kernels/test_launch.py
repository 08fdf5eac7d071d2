"""launch_tuned: the autotuner chooses once per key, later launches skip it with that config."""
import pytest
import torch
import triton

from flashlib import flash_attention, naive_attention
from flashlib.kernels.tuned import launch_tuned
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
    for _ in range(2):
        o = flash_attention(q, k, v, causal=causal)
        o.backward(do)
        runs.append([o.detach().clone()] + [t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for first, second in zip(*runs):
        assert torch.equal(first, second)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = naive_attention(qd, kd, vd, causal=causal)
    ref.backward(do.double())
    for got, want in zip(runs[1], (ref, qd.grad, kd.grad, vd.grad)):
        assert relative_error(got, want.detach()) < tolerance(torch.float16)
