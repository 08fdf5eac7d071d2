"""FP8 attention: float8_e4m3fn q, k, v with descale factors (flashlib.fp8, through flash_attention).

On CPU: quantization, and a clear error for every wrong call (the interpreter has no FP8 tensor
cores, so the kernel itself refuses there). On a Hopper GPU: accuracy against the float64
reference of the dequantized inputs, and against the 16-bit inputs before quantization.
"""
import pytest
import torch

from flashlib import flash_attention, runtime
from flashlib.fp8 import FP8_DTYPE, FP8_MAX, keys_innermost, quantize_fp8
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec
from flashlib.validation import relative_error
from support.attention import DEVICE


def fp8_inputs(batch=1, heads=2, kv_heads=2, n=64, d=32, per_head=False, layout="bhnd", seed=0):
    gen = torch.Generator().manual_seed(seed)

    def one(h):
        t = torch.randn(batch, h, n, d, generator=gen) * (1 + torch.rand(1, h, 1, 1, generator=gen) * 3)
        t = t.to(DEVICE)
        return t.transpose(1, 2).contiguous() if layout == "bnhd" else t

    full = [one(heads), one(kv_heads), one(kv_heads)]
    quantized = [quantize_fp8(t, layout, per_head, kv_heads=kv_heads) for t in full]
    return full, quantized


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_quantize_fp8_round_trips_within_e4m3_precision(per_head, layout):
    (x, *_), ((x8, descale), *_) = fp8_inputs(batch=2, heads=6, kv_heads=3, per_head=per_head, layout=layout)
    assert x8.dtype == FP8_DTYPE and x8.shape == x.shape
    assert descale.shape == ((2, 3) if per_head else (1,)) and descale.dtype == torch.float32
    back = dequantized((x8, descale), layout, per_head).float()
    assert relative_error(back, x) < 2 ** -4, "e4m3 keeps 3 mantissa bits: about 6% per element at most"
    assert x8.float().abs().max().item() == FP8_MAX, "the amax maps to the largest FP8 value"


def test_fp8_refuses_the_interpreter_and_old_gpus_with_a_clear_error():
    _, ((q8, dq), (k8, dk), (v8, dv)) = fp8_inputs()
    if runtime.INTERPRET:
        with pytest.raises(RuntimeError, match="FP8 tensor cores.*interpreter"):
            flash_attention(q8, k8, v8, q_descale=dq, k_descale=dk, v_descale=dv)
    elif torch.cuda.get_device_capability() < (8, 9):
        with pytest.raises(RuntimeError, match="compute capability >= 8.9"):
            flash_attention(q8, k8, v8, q_descale=dq, k_descale=dk, v_descale=dv)
    else:
        pytest.skip("this GPU has FP8 tensor cores")


@pytest.mark.parametrize("case, error, match", [
    ("negative descale", ValueError, "q_descale must hold finite factors > 0"),
    ("wrong descale shape", ValueError, r"k_descale must have shape \(1,\) .* \(B, H_kv\) = \(1, 2\)"),
    ("integer descale", TypeError, "v_descale must be a floating-point tensor"),
    ("descale with float16 inputs", TypeError, "needs q, k, v all torch.float8_e4m3fn; q is torch.float16"),
    ("mixed dtypes", TypeError, "q, k, v must have the same dtype"),
    ("float32 out_dtype", TypeError, "out_dtype must be torch.bfloat16 or torch.float16"),
    ("out_dtype without fp8", ValueError, "out_dtype is for FP8 inputs"),
    ("seq_lens", ValueError, "seq_lens, return_dropout_mask and variant='splitkv' are not supported"),
    ("dropout", ValueError, "dropout_p must be 0"),
])
def test_wrong_fp8_calls_name_the_argument(case, error, match):
    (q, k, v), ((q8, dq), (k8, dk), (v8, dv)) = fp8_inputs()
    kwargs = dict(q_descale=dq, k_descale=dk, v_descale=dv)
    args = [q8, k8, v8]
    if case == "negative descale":
        if DEVICE.type == "cuda":
            return negative_descale_stops_the_gpu()
        kwargs["q_descale"] = -dq
    elif case == "wrong descale shape":
        kwargs["k_descale"] = torch.ones(3, 3, device=DEVICE)
    elif case == "integer descale":
        kwargs["v_descale"] = torch.ones(1, dtype=torch.int32, device=DEVICE)
    elif case == "descale with float16 inputs":
        args = [t.half() for t in (q, k, v)]
    elif case == "mixed dtypes":
        args = [q8, k.half(), v8]
    elif case == "float32 out_dtype":
        kwargs["out_dtype"] = torch.float32
    elif case == "out_dtype without fp8":
        args, kwargs = [q, k, v], dict(out_dtype=torch.bfloat16)
    elif case == "seq_lens":
        kwargs["seq_lens"] = torch.tensor([32], dtype=torch.int32, device=DEVICE)
    elif case == "dropout":
        kwargs["dropout_p"] = 0.1
    with pytest.raises(error, match=match):
        flash_attention(*args, **kwargs)


