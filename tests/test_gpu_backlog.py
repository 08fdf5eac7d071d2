"""benchmarks/gpu_backlog.py on the CPU: every stage fits one device call, and every step's arguments are taken by
its script's own parser, so that the calls of the next GPU session are not spent on a renamed option."""
import json
import os
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_backlog  # noqa: E402

#: Files a device call brings back (the device tool's limit); each step writes one log, the grid two results more.
FILES_PER_CALL = 8


@pytest.mark.parametrize("stage", sorted(gpu_backlog.STAGES))
def test_a_stage_fits_one_device_call(stage):
    steps = gpu_backlog.STAGES[stage]
    assert sum(step.limit_s for step in steps) <= gpu_backlog.STAGE_BUDGET_S < 600
    assert len(steps) + sum("--out" in step.argv for step in steps) * 2 <= FILES_PER_CALL
    assert len({step.name for step in steps}) == len(steps)


@pytest.mark.parametrize("step", [s for steps in gpu_backlog.STAGES.values() for s in steps], ids=lambda s: s.name)
def test_every_step_parses_its_arguments_and_says_what_it_decides(step):
    gpu_backlog.check_step(step)
    assert len(step.decides) > 40


def test_the_tests_stage_runs_the_changed_kernels_first_then_every_other_gpu_test():
    changed, rest = gpu_backlog.STAGES["tests"]
    root = BENCHMARKS.parent
    with_gpu_tests = {str(p.relative_to(root)) for p in root.glob("tests/**/test_*.py")
                      if gpu_backlog.GPU_MARK.search(p.read_text())}
    assert set(gpu_backlog.CHANGED_KERNEL_TESTS) <= with_gpu_tests
    changed_files = {a for a in changed.argv if a.startswith("tests/")}
    rest_files = {a for a in rest.argv if a.startswith("tests/")}
    assert changed_files == set(gpu_backlog.CHANGED_KERNEL_TESTS)
    assert rest_files == with_gpu_tests - changed_files and "tests/test_decode.py" in rest_files
    assert "tests/test_gpu_backlog.py" not in with_gpu_tests  # it names the mark in a string, not on a test


@pytest.mark.parametrize("argv, message", [
    (("benchmarks/gluon_dq_ab.py", "--dtype", "fp16", "--heads", "16"), "refused"),
    (("benchmarks/gluon_dq_ab.py", "--d", "96"), "refused"),
    (("benchmarks/gluon_dq_abc.py", "--d", "64"), "no such script"),
    (("-m", "flashlib.bench", "--mode", "fwd", "--causl", "both"), "refused"),
    (("benchmarks/front_door.py", "--sectons", "train"), "refused"),
    (("-m", "pytest", "-m", "gpu", "tests/test_no_such_file.py"), "no such test file"),
])
def test_a_step_whose_arguments_drifted_is_refused_by_name(argv, message):
    step = gpu_backlog.Step("drifted", 10, argv, "what a drifted step would have decided, never run")
    with pytest.raises((ValueError, FileNotFoundError), match=f"step drifted: .*{message}"):
        gpu_backlog.check_step(step)


def test_a_dry_run_prints_each_step_and_runs_nothing(tmp_path, capsys):
    assert gpu_backlog.main(["timings", "--dry-run", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert [line.split(":")[0] for line in printed.splitlines()] == [s.name for s in gpu_backlog.STAGES["timings"]]
    assert not (tmp_path / "out").exists()


def test_steps_picks_a_subset_in_the_stage_order_and_refuses_an_unknown_name(tmp_path, capsys):
    argv = ["timings", "--dry-run", "--out", str(tmp_path), "--steps", "gluon_fwd_ab,gluon_fp8_ab"]
    assert gpu_backlog.main(argv) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == ["gluon_fp8_ab", "gluon_fwd_ab"]
    with pytest.raises(SystemExit):
        gpu_backlog.main(["timings", "--dry-run", "--steps", "gluon_fp8_ab,hopper_grid"])
    assert "--steps: hopper_grid not in stage 'timings'" in capsys.readouterr().err


def test_a_step_that_overruns_its_limit_is_stopped_with_what_it_started_and_logged(tmp_path):
    grandchild = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)']); open({str(grandchild)!r}, 'w').write(str(child.pid)); print('row', flush=True); "
            "time.sleep(60)")
    step = gpu_backlog.Step("sleeper", 3, ("-c", code), "nothing: a step that runs past its limit")
    assert gpu_backlog.run_step(step, tmp_path) == 124
    log = (tmp_path / "sleeper.log").read_text()
    assert log.startswith("# sleeper: ") and "\nrow\n" in log and "# exit 124 after" in log
    pid = int(grandchild.read_text())
    for _ in range(50):  # the group was killed: the orphan is gone, or a zombie where nothing reaps orphans
        if not _running(pid):
            break
        time.sleep(0.1)
    assert not _running(pid)


