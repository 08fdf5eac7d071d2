"""flashlib chooses the interpreter before any kernel is defined, unless the user chose."""
import os
import subprocess
import sys

import pytest
import torch

from flashlib import runtime


def _run(code: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_import_turns_on_the_interpreter_before_kernels_are_defined():
    code = (
        "import flashlib, os, triton, triton.language as tl\n"
        "@triton.jit\n"
        "def k(x): pass\n"
        "print(os.environ['TRITON_INTERPRET'], type(k).__name__, flashlib.runtime.MODE_CHOSEN_BY)"
    )
    assert _run(code) == "1 InterpretedFunction flashlib"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_importing_triton_first_gives_a_clear_warning():
    code = ("import warnings, triton.language\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import flashlib\n"
            "print(any('Import flashlib before triton' in str(w.message) for w in caught))")
    assert _run(code) == "True"


def test_user_choice_is_respected():
    code = "import flashlib, os; print(os.environ['TRITON_INTERPRET'], flashlib.runtime.MODE_CHOSEN_BY, flashlib.runtime.INTERPRET)"
    assert _run(code, TRITON_INTERPRET="1") == "1 user True"


def test_sizes_are_small_in_the_interpreter_and_named():
    if runtime.INTERPRET:
        assert runtime.sizes("attention")["seq_len"] <= 256
        assert max(runtime.sizes("seq_lens")) <= 512
        assert runtime.sizes("decode")["cache_len"] <= 256
    with pytest.raises(KeyError, match="Unknown problem-size name 'nope'"):
        runtime.sizes("nope")


def test_pick_follows_the_mode():
    assert runtime.pick(gpu="big", cpu="small") == ("small" if runtime.INTERPRET else "big")


def test_bfloat16_never_reaches_tl_dot_in_the_interpreter():
    bf16 = torch.ones(2, dtype=torch.bfloat16)
    (converted,) = runtime.upcast_for_interpreter(bf16)
    if runtime.INTERPRET:
        assert runtime.dot_safe_dtype(torch.bfloat16) == torch.float32
        assert converted.dtype == torch.float32
    else:
        assert converted.dtype == torch.bfloat16
    assert runtime.dot_safe_dtype(torch.float16) == torch.float16


def test_is_triton_kernel():
    import triton

    @triton.jit
    def kernel(x):
        pass

    assert runtime.is_triton_kernel(kernel)
    assert not runtime.is_triton_kernel(lambda x: x)
    assert not runtime.is_triton_kernel(torch.matmul)


def test_without_triton_import_flashlib_says_why_in_one_sentence():
    import subprocess
    import sys

    code = "import sys; sys.modules['triton'] = None\nimport flashlib"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: flashlib needs Triton, which cannot be imported here")
    assert "Linux container or WSL2" in last
