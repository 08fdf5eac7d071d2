"""Take a learner's answers out of their notebook, and put them back into the course's own.

A learner may write only between the answer markers that the exercise generator
leaves in each exercise cell (``### BEGIN YOUR ANSWER ...`` / ``### END YOUR
ANSWER``; a solution notebook's ``### BEGIN SOLUTION`` / ``### END SOLUTION`` count
too, so that solutions grade like answers). The grader therefore never runs the
learner's notebook: it rebuilds the canonical exercise notebook with the learner's
regions in it (:func:`take_answers`), and everything else (imports, given code, the
check cells) is the course's own. Changes outside the regions are not run; they
come back as warnings for the instructor.

Cells are matched by their id (Jupyter keeps ids), else by the name the exercise
cell defines. This module imports no torch.

A given cell tagged ``demo`` in the course's notebook shows an answer at work for the
learner (a figure, a comparison with the library); the grader does not run it, since
no verdict depends on it. Nothing after a demo cell may use a name it binds or
changes (:func:`demo_names_used_later` finds any; a test holds every notebook to it),
and a demo cell whose names a learner's answer reads does run
(:func:`demo_cells_read_by`), so that the grader's verdict stays the notebook's.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import json
import re
import symtable

import nbformat

from . import registry
from .make_exercises import ANSWER_BEGIN, ANSWER_END, BEGIN, COURSE_CELLS, END, PLACEHOLDER

GIVEN, ANSWER, CHECK, DEMO = "given", "answer", "check", "demo"
#: The cell tag that makes a given cell a demo: shown to the learner, not run by the grader.
DEMO_TAG = "demo"
_CHECK_CALL = re.compile(r"\bchecks\.check_\w+\s*\(")


def _is_begin(line: str) -> bool:
    text = line.strip()
    return text.startswith(ANSWER_BEGIN.split(" (")[0]) or text.startswith(BEGIN)


def _is_end(line: str) -> bool:
    text = line.strip()
    return text.startswith(ANSWER_END) or text == END


def marker_pairs(lines: list[str]) -> list[tuple[int, int]] | str:
    """(begin, end) line indices of every answer region, or what is wrong with the markers."""
    pairs, begin = [], None
    for index, line in enumerate(lines):
        if _is_begin(line):
            if begin is not None:
                return f"line {index + 1}: a second BEGIN marker before the END of the one at line {begin + 1}"
            begin = index
        elif _is_end(line):
            if begin is None:
                return f"line {index + 1}: an END marker without its BEGIN marker"
            pairs.append((begin, index))
            begin = None
    if begin is not None:
        return f"line {begin + 1}: a BEGIN marker that is never closed"
    return pairs


@dataclasses.dataclass
class Cell:
    """One code cell of the rebuilt notebook.

    ``regions`` are the 1-based, inclusive line ranges of the learner's code in
    ``source`` (answer cells only); ``exercise`` is the exercise id of an answer
    or check cell.
    """

    index: int
    kind: str
    source: str
    exercise: str | None = None
    regions: list[tuple[int, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Submission:
    """The canonical notebook with a learner's answers in it, and what was left out."""

    notebook: str
    cells: list[Cell]
    problems: dict[str, str]  # exercise id -> why its answer could not be taken (scores 0)
    warnings: list[str]

    def answer_cells(self, exercise: str) -> list[Cell]:
        return [cell for cell in self.cells if cell.kind == ANSWER and cell.exercise == exercise]


