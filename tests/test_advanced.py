"""`make advanced` (python -m flashlib.advanced): every example passes, and a wrong one is caught."""
import dataclasses

import pytest

from flashlib import advanced
from flashlib.reference import naive_attention


def _main(capsys, argv=()):
    with pytest.raises(SystemExit) as exit_:
        advanced.main(list(argv))
    return exit_.value.code, capsys.readouterr().out


def test_every_example_agrees_with_the_reference(capsys):
    code, out = _main(capsys)
    verdicts = [line for line in out.splitlines() if line.startswith("[")]
    assert code == 0, out
    assert len(verdicts) == len(advanced.examples()) == 8
    assert all(line.startswith("[ok ]") for line in verdicts), out
    for feature in ("GQA", "MQA", "sliding window", "with causal", "bhnd", "bnhd", "seq_lens", "packed varlen"):
        assert feature in out, f"no example of {feature!r} in:\n{out}"
    assert "dQ" in out and "dQKV" in out, "the gradients must be compared too"


def _tiled_gqa_reference(q, k, v):
    """A plausible GQA mistake: K/V heads tiled (0, 1, 0, 1) instead of grouped (0, 0, 1, 1)."""
    group = q.shape[1] // k.shape[1]
    return naive_attention(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1))


def test_a_failing_comparison_exits_non_zero(monkeypatch, capsys):
    gqa, *_, bnhd, _, _ = advanced.examples()
    assert gqa.name.startswith("GQA") and "bnhd" in bnhd.name
    wrong = dataclasses.replace(gqa, reference=_tiled_gqa_reference)
    monkeypatch.setattr(advanced, "examples", lambda: [wrong, bnhd])
    code, out = _main(capsys)
    assert code == 1, out
    assert "[FAIL] GQA" in out and "[ok ] layout bnhd" in out, out
    assert f"1 example(s) disagree with the reference: {gqa.name}" in out


def test_an_example_that_raises_is_reported_and_the_others_still_run(monkeypatch, capsys):
    examples = advanced.examples()
    bnhd = next(e for e in examples if "bnhd" in e.name)

    def broken(qkv):
        raise ValueError("Unsupported head_dim 7")

    monkeypatch.setattr(advanced, "examples", lambda: [dataclasses.replace(bnhd, flash=broken), bnhd])
    code, out = _main(capsys)
    assert code == 1
    assert "[FAIL] layout bnhd" in out and "raised ValueError: Unsupported head_dim 7" in out
    assert "[ok ] layout bnhd" in out
