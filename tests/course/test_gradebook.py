"""A whole class graded by one command (``python -m flashlib.grade CLASS --learners``), into one gradebook."""
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from flashlib.course import gradebook, grader, registry, sandbox

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"


def copy_solution(key: str, folder: Path, name: str | None = None, answer: tuple[str, str] | None = None) -> Path:
    """The solution notebook of ``key`` in ``folder``; ``answer`` = (old, new) swaps a line of its answer."""
    nb = nbformat.read(SOLUTIONS / f"{key}.ipynb", as_version=4)
    if answer:
        old, new = answer
        cells = [c for c in nb.cells if c.cell_type == "code" and old in c.source]
        assert cells, f"{old!r} is in no cell of {key}"
        cells[0].source = cells[0].source.replace(old, new)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or f"{key}.ipynb")
    nbformat.write(nb, path)
    return path


def sandbox_mode() -> str:
    """The strongest mode that lets learners be graded side by side here."""
    try:
        return sandbox.pick_mode("bwrap")
    except ValueError:  # no bubblewrap here
        return "session"


def grade_by_cli(root: Path, out: Path, *options: str) -> dict:
    # one seed for the hidden cases, so that two runs draw the same ones (and print the same)
    proc = subprocess.run([sys.executable, "-m", "flashlib.grade", str(root), "--learners", "--sandbox", sandbox_mode(),
                           "--csv", str(out / "grades.csv"), "--json", str(out / "grades.json"), "--seed", "7",
                           *options],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "grades.csv", newline="", encoding="utf-8") as handle:
        rows = {row["learner"]: row for row in csv.DictReader(handle)}
    return {"stdout": proc.stdout, "csv": rows, "json": json.loads((out / "grades.json").read_text())}


@pytest.fixture(scope="module")
def class_folder(tmp_path_factory):
    """alice: notebooks 01 and 07, both right; bob: 01 with the scale forgotten; carol: nothing; dave: 03 twice;
    a notebook lying at the top of the class folder (no learner's) and a hidden folder are not graded."""
    root = tmp_path_factory.mktemp("class") / "submissions"
    copy_solution("01_naive_attention", root / "alice")
    copy_solution("07_performance", root / "alice")
    copy_solution("01_naive_attention", root / "bob",
                  answer=(" / math.sqrt(q.shape[-1])", ""))
    copy_solution("03_online_softmax", root / "dave")
    copy_solution("03_online_softmax", root / "dave", name="03_online_softmax_copy.ipynb")
    (root / "carol").mkdir()
    copy_solution("01_naive_attention", root)
    copy_solution("01_naive_attention", root / ".ipynb_checkpoints")
    return root


@pytest.fixture(scope="module")
def graded_class(class_folder, tmp_path_factory):
    return grade_by_cli(class_folder, tmp_path_factory.mktemp("out"))


@pytest.mark.slow
def test_one_learners_notebooks_side_by_side_score_the_same_and_duplicates_are_still_found(tmp_path):
    folder = tmp_path / "ann"
    for key in ("01_naive_attention", "03_online_softmax", "07_performance"):
        copy_solution(key, folder)
    copy_solution("01_naive_attention", folder, name="01_naive_attention_again.ipynb")
    one, two = (grader.grade(grader.find_notebooks(folder), jobs=jobs, mode=sandbox_mode()) for jobs in (1, 2))
    assert [(r.path, r.status, r.total) for r in two] == [(r.path, r.status, r.total) for r in one]
    assert [r.status for r in two] == ["duplicate", "duplicate", "graded", "graded"]
    assert sum(r.total for r in two) == 4 + 5


@pytest.mark.slow
def test_two_learners_at_a_time_give_the_same_gradebook(class_folder, graded_class, tmp_path):
    side_by_side = grade_by_cli(class_folder, tmp_path, "--jobs", "2")
    assert side_by_side["csv"] == graded_class["csv"]
    assert side_by_side["stdout"].split("\n")[1:] == graded_class["stdout"].split("\n")[1:]
    assert "hidden cases: seed 7 (--seed 7 grades again with the same cases)" in side_by_side["stdout"]