def test_a_step_runs_on_its_own_pythonpath_and_says_so(tmp_path):
    """A step that times another commit's flashlib (``Step.pythonpath``) gets that path in its environment and its
    log's command line."""
    (tmp_path / "copy" / "flashlib").mkdir(parents=True)
    (tmp_path / "copy" / "flashlib" / "__init__.py").write_text("")
    entry = str(tmp_path / "copy")
    step = gpu_backlog.Step("paths", 30, ("-c", "import os; print('path', os.environ['PYTHONPATH'])"), "nothing",
                            pythonpath=f"{entry}:benchmarks")
    assert gpu_backlog.run_step(step, tmp_path) == 0
    log = (tmp_path / "paths.log").read_text()
    assert f"# command: PYTHONPATH={entry}:benchmarks python3 -c" in log and f"\npath {entry}:benchmarks\n" in log


def test_a_step_whose_flashlib_copy_is_missing_is_not_run(tmp_path):
    """Without the copy, Python would import the tree's own flashlib and time it under the other's name: the step
    stops before its command, and says why."""
    marker = tmp_path / "ran"
    step = gpu_backlog.Step("before", 30, ("-c", f"open({str(marker)!r}, 'w')"), "nothing",
                            pythonpath=f"{tmp_path / 'absent'}:benchmarks:tests")
    assert gpu_backlog.missing_copies(step) == [str(tmp_path / "absent")]
    assert gpu_backlog.run_step(step, tmp_path) == 2
    assert not marker.exists() and "# not run: no flashlib/ in" in (tmp_path / "before.log").read_text()
    assert gpu_backlog.missing_copies(gpu_backlog.Step("tree", 1, ("-c", ""), "nothing")) == []


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed orphan stays one in a container whose first
    process reaps nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _log(path, rows, tail=""):
    path.write_text("# header\n" + "".join(json.dumps(row) + "\n" for row in rows) + tail)


def _summary(out):
    return {(step, question): answer for step, question, answer in gpu_backlog.decisions(out)}


def test_the_summary_takes_a_head_dim_only_where_it_wins_at_every_point(tmp_path):
    _log(tmp_path / "gluon_dq_ab.log",
         [{"case": "odd", "status": "ok"}]
         + [{"d": 128, "N": n, "causal": c, "dq regs/shared": 1.04} for n in (1024, 4096) for c in (False, True)]
         + [{"d": 64, "N": 1024, "causal": False, "dq regs/shared": 1.10},
            {"d": 64, "N": 4096, "causal": True, "dq regs/shared": 0.99}],
         tail='{"d": 64, "N": 16384, "dq re')  # a row cut by the step's limit
    answers = _summary(tmp_path)
    assert answers[("gluon_dq_ab", "DQ_REGISTER_OPERANDS gets 128")].startswith("yes (1.040-1.040 over 4 points)")
    assert answers[("gluon_dq_ab", "DQ_REGISTER_OPERANDS gets 64")].startswith("no (0.990-1.100 over 2 points)")
    assert answers[("gluon_dq_ab", "failed checks")] == "none"


