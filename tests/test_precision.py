"""flashlib's float32 attention follows torch's float32 matmul precision, as torch.matmul does.

By default ("highest", or "ieee" in torch's newer API) its ``tl.dot`` multiplies full float32;
once the user allows TF32 it rounds the inputs to TF32 (10-bit mantissa) on tensor cores.
16-bit inputs are unaffected. The interpreter computes in float32 whatever the setting, so on
the CPU the tests check the wiring; on a GPU they check the numbers.
"""
import subprocess
import sys

import pytest
import torch

from flashlib import flash_attention, runtime
from flashlib.kernels import attention_bwd, attention_fwd
from flashlib.reference import naive_attention
from flashlib.validation import relative_error

DEVICE = runtime.DEVICE
FULL_FLOAT32_TOL = 1e-5   # float32 rounding, the interpreter's float32 tolerance


@pytest.mark.parametrize("setting, expected", [
    ("", "ieee"),
    ("torch.backends.cuda.matmul.fp32_precision = 'tf32'", "tf32"),
    ("torch.backends.cuda.matmul.fp32_precision = 'ieee'", "ieee"),
    ("torch.backends.fp32_precision = 'tf32'", "tf32"),
    ("torch.set_float32_matmul_precision('high')", "tf32"),
    ("torch.set_float32_matmul_precision('medium')", "tf32"),
    ("torch.backends.cuda.matmul.allow_tf32 = True", "tf32"),
])
def test_dot_precision_follows_each_of_torchs_settings(setting, expected):
    """Each process sets torch's precision once, with one API, as a user does (torch refuses mixes)."""
    code = (f"import flashlib, torch\n{setting}\n"
            "from flashlib.runtime import dot_precision\n"
            "print(dot_precision(torch.float32), dot_precision(torch.float16), dot_precision(torch.bfloat16))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [expected, "tf32", "tf32"]


@pytest.fixture
def tf32_allowed():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    yield
    matmul.fp32_precision = before


class _Spy:
    """Stands in for a @triton.jit kernel: records DOT_PRECISION of each launch, then launches."""

    def __init__(self, kernel, seen):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append(kwargs["DOT_PRECISION"])
            return self.kernel[grid](*args, **kwargs)
        return launch


def _launches(monkeypatch, dtype):
    """DOT_PRECISION of the forward, dK/dV and dQ launches of one call (fixed blocks: the interpreter's)."""
    seen = []
    monkeypatch.setattr(attention_fwd, "attention_fwd_kernel", _Spy(attention_fwd.attention_fwd_kernel, seen))
    for name in ("attention_bwd_dkdv_kernel", "attention_bwd_dq_kernel"):
        monkeypatch.setattr(attention_bwd, name, _Spy(getattr(attention_bwd, name), seen))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen).to(DEVICE, dtype).requires_grad_() for _ in range(3))
    flash_attention(q, k, v, causal=True).sum().backward()
    return seen


wiring = pytest.mark.skipif(not runtime.INTERPRET, reason="the GPU launches the autotuned kernels: "
                            "test_on_a_gpu_* check the numbers there")


@wiring
def test_the_kernels_get_full_float32_by_default(monkeypatch):
    assert _launches(monkeypatch, torch.float32) == ["ieee"] * 3


@wiring
def test_the_kernels_get_tf32_once_torch_allows_it(monkeypatch, tf32_allowed):
    assert _launches(monkeypatch, torch.float32) == ["tf32"] * 3


@wiring
def test_sixteen_bit_inputs_are_unaffected(monkeypatch):
    assert _launches(monkeypatch, torch.float16) == ["tf32"] * 3   # Triton's default: no change to their kernels


def test_the_autotuners_tune_each_precision_apart():
    for tuned in (attention_fwd.attention_fwd_kernel_autotuned, attention_bwd.attention_bwd_dkdv_kernel_autotuned,
                  attention_bwd.attention_bwd_dq_kernel_autotuned):
        assert "DOT_PRECISION" in tuned.keys


def _errors(causal=True):
    """Relative errors of flashlib's float32 output and gradients against float64 autograd."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 300, 64, generator=gen, dtype=torch.float64) for _ in range(3))
    do = torch.randn(2, 4, 300, 64, generator=gen, dtype=torch.float64)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = naive_attention(*ref, causal=causal)
    expected.backward(do)
    run = [t.float().to(DEVICE).requires_grad_() for t in (q, k, v)]
    out = flash_attention(*run, causal=causal)
    out.backward(do.float().to(DEVICE))
    return [relative_error(out, expected)] + [relative_error(t.grad, r.grad) for t, r in zip(run, ref)]


@pytest.mark.gpu
def test_on_a_gpu_float32_is_full_precision_by_default():
    errors = _errors()
    assert max(errors) <= FULL_FLOAT32_TOL, errors


@pytest.mark.gpu
def test_on_a_gpu_allowing_tf32_makes_flashlib_use_it():
    full = _errors()
    matmul = torch.backends.cuda.matmul
    before, matmul.fp32_precision = matmul.fp32_precision, "tf32"
    try:
        tf32 = _errors()
    finally:
        matmul.fp32_precision = before
    # TF32's unit roundoff is 2**-11, float32's 2**-24: every result shows the switch took.
    assert all(t > 10 * f for t, f in zip(tf32, full)), (tf32, full)
    assert max(tf32) <= 5e-3, tf32   # and no more than TF32's error (validation's TF32 tolerance)


@pytest.mark.parametrize("head_dim", [32, 128, 256])
def test_full_float32_launches_one_small_config_and_tensor_cores_keep_autotuning(head_dim):
    """Full float32 runs on CUDA cores: big tiles spill and compile for minutes, so 32 x 32 alone."""
    block_d = head_dim
    float32, float16 = torch.empty(1, dtype=torch.float32), torch.empty(1, dtype=torch.float16)
    hooks = {"fwd": (attention_fwd._prune_configs, attention_fwd.attention_fwd_kernel_autotuned.configs),
             "dkdv": (attention_bwd._pruner("dkdv"), attention_bwd.attention_bwd_dkdv_kernel_autotuned.configs),
             "dq": (attention_bwd._pruner("dq"), attention_bwd.attention_bwd_dq_kernel_autotuned.configs)}
    budget = attention_fwd.smem_budget()
    for kernel, (prune, configs) in hooks.items():
        args = dict(BLOCK_D=block_d, Q_BUCKET=1024, HAS_RIGHT=False)  # as every launch passes them
        [only] = prune(configs, dict(Q=float32), **args, DOT_PRECISION="ieee")
        assert (only.kwargs["BLOCK_M"], only.kwargs["BLOCK_N"]) == attention_fwd.FULL_FLOAT32_BLOCKS == (32, 32)
        smem = (attention_fwd.smem_bytes(32, 32, block_d, only.num_stages, 4) if kernel == "fwd"
                else attention_bwd.smem_bytes(kernel, 32, 32, block_d, only.num_stages, 4))
        assert smem <= budget or only.num_stages == 1, (kernel, only)
        if head_dim <= 128:  # (at 256 in float32 few configs fit shared memory at all)
            for q in (float32, float16):
                kept = prune(configs, dict(Q=q), **args, DOT_PRECISION="tf32")
                assert len(kept) > 1, (kernel, q.dtype, kept)
