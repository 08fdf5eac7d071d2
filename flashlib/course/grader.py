"""Grade exercise notebooks: run each in a fresh kernel and read what its checks record.

The learner's file is only read. Its in-memory copy runs in a new kernel (working
folder: the notebook's own folder, so relative paths work) whose environment sets
``FLASHLIB_RESULTS_FILE`` to a temporary file; every check appends its
:class:`~flashlib.course.results.ExerciseResult` there. The exercises a notebook
should contain come from ``flashlib.course.checks.EXERCISES``, so an exercise whose
check never ran is reported as NOT RUN with 0 points rather than left out.

Limits keep one bad exercise from costing the others: a cell running longer than
the per-cell timeout is interrupted and the run goes on; a cell that ignores the
interrupt, or a notebook past its wall-clock limit, gets its kernel killed and the
exercises not yet checked are NOT RUN. Cell outputs are dropped as they arrive
(only errors are kept), so a cell that floods its output costs no memory here.

    python -m flashlib.grade NOTEBOOK_OR_FOLDER [--json FILE] [--timeout SECONDS]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from time import monotonic

import nbformat
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from flashlib.course.results import RESULTS_ENV, read_results

DEFAULT_TIMEOUT = 120.0  # seconds per cell
DEFAULT_NOTEBOOK_TIMEOUT = 900.0  # seconds per notebook
KILL_GRACE = 10.0  # seconds a timed-out cell gets to answer the interrupt before its kernel is killed
MESSAGE_CHARS = 200  # error and feedback messages are cut to this length in the report
TABLE_FEEDBACK_CHARS = 60

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"


@dataclasses.dataclass
class ExerciseScore:
    exercise: str
    points: float
    max_points: float
    passed: bool
    status: str
    feedback: str


@dataclasses.dataclass
class CellProblem:
    """A cell that raised, timed out or stopped the run; ``cell`` is its index (None: the whole run)."""

    cell: int | None
    kind: str  # "error", "timeout", "kernel died", "time limit", "unreadable", "grader"
    message: str


@dataclasses.dataclass
class NotebookReport:
    path: str
    exercises: list[ExerciseScore]
    errors: list[CellProblem]

    @property
    def total(self) -> float:
        return sum(score.points for score in self.exercises)

    @property
    def max_total(self) -> float:
        return sum(score.max_points for score in self.exercises)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "exercises": [dataclasses.asdict(score) for score in self.exercises],
            "total": self.total,
            "max_total": self.max_total,
            "errors": [dataclasses.asdict(problem) for problem in self.errors],
        }


def _short(text: str, limit: int = MESSAGE_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- which exercises a notebook should have -----------------------------------------

def load_registry() -> dict:
    """``checks.EXERCISES``: notebook stem → [(exercise name, max points, title), ...]."""
    from flashlib.course import checks

    return checks.EXERCISES


def notebook_key(nb: nbformat.NotebookNode | None, path: Path, registry: dict) -> str | None:
    """The registry key for a notebook: its ``metadata.flashlib.notebook``, else its file name.

    A renamed copy ("alice_01_naive_attention.ipynb") still matches through the
    longest key its file name contains.
    """
    if nb is not None:
        declared = nb.metadata.get("flashlib", {}).get("notebook")
        if declared in registry:
            return declared
    if path.stem in registry:
        return path.stem
    contained = [key for key in registry if key in path.stem]
    return max(contained, key=len) if contained else None


def score_exercises(key: str | None, registry: dict, recorded: dict) -> list[ExerciseScore]:
    """One score per expected exercise (or per recorded result when none are expected)."""
    if key is None:
        expected = [(exercise, result.max_points) for exercise, result in recorded.items()]
    else:
        expected = [(f"{key}.{name}", max_points) for name, max_points, _title in registry[key]]
    scores = []
    for exercise, max_points in expected:
        result = recorded.get(exercise)
        if result is None:
            scores.append(ExerciseScore(exercise, 0.0, float(max_points), False, NOT_RUN,
                                        "no result: its check cell did not run to the end"))
            continue
        points = min(max(float(result.points), 0.0), float(max_points))
        scores.append(ExerciseScore(exercise, points, float(max_points), bool(result.passed),
                                    PASS if result.passed else FAIL, _short(result.feedback)))
    return scores


# --- running a notebook --------------------------------------------------------------

class _GradingClient(NotebookClient):
    """A NotebookClient that keeps only error outputs: the grader needs nothing else."""

    def output(self, outs, msg, display_id, cell_index):
        if msg["msg_type"] != "error":
            return None
        return super().output(outs, msg, display_id, cell_index)


class _Watchdog:
    """Kills the kernel when a cell outlives its time limit plus KILL_GRACE (interrupt ignored)."""

    def __init__(self, km):
        self.km = km
        self.deadline: float | None = None
        self.killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _watch(self):
        while not self._stop.wait(0.25):
            if self.deadline is not None and monotonic() > self.deadline:
                self._kill()
                return

    def _kill(self):
        provisioner = getattr(self.km, "provisioner", None)
        pgid = getattr(provisioner, "pgid", None)
        pid = getattr(provisioner, "pid", None)
        try:
            if pgid and hasattr(os, "killpg"):
                os.killpg(pgid, signal.SIGKILL)
            elif pid:
                os.kill(pid, signal.SIGKILL)
            else:
                return
        except ProcessLookupError:
            return
        self.killed = True


# nbclient logs timeouts and interrupts as errors; the report says it better.
_quiet_log = logging.getLogger("flashlib.grade.nbclient")
_quiet_log.addHandler(logging.NullHandler())
_quiet_log.propagate = False


def _error_message(cell: nbformat.NotebookNode) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return _short(f"{output.get('ename')}: {output.get('evalue')}")
    return None


def run_notebook(nb: nbformat.NotebookNode, cwd: str, results_file: str, timeout: float,
                 notebook_timeout: float, kernel_name: str) -> list[CellProblem]:
    """Execute ``nb`` (in memory) in a fresh kernel; return the cells that went wrong."""
    problems: list[CellProblem] = []
    limit = {"seconds": timeout}
    client = _GradingClient(
        nb,
        timeout_func=lambda cell: limit["seconds"],
        allow_errors=True,
        interrupt_on_timeout=True,
        kernel_name=kernel_name,
        shutdown_kernel="immediate",
        record_timing=False,
        log=_quiet_log,
    )
    env = {**os.environ, RESULTS_ENV: results_file}
    # The kernel's own stdout/stderr (not the cells' output, which comes as messages)
    # would only add start-up warnings to the score table.
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    with client.setup_kernel(env=env, cwd=cwd, **quiet), _Watchdog(client.km) as watchdog:
        wall_deadline = monotonic() + notebook_timeout  # from a ready kernel on
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            remaining = wall_deadline - monotonic()
            if remaining <= 0:
                problems.append(CellProblem(index, "time limit",
                                            f"notebook time limit ({notebook_timeout:g} s) reached; "
                                            "this cell and the ones after it did not run"))
                break
            limit["seconds"] = min(timeout, remaining)
            started = monotonic()
            watchdog.deadline = started + limit["seconds"] + KILL_GRACE
            try:
                client.execute_cell(cell, index)
            except DeadKernelError:
                why = ("killed: it did not stop when interrupted after "
                       f"{limit['seconds']:g} s" if watchdog.killed
                       else "the kernel died (it crashed, exited or ran out of memory)")
                problems.append(CellProblem(index, "kernel died",
                                            f"{why}; the cells after it did not run"))
                break
            finally:
                watchdog.deadline = None
            error = _error_message(cell)
            if error is None:
                continue
            if monotonic() - started >= limit["seconds"] and error.startswith("KeyboardInterrupt"):
                reason = ("the notebook time limit" if limit["seconds"] < timeout
                          else f"the {timeout:g} s limit per cell")
                problems.append(CellProblem(index, "timeout",
                                            f"interrupted: ran past {reason}"))
            else:
                problems.append(CellProblem(index, "error", error))
    return problems


def grade_notebook(path: str | Path, timeout: float = DEFAULT_TIMEOUT,
                   notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
                   kernel_name: str = "python3", registry: dict | None = None) -> NotebookReport:
    """Run one notebook and score it; the file at ``path`` is read, never written."""
    path = Path(path)
    registry = load_registry() if registry is None else registry
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as error:  # a learner's broken file is reported, not fatal
        key = notebook_key(None, path, registry)
        return NotebookReport(str(path), score_exercises(key, registry, {}),
                              [CellProblem(None, "unreadable", _short(f"{type(error).__name__}: {error}"))])
    with tempfile.TemporaryDirectory(prefix="flashlib-grade-") as scratch:
        results_file = os.path.join(scratch, "results.jsonl")
        try:
            problems = run_notebook(nb, str(path.parent.resolve()), results_file,
                                    timeout, notebook_timeout, kernel_name)
        except Exception as error:  # e.g. the kernel would not start: grade the rest anyway
            problems = [CellProblem(None, "grader", _short(f"{type(error).__name__}: {error}"))]
        try:
            recorded = read_results(results_file)
        except (ValueError, TypeError) as error:  # the notebook wrote into the results file
            problems.append(CellProblem(None, "grader", _short(f"unreadable results file: {error}")))
            recorded = {}
    key = notebook_key(nb, path, registry)
    return NotebookReport(str(path), score_exercises(key, registry, recorded), problems)


# --- reporting -------------------------------------------------------------------------

def _points(value: float) -> str:
    return f"{value:g}"


def format_report(report: NotebookReport) -> str:
    """The score table of one notebook, as printed."""
    rows = [(s.exercise, f"{_points(s.points)}/{_points(s.max_points)}", s.status,
             _short(s.feedback, TABLE_FEEDBACK_CHARS)) for s in report.exercises]
    header = ("exercise", "points", "status", "feedback")
    widths = [max([len(header[i])] + [len(row[i]) for row in rows]) for i in range(3)]
    line = "  {:<%d}  {:>%d}  {:<%d}  {}" % tuple(widths)
    out = [report.path, line.format(*header)]
    out += [line.format(*row) for row in rows]
    if not rows:
        out.append("  (no exercises expected or recorded)")
    out.append(line.format("total", f"{_points(report.total)}/{_points(report.max_total)}", "", ""))
    for problem in report.errors:
        where = "notebook" if problem.cell is None else f"cell {problem.cell}"
        out.append(f"  ! {where} ({problem.kind}): {problem.message}")
    return "\n".join(out)


def to_json(reports: list[NotebookReport]) -> dict:
    return {
        "notebooks": [report.to_dict() for report in reports],
        "total": sum(report.total for report in reports),
        "max_total": sum(report.max_total for report in reports),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashlib.grade",
        description="Grade flashlib exercise notebooks. The notebooks are run, never changed.",
    )
    parser.add_argument("target", help="a notebook, or a folder: every *.ipynb in it is graded")
    parser.add_argument("--json", metavar="FILE", help="also write the scores as JSON to FILE")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"time limit per cell (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--notebook-timeout", type=float, default=DEFAULT_NOTEBOOK_TIMEOUT,
                        metavar="SECONDS", help=f"time limit per notebook (default {DEFAULT_NOTEBOOK_TIMEOUT:g})")
    parser.add_argument("--kernel-name", default="python3",
                        help="Jupyter kernel to run the notebooks in (default python3: this Python)")
    args = parser.parse_args(argv)

    target = Path(args.target)
    if target.is_dir():
        notebooks = sorted(target.glob("*.ipynb"))
        if not notebooks:
            parser.error(f"NOTEBOOK_OR_FOLDER: no *.ipynb files in folder {args.target!r}")
    elif target.is_file() and target.suffix == ".ipynb":
        notebooks = [target]
    elif target.exists():
        parser.error(f"NOTEBOOK_OR_FOLDER: expected an .ipynb file or a folder, got {args.target!r}")
    else:
        parser.error(f"NOTEBOOK_OR_FOLDER: {args.target!r} does not exist")
    if args.timeout <= 0 or args.notebook_timeout <= 0:
        parser.error(f"--timeout and --notebook-timeout must be positive, got "
                     f"{args.timeout:g} and {args.notebook_timeout:g}")
    try:
        KernelSpecManager().get_kernel_spec(args.kernel_name)
    except NoSuchKernel:
        parser.error(f"--kernel-name: no Jupyter kernel named {args.kernel_name!r} is installed")

    registry = load_registry()
    reports = []
    for notebook in notebooks:
        report = grade_notebook(notebook, args.timeout, args.notebook_timeout, args.kernel_name, registry)
        print(format_report(report), flush=True)
        print(flush=True)
        reports.append(report)
    summary = to_json(reports)
    print(f"grand total: {_points(summary['total'])}/{_points(summary['max_total'])} "
          f"({len(reports)} notebook(s))")
    if args.json:
        json_path = Path(args.json)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
