"""Grade learners' exercise notebooks: the grader computes every verdict; the learner's code only answers.

For each notebook:

1. **What the learner wrote.** The notebook is read (never written, never run). Its
   key (``01_naive_attention``, ...) comes from the file name, else from its
   metadata; the answer regions are taken out of it and put into the course's own
   exercise notebook (:mod:`flashlib.course.answers`). Edited given code, edited
   check cells and extra cells are not run; they are listed as warnings.
2. **Whose work it is.** Each answer is read statically (:mod:`flashlib.course.policy`):
   imports, Python internals, flashlib's finished code, SDPA and the like are
   refused with the reason, and a refused answer is not run at all.
3. **What it does.** The rebuilt notebook runs in a sandbox
   (:mod:`flashlib.course.sandbox`) in a temporary folder, as
   :mod:`flashlib.course.worker`, which calls each answer on the cases the grader
   wrote there and writes back what it returned.
4. **The verdict.** The grader compares those replies with its own float64
   reference (:func:`flashlib.course.checks.framework.judge`), on the notebook's
   public cases and on hidden ones: every case of the exercise drawn again from a seed
   of the run (``--seed``), its designed cases included, so that outputs looked up in a
   table fail, and fail where the mistake the table hides shows. Replies are read
   as plain data; a reply, a cells file or a file name the checks cannot read
   costs that exercise, never the run; a notebook the grader itself fails on is
   reported as such, and the class goes on.

Scores come from :mod:`flashlib.course.registry`: points are clamped to each
exercise's maximum, totals cannot be NaN, a notebook of no known exercise and a
second submission of the same notebook are reported and not scored.

    python -m flashlib.grade NOTEBOOK_OR_FOLDER [--json FILE] [--timeout SECONDS] [--sandbox MODE] [--seed N]
    python -m flashlib.grade CLASS_FOLDER --learners [--csv FILE] [--json FILE] ...   (:mod:`.gradebook`)
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import multiprocessing
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

from . import answers, make_exercises, policy, registry, sandbox

DEFAULT_TIMEOUT = 300.0  # wall-clock seconds per notebook, in the sandbox
CELL_TIME_LIMIT = 120.0  # seconds per given cell
MAX_NOTEBOOK_BYTES = 50 * 2**20
MESSAGE_CHARS = 300  # feedback is cut to this length in the report
TABLE_FEEDBACK_CHARS = 70

PASS, FAIL, NOT_RUN, REFUSED = "PASS", "FAIL", "NOT RUN", "REFUSED"
GRADED, DUPLICATE, UNKNOWN, UNREADABLE = "graded", "duplicate", "unknown notebook", "unreadable"
#: Not scored: a notebook that is a symbolic link (it could be another learner's), and one the grader itself
#: failed on (a bug to report; the class run goes on).
LINKED, GRADER_ERROR = "symbolic link", "grader error"


@dataclasses.dataclass
class ExerciseScore:
    exercise: str
    points: float
    max_points: float
    passed: bool
    status: str
    feedback: str


@dataclasses.dataclass
class NotebookReport:
    """One notebook's scores; ``status`` says whether it counts (``graded``) or why not."""

    path: str
    notebook: str | None
    status: str
    exercises: list[ExerciseScore]
    warnings: list[str]
    sandbox: str = ""
    case_seed: int | None = None  # what drew the hidden cases (--seed grades again with the same ones)

    @property
    def counted(self) -> bool:
        return self.status == GRADED

    @property
    def total(self) -> float:
        if not self.counted:
            return 0.0
        return sum(registry.clamp_points(s.points, s.max_points) for s in self.exercises)

    @property
    def max_total(self) -> float:
        return registry.max_points(self.notebook) if self.counted else 0.0

    def to_dict(self) -> dict:
        return {"path": self.path, "notebook": self.notebook, "status": self.status,
                "exercises": [dataclasses.asdict(score) for score in self.exercises],
                "total": self.total, "max_total": self.max_total, "warnings": self.warnings,
                "sandbox": self.sandbox, "case_seed": self.case_seed}


def display_path(path: str | os.PathLike) -> str:
    """``path`` as text that any output can hold: bytes of a file name that are not UTF-8 (kept by Python
    as lone surrogates) become backslash escapes, so printing and writing the report never fail on them."""
    return os.fspath(path).encode("utf-8", "backslashreplace").decode("utf-8")


