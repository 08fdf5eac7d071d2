"""benchmarks/fwd_persistent.py's kernels in Triton's interpreter: the grid, persistent and loop-flattened forms of
the forward (TUNING, twenty-eighth finding) compute attention, and every tile is written, whatever the number of
programs. The GPU timings are the script's; here the math and the tile walk are held, so the stored comparison
stays one of three correct kernels."""
import sys
from pathlib import Path

import pytest
import torch

from flashlib import runtime
from flashlib.reference import naive_attention
from flashlib.validation import relative_error

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fwd_persistent  # noqa: E402

pytestmark = pytest.mark.skipif(not runtime.INTERPRET, reason="the interpreter run; the GPU run is the script's")


#: (variant, causal) pairs the script times: the flattened form fuses one inner loop only, so it runs without a mask.
MEASURED = [(variant, causal) for variant in fwd_persistent.VARIANTS for causal in (False, True)
            if not (causal and variant == "flattened")]


@pytest.mark.parametrize("variant,causal", MEASURED)
@pytest.mark.parametrize("programs", [3, 64])  # fewer programs than tiles (each walks several), and more
def test_every_variant_matches_float64_and_writes_every_row(variant, causal, programs):
    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 2, 128, 32, dtype=torch.float16) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    fwd_persistent.launcher(variant, q, k, v, o, (32, 16, 2, 4), causal, programs)()
    assert not o.isnan().any(), "a tile was left unwritten"
    reference = naive_attention(q.double(), k.double(), v.double(), causal=causal)
    assert relative_error(o.double(), reference) < 2e-3
