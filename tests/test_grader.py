"""The grader: scores from recorded results, time limits, floods, dead kernels, the CLI.

The fixture notebooks (tests/fixtures/grader, made by tests/fixtures/make_fixtures.py)
record ExerciseResults directly, and the tests hand the grader a matching registry,
so these tests do not depend on the real checks. The tests at the end grade the
real course (solutions/ and exercises/) through the command line.
"""
import contextlib
import hashlib
import io
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from time import monotonic
from types import SimpleNamespace

import nbformat
import pytest

from flashlib.course import grader
from flashlib.course.results import ExerciseResult

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "grader"
TIMEOUT = 3.0  # per cell; the fixtures with hanging cells do not import torch
FLOOD_BYTES = 200_000 * 1_000  # what the flood cell of flood.ipynb prints

REGISTRY = {
    "fx_all_pass": [("one", 2, "First"), ("two", 3, "Second")],
    "fx_partial": [("good", 1, "Good"), ("bad", 4, "Bad")],
    "fx_trouble": [(name, 1, name) for name in "abcdefg"],
    "fx_flood": [("a", 1, "A"), ("b", 1, "B")],
    "fx_dies": [("a", 1, "A"), ("b", 1, "B")],
    "fx_stubborn": [("a", 1, "A"), ("b", 1, "B")],
    "fx_slow": [("a", 1, "A"), ("b", 1, "B")],
}


def fingerprint(path):
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def by_exercise(report):
    return {score.exercise: score for score in report.exercises}


# --- scoring, without a kernel ---------------------------------------------------------

def result(exercise, passed, points, max_points, feedback="fb"):
    return ExerciseResult(exercise, passed, points, max_points, feedback)


def test_scores_follow_the_registry_and_clamp_points():
    recorded = {
        "fx_partial.good": result("fx_partial.good", True, 7, 7),  # claims more than the registry allows
        "fx_partial.unexpected": result("fx_partial.unexpected", True, 5, 5),
    }
    scores = grader.score_exercises("fx_partial", REGISTRY, recorded)
    assert [(s.exercise, s.points, s.max_points, s.status) for s in scores] == [
        ("fx_partial.good", 1.0, 1.0, "PASS"),
        ("fx_partial.bad", 0.0, 4.0, "NOT RUN"),
    ]


def test_without_a_registry_entry_the_recorded_results_are_the_scores():
    recorded = {"misc.x": result("misc.x", False, 0.5, 2, "half\nright")}
    [score] = grader.score_exercises(None, REGISTRY, recorded)
    assert (score.exercise, score.points, score.max_points, score.passed, score.status, score.feedback) == (
        "misc.x", 0.5, 2.0, False, "FAIL", "half right")


def test_notebook_key_from_metadata_then_file_name():
    nb = nbformat.v4.new_notebook()
    nb.metadata["flashlib"] = {"notebook": "fx_slow"}
    assert grader.notebook_key(nb, Path("fx_dies.ipynb"), REGISTRY) == "fx_slow"
    assert grader.notebook_key(nbformat.v4.new_notebook(), Path("fx_dies.ipynb"), REGISTRY) == "fx_dies"
    assert grader.notebook_key(None, Path("alice-fx_partial-v2.ipynb"), REGISTRY) == "fx_partial"
    assert grader.notebook_key(None, Path("other.ipynb"), REGISTRY) is None


def test_only_error_outputs_are_kept():
    client = grader._GradingClient(nbformat.v4.new_notebook())
    client.clear_before_next_output = False  # as execute_cell sets it before a cell's messages
    outs = []

    def message(msg_type, content):
        return {"msg_type": msg_type, "header": {"msg_type": msg_type}, "content": content,
                "parent_header": {"msg_id": "m"}, "metadata": {}}

    client.output(outs, message("stream", {"name": "stdout", "text": "x" * 1_000_000}), None, 0)
    client.output(outs, message("display_data", {"data": {"text/plain": "y"}, "metadata": {}}), None, 0)
    assert outs == []
    client.output(outs, message("error", {"ename": "ValueError", "evalue": "bad", "traceback": []}), None, 0)
    assert [(o.output_type, o.ename) for o in outs] == [("error", "ValueError")]


def test_an_unreadable_notebook_is_reported_not_fatal(tmp_path):
    path = tmp_path / "fx_dies.ipynb"
    path.write_text("{ not json", encoding="utf-8")
    report = grader.grade_notebook(path, registry=REGISTRY)
    assert [s.status for s in report.exercises] == ["NOT RUN", "NOT RUN"]
    assert [e.kind for e in report.errors] == ["unreadable"]


# --- one kernel run with everything that can go wrong in a cell ----------------------