def _short(text: str, limit: int = MESSAGE_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------ which notebook

def notebook_key(nb: nbformat.NotebookNode | None, path: Path) -> tuple[str | None, str | None]:
    """(key, warning): the registry key from the file name, else from the metadata.

    The file name is what the instructor sees, so it wins: a renamed copy
    ("alice_01_naive_attention.ipynb") matches through the longest key it contains.
    Metadata that names another notebook is reported.
    """
    keys = registry.notebooks()
    contained = [key for key in keys if key in path.stem]
    declared = None
    if nb is not None:
        meta = nb.metadata.get("flashlib", {})
        declared = meta.get("notebook") if isinstance(meta, dict) else None
    if contained:
        key = max(contained, key=len)
        warning = (f"the notebook's metadata says {declared!r}; graded as {key!r}, as its file name says"
                   if declared is not None and declared != key else None)
        return key, warning
    if isinstance(declared, str) and declared in keys:
        return declared, None
    return None, None


def _scores_for(notebook: str, status: str, feedback: str) -> list[ExerciseScore]:
    return [ExerciseScore(e.key, 0.0, float(e.points), False, status, feedback)
            for e in registry.exercises_of(notebook)]


# ------------------------------------------------------------------ grading one notebook

def default_exercises_dir() -> Path:
    """The course's generated exercise notebooks (``exercises/`` beside the package)."""
    return make_exercises.EXERCISES_DIR


def _worker_env(workdir: str) -> dict[str, str]:
    package_root = str(Path(__file__).resolve().parents[2])
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": workdir, "TMPDIR": os.path.join(workdir, "tmp"), "LANG": "C.UTF-8",
        "PYTHONPATH": package_root, "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1", "MPLBACKEND": "Agg",
        "TRITON_CACHE_DIR": os.path.join(workdir, "tmp", "triton"), "OMP_NUM_THREADS": "1",
        "MPLCONFIGDIR": os.path.join(workdir, "tmp", "mpl"),
    }


def _judge_all(notebook: str, submission: answers.Submission, refused: dict[str, str],
               cases: dict, workdir: str, outcome: sandbox.Outcome, cell_errors: dict) -> list[ExerciseScore]:
    from . import wire
    from .checks import CHECKS
    from .checks.framework import verdict

    scores = []
    for exercise in registry.exercises_of(notebook):
        key = exercise.key
        if key in submission.problems:
            scores.append(ExerciseScore(key, 0.0, float(exercise.points), False, FAIL,
                                        _short(submission.problems[key])))
            continue
        if key in refused:
            scores.append(ExerciseScore(key, 0.0, float(exercise.points), False, REFUSED,
                                        _short(refused[key])))
            continue
        path = os.path.join(workdir, "replies", f"{key}.pt")
        try:
            loaded = wire.load(path)
            public, hidden = cases[key]
            expected = len(public) + len(hidden)
            if not isinstance(loaded, list) or len(loaded) > expected:  # never iterate what the learner sized
                raise ValueError(f"expected a list of at most {expected} replies, got a {type(loaded).__name__}"
                                 + (f" of {len(loaded)}" if isinstance(loaded, list) else ""))
            replies = [wire.reply_from_wire(item) for item in loaded]
        except FileNotFoundError:
            why = ("the run was stopped at the notebook time limit" if outcome.timed_out
                   else f"the run was stopped: {outcome.disk_exceeded}" if outcome.disk_exceeded
                   else "the run ended before this exercise (it crashed or exited)")
            cells = [cell for cell in submission.answer_cells(key) if str(cell.index) in cell_errors]
            if cells:
                why += f"; its cell raised {cell_errors[str(cells[0].index)]}"
            scores.append(ExerciseScore(key, 0.0, float(exercise.points), False, NOT_RUN, _short(why)))
            continue
        except Exception as error:  # noqa: BLE001 - a damaged reply fails the exercise, nothing more
            scores.append(ExerciseScore(key, 0.0, float(exercise.points), False, FAIL,
                                        _short(f"unreadable reply from the learner's process: {error}")))
            continue
        if not isinstance(replies, list):
            replies = []
        try:
            passed, headline, details = judge_with_hidden(CHECKS[key], cases[key], replies)
        except Exception as error:  # noqa: BLE001 - a reply the checks cannot read (a float8 tensor, ...) fails
            scores.append(ExerciseScore(key, 0.0, float(exercise.points), False, FAIL,
                                        _short(f"the answer's output could not be judged: {type(error).__name__}: "
                                               f"{error}")))
            continue
        result = verdict(key, passed, headline, details)
        scores.append(ExerciseScore(key, registry.clamp_points(result.points, exercise.points),
                                    float(exercise.points), passed, PASS if passed else FAIL,
                                    _short(result.feedback)))
    return scores


