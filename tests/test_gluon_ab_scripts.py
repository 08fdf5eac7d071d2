"""The Gluon A/B scripts' options (benchmarks/gluon_fwd_ab.py, gluon_bwd_ab.py, gluon_fp8_ab.py,
bwd_kernel_split.py), on the CPU machine: what they measure needs a Hopper GPU, but a mistyped option must stop them
at once, by name, before any GPU time is spent."""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gluon_fwd_ab  # noqa: E402


def test_variants_parse_with_their_flags():
    assert gluon_fwd_ab.parse_variants("a=128:64,128,2:nopersist;b=64:64,128,3:nopp;c=64:64,128,2:three") == {
        "a": (128, (64, 128, 2), True, False, 2), "b": (64, (64, 128, 3), False, True, 2),
        "c": (64, (64, 128, 2), True, True, 3)}
    assert gluon_fwd_ab.config_variants("v=128:64,64,2") == {"v": (128, (64, 64, 2), set())}


@pytest.mark.parametrize("text", ["a=128:64,128", "a=96:64,128,2", "a=128:64,128,2:fast", "a128:64,128,2",
                                  "a=128:64,0,2"])
def test_a_malformed_variant_is_refused_with_the_expected_form(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"NAME=D:BLOCK_M,BLOCK_N,STAGES\[:nopp\]\[:nopersist\]"):
        gluon_fwd_ab.parse_variants(text)


@pytest.mark.parametrize("default", [(), (64,), (128, 64)])
def test_register_operands_are_set_either_way_whatever_the_default(default):
    """The A/Bs time the shared-memory and register variants by name: were "registers" only added to the default,
    a default that already holds the head_dim would time one kernel twice (and the rule adopting it could undo it)."""
    holder = argparse.Namespace(OPERANDS=default)
    for on, expected in ((True, True), (False, False)):
        with gluon_fwd_ab.register_operands_in_place(holder, "OPERANDS", 64, on):
            assert (64 in holder.OPERANDS) is expected and holder.OPERANDS.count(64) <= 1
            assert set(holder.OPERANDS) - {64} == set(default) - {64}
        assert holder.OPERANDS == default


def test_the_backward_variants_take_no_flags():
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=D:BLOCK_M,BLOCK_N,STAGES; got"):
        gluon_fwd_ab.config_variants("a=128:64,64,2:nopp")


@pytest.mark.parametrize("script, option, value", [("gluon_bwd_ab.py", "--variants", "a=128:64,64"),
                                                   ("gluon_bwd_ab.py", "--d", "96"),
                                                   ("gluon_fwd_ab.py", "--variants", "a=128:64,128,2:fast"),
                                                   ("gluon_fwd_ab.py", "--dtype", "fp8"),
                                                   ("gluon_fp8_ab.py", "--configs", "a=128:64,128"),
                                                   ("gluon_fp8_ab.py", "--d", "256"),
                                                   ("bwd_kernel_split.py", "--dtype", "fp8"),
                                                   ("bwd_kernel_split.py", "--N", "0"),
                                                   ("bwd_kernel_split.py", "--dropout", "1.0")])
def test_the_scripts_stop_on_a_bad_option_naming_it(script, option, value):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCHMARKS.parent), str(BENCHMARKS)]))
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), option, value], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument {option}" in done.stderr and repr(value) in done.stderr


def test_the_checks_cover_only_the_head_dims_asked(monkeypatch):
    monkeypatch.setattr(gluon_fwd_ab, "make_inputs", lambda *shape, bnhd=False, grad_out=False: (shape[-2], ))
    seen = []
    rows = gluon_fwd_ab.check_grid(["fp16"], lambda case, d, causal: seen.append(d) or {"case": case}, dims=[128])
    assert set(seen) == {128} and len(rows) == 2 * len(gluon_fwd_ab.CHECK_CASES)
    seen.clear()
    gluon_fwd_ab.check_grid(["fp16"], lambda case, d, causal: seen.append(d) or {"case": case})
    assert set(seen) == {64, 128}


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_dq_ab_times_the_triton_dq_kernel_where_the_gluon_one_is_routed(monkeypatch, head_dim):
    """gluon_dq_ab.py's "triton" columns must come from the Triton dQ kernel. Where ``DQ_MIN_ROWS`` routes the Gluon
    one (from 1024 rows at 128, 4096 at 64), a plain ``launch_attention_backward`` timed the Gluon kernel against
    itself (sessions 43-63, in its timings). The dK/dV kernel keeps its route either way, and the routes come back
    afterwards."""
    import gluon_dq_ab
    from flashlib.kernels import attention_bwd_hopper as bwd_hopper

    routes = []

    def record_routes(q, *_):
        rows = 16384
        routes.append((bwd_hopper.dq_preferred(head_dim, rows, rows, 2 ** 40),
                       bwd_hopper.preferred(head_dim, rows, rows, 2 ** 40)))

    monkeypatch.setattr(gluon_dq_ab, "launch_attention_backward", record_routes)
    monkeypatch.setattr(gluon_dq_ab.bwd_hopper, "launch_attention_dq_hopper", lambda *args, **kwargs: None)
    q = torch.empty(1, 1, 1, head_dim)
    spec = gluon_dq_ab.AttentionSpec()
    gluon_dq_ab.dq_pass(q, q, q, q, None, q, q, spec, False)
    gluon_dq_ab.whole_backward(q, q, q, q, None, q, q, q, q, spec, False)
    assert routes == [(False, True), (False, True)]
    routes.clear()
    gluon_dq_ab.dq_pass(q, q, q, q, None, q, q, spec, True)  # the Gluon pass: the preprocess call, routes as ever
    assert routes == [(True, True)]
    assert bwd_hopper.dq_preferred(head_dim, 16384, 16384, 2 ** 40)