@pytest.fixture(scope="module")
def trouble():
    path = FIXTURES / "trouble.ipynb"
    before = fingerprint(path)
    started = monotonic()
    report = grader.grade_notebook(path, timeout=TIMEOUT, registry=REGISTRY)
    elapsed = monotonic() - started
    return SimpleNamespace(report=report, elapsed=elapsed, before=before, after=fingerprint(path))


def test_a_raising_cell_costs_only_its_exercise(trouble):
    scores = by_exercise(trouble.report)
    assert scores["fx_trouble.a"].status == "PASS" and scores["fx_trouble.a"].points == 1
    assert scores["fx_trouble.b"].status == "NOT RUN" and scores["fx_trouble.b"].points == 0
    assert scores["fx_trouble.c"].status == "FAIL" and scores["fx_trouble.c"].feedback == "expected 1.0 got 2.0"
    [error] = [e for e in trouble.report.errors if e.cell == 2]
    assert error.kind == "error" and error.message == "ValueError: boom in the check of b"


def test_hanging_cells_are_interrupted_and_the_run_goes_on(trouble):
    scores = by_exercise(trouble.report)
    for hanging in ("fx_trouble.d", "fx_trouble.f"):  # `while True: pass`, `time.sleep(1000)`
        assert scores[hanging].status == "NOT RUN" and scores[hanging].points == 0
    for after in ("fx_trouble.e", "fx_trouble.g"):
        assert scores[after].status == "PASS"
    timeouts = {e.cell: e.message for e in trouble.report.errors if e.kind == "timeout"}
    assert sorted(timeouts) == [4, 6]
    assert "3 s limit per cell" in timeouts[4]
    assert trouble.elapsed < 2 * TIMEOUT + 60


def test_totals_and_the_learners_file_is_untouched(trouble):
    assert (trouble.report.total, trouble.report.max_total) == (3, 7)
    assert trouble.after == trouble.before


def test_a_flood_of_output_is_not_kept():
    tracemalloc.start()
    try:
        report = grader.grade_notebook(FIXTURES / "flood.ipynb", timeout=60, registry=REGISTRY)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [s.status for s in report.exercises] == ["PASS", "PASS"]
    assert report.errors == []
    # keeping the outputs would take the whole 200 MB (more, as Python strings)
    assert peak < FLOOD_BYTES, f"the grader held {peak / 1e6:.0f} MB of a 200 MB flood"


def test_a_dead_kernel_leaves_the_rest_not_run():
    report = grader.grade_notebook(FIXTURES / "dies.ipynb", timeout=TIMEOUT, registry=REGISTRY)
    assert [s.status for s in report.exercises] == ["PASS", "NOT RUN"]
    assert [(e.cell, e.kind) for e in report.errors] == [(2, "kernel died")]


def test_a_cell_that_ignores_the_interrupt_gets_its_kernel_killed(monkeypatch):
    monkeypatch.setattr(grader, "KILL_GRACE", 1.0)
    started = monotonic()
    report = grader.grade_notebook(FIXTURES / "ignores_interrupt.ipynb", timeout=TIMEOUT, registry=REGISTRY)
    assert [s.status for s in report.exercises] == ["PASS", "NOT RUN"]
    [error] = report.errors
    assert (error.cell, error.kind) == (2, "kernel died") and "did not stop when interrupted" in error.message
    assert monotonic() - started < TIMEOUT + 60


def test_the_notebook_time_limit_stops_the_run():
    started = monotonic()
    report = grader.grade_notebook(FIXTURES / "slow.ipynb", timeout=60, notebook_timeout=8, registry=REGISTRY)
    assert [s.status for s in report.exercises] == ["PASS", "NOT RUN"]
    assert [(e.cell, e.kind) for e in report.errors] == [(2, "timeout"), (3, "time limit")]
    assert "notebook time limit" in report.errors[0].message
    assert monotonic() - started < 8 + 30  # the cell sleeps 30 s


# --- the command line ------------------------------------------------------------------

@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    folder = FIXTURES / "folder"
    before = {path.name: fingerprint(path) for path in folder.iterdir()}
    json_path = tmp_path_factory.mktemp("grade") / "out" / "scores.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grader, "load_registry", lambda: REGISTRY)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = grader.main([str(folder), "--json", str(json_path), "--timeout", "60"])
    after = {path.name: fingerprint(path) for path in folder.iterdir()}
    return SimpleNamespace(code=code, printed=printed.getvalue(), data=json.loads(json_path.read_text()),
                           before=before, after=after)


def test_folder_grading_writes_the_json_schema(folder_run):
    assert folder_run.code == 0
    data = folder_run.data
    assert set(data) == {"notebooks", "total", "max_total"}
    for notebook in data["notebooks"]:
        assert set(notebook) == {"path", "exercises", "total", "max_total", "errors"}
        for exercise in notebook["exercises"]:
            assert set(exercise) == {"exercise", "points", "max_points", "passed", "status", "feedback"}
    assert [Path(n["path"]).name for n in data["notebooks"]] == ["all_pass.ipynb", "fx_partial.ipynb",
                                                                 "unregistered.ipynb"]
    assert (data["total"], data["max_total"]) == (6.5, 12)
    assert folder_run.after == folder_run.before