def judge_with_hidden(check, cases: tuple[list, list], replies: list) -> tuple[bool, str, list[str]]:
    """The verdict on the public cases, as the notebook's check cell gives it (the same words), then on the
    hidden cases (:func:`~flashlib.course.checks.framework.hidden_cases`) that the grader added after them."""
    from .checks.framework import judge

    public, hidden = cases
    passed, headline, details = judge(check, public, replies[:len(public)])
    if passed and hidden:
        hidden_passed, hidden_headline, hidden_details = judge(check, hidden, replies[len(public):])
        if not hidden_passed:
            return False, ("right on the notebook's cases, not on a case only the grader draws: "
                           + hidden_headline), hidden_details
    return passed, headline, details


def hidden_seed(case_seed: int, exercise: str) -> int:
    """The seed of an exercise's hidden cases: a hash of the run's ``case_seed`` and the exercise's id. It was
    ``case_seed`` times a constant plus the exercise's own seed, which ``--seed 0`` turned into the public seed:
    the random cases then equalled the public ones and were dropped, and seven exercises had no hidden case
    (session 72's review)."""
    digest = hashlib.sha256(f"hidden cases {case_seed} {exercise}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % 2**62


def _cells_to_run(submission: answers.Submission, canonical: nbformat.NotebookNode,
                  enforce_policy: bool) -> tuple[list[dict], dict[str, str]]:
    """The cells the worker runs, and why each refused answer was refused.

    A refused answer never runs: its cell goes back to the canonical one, placeholder and all.
    Check cells never run; a demo cell runs only if an answer that runs reads a name it binds
    (so the grader's verdict stays the notebook's).
    """
    given_sources = [cell.source for cell in submission.cells if cell.kind != answers.ANSWER]
    given = policy.flashlib_names(given_sources)
    readable = answers.names_an_answer_may_read(submission.cells)
    refused: dict[str, str] = {}
    sources = {}
    for cell in submission.cells:
        sources[cell.index] = cell.source
        if cell.kind == answers.ANSWER:
            lines = cell.source.split("\n")
            regions = [(first, last) for first, last in cell.regions
                       if not answers.is_unattempted("\n".join(lines[first - 1:last]))]
            problems = policy.check_answer(registry.exercise(cell.exercise), cell.source, regions, given,
                                           given_sources=given_sources, notebook_names=readable)
            if regions and problems and enforce_policy:
                refused[cell.exercise] = policy.describe(problems)
                sources[cell.index] = canonical.cells[cell.index].source
    answer_sources = [sources[cell.index] for cell in submission.cells if cell.kind == answers.ANSWER]
    demos_needed = answers.demo_cells_read_by(submission, answer_sources)
    run_cells = [{"index": cell.index, "kind": cell.kind, "source": sources[cell.index]}
                 for cell in submission.cells
                 if cell.kind != answers.CHECK and (cell.kind != answers.DEMO or cell.index in demos_needed)]
    return run_cells, refused


def grade_notebook(path: str | Path, timeout: float = DEFAULT_TIMEOUT, mode: str | None = None,
                   exercises_dir: str | Path | None = None, hide: list[str | Path] = (),
                   enforce_policy: bool = True, case_seed: int | None = None) -> NotebookReport:
    """Grade one notebook; the file at ``path`` is read, never written, and never run.

    ``case_seed`` draws each exercise's hidden cases (:func:`hidden_seed`; None: a fresh seed, reported in
    the notebook's ``case_seed``). ``enforce_policy=False`` runs even refused answers (tests of the sandbox
    only). A notebook that is a
    symbolic link is not read (it could be another learner's); should the grader fail on a notebook, that
    notebook is reported as such, not scored, and the others are graded.
    """
    path = Path(path)
    shown = display_path(path)
    if path.is_symlink():
        key, _ = notebook_key(None, path)
        return NotebookReport(shown, key, LINKED, _scores_for(key, NOT_RUN, "not graded: a symbolic link") if key
                              else [], ["a symbolic link to another file, not a notebook: not graded; hand in the "
                                        "notebook itself"])
    try:
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            raise ValueError(f"{path.stat().st_size} bytes, more than the {MAX_NOTEBOOK_BYTES} a notebook may have")
        nb = nbformat.read(path, as_version=4)
    except Exception as error:  # noqa: BLE001 - a learner's broken file is reported, not fatal
        key, _ = notebook_key(None, path)
        return NotebookReport(shown, key, UNREADABLE if key else UNKNOWN,
                              _scores_for(key, NOT_RUN, "unreadable notebook") if key else [],
                              [_short(f"unreadable notebook: {type(error).__name__}: {error}")])
    key, warning = notebook_key(nb, path)
    if key is None:
        return NotebookReport(shown, None, UNKNOWN, [],
                              ["no exercise notebook of the course matches this file's name or metadata"])
    warnings = [warning] if warning else []
    exercises_dir = Path(exercises_dir) if exercises_dir else default_exercises_dir()
    canonical_path = exercises_dir / f"{key}.ipynb"
    if not canonical_path.is_file():
        raise FileNotFoundError(f"the course's exercise notebook {canonical_path} is missing: "
                                "run python -m flashlib.course.make_exercises")
    canonical = nbformat.read(canonical_path, as_version=4)
    try:
        if case_seed is None:
            case_seed = secrets.randbelow(2**31)
        return _grade_read_notebook(nb, key, canonical, path, warnings, timeout, mode, hide, enforce_policy,
                                    case_seed)
    except Exception as error:  # noqa: BLE001 - one notebook the grader fails on must not stop the class
        return NotebookReport(shown, key, GRADER_ERROR, _scores_for(key, NOT_RUN, "the grader failed on this "
                                                                         "notebook"),
                              warnings + [_short(f"the grader failed on this notebook ({type(error).__name__}: "
                                                 f"{error}): not scored; please report it")])


def _grade_read_notebook(nb, key: str, canonical, path: Path, warnings: list[str], timeout: float,
                         mode: str | None, hide, enforce_policy: bool, case_seed: int) -> NotebookReport:
    """:func:`grade_notebook` once the notebook is read and known: answers out, sandboxed run, verdicts."""
    submission = answers.take_answers(nb, canonical, key)
    warnings += submission.warnings

    run_cells, refused = _cells_to_run(submission, canonical, enforce_policy)
    from . import wire
    from .checks import CHECKS
    from .checks.framework import hidden_cases, make_cases

    to_run = [e for e in registry.exercises_of(key) if e.key not in refused and e.key not in submission.problems]
    # (public cases, hidden cases): the worker gets both, in that order, not knowing which is which
    cases = {e.key: (make_cases(CHECKS[e.key]), hidden_cases(CHECKS[e.key], hidden_seed(case_seed, e.key)))
             for e in to_run}
    workdir = tempfile.mkdtemp(prefix="flashlib-grade-")
    try:
        os.chmod(workdir, 0o700)
        os.makedirs(os.path.join(workdir, "cases"))
        os.makedirs(os.path.join(workdir, "tmp"))
        for exercise in to_run:
            public, hidden = cases[exercise.key]
            wire.save_cases(os.path.join(workdir, "cases", f"{exercise.key}.pt"), public + hidden)
        job = {"notebook": key, "cells": run_cells, "cell_time_limit": CELL_TIME_LIMIT,
               "exercises": [e.key for e in to_run], "answers": {e.key: e.answer for e in to_run}}
        Path(workdir, "job.json").write_text(json.dumps(job), encoding="utf-8")
        outcome = sandbox.run([sys.executable, "-m", "flashlib.course.worker", workdir], workdir,
                              _worker_env(workdir), sandbox.Limits(wall_seconds=timeout), mode=mode,
                              hide=[path.parent.resolve(), *hide])
        try:
            cell_errors = wire.load(os.path.join(workdir, "cells.pt")).get("errors", {})
            # written by the learner's process: only cell numbers with text count
            cell_errors = {str(k): _short(v) for k, v in dict(cell_errors).items()
                           if isinstance(k, str) and k.isdigit() and isinstance(v, str)}
        except Exception:  # noqa: BLE001 - missing or damaged: the run ended early
            cell_errors = {}
        scores = _judge_all(key, submission, refused, cases, workdir, outcome, cell_errors)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for index, message in sorted(cell_errors.items(), key=lambda item: int(item[0])):
        warnings.append(f"cell {index} raised {message}")
    if outcome.timed_out:
        warnings.append(f"the notebook ran past its {timeout:g} s limit and was stopped")
    if outcome.disk_exceeded:
        warnings.append(f"the notebook was stopped: {outcome.disk_exceeded}")
    if outcome.leftovers_killed:
        warnings.append(f"{outcome.leftovers_killed} process(es) left behind by the notebook were killed")
    return NotebookReport(display_path(path), key, GRADED, scores, [_short(w) for w in warnings], outcome.mode,
                          case_seed)


def find_notebooks(target: Path) -> list[Path]:
    """A notebook, or every *.ipynb in a folder (one learner's submission), sorted; symbolic links too (even
    dangling), which :func:`grade_notebook` reports without reading them."""
    if target.is_dir():
        return sorted(p for p in target.glob("*.ipynb") if p.is_file() or p.is_symlink())
    return [target]


def side_by_side(function, calls: list[tuple], jobs: int, mode: str | None) -> list:
    """``[function(*args) for args in calls]``, ``jobs`` at a time, each in a process of its own.

    The processes are started fresh (spawned, not forked from a grader that holds torch's threads),
    and each is the child subreaper of its own sandboxes, so a clean-up kills only its own job's
    processes. Not with the ``user`` sandbox, whose clean-up kills every process of its one user id.
    """
    if jobs < 1:
        raise ValueError(f"jobs: expected a whole number of at least 1, got {jobs}")
    if jobs == 1 or len(calls) < 2:
        return [function(*args) for args in calls]
    if mode not in ("bwrap", "session"):
        raise ValueError(f"jobs: grading side by side needs the 'bwrap' or 'session' sandbox, whose clean-up "
                         f"stays inside one job; got mode {mode!r}")
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(function, *args) for args in calls]
        return [future.result() for future in futures]