def test_the_summary_reports_failed_checks_and_the_issue_targets(tmp_path):
    _log(tmp_path / "gluon_fp8_ab.log",
         [{"case": "gqa", "d": 64, "causal": True, "status": "FAIL"}, {"case": "odd", "status": "not supported"},
          {"d": 128, "N": 4096, "causal": False, "fp8_gluon_ms": 1.0, "fp8_triton_ms": 1.5,
           "fp8_gluon_registers_ms": 1.1, "fp8_gluon_q_shared_ms": 0.9, "fp8_gluon/fp16": 1.45,
           "fp8_triton/fp16": 0.97},
          {"d": 128, "N": 16384, "causal": True, "fp8_gluon_ms": 2.0, "fp8_triton_ms": 2.4,
           "fp8_gluon_registers_ms": 2.2, "fp8_gluon_q_shared_ms": 1.9, "fp8_gluon/fp16": 1.38}])
    _log(tmp_path / "gluon_dropout_ab.log", [{"d": 128, "N": 1024, "causal": False, "bwd_gluon/plain": 1.12,
                                              "bwd_triton/plain": 1.31}])
    answers = _summary(tmp_path)
    assert answers[("gluon_fp8_ab", "failed checks")] == ["case=gqa, d=64, causal=True"]
    assert answers[("gluon_fp8_ab", "FP8_HEAD_DIMS gets 128 (Gluon over Triton FP8)")].startswith("yes")
    assert answers[("gluon_fp8_ab", "D = 128: P in registers beats the default")].startswith("no")
    assert answers[("gluon_fp8_ab", "D = 128: Q in shared memory beats the default")].startswith("yes")
    assert answers[("gluon_fp8_ab", "FP8_HEAD_DIMS gets 64 (Gluon over Triton FP8)")] == "not measured"
    assert answers[("gluon_fp8_ab", "issue 14: FP8 >= 1.4x fp16 at N >= 4k, D = 128")] == "no (least 1.380)"
    assert answers[("gluon_dropout_ab", "issue 13: dropout's backward <= 1.15x at D = 128")] == "no (1.120-1.310)"


def test_the_summary_compares_the_dropout_config_with_the_default_one(tmp_path):
    _log(tmp_path / "gluon_dropout_m32.log",
         [{"dtype": t, "d": 128, "N": 4096, "causal": c, "bwd_gluon_ms": 1.0, "bwd_gluon_m32_ms": 0.97}
          for t in ("fp16", "bf16") for c in (False, True)])
    answers = _summary(tmp_path)
    question = ("gluon_dropout_m32", "the dK/dV kernel with dropout takes 32 query rows a step at D = 128")
    assert answers[question].startswith("yes (1.031-1.031 over 4 points)")


def test_the_summary_reads_the_dkdv_steps_logged_under_their_own_names(tmp_path):
    """Session 61's D = 64 route and third-slot logs and session 62's 128-row step, as stored: the rules their steps
    state, answered (a variant over either operand placement of the default blocks)."""
    results = gpu_backlog.ROOT / "benchmarks" / "results"
    for stored, name in (("gluon_bwd_d64_fp16_session61_h100.log", "gluon_bwd_d64_fp16"),
                         ("gluon_bwd_three_slots_session61_h100.log", "gluon_bwd_three_slots"),
                         ("gluon_bwd_d64_rows128_session62_h100.log", "gluon_bwd_d64_rows128")):
        (tmp_path / f"{name}.log").write_text((results / stored).read_text())
    answers = _summary(tmp_path)
    assert answers[("gluon_bwd_d64_fp16", "D = 64: the Gluon dK/dV kernel over the Triton one")].startswith(
        "yes (1.017-1.122 over 6 points)")
    assert answers[("gluon_bwd_d64_fp16", "D = 64: gluon_regs over gluon")].startswith("yes")
    assert answers[("gluon_bwd_three_slots", "D = 128: s3 over gluon")].startswith("no (0.978-")
    assert ("gluon_bwd_three_slots", "D = 128: s3 over gluon_regs") not in answers  # no such column at 128
    assert answers[("gluon_bwd_d64_rows128", "D = 64: m128 over gluon_regs")].startswith("yes (1.000-1.034 over 6")
    assert answers[("gluon_bwd_d64_rows128", "D = 64: m128 over gluon")].startswith("yes (1.021-1.058 over 6")