def _defined_names(source: str) -> set[str]:
    """Top-level functions and classes a cell defines (a cell that does not parse defines none)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _defines(source: str, name: str) -> bool:
    # [ \t] rather than \s: with re.M, \s* would run across newlines from every line start (quadratic in a
    # learner's cell of blank lines)
    return re.search(rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{re.escape(name)}\b", source, re.M) is not None


def canonical_cells(canonical: nbformat.NotebookNode, notebook: str) -> list[Cell]:
    """The canonical notebook's code cells, each marked as given, demo, answer (with its exercise) or check."""
    by_answer = {exercise.answer: exercise.key for exercise in registry.exercises_of(notebook)}
    cells = []
    for index, cell in enumerate(canonical.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        pairs = marker_pairs(cell.source.split("\n"))
        if isinstance(pairs, str):
            raise ValueError(f"canonical notebook {notebook}, cell {index}: {pairs}")
        demo = DEMO_TAG in cell.metadata.get("tags", [])
        if demo and (pairs or _CHECK_CALL.search(cell.source)):
            raise ValueError(f"canonical notebook {notebook}, cell {index}: tagged {DEMO_TAG!r} but holds "
                             f"{'answer markers' if pairs else 'a check'}; the grader must run it")
        if demo:
            cells.append(Cell(index, DEMO, cell.source))
        elif pairs:
            names = [name for name in _defined_names(cell.source) if name in by_answer]
            if len(names) != 1:
                raise ValueError(f"canonical notebook {notebook}, cell {index}: answer markers in a cell "
                                 f"that defines {sorted(names) or 'no'} registered answer(s)")
            cells.append(Cell(index, ANSWER, cell.source, by_answer[names[0]]))
        elif _CHECK_CALL.search(cell.source):
            cells.append(Cell(index, CHECK, cell.source))
        else:
            cells.append(Cell(index, GIVEN, cell.source))
    return cells


def _find_learner_cell(canonical_cell_id, learner_by_id, learner_code, answer_name):
    """The learner's version of a canonical exercise cell: same id, else the cell that defines the answer."""
    cell = learner_by_id.get(canonical_cell_id)
    if cell is not None and cell.cell_type == "code":
        return cell
    for cell in learner_code:
        if _defines(cell.source, answer_name):
            return cell
    return None


def _without_regions(lines: list[str], pairs) -> list[str]:
    """The lines outside the answer regions (markers kept): what the learner should not change."""
    keep, last = [], 0
    for begin, end in pairs:
        keep += lines[last:begin] + ["<answer>"]
        last = end + 1
    return [line.rstrip() for line in keep + lines[last:]]


def _splice(canonical_lines: list[str], canonical_pairs, regions: list[list[str]]):
    """The canonical lines with each region's inside replaced; returns (source, 1-based line ranges)."""
    out, ranges, last = [], [], 0
    for (begin, end), region in zip(canonical_pairs, regions):
        out += canonical_lines[last:begin + 1]
        start = len(out) + 1
        out += region
        ranges.append((start, start + len(region) - 1))
        last = end
    out += canonical_lines[last:]
    return "\n".join(out), ranges


def take_answers(learner: nbformat.NotebookNode, canonical: nbformat.NotebookNode,
                 notebook: str) -> Submission:
    """The canonical exercise notebook ``canonical`` (key ``notebook``) with the learner's answers in it."""
    cells = canonical_cells(canonical, notebook)
    canonical_ids = {index: canonical.cells[index].get("id") for index in range(len(canonical.cells))}
    learner_code = [cell for cell in learner.cells if cell.cell_type == "code"]
    learner_by_id = {cell.get("id"): cell for cell in learner.cells if cell.get("id")}
    problems: dict[str, str] = {}
    warnings: list[str] = []
    used_ids = set()

    for cell in cells:
        cell_id = canonical_ids[cell.index]
        if cell.kind != ANSWER:
            mine = learner_by_id.get(cell_id)
            if mine is not None:
                used_ids.add(cell_id)
                if mine.source.strip() != cell.source.strip():
                    what = "check" if cell.kind == CHECK else "given code"
                    warnings.append(f"cell {cell.index}: the {what} was edited; the grader ran the original")
            elif cell.kind == CHECK:
                warnings.append(f"cell {cell.index}: the check cell is missing; the grader runs its own checks")
            continue
        answer_name = registry.exercise(cell.exercise).answer
        canonical_lines = cell.source.split("\n")
        canonical_pairs = marker_pairs(canonical_lines)
        mine = _find_learner_cell(cell_id, learner_by_id, learner_code, answer_name)
        placeholder_regions = [canonical_lines[b + 1:e] for b, e in canonical_pairs]
        if mine is None:
            problems[cell.exercise] = (f"no cell defines {answer_name!r}: the exercise cell was deleted "
                                       "or its definition renamed")
            regions = placeholder_regions
        else:
            used_ids.add(mine.get("id"))
            lines = mine.source.split("\n")
            pairs = marker_pairs(lines)
            if isinstance(pairs, str) or len(pairs) != len(canonical_pairs):
                why = pairs if isinstance(pairs, str) else (
                    f"found {len(pairs)} answer region(s), expected {len(canonical_pairs)}")
                problems[cell.exercise] = (f"the answer markers in the cell defining {answer_name!r} were "
                                           f"edited ({why}): only code between BEGIN YOUR ANSWER and END YOUR "
                                           "ANSWER is graded; restore the markers")
                regions = placeholder_regions
            else:
                regions = [lines[b + 1:e] for b, e in pairs]
                if _without_regions(lines, pairs) != _without_regions(canonical_lines, canonical_pairs):
                    warnings.append(f"cell {cell.index} ({answer_name}): lines outside the answer markers "
                                    "were changed; the grader used the original lines")
        cell.source, cell.regions = _splice(canonical_lines, canonical_pairs, regions)

    extra = [cell for cell in learner_code if cell.get("id") not in used_ids and cell.source.strip()
             and cell.get("id") not in set(canonical_ids.values())]
    if extra:
        warnings.append(f"{len(extra)} code cell(s) that the exercise does not have were not run "
                        "(only the answer regions count)")
    return Submission(notebook, cells, problems, warnings)


def is_unattempted(region_source: str) -> bool:
    """Whether a region still holds the generator's placeholder (or nothing)."""
    text = "\n".join(line.strip() for line in region_source.split("\n") if line.strip())
    return text in ("", PLACEHOLDER)


def _tables(source: str) -> list[symtable.SymbolTable]:
    """The cell's symbol tables: the module's, then every function's and class's inside it."""
    tables, todo = [], [symtable.symtable(source, "<cell>", "exec")]
    while todo:
        table = todo.pop()
        tables.append(table)
        todo += table.get_children()
    return tables


def _bound_or_changed(source: str) -> set[str]:
    """Global names a cell binds (assignment, import, def, for, with; ``global`` in a function) or changes in
    place (``x.a = ...``, ``x[i] += ...``; counted wherever it is written, to be safe)."""
    names = names_bound([source])
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            base = node.value
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if isinstance(base, ast.Name):
                names.add(base.id)
    return names


@functools.lru_cache(maxsize=None)
def course_cells(notebook: str) -> tuple[list[str], set[str]] | None:
    """(given cell sources, names an answer may read) of the course's notebook ``notebook``, as the grader reads
    them from its canonical notebook; None for a notebook the record does not hold. Read from the record that
    ``make_exercises`` writes with the exercises, never from ``exercises/`` itself, which the learner edits
    (a scratch cell saved there is no cell of the course's)."""
    try:
        entry = json.loads(COURSE_CELLS.read_text(encoding="utf-8")).get(notebook)
    except (OSError, ValueError):
        return None
    return None if entry is None else (list(entry["given_sources"]), set(entry["names"]))


def names_an_answer_may_read(cells: list[Cell]) -> set[str]:
    """The global names that the cells the grader runs may bind: every cell's but the check cells' (the grader
    never runs those)."""
    return names_bound([cell.source for cell in cells if cell.kind != CHECK])


def names_bound(sources: list[str]) -> set[str]:
    """Every global name the cells bind (assignment, import, def, class, for, with; ``global`` in a function):
    what an answer, run among these cells, may read. Cells that do not parse (or nest too deeply for Python's
    parser) bind nothing here."""
    names = set()
    for source in sources:
        try:
            tables = _tables(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # the rules refuse such a cell themselves
            continue
        names |= {symbol.get_name() for table in tables for symbol in table.get_symbols()
                  if (table.get_type() == "module" or symbol.is_declared_global())
                  and (symbol.is_assigned() or symbol.is_imported())}
    return names


def _globals_read(source: str) -> set[str]:
    """Global names a cell reads: at its top level, or inside a function or class where they are not local."""
    return {symbol.get_name() for table in _tables(source) for symbol in table.get_symbols()
            if symbol.is_referenced() and (table.get_type() == "module" or symbol.is_global())}


def demo_names_used_later(canonical: nbformat.NotebookNode, notebook: str) -> list[str]:
    """Each name a demo cell binds or changes that a later cell the grader runs uses ("cell 6 -> cell 11: q").

    Empty when skipping the demo cells changes nothing the graded cells can see by name.
    """
    found, demo_names = [], {}
    for cell in canonical_cells(canonical, notebook):
        if cell.kind == DEMO:
            for name in _bound_or_changed(cell.source):
                demo_names[name] = cell.index
        elif cell.kind != CHECK:
            found += [f"cell {demo_names[name]} -> cell {cell.index}: {name}"
                      for name in sorted(_globals_read(cell.source) & demo_names.keys())]
    return found


def demo_cells_read_by(submission: Submission, sources: list[str]) -> set[int]:
    """The indices of the demo cells that bind or change a global name one of ``sources`` reads.

    A source that does not parse reads nothing (it fails on its own).
    """
    read = set()
    for source in sources:
        try:
            read |= _globals_read(source)
        except SyntaxError:
            continue
    return {cell.index for cell in submission.cells if cell.kind == DEMO and _bound_or_changed(cell.source) & read}