def negative_descale_stops_the_gpu():
    """On a GPU the factors are checked there, with no host sync: a device-side assert, which ends the
    process's CUDA context, so it runs in a process of its own."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import torch
        from flashlib import flash_attention
        from flashlib.fp8 import quantize_fp8
        q8, d = quantize_fp8(torch.randn(1, 2, 64, 64, device="cuda"))
        flash_attention(q8, q8, q8, q_descale=-d)
        torch.cuda.synchronize()
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "q_descale must hold finite factors > 0" in run.stderr, run.stderr[-2000:]


# ---------------------------------------------------------------- on a GPU with FP8 tensor cores
def dequantized(pair, layout, per_head):
    """x8 * descale in float64, in x8's layout; a (B, H_kv) descale covers groups of heads."""
    x8, descale = pair
    x = to_bhnd(x8.double(), layout)
    if per_head:
        groups = descale.shape[1]
        x = (x.reshape(x.shape[0], groups, -1, *x.shape[2:]) * descale.double()[:, :, None, None, None]).reshape(
            x.shape)
    else:
        x = x * descale.double()
    return to_bhnd(x, layout)


def to_bhnd(t, layout):
    return t if layout == "bhnd" else t.transpose(1, 2)


#: O's relative error against the float64 reference of the dequantized inputs. P enters the
#: tensor cores as e4m3 (3 mantissa bits, up to 6% per weight); the errors average out over keys.
FP8_TOLERANCE = 3e-2
#: L's relative error against the same reference: P's rounding does not reach L (the row sums are taken in float32
#: before P is rounded to FP8), but Hopper's FP8 tensor cores keep about 14 bits of their sums (DeepSeek-V3's
#: report, section 3.3.2), about 6e-5 of each score's magnitude; scores of a few units put L within 1e-3.
FP8_LSE_TOLERANCE = 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("per_head", [False, True])
def test_gpu_fp8_matches_the_reference_of_its_dequantized_inputs(d, causal, layout, per_head):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs FP8 tensor cores")
    full, quantized = fp8_inputs(batch=2, heads=8, kv_heads=2, n=700, d=d, per_head=per_head, layout=layout)
    (q8, dq), (k8, dk), (v8, dv) = quantized
    o = flash_attention(q8, k8, v8, causal=causal, layout=layout, q_descale=dq, k_descale=dk, v_descale=dv)
    assert o.dtype == torch.bfloat16 and o.shape == q8.shape and not o.isnan().any()
    q, k, v = (to_bhnd(dequantized(p, layout, per_head), layout) for p in quantized)
    want = to_bhnd(naive_attention(q, k, v, causal=causal), layout)
    error = relative_error(o, want)
    assert error < FP8_TOLERANCE, f"relative error {error:.2e} against the dequantized reference"
    # Against the inputs before quantization, the kernel adds little to what quantizing them costs.
    exact = to_bhnd(naive_attention(*(to_bhnd(t.double(), layout) for t in full), causal=causal), layout)
    floor = relative_error(want, exact)
    assert relative_error(o, exact) < floor + FP8_TOLERANCE, f"input quantization alone: {floor:.2e}"