def grade(paths: list[Path], jobs: int = 1, **options) -> list[NotebookReport]:
    """Grade notebooks of one learner, ``jobs`` at a time (:func:`side_by_side`); a second notebook with the
    same key is reported, not scored."""
    reports = side_by_side(functools.partial(grade_notebook, **options), [(path,) for path in paths], jobs,
                           options.get("mode"))
    by_key: dict[str, list[NotebookReport]] = {}
    for report in reports:
        if report.notebook is not None and report.status == GRADED:
            by_key.setdefault(report.notebook, []).append(report)
    for key, same in by_key.items():
        if len(same) > 1:
            names = ", ".join(Path(r.path).name for r in same)
            for report in same:
                report.status = DUPLICATE
                report.warnings.insert(0, f"{len(same)} submissions of {key} ({names}): none is scored; "
                                          "keep one and grade again")
    return reports


# ------------------------------------------------------------------ reporting

def format_points(value: float) -> str:
    """Points as printed: 4, 2.5."""
    return f"{value:g}"


def format_report(report: NotebookReport) -> str:
    """The score table of one notebook, as printed."""
    rows = [(s.exercise, f"{format_points(s.points)}/{format_points(s.max_points)}", s.status,
             _short(s.feedback, TABLE_FEEDBACK_CHARS)) for s in report.exercises]
    header = ("exercise", "points", "status", "feedback")
    widths = [max([len(header[i])] + [len(row[i]) for row in rows]) for i in range(3)]
    line = "  {:<%d}  {:>%d}  {:<%d}  {}" % tuple(widths)
    title = report.path + ("" if report.counted else f"  [{report.status.upper()}: not scored]")
    out = [title, line.format(*header)]
    out += [line.format(*row) for row in rows]
    if not rows:
        out.append("  (no exercises)")
    out.append(line.format("total", f"{format_points(report.total)}/{format_points(report.max_total)}", "", ""))
    out += [f"  ! {warning}" for warning in report.warnings]
    return "\n".join(out)