def test_all_passed_gives_full_marks(folder_run):
    all_pass = folder_run.data["notebooks"][0]
    assert (all_pass["total"], all_pass["max_total"]) == (5, 5)
    assert [(e["exercise"], e["points"], e["passed"], e["status"]) for e in all_pass["exercises"]] == [
        ("fx_all_pass.one", 2, True, "PASS"), ("fx_all_pass.two", 3, True, "PASS")]
    assert all_pass["errors"] == []


def test_registry_by_file_name_and_unregistered_notebooks(folder_run):
    partial, unregistered = folder_run.data["notebooks"][1:]
    assert [(e["exercise"], e["points"], e["max_points"], e["status"]) for e in partial["exercises"]] == [
        ("fx_partial.good", 1, 1, "PASS"), ("fx_partial.bad", 0, 4, "FAIL")]
    assert partial["exercises"][1]["feedback"] == "wrong scale: expected 1/sqrt(D), got 1/D"
    assert [(e["exercise"], e["points"], e["max_points"]) for e in unregistered["exercises"]] == [
        ("misc.extra", 0.5, 2)]


def test_the_score_table_is_printed(folder_run):
    lines = folder_run.printed.splitlines()
    assert any(line.split()[:3] == ["fx_partial.bad", "0/4", "FAIL"] for line in lines)
    assert any(line.split()[:2] == ["total", "5/5"] for line in lines)
    assert lines[-1] == "grand total: 6.5/12 (3 notebook(s))"


@pytest.mark.parametrize("argv, words", [
    (["missing.ipynb"], "does not exist"),
    ([str(FIXTURES / "../make_fixtures.py")], "expected an .ipynb file or a folder"),
    ([str(FIXTURES / "folder"), "--timeout", "0"], "must be positive"),
    ([str(FIXTURES / "folder"), "--kernel-name", "no-such-kernel"], "no Jupyter kernel named"),
])
def test_usage_errors_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        grader.main(argv)
    assert info.value.code == 2
    assert words in capsys.readouterr().err


def test_empty_folder_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        grader.main([str(tmp_path)])
    assert info.value.code == 2 and "no *.ipynb files" in capsys.readouterr().err


def test_module_entry_point_reports_usage_errors():
    proc = subprocess.run([sys.executable, "-m", "flashlib.grade", "no/such/notebook.ipynb"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


# --- the real course: grade solutions/ and exercises/ through the command line --------

SOLUTIONS = sorted(p.name for p in (REPO / "solutions").glob("*.ipynb"))


def grade_folder(folder, tmp_path_factory):
    json_path = tmp_path_factory.mktemp("course") / f"{folder}.json"
    proc = subprocess.run([sys.executable, "-m", "flashlib.grade", folder, "--json", str(json_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {Path(n["path"]).name: n for n in json.loads(json_path.read_text())["notebooks"]}


@pytest.fixture(scope="module")
def graded_solutions(tmp_path_factory):
    return grade_folder("solutions", tmp_path_factory)


@pytest.fixture(scope="module")
def graded_exercises(tmp_path_factory):
    return grade_folder("exercises", tmp_path_factory)


def expected_ids(name):
    from flashlib.course import checks

    key = nbformat.read(REPO / "solutions" / name, as_version=4).metadata["flashlib"]["notebook"]
    assert key == Path(name).stem, f"{name}: metadata.flashlib.notebook is {key!r}"
    return [f"{key}.{exercise}" for exercise, _points, _title in checks.EXERCISES[key]]


def test_the_course_has_solution_notebooks():
    assert SOLUTIONS, "solutions/ holds no notebooks: the course tests below have nothing to grade"


@pytest.mark.slow
@pytest.mark.parametrize("name", SOLUTIONS)
def test_solutions_get_full_marks(name, graded_solutions):
    report = graded_solutions[name]
    assert [e["exercise"] for e in report["exercises"]] == expected_ids(name)
    assert report["max_total"] > 0
    for exercise in report["exercises"]:
        assert exercise["status"] == "PASS" and exercise["points"] == exercise["max_points"], exercise
    assert report["errors"] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", SOLUTIONS)
def test_exercises_get_zero_and_every_exercise_is_checked(name, graded_exercises):
    assert name in graded_exercises, f"exercises/{name} is missing: run python -m flashlib.course.make_exercises"
    report = graded_exercises[name]
    assert [e["exercise"] for e in report["exercises"]] == expected_ids(name)
    assert report["total"] == 0
    for exercise in report["exercises"]:
        # the check ran and said why (e.g. "not attempted yet"): the notebook runs end to end
        assert exercise["status"] == "FAIL" and exercise["points"] == 0, exercise