@pytest.mark.gpu
def test_gpu_fp8_descriptor_and_pointer_paths_agree():
    """V stored keys-innermost through a (B, H, D, N) host descriptor, or read through pointers."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("host descriptors need Hopper")
    _, quantized = fp8_inputs(batch=1, heads=4, kv_heads=4, n=500, d=128, per_head=True)
    (q8, dq), (k8, dk), (v8, dv) = quantized
    descale = torch.stack([dq, dk, dv]).contiguous()
    v_keys_inner = keys_innermost(v8)  # 500 keys: rows padded to 512 bytes for the copy engine
    outs = []
    for use_tma in (True, False):
        o = torch.full(q8.shape, float("nan"), dtype=torch.float16, device=DEVICE)
        lse = torch.empty(q8.shape[:3], device=DEVICE)
        launch_attention_forward(q8, k8, v_keys_inner, o, lse, AttentionSpec(causal=True), descale=descale,
                                 use_tma=use_tma)
        assert not o.isnan().any(), "every element written"
        outs.append(o)
    assert relative_error(outs[0], outs[1]) < 1e-2


def test_keys_innermost_pads_rows_to_16_bytes_and_keeps_values():
    v = torch.randn(2, 3, 500, 64).to(FP8_DTYPE)
    stored = keys_innermost(v)
    assert stored.shape == v.shape and stored.stride(2) == 1 and stored.stride(3) % 16 == 0
    assert torch.equal(stored.float(), v.float())
    assert keys_innermost(stored) is stored, "already stored so: no copy"


# ---------------------------------------------------------------- the Gluon forward's FP8 path (Hopper)
def _gluon_fp8(monkeypatch, quantized, causal, out_dtype, use_gluon=True, persistent=True, weights_shared=None,
               q_in_registers=None):
    """O and L of (B, H, N, D) FP8 inputs through the launcher, O and L filled with NaN first, and how many times
    the Gluon forward was launched; ``weights_shared``: where its P enters P V from, ``q_in_registers``: where S
    reads Q from (None: the kernel's defaults)."""
    from flashlib.kernels import attention_fwd_hopper as hopper
    launched = []
    real = hopper.launch_attention_forward_hopper

    def counted(*args, **kwargs):
        launched.append(1)
        return real(*args, persistent=persistent, fp8_weights_shared=weights_shared, q_in_registers=q_in_registers,
                    **kwargs)
    (q8, dq), (k8, dk), (v8, dv) = quantized
    descale = torch.stack([t.expand(q8.shape[0], k8.shape[1]) for t in (dq, dk, dv)]).contiguous()
    o = torch.full(q8.shape, float("nan"), dtype=out_dtype, device=DEVICE)
    lse = torch.full(q8.shape[:3], float("nan"), device=DEVICE)
    with monkeypatch.context() as patched:  # undone on leaving: a second call wraps the real launcher again
        patched.setattr(hopper, "launch_attention_forward_hopper", counted)
        launch_attention_forward(q8, k8, keys_innermost(v8), o, lse, AttentionSpec(causal=causal), descale=descale,
                                 use_gluon=use_gluon)
    return o, lse, len(launched)


def _needs_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon forward runs on Hopper (sm_90)")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_gpu_gluon_fp8_matches_the_dequantized_reference_and_the_triton_fp8_forward(monkeypatch, d, causal, per_head,
                                                                                   out_dtype):
    """GQA 8/2, 700 rows (a partial last tile), per-tensor or per-head factors: every output written, O within
    FP8's tolerance of the float64 reference of the dequantized inputs and of the Triton FP8 forward, L (float32
    scores of exact FP8 products, summed by FP8 tensor cores) within :data:`FP8_LSE_TOLERANCE`. P enters P V from
    shared memory by default and from registers on request, and S reads Q from registers by default and from shared
    memory on request: the same FP8 products in the same order, so the same O and L exactly."""
    _needs_hopper()
    _, quantized = fp8_inputs(batch=2, heads=8, kv_heads=2, n=700, d=d, per_head=per_head)
    o, lse, launched = _gluon_fp8(monkeypatch, quantized, causal, out_dtype)
    assert launched == 1, "the Gluon forward ran"
    assert o.dtype == out_dtype and not o.isnan().any() and not lse.isnan().any(), "every element written"
    q, k, v = (dequantized(p, "bhnd", per_head) for p in quantized)
    want, want_lse = naive_attention(q, k, v, causal=causal, return_lse=True)
    error = relative_error(o, want)
    assert error < FP8_TOLERANCE, f"relative error {error:.2e} against the dequantized reference"
    assert relative_error(lse, want_lse) < FP8_LSE_TOLERANCE
    triton_o, _, launched = _gluon_fp8(monkeypatch, quantized, causal, out_dtype, use_gluon=False)
    assert launched == 0
    assert relative_error(o, triton_o) < FP8_TOLERANCE
    for weights_shared, q_in_registers in ((True, True), (False, True), (True, False), (False, False)):
        other_o, other_lse, launched = _gluon_fp8(monkeypatch, quantized, causal, out_dtype,
                                                  weights_shared=weights_shared, q_in_registers=q_in_registers)
        assert launched == 1
        assert torch.equal(other_o, o) and torch.equal(other_lse, lse), (weights_shared, q_in_registers)

