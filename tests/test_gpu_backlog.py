"""benchmarks/gpu_backlog.py on the CPU: every stage fits one device call, and every step's arguments are taken by
its script's own parser, so that the calls of the next GPU session are not spent on a renamed option."""
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


def test_the_tests_stage_covers_every_gpu_test_of_the_changed_kernels():
    (tests_step,) = gpu_backlog.STAGES["tests"]
    for path in gpu_backlog.CHANGED_KERNEL_TESTS:
        assert "mark.gpu" in (BENCHMARKS.parent / path).read_text(), path
    assert set(gpu_backlog.CHANGED_KERNEL_TESTS) <= set(tests_step.argv)


@pytest.mark.parametrize("argv, message", [
    (("benchmarks/gluon_dq_ab.py", "--dtype", "fp16", "--heads", "16"), "refused"),
    (("benchmarks/gluon_dq_ab.py", "--d", "96"), "refused"),
    (("benchmarks/gluon_dq_abc.py", "--d", "64"), "no such script"),
    (("-m", "flashlib.bench", "--mode", "fwd", "--causl", "both"), "refused"),
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
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # the group was killed; the orphan is reaped by init shortly after
            os.kill(pid, 0)
            time.sleep(0.1)