def test_the_forward_ab_times_two_consumers_in_its_base_columns_where_three_are_routed(monkeypatch):
    """gluon_fwd_ab.py's gluon, gluon_qshared and gluon_qregs columns are the two-consumer kernel with turns, also
    where the launcher's default runs three consumers without turns (head_dim 64, 16384 unmasked rows of the
    FlashAttention-2 shapes); a variant passes its own."""
    import gluon_fwd_ab
    from flashlib.kernels import attention_fwd_hopper as hopper

    launched = []
    monkeypatch.setattr(hopper, "launch_attention_forward_hopper", lambda *args, **kwargs: launched.append(kwargs))
    assert hopper.three_consumers_preferred(64, 16384, 16384, 32 * 16384 ** 2, False)
    q = torch.zeros(1, 1, 8, 64)  # the launcher is a stand-in: what it is asked decides
    gluon_fwd_ab.run_gluon(q, q, q, False)
    for on in (False, True):
        gluon_fwd_ab.run_gluon(q, q, q, False, q_in_registers=on)
    assert [(kw["consumers"], kw["pingpong"]) for kw in launched] == [(2, hopper.PINGPONG)] * 3
    launched.clear()
    gluon_fwd_ab.run_variant((128, 64, 2), False, True, q, q, q, False, consumers=3)
    assert [(kw["consumers"], kw["pingpong"]) for kw in launched] == [(3, False)]


def test_the_kernel_split_times_each_kernel_with_and_without_dropout(monkeypatch):
    """bwd_kernel_split.py --dropout: each spec's forward runs before its backward; the kernels timed alone get that
    spec's D (the backward's preprocess) and the effective p with the seed, as the backward passes them (p = 0.1
    rounds to 26/256); dropout's extra backward time is divided between the kernels by their own extra times."""
    import bwd_kernel_split as split
    from flashlib.kernels.dropout import effective_dropout_p

    p = 0.1
    times = {("backward", 0.0): 10.0, ("dkdv", 0.0): 6.0, ("dq", 0.0): 3.5,
             ("backward", p): 12.0, ("dkdv", effective_dropout_p(p)): 7.5, ("dq", effective_dropout_p(p)): 4.0}
    calls, forwards = [], []

    def forward(q, k, v, o, lse, spec, dropout_seed):
        forwards.append(spec.dropout_p)

    def backward(*args, dropout_seed=None, use_gluon=None):
        spec = next(a for a in args if isinstance(a, split.AttentionSpec))
        assert forwards[-1] == spec.dropout_p and (spec.dropout_p == 0 or dropout_seed is not None)
        calls.append(("backward", spec.dropout_p))
        return ("delta", spec.dropout_p)

    def kernel(part):
        def record(*args, dropout_p=0.0, dropout_seed=None, **kwargs):
            assert ("delta", forwards[-1]) in args, f"{part} got another spec's D"
            assert dropout_p == 0.0 or dropout_seed is not None, part
            calls.append((part, dropout_p))
        return record

    monkeypatch.setattr(split, "make_inputs", lambda *shape, grad_out: tuple(torch.randn(1, 2, 16, 64) for _ in "qkvd"))
    monkeypatch.setattr(split, "launch_attention_forward", forward)
    monkeypatch.setattr(split, "launch_attention_backward", backward)
    monkeypatch.setattr(split.bwd_hopper, "launch_attention_dkdv_hopper", kernel("dkdv"))
    monkeypatch.setattr(split.bwd_hopper, "launch_attention_dq_hopper", kernel("dq"))
    monkeypatch.setattr(split, "graph_time_ms", lambda call, rep: (call(), times[calls[-1]])[1])
    row = split.split_row("fp16", 64, 16, False, 1, 2, dropout_p=p)
    assert forwards == [0.0, p] and sorted(set(calls)) == sorted(times)
    assert row["dkdv_dropout_cost"] == 7.5 / 6.0 and row["backward_dropout_cost"] == 1.2
    assert row["dkdv_dropout_extra_share"] == 0.75 and row["dq_dropout_extra_share"] == 0.25
    assert row["dkdv_share"] == 0.6 and "dkdv_dropout_ms" in row
    calls.clear()
    assert "dkdv_dropout_ms" not in split.split_row("fp16", 64, 16, False, 1, 2)
    assert {p for _, p in calls} == {0.0}