def test_the_summary_judges_the_dq_routes_only_where_they_apply(tmp_path, monkeypatch):
    """gluon_dq_routes: a point below the route's rows (Triton's dQ there) does not count, the routed points do; the
    rows come from the kernel's source as it is when the summary runs."""
    monkeypatch.setattr(gpu_backlog, "source_setting", lambda name: {"DQ_MIN_ROWS": {128: 2048, 64: 4096}}[name])
    _log(tmp_path / "gluon_dq_routes.log",
         [{"d": 64, "N": 1024, "causal": False, "dq gluon/triton": 0.90},
          {"d": 64, "N": 4096, "causal": False, "dq gluon/triton": 1.03},
          {"d": 128, "N": 1024, "causal": True, "dq gluon/triton": 0.95},
          {"d": 128, "N": 2048, "causal": True, "dq gluon/triton": 0.98},
          {"d": 128, "N": 4096, "causal": True, "dq gluon/triton": 1.10}])
    answers = _summary(tmp_path)
    assert answers[("gluon_dq_routes", "D = 64: the Gluon dQ kernel beats Triton's where routed (from 4096 rows)")
                   ].startswith("yes (1.030-1.030 over 1 points)")
    assert answers[("gluon_dq_routes", "D = 128: the Gluon dQ kernel beats Triton's where routed (from 2048 rows)")
                   ].startswith("no (0.980-1.100 over 2 points)")


def test_a_setting_read_from_the_source_is_the_one_the_module_holds():
    from flashlib.kernels import attention_bwd_hopper

    assert gpu_backlog.source_setting("DQ_MIN_ROWS") == attention_bwd_hopper.DQ_MIN_ROWS
    assert gpu_backlog.source_setting("DKDV_REGISTER_OPERANDS") == attention_bwd_hopper.DKDV_REGISTER_OPERANDS


def _split_row(n, dq_ms, **extra):
    return dict(dtype="fp16", d=64, N=n, causal=False, backward_dropout_ms=1.6, dkdv_dropout_ms=1.0,
                dq_dropout_ms=dq_ms, **extra)


def test_the_summary_splits_dropout_by_kernel_and_compares_the_tree_before(tmp_path):
    """bwd_kernel_split_dropout: each head dim's ranges; against the tree before, point by point, only where both
    trees timed the point (and a row cut before its dropout parts is left out)."""
    _log(tmp_path / "bwd_kernel_split_dropout.log",
         [_split_row(n, 1.0, backward_dropout_cost=1.2, dkdv_dropout_cost=1.1, dq_dropout_cost=c,
                     dkdv_dropout_extra_share=s, dq_dropout_extra_share=1 - s)
          for n, c, s in ((1024, 1.4, 0.4), (4096, 1.5, 0.3), (16384, 1.5, 0.3))])
    _log(tmp_path / "bwd_kernel_split_dropout_before.log",
         [dict(_split_row(1024, 1.1), backward_dropout_ms=2.0), dict(_split_row(4096, 0.9), backward_dropout_ms=2.0),
          {"dtype": "fp16", "d": 64, "N": 16384, "causal": False, "backward_ms": 9.0}])
    answers = _summary(tmp_path)
    assert answers[("bwd_kernel_split_dropout", "D = 64: dq_dropout_cost")] == "1.400-1.500"
    assert answers[("bwd_kernel_split_dropout", "D = 64: dkdv_dropout_extra_share")] == "0.300-0.400"
    assert answers[("bwd_kernel_split_dropout", "D = 64: dq_dropout_extra_share")] == "0.600-0.700"
    assert answers[("bwd_kernel_split_dropout", "D = 64: backward with dropout faster than the tree before")
                   ].startswith("yes (1.250-1.250 over 2 points)")
    assert answers[("bwd_kernel_split_dropout", "D = 64: dq with dropout faster than the tree before")
                   ].startswith("no (0.900-1.100 over 2 points)")


def test_the_summary_of_an_empty_folder_decides_nothing(tmp_path):
    assert gpu_backlog.decisions(tmp_path) == []


def _write_log(out: Path, name: str, rows) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.log").write_text("# header\n" + "\n".join(json.dumps(row) for row in rows) + "\n")


