"""benchmarks/hf_generate.py on the CPU, at tiny sizes: it runs both caches on both attentions, and in float32
flashlib's greedy tokens are sdpa's (the check the GPU run reports as a share, since 16 bits may flip a tie)."""
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
                      "--layers", "1", "--hidden", "64", "--head-dim", "16", "--vocab", "64", "--out", str(out)])
    result = json.loads(out.read_text())
    assert {key for key in result} >= {"gpu", "torch", "triton", "transformers", "date", "command", "rows"}
    assert result["command"].endswith("--out " + str(out))
    rows = result["rows"]
    assert [(row["cache"], row["impl"]) for row in rows] == [("dynamic", "sdpa"), ("dynamic", "flashlib"),
                                                            ("static", "sdpa"), ("static", "flashlib")]
    assert all(row["tokens_per_s"] > 0 and row["decode_tokens_per_s"] > 0 for row in rows)
    assert all(row["tokens_equal_to_sdpa"] == 1.0 for row in rows)


def test_too_few_new_tokens_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        hf_generate.main(["--device", "cpu", "--new", "4"])
    assert "--new must be at least 8" in capsys.readouterr().err
