"""A whole class at once: one folder per learner, graded into one gradebook (``--jobs N``: N learners at a time).

``python -m flashlib.grade submissions/ --learners --csv grades.csv`` grades every
subfolder of ``submissions/`` as one learner's submission (its ``*.ipynb`` files, as
:func:`flashlib.course.grader.grade` does for a single folder), prints each
learner's score tables, then one line per learner, and writes the gradebook:

* CSV: a row per learner, a column per course notebook (its points, empty where the
  learner handed in none), the total, the course's maximum and notes (a notebook
  missing, not scored, or with warnings for the instructor to read);
* JSON: every learner's full report, as the single-learner ``--json`` writes it.

Every learner is scored out of the whole course, so a missing notebook costs its
points. While one learner's code runs, the whole class folder is hidden from it
(``bwrap`` sandbox), not only that learner's own folder.
"""
from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from . import grader, registry


@dataclasses.dataclass
class LearnerResult:
    """One learner's reports (empty when their folder held no notebook, or is a symbolic link)."""

    learner: str
    reports: list[grader.NotebookReport]
    linked: bool = False  # the folder is a symbolic link (perhaps to another learner's): not graded

    @property
    def total(self) -> float:
        return sum(report.total for report in self.reports)

    def points_of(self, notebook: str) -> float | None:
        """Points of a course notebook; None when no scored submission of it is here."""
        scored = [report for report in self.reports if report.notebook == notebook and report.counted]
        return scored[0].total if scored else None

    def notes(self) -> list[str]:
        """What the instructor should look at: missing or unscored notebooks, and warnings."""
        notes = []
        handed_in = {report.notebook for report in self.reports}
        missing = [key for key in registry.notebooks() if key not in handed_in]
        if self.linked:
            notes.append("the folder is a symbolic link: not graded")
        elif not self.reports:
            notes.append("no notebooks")
        elif missing:
            notes.append("missing " + ", ".join(missing))
        for report in self.reports:
            name = Path(report.path).name
            if not report.counted:
                notes.append(f"{name}: {report.status}, not scored")
            elif report.warnings:
                notes.append(f"{name}: {len(report.warnings)} warning(s)")
        return notes


def course_max_total() -> float:
    """The points of the whole course: what every learner is scored out of."""
    return float(sum(registry.max_points(key) for key in registry.notebooks()))


def find_learners(root: Path) -> list[tuple[str, list[Path], bool]]:
    """Every subfolder of ``root`` (hidden ones left out), sorted by name: (learner, notebooks, linked). A folder
    that is a symbolic link (perhaps to another learner's) is ``linked``, with no notebooks: it is never read."""
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    return [(grader.display_path(folder.name), [] if folder.is_symlink() else grader.find_notebooks(folder),
             folder.is_symlink()) for folder in folders]


def _grade_learner(name: str, notebooks: list[Path], options: dict) -> LearnerResult:
    return LearnerResult(name, grader.grade(notebooks, **options) if notebooks else [])


def grade_class(root: str | Path, hide: list[str | Path] = (), jobs: int = 1, **options) -> list[LearnerResult]:
    """Grade each learner folder under ``root`` (options as :func:`grader.grade`); ``root`` is hidden from all.

    ``jobs`` > 1 grades that many learners at once (:func:`grader.side_by_side`).
    """
    root = Path(root).resolve()
    options = dict(options, hide=[root, *hide])
    learners = find_learners(root)
    calls = [(name, notebooks, options) for name, notebooks, linked in learners if not linked]
    graded = iter(grader.side_by_side(_grade_learner, calls, jobs, options.get("mode")))
    return [LearnerResult(name, [], linked=True) if linked else next(graded) for name, _, linked in learners]


def gradebook_rows(results: list[LearnerResult]) -> list[dict]:
    """One row per learner: the points of every course notebook, the total, the maximum and the notes."""
    out_of = course_max_total()
    rows = []
    for result in results:
        row = {"learner": result.learner}
        for key in registry.notebooks():
            points = result.points_of(key)
            row[key] = "" if points is None else grader.format_points(points)
        row.update(total=grader.format_points(result.total), max_total=grader.format_points(out_of),
                   notes="; ".join(result.notes()))
        rows.append(row)
    return rows


def write_csv(results: list[LearnerResult], path: Path) -> None:
    rows = gradebook_rows(results)
    fields = ["learner", *registry.notebooks(), "total", "max_total", "notes"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def to_json(results: list[LearnerResult]) -> dict:
    return {"max_total": course_max_total(),
            "learners": [{"learner": r.learner, **grader.to_json(r.reports), "max_total": course_max_total(),
                          "notes": r.notes()} for r in results]}


def summary_lines(results: list[LearnerResult]) -> list[str]:
    """The class at a glance: a line per learner, as printed after the score tables."""
    out_of = grader.format_points(course_max_total())
    width = max([len("learner")] + [len(r.learner) for r in results])
    lines = [f"{'learner':<{width}}  points  notes"]
    for result in results:
        notes = "; ".join(result.notes())
        lines.append(f"{result.learner:<{width}}  {grader.format_points(result.total):>3}/{out_of}  {notes}".rstrip())
    return lines