def test_the_timings_decide_the_settings_by_the_stated_rules(tmp_path):
    """A head dim joins a tuple only where its route wins at every point; failed checks leave a setting alone."""
    points = (1024, 4096, 16384)
    _write_log(tmp_path, "gluon_fp8_ab", [
        {"d": d, "N": n, "fp8_triton_ms": 1.0, "fp8_gluon_ms": 0.9 if d == 128 else (0.9 if n < 16384 else 1.1),
         "fp8_gluon_registers_ms": 0.8, "fp8_gluon_q_shared_ms": 1.0} for d in (128, 64) for n in points])
    _write_log(tmp_path, "gluon_dq_ab", [{"d": d, "N": n, "dq regs/shared": 1.02} for d in (128, 64) for n in points]
               + [{"case": "grad", "d": 64, "status": "mismatch"}])
    _write_log(tmp_path, "gluon_bwd_ab", [{"d": 64, "N": n, "gluon_regs_tflops": 300, "gluon_tflops": 290}
                                          for n in points])
    _write_log(tmp_path, "gluon_fwd_ab", [{"d": d, "N": n, "qregs/qshared": 1.01 if d == 64 else 0.99}
                                          for d in (128, 64) for n in points])
    assert gpu_backlog.settings(tmp_path) == {
        "FP8_HEAD_DIMS": (128,), "FP8_WEIGHTS_SHARED": False, "FP8_Q_IN_REGISTERS": True,
        "DKDV_REGISTER_OPERANDS": (64,), "Q_IN_REGISTERS_HEAD_DIMS": (64,)}  # dq: a failed check, left alone


def test_applying_settings_rewrites_only_their_assignments(tmp_path):
    root = BENCHMARKS.parent
    for relative in set(gpu_backlog.SETTING_FILES.values()):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text((root / relative).read_text())
    shared = "\nFP8_WEIGHTS_SHARED = True\n" in (root / gpu_backlog.SETTING_FILES["FP8_WEIGHTS_SHARED"]).read_text()
    # Values no head dim list holds today, and the flag flipped, so that each is a change.
    chosen = {"FP8_HEAD_DIMS": (256, 32), "FP8_WEIGHTS_SHARED": not shared, "DQ_REGISTER_OPERANDS": (256,)}
    changed = gpu_backlog.apply_settings(chosen, tmp_path)
    assert len(changed) == 3
    fwd = (tmp_path / gpu_backlog.SETTING_FILES["FP8_HEAD_DIMS"]).read_text()
    assert "\nFP8_HEAD_DIMS: tuple[int, ...] = (256, 32)\n" in fwd and f"\nFP8_WEIGHTS_SHARED = {not shared}\n" in fwd
    before = (root / gpu_backlog.SETTING_FILES["FP8_HEAD_DIMS"]).read_text().splitlines()
    assert sum(a != b for a, b in zip(before, fwd.splitlines())) == 2 and len(before) == len(fwd.splitlines())
    assert gpu_backlog.apply_settings(chosen, tmp_path) == []  # applied twice: nothing more changes


def test_the_summary_compares_each_dq_config_with_the_default_one(tmp_path):
    rows = [{"d": 64, "N": n, "causal": c, "bwd_gluon_tflops": 300.0, "bwd_triton_tflops": 280.0,
             "bwd_gluon_regs_tflops": 299.0, "bwd_n64s3_tflops": 306.0, "bwd_n128s3_tflops": 303.0 if c else 297.0}
            for n in (4096, 16384) for c in (False, True)]
    _log(tmp_path / "gluon_dq_d64_configs.log", rows)
    answers = _summary(tmp_path)
    assert answers[("gluon_dq_d64_configs", "D = 64: bwd_n64s3 over bwd_gluon")] == "yes (1.020-1.020 over 4 points)"
    assert answers[("gluon_dq_d64_configs", "D = 64: bwd_n128s3 over bwd_gluon")].startswith("no (0.990-1.010")
    assert not [key for key in answers if key[0] == "gluon_dq_d64_configs" and "regs" in key[1]]


def test_the_summary_answers_the_dropout_kv_placement_step(tmp_path):
    _log(tmp_path / "gluon_dropout_d64_kv_registers.log",
         [{"d": 64, "N": 4096, "causal": False, "kv_placements_equal": True, "kv regs/shared": 1.02},
          {"d": 64, "N": 4096, "causal": True, "kv_placements_equal": False, "kv regs/shared": 1.01}])
    answers = _summary(tmp_path)
    step = "gluon_dropout_d64_kv_registers"
    assert answers[(step, "K and V placements give unequal gradients")] == ["N=4096, causal=True"]
    assert answers[(step, "DKDV_DROPOUT_REGISTER_OPERANDS keeps 64")] == \
        "no: unequal gradients; yes (1.010-1.020 over 2 points)"


