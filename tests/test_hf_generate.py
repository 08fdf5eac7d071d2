"""benchmarks/hf_generate.py on the CPU, at tiny sizes: it runs both caches on both attentions (and the eager steps
with a padding plan made in each layer), and in float32 flashlib's greedy tokens are sdpa's (the check the GPU run
reports as a share, since 16 bits may flip a tie)."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="benchmarks/hf_generate.py needs Hugging Face Transformers: "
                    "pip install flashlib[hf]")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import hf_generate  # noqa: E402


def test_the_generation_benchmark_runs_both_caches_and_agrees_with_sdpa(tmp_path):
    out = tmp_path / "hf_generate.json"
    hf_generate.main(["--device", "cpu", "--dtype", "fp32", "--batch", "2", "--prompt", "12", "--new", "8",
                      "--layers", "2", "--hidden", "64", "--head-dim", "16", "--vocab", "64", "--plan-per-layer",
                      "--out", str(out)])
    result = json.loads(out.read_text())
    assert {key for key in result} >= {"gpu", "torch", "triton", "transformers", "date", "command", "rows"}
    assert result["command"].endswith("--out " + str(out))
    rows = result["rows"]
    assert [(row["cache"], row["impl"]) for row in rows] == [
        ("dynamic", "sdpa"), ("dynamic", "flashlib"), ("dynamic", "flashlib_plan_per_layer"),
        ("static", "sdpa"), ("static", "flashlib")]
    assert all(row["tokens_per_s"] > 0 for row in rows)
    # the decoding rate is a difference of two timings: at these sizes on a CPU it may be lost in the noise (None,
    # session 55's CI saw it), but never a rate of zero or less
    assert all(row["decode_tokens_per_s"] is None or row["decode_tokens_per_s"] > 0 for row in rows)
    assert all(row["tokens_equal_to_sdpa"] == 1.0 for row in rows)


def test_a_decoding_rate_is_none_where_the_longer_call_was_not_slower(monkeypatch):
    times = iter([1.0, 1.0, 0.5, 0.6])  # warm-ups, then the whole call faster than the short one
    monkeypatch.setattr(hf_generate, "timed", lambda *args: (next(times), "tokens"))
    result = hf_generate.measure(None, hf_generate.torch.zeros(2, 3), None, 8, "dynamic")
    assert result["decode_tokens_per_s"] is None and result["tokens_per_s"] == 2 * 8 / 0.5
    times = iter([1.0, 1.0, 0.9, 0.3])
    assert hf_generate.measure(None, hf_generate.torch.zeros(2, 3), None, 8, "dynamic")["decode_tokens_per_s"] == (
        2 * 6 / (0.9 - 0.3))
    assert hf_generate.rate(None) == "n/a" and hf_generate.rate(12.4) == "12"


def test_too_few_new_tokens_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        hf_generate.main(["--device", "cpu", "--new", "4"])
    assert "--new must be at least 8" in capsys.readouterr().err