def test_learners_are_not_graded_side_by_side_in_the_user_sandbox(tmp_path, monkeypatch, capsys):
    (tmp_path / "ann").mkdir()
    (tmp_path / "ann" / "01_naive_attention.ipynb").write_text("{}")
    monkeypatch.setattr(sandbox, "pick_mode", lambda requested=None: "user")
    with pytest.raises(SystemExit) as info:
        grader.main([str(tmp_path), "--learners", "--jobs", "2"])
    assert info.value.code == 2 and "the 'user' sandbox kills every process" in capsys.readouterr().err
    (tmp_path / "ben").mkdir()
    with pytest.raises(ValueError, match="needs the 'bwrap' or 'session' sandbox"):
        gradebook.grade_class(tmp_path, jobs=2, mode="user")


@pytest.mark.slow
def test_every_learner_gets_a_row_with_each_notebook_and_the_course_total(graded_class):
    rows = graded_class["csv"]
    assert list(rows) == ["alice", "bob", "carol", "dave"]  # sorted; no row for the top-level file or .folders
    out_of = sum(e.points for e in registry.EXERCISES)
    assert {row["max_total"] for row in rows.values()} == {f"{out_of:g}"}
    alice = rows["alice"]
    assert (alice["01_naive_attention"], alice["07_performance"], alice["total"]) == ("4", "5", "9")
    assert alice["03_online_softmax"] == ""  # not handed in: empty, and named in the notes
    assert "missing 02_triton_tiled_matmul" in alice["notes"] and "07_performance" not in alice["notes"]


@pytest.mark.slow
def test_a_wrong_answer_a_duplicate_and_an_empty_folder_are_scored_as_such(graded_class):
    rows = graded_class["csv"]
    assert rows["bob"]["01_naive_attention"] == "2" and rows["bob"]["total"] == "2"  # the scale forgotten
    assert rows["carol"]["total"] == "0" and rows["carol"]["notes"] == "no notebooks"
    dave = rows["dave"]
    assert dave["03_online_softmax"] == "" and dave["total"] == "0"
    assert "03_online_softmax.ipynb: duplicate, not scored" in dave["notes"]


@pytest.mark.slow
def test_the_printed_summary_and_the_json_agree_with_the_csv(graded_class):
    stdout, learners = graded_class["stdout"], graded_class["json"]["learners"]
    assert [entry["learner"] for entry in learners] == list(graded_class["csv"])
    for entry in learners:
        assert f"{entry['total']:g}" == graded_class["csv"][entry["learner"]]["total"]
        assert f"== {entry['learner']} ==" in stdout
    assert re.search(r"^alice +9/40  missing 02_", stdout, re.M)
    assert re.search(r"^carol +0/40  no notebooks$", stdout, re.M)


def test_the_whole_class_folder_is_hidden_from_every_learner(tmp_path, monkeypatch):
    for name in ("ann", "ben"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "01_naive_attention.ipynb").write_text("{}")
    seen = []
    monkeypatch.setattr(grader, "grade", lambda notebooks, **options: seen.append(options["hide"]) or [])
    gradebook.grade_class(tmp_path, hide=[Path("/out")], timeout=5)
    assert seen == [[tmp_path.resolve(), Path("/out")]] * 2


@pytest.mark.parametrize("argv, words", [
    (["{root}/ann/01_naive_attention.ipynb", "--learners"], "expected a folder holding one folder per learner"),
    (["{root}/ann", "--learners"], "holds no learner folders"),
    (["{root}/ann", "--csv", "grades.csv"], "--csv: the gradebook is written for a class; add --learners"),
    (["{root}"], "it holds folders; add --learners"),
    (["{root}", "--learners", "--jobs", "0"], "--jobs: expected a whole number of at least 1, got 0"),
])
def test_class_usage_errors_exit_2_and_say_what_to_do(argv, words, tmp_path, capsys):
    (tmp_path / "ann").mkdir()
    (tmp_path / "ann" / "01_naive_attention.ipynb").write_text("{}")
    with pytest.raises(SystemExit) as info:
        grader.main([arg.format(root=tmp_path) for arg in argv])
    assert info.value.code == 2
    assert words in capsys.readouterr().err