def test_the_summary_reads_the_stored_dropout_d64_log(tmp_path):
    """Session 63's log, as stored: dropout's cost at D = 64 and the 128-row candidate, answered by the rules its
    step states (the run was cut after the first bf16 point)."""
    stored = gpu_backlog.ROOT / "benchmarks" / "results" / "gluon_dropout_d64_rows128_session63_h100.log"
    (tmp_path / "gluon_dropout_d64_rows128.log").write_text(stored.read_text())
    answers = _summary(tmp_path)
    step = "gluon_dropout_d64_rows128"
    assert answers[(step, "issue 13: dropout's backward <= 1.15x at D = 64")] == "no (1.228-1.287)"
    assert answers[(step, "D = 64: DROPOUT_CONFIGS takes m128")].startswith("no (0.891-1.026 over 7 points)")


def test_a_forward_log_that_timed_the_default_against_itself_decides_no_placement(tmp_path):
    """Before session 64 gluon_fwd_ab's 'qregs/gluon' set Q in registers against the default, which at head_dim 64
    is registers too: such a log must leave Q_IN_REGISTERS_HEAD_DIMS alone, not empty it on noise."""
    _write_log(tmp_path, "gluon_fwd_ab", [{"d": d, "N": n, "qregs/gluon": 0.999} for d in (128, 64)
                                          for n in (1024, 4096, 16384)])
    assert "Q_IN_REGISTERS_HEAD_DIMS" not in gpu_backlog.settings(tmp_path)
    answers = {(step, question): answer for step, question, answer in gpu_backlog.decisions(tmp_path)}
    assert answers[("gluon_fwd_ab", "Q_IN_REGISTERS_HEAD_DIMS gets 64 (16-bit)")] == "not measured"


def test_the_summary_answers_the_gluon_launch_stage(tmp_path):
    """gluon_launch: pytest's summary of the tests step, and the host-time ratios of the probe per mode, under
    either name (session 67's stored log calls the ratio "gluon cached/host"; a row printed without the cached
    measurement, as by a probe run without the option, is left out)."""
    (tmp_path / "gluon_launch_gpu_tests.log").write_text("# header\n....\n4 passed, 1 skipped in 60.0s\n")
    rows = [dict(dtype="fp16", mode="bwd", causal=True, N=1024, D=128, **{"gluon cached/run": 0.7}),
            dict(dtype="bf16", mode="bwd", causal=False, N=1024, D=128, **{"gluon cached/run": 0.8}),
            dict(dtype="fp16", mode="fwd", causal=False, N=1024, D=128, **{"gluon cached/host": 0.95}),
            dict(dtype="fp16", mode="fwd", causal=True, N=1024, D=128, host_us=200.0)]
    _write_log(tmp_path, "gluon_launch_host", rows)
    answers = _summary(tmp_path)
    assert answers[("gluon_launch_gpu_tests", "pytest's summary")] == "4 passed, 1 skipped in 60.0s"
    assert answers[("gluon_launch_host", "bwd: host time a call, Gluon kernels from the cache / through run")
                   ] == "0.700-0.800 over 2 points"
    assert answers[("gluon_launch_host", "fwd: host time a call, Gluon kernels from the cache / through run")
                   ] == "0.950-0.950 over 1 points"


