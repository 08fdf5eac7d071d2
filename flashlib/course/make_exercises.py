"""Make the learners' exercise notebooks from the solution notebooks.

``solutions/`` is the only source: every code cell's learner part sits between a
``### BEGIN SOLUTION`` line and a ``### END SOLUTION`` line. The generated copy in
``exercises/`` has each such region's answer replaced by one line, between two
markers at the BEGIN line's indentation that show the learner what is graded::

    ### BEGIN YOUR ANSWER (graded: only the lines between these two markers count)
    raise NotImplementedError("Exercise: write your code here")
    ### END YOUR ANSWER

or, when the BEGIN line reads ``### BEGIN SOLUTION stub: <code>``, ``<code>`` in
place of the ``raise`` (a ``raise`` would not compile inside a ``@triton.jit``
kernel). The grader takes exactly those regions from a learner's notebook
(:mod:`flashlib.course.answers`). Everything else is
kept as it is, except what comes from running the notebook: outputs, execution
counts, nbclient's timing metadata and saved widget state. The output is
byte-for-byte deterministic, so a test can tell when ``exercises/`` drifts::

    python -m flashlib.course.make_exercises [SRC=solutions] [DST=exercises] [--check]
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import warnings
from pathlib import Path

import nbformat
from nbformat.validator import MissingIDFieldWarning

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
PLACEHOLDER = 'raise NotImplementedError("Exercise: write your code here")'
ANSWER_BEGIN = "### BEGIN YOUR ANSWER (graded: only the lines between these two markers count)"
ANSWER_END = "### END YOUR ANSWER"
_STUB = re.compile(r"### BEGIN SOLUTION stub: (?P<code>\S.*)$")


class MarkerError(ValueError):
    """A solution cell whose BEGIN/END SOLUTION markers do not pair up."""


def _replacement(marker: str, where: str) -> str:
    """The code a BEGIN line asks for: the placeholder, or its stub."""
    if marker == BEGIN:
        return PLACEHOLDER
    stub = _STUB.match(marker)
    if stub is None:
        raise MarkerError(
            f"{where}: expected '{BEGIN}' or '{BEGIN} stub: <code>', got {marker!r}"
        )
    return stub.group("code").rstrip()


def replace_solutions(source: str, where: str = "cell") -> str:
    """``source`` with every solution region replaced; ``where`` names the cell in errors."""
    lines = source.split("\n")
    out: list[str] = []
    begin_line = None  # 1-based line of the open BEGIN marker
    for number, line in enumerate(lines, start=1):
        marker = line.strip()
        if marker.startswith(BEGIN):
            if begin_line is not None:
                raise MarkerError(
                    f"{where}, line {number}: '{BEGIN}' inside the region opened at line "
                    f"{begin_line} (expected '{END}' first)"
                )
            begin_line = number
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + ANSWER_BEGIN)
            out.append(indent + _replacement(marker, f"{where}, line {number}"))
            out.append(indent + ANSWER_END)
        elif marker.startswith(END):
            if begin_line is None:
                raise MarkerError(f"{where}, line {number}: '{END}' without a '{BEGIN}' before it")
            if marker != END:
                raise MarkerError(f"{where}, line {number}: expected '{END}', got {marker!r}")
            begin_line = None
        elif begin_line is None:
            out.append(line)
    if begin_line is not None:
        raise MarkerError(f"{where}, line {begin_line}: '{BEGIN}' is never closed by '{END}'")
    return "\n".join(out)


def make_exercise_notebook(nb: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """A new exercise notebook from solution notebook ``nb`` (which is left unchanged).

    ``name`` is used in error messages, which say notebook, cell index and line.
    """
    exercise = copy.deepcopy(nb)
    for index, cell in enumerate(exercise.cells):
        if cell.cell_type != "code":
            continue
        cell.source = replace_solutions(cell.source, f"{name}: cell {index}")
        cell.outputs = []
        cell.execution_count = None
        cell.metadata.pop("execution", None)  # nbclient's timestamps: output, not content
    exercise.metadata.pop("widgets", None)  # saved widget state is output too
    return exercise


def render(nb: nbformat.NotebookNode) -> str:
    """The exact text written for ``nb`` (nbformat's JSON layout, one final newline)."""
    text = nbformat.writes(nb, version=nbformat.NO_CONVERT)
    return text if text.endswith("\n") else text + "\n"


def read_solution(path: Path) -> nbformat.NotebookNode:
    """Read a solution notebook; cells saved without an id get a stable one.

    (nbformat would invent random ids for them, and the output would change every run.)
    """
    text = path.read_text(encoding="utf-8")
    raw_cells = json.loads(text).get("cells", [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingIDFieldWarning)
        nb = nbformat.reads(text, as_version=4)
    for index, (raw, cell) in enumerate(zip(raw_cells, nb.cells)):
        if "id" not in raw and "id" in cell:
            cell.id = f"cell-{index}"
    return nb


def check_against_registry(exercise: nbformat.NotebookNode, key: str) -> None:
    """MarkerError unless the notebook's answer cells are exactly the registry's exercises of ``key``.

    The grader finds answers through the registry (the name each exercise cell
    defines); a solution whose cells and the registry disagree would grade wrongly.
    """
    from . import answers, registry

    if key not in registry.notebooks():
        return
    try:
        found = {cell.exercise for cell in answers.take_answers(exercise, exercise, key).cells
                 if cell.kind == answers.ANSWER}
    except ValueError as error:
        raise MarkerError(str(error)) from None
    wanted = {e.key for e in registry.exercises_of(key)}
    if found != wanted:
        raise MarkerError(f"{key}: the registry lists {sorted(wanted)}, the notebook's answer cells "
                          f"define {sorted(found)}")


def _expected(src: Path) -> dict[str, str]:
    """File name → exercise text for every solution notebook in ``src``."""
    expected = {}
    for path in sorted(src.glob("*.ipynb")):
        solution = read_solution(path)
        exercise = make_exercise_notebook(solution, str(path))
        check_against_registry(exercise, path.stem)
        expected[path.name] = render(exercise)
    return expected


#: The course's generated exercise notebooks, beside the package: the grader's canonical notebooks by default.
EXERCISES_DIR = Path(__file__).resolve().parents[2] / "exercises"
#: What the check cells read of the course's notebooks (:func:`flashlib.course.answers.course_cells`): written
#: here with the exercises, since a learner edits ``exercises/`` itself.
COURSE_CELLS = Path(__file__).with_name("course_cells.json")


def course_cells_record(expected: dict[str, str]) -> str:
    """The text of :data:`COURSE_CELLS` for the generated exercise notebooks ``expected`` (file name → text):
    each notebook's given cells and the names an answer may read, as the grader reads them."""
    from . import answers  # answers imports this module's markers

    record = {}
    for name, text in sorted(expected.items()):
        key = name.removesuffix(".ipynb")
        cells = answers.canonical_cells(nbformat.reads(text, as_version=4), key)
        record[key] = {"given_sources": [cell.source for cell in cells if cell.kind != answers.ANSWER],
                       "names": sorted(answers.names_an_answer_may_read(cells))}
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def sync(src: str | Path, dst: str | Path, check: bool = False, record: Path | None = None) -> list[str]:
    """Bring ``dst`` in line with ``src``; return what was (or, with ``check``, would be) changed.

    Every notebook is generated before anything is written, so a marker error leaves
    ``dst`` untouched. With ``check=True`` nothing is written; an empty list means
    ``dst`` is up to date. ``record`` (the command line's :data:`COURSE_CELLS`) is kept up to date too.
    """
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise ValueError(f"src: expected a folder of solution notebooks, got {str(src)!r}")
    expected = _expected(src)
    existing = {path.name for path in dst.glob("*.ipynb")} if dst.is_dir() else set()
    problems = []
    writes = {}
    for name, text in expected.items():
        target = dst / name
        if name not in existing:
            problems.append(f"{target}: missing (generate it from {src / name})")
            writes[name] = text
        elif target.read_bytes() != text.encode("utf-8"):
            problems.append(f"{target}: stale (differs from what {src / name} generates)")
            writes[name] = text
    extra = sorted(existing - set(expected))
    problems += [f"{dst / name}: extra (no {src / name})" for name in extra]
    record_text = course_cells_record(expected) if record is not None else None
    if record is not None and (not record.is_file() or record.read_text(encoding="utf-8") != record_text):
        problems.append(f"{record}: stale (the given cells of {dst} differ)")
    if not check:
        dst.mkdir(parents=True, exist_ok=True)
        for name, text in writes.items():
            (dst / name).write_bytes(text.encode("utf-8"))
        for name in extra:
            (dst / name).unlink()
        if record_text is not None:
            record.write_text(record_text, encoding="utf-8")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashlib.course.make_exercises",
        description="Generate exercise notebooks from solution notebooks.",
    )
    parser.add_argument("src", nargs="?", default="solutions", help="solution notebooks (default: solutions)")
    parser.add_argument("dst", nargs="?", default="exercises", help="exercise notebooks (default: exercises)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if DST is not up to date")
    args = parser.parse_args(argv)
    if not Path(args.src).is_dir():
        parser.error(f"SRC: expected a folder of solution notebooks, got {args.src!r}")
    try:
        course = Path(args.dst).resolve() == EXERCISES_DIR  # the course's own exercises: keep their record
        problems = sync(args.src, args.dst, check=args.check, record=COURSE_CELLS if course else None)
    except MarkerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.check:
        if problems:
            print(f"{args.dst} is not up to date with {args.src}:", file=sys.stderr)
            for problem in problems:
                print(f"  {problem}", file=sys.stderr)
            print(f"run: python -m flashlib.course.make_exercises {args.src} {args.dst}", file=sys.stderr)
            return 1
        print(f"{args.dst} is up to date with {args.src}")
        return 0
    for problem in problems:
        print(f"fixed: {problem}")
    print(f"{args.dst} is up to date with {args.src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