def to_json(reports: list[NotebookReport]) -> dict:
    return {
        "notebooks": [report.to_dict() for report in reports],
        "total": sum(report.total for report in reports),
        "max_total": sum(report.max_total for report in reports),
    }


def _print_reports(reports: list[NotebookReport]) -> None:
    for report in reports:
        print(format_report(report), flush=True)
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashlib.grade",
        description="Grade flashlib exercise notebooks. The notebooks are read, never changed or run: "
                    "the grader runs each learner's answers in a sandbox and judges them itself.",
    )
    parser.add_argument("target", help="a notebook, or a folder holding one learner's notebooks "
                                       "(with --learners: a folder holding one folder per learner)")
    parser.add_argument("--learners", action="store_true",
                        help="grade every subfolder of TARGET as one learner's notebooks, into one gradebook")
    parser.add_argument("--csv", metavar="FILE", help="with --learners: write the gradebook as CSV to FILE")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="grade N notebooks (with --learners: N learners) at once, each in a process of its own "
                             "(default 1; not with --sandbox user)")
    parser.add_argument("--json", metavar="FILE", help="also write the scores as JSON to FILE")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"time limit per notebook (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--sandbox", choices=sandbox.MODES, default=None,
                        help="how to isolate learners' code (default: the strongest that works here)")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="draw each exercise's hidden cases from N (default: a fresh seed, printed), to grade "
                             "again with the same cases")
    parser.add_argument("--exercises", metavar="DIR", default=None,
                        help=f"the course's exercise notebooks (default {default_exercises_dir()})")
    args = parser.parse_args(argv)

    target = Path(args.target)
    if not target.exists():
        parser.error(f"NOTEBOOK_OR_FOLDER: {args.target!r} does not exist")
    if args.csv and not args.learners:
        parser.error("--csv: the gradebook is written for a class; add --learners")
    if args.jobs < 1:
        parser.error(f"--jobs: expected a whole number of at least 1, got {args.jobs}")
    if args.learners:
        from . import gradebook

        if not target.is_dir():
            parser.error(f"--learners: expected a folder holding one folder per learner, got the file {args.target!r}")
        if not gradebook.find_learners(target):
            parser.error(f"--learners: {args.target!r} holds no learner folders (one subfolder per learner)")
    else:
        if target.is_file() and target.suffix != ".ipynb":
            parser.error(f"NOTEBOOK_OR_FOLDER: expected an .ipynb file or a folder, got {args.target!r}")
        notebooks = find_notebooks(target)
        if not notebooks:
            hint = (": it holds folders; add --learners to grade one folder per learner"
                    if any(p.is_dir() for p in target.iterdir()) else "")
            parser.error(f"NOTEBOOK_OR_FOLDER: no *.ipynb files in folder {args.target!r}{hint}")
    if args.timeout <= 0:
        parser.error(f"--timeout: expected a positive number of seconds, got {args.timeout:g}")
    exercises_dir = Path(args.exercises) if args.exercises else default_exercises_dir()
    if not exercises_dir.is_dir():
        parser.error(f"--exercises: {str(exercises_dir)!r} is not a folder of exercise notebooks")
    try:
        mode = sandbox.pick_mode(args.sandbox)
    except ValueError as error:
        parser.error(f"--sandbox: {error}")
    if args.jobs > 1 and mode == "user":
        parser.error("--jobs: the 'user' sandbox kills every process of its one user id when a notebook ends, "
                     "so nothing can be graded side by side with it; use --jobs 1, or install bubblewrap")
    print(f"sandbox: {mode}: {sandbox.GUARANTEES[mode]}", flush=True)
    if args.seed is not None and args.seed < 0:
        parser.error(f"--seed: expected a whole number of at least 0, got {args.seed}")
    case_seed = secrets.randbelow(2**31) if args.seed is None else args.seed
    print(f"hidden cases: seed {case_seed} (--seed {case_seed} grades again with the same cases)", flush=True)
    outputs = [Path(path).resolve() for path in (args.json, args.csv) if path]
    hide = [path.parent for path in outputs]
    options = dict(timeout=args.timeout, mode=mode, exercises_dir=exercises_dir, hide=hide, case_seed=case_seed)
    if args.learners:
        results = gradebook.grade_class(target, jobs=args.jobs, **options)
        for result in results:
            print(f"== {result.learner} ==", flush=True)
            _print_reports(result.reports)
            if not result.reports:
                print("  (no notebooks)\n", flush=True)
        print("\n".join(gradebook.summary_lines(results)))
        summary = gradebook.to_json(results)
        if args.csv:
            gradebook.write_csv(results, Path(args.csv).resolve())
    else:
        reports = grade(notebooks, jobs=args.jobs, **options)
        _print_reports(reports)
        summary = to_json(reports)
        print(f"grand total: {format_points(summary['total'])}/{format_points(summary['max_total'])} "
              f"({sum(r.counted for r in reports)} of {len(reports)} notebook(s) scored)")
    if args.json:
        json_path = Path(args.json).resolve()
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