def test_the_summary_answers_the_draws_ahead_stage(tmp_path):
    """draws_ahead: a head dim takes each kernel's draws ahead only where that kernel ran faster with them at every
    point, and none does where a row found unequal gradients; the backward's dropout cost with them is reported."""
    def row(d, n, ratio, bitwise=True):
        timed = dict(backward_dropout_ms=1.2, dkdv_dropout_ms=0.8, dq_dropout_ms=0.4, backward_ms=1.0,
                     backward_dropout_ahead_ms=1.1, **{"dkdv ahead/now": ratio, "dq ahead/now": 2 - ratio,
                                                       "backward_dropout_ahead_cost": 1.1})
        return dict(dtype="fp16", d=d, N=n, causal=False, ahead_bitwise=bitwise, **timed)
    _write_log(tmp_path, "bwd_kernel_split_draws_ahead", [row(64, 4096, 1.08), row(64, 16384, 1.05),
                                                          row(128, 4096, 1.02), row(128, 16384, 0.99)])
    answers = _summary(tmp_path)
    assert answers[("bwd_kernel_split_draws_ahead", "dQ, dK, dV with the draws ahead differ from the default's")] == "none"
    assert answers[("bwd_kernel_split_draws_ahead", "DKDV_DRAWS_AHEAD gets 64")].startswith("yes (1.050-1.080")
    assert answers[("bwd_kernel_split_draws_ahead", "DKDV_DRAWS_AHEAD gets 128")].startswith("no (0.990-1.020")
    assert answers[("bwd_kernel_split_draws_ahead", "DQ_DRAWS_AHEAD gets 64")].startswith("no (0.920-0.950")
    assert answers[("bwd_kernel_split_draws_ahead", "DQ_DRAWS_AHEAD gets 128")].startswith("no (0.980-1.010")
    assert answers[("bwd_kernel_split_draws_ahead", "D = 64: backward_dropout_ahead_cost (issue 13: 1.15)")
                   ] == "1.100-1.100"
    _write_log(tmp_path, "bwd_kernel_split_draws_ahead", [row(64, 4096, 1.08, bitwise=False), row(64, 16384, 1.05)])
    answers = _summary(tmp_path)
    assert answers[("bwd_kernel_split_draws_ahead", "DKDV_DRAWS_AHEAD gets 64")] == "no: unequal gradients"


def test_the_summary_answers_the_three_consumers_stage(tmp_path):
    """A forward log of variants (three consumers): which variants gave a wrong output, and each variant against
    the two consumers' default, the Triton forward and cuDNN, at every point of its head dim. The bases are no
    variants, and a variant wrong at any point wins nowhere."""
    def row(n, causal, three, wrong=()):
        timed = dict(gluon_tflops=400.0, gluon_qshared_tflops=390.0, triton_tflops=410.0, cudnn_tflops=420.0,
                     three_tflops=three)
        marks = {"wrong_variants": list(wrong)} if wrong else {}
        return dict(dtype="fp16", d=64, N=n, causal=causal, **timed, **marks)
    _write_log(tmp_path, "gluon_fwd_three_consumers", [row(1024, False, 380.0), row(16384, False, 440.0)])
    answers = _summary(tmp_path)
    step = "gluon_fwd_three_consumers"
    assert answers[(step, "variants whose output differs from the Triton forward's")] == "none"
    assert answers[(step, "D = 64: three over gluon")] == "no (0.950-1.100 over 2 points)"
    assert answers[(step, "D = 64: three over cudnn")].startswith("no (0.905-1.048")
    assert (step, "D = 64: gluon_qshared over gluon") not in answers  # a placement, not a variant
    assert not any(question.startswith(("D = 64: triton over", "D = 64: cudnn over")) for _, question in answers)
    _write_log(tmp_path, step, [row(16384, True, 450.0, wrong=["three"]), row(16384, False, 450.0)])
    answers = _summary(tmp_path)
    assert answers[(step, "variants whose output differs from the Triton forward's")] == [
        "three at D=64 N=16384 causal=True"]
    assert answers[(step, "D = 64: three over gluon")] == "no: its output differs"  # 1.125x at both points


def test_the_summary_compares_the_forward_with_the_tree_before_per_mask(tmp_path):
    """relative_mask: the Gluon forward on the tree after a change against the tree before, point by point, apart
    for each mask; a point timed on one tree only decides nothing."""
    def row(n, causal, tflops):
        return dict(dtype="fp16", d=128, N=n, causal=causal, gluon_tflops=tflops)
    _write_log(tmp_path, "fwd_masks_before", [row(1024, False, 500.0), row(1024, True, 400.0),
                                               row(4096, True, 450.0)])
    _write_log(tmp_path, "fwd_masks_after", [row(1024, False, 495.0), row(1024, True, 440.0), row(4096, True, 459.0),
                                              row(16384, True, 1.0)])
    answers = _summary(tmp_path)
    assert answers[("fwd_masks_after", "D = 128, causal=False: the Gluon forward faster than the tree before")
                   ] == "no (0.990-0.990 over 1 points)"
    assert answers[("fwd_masks_after", "D = 128, causal=True: the Gluon forward faster than the tree before")
                   ] == "yes (1.020-1.100 over 2 points)"
