"""What an answer may use: the rules that keep an answer the learner's own work.

The grader runs only the learner's answer regions, inside the course's own cells
(:mod:`flashlib.course.answers`), and every region sits inside a function body, a
kernel or a method. Read statically (with :mod:`ast`, before anything runs), a
region is refused when it

* imports anything, or declares ``global``/``nonlocal`` (an answer uses what the
  notebook imported, and defines nothing outside its function);
* touches a global name, a dunder or an attribute that starts with ``_`` (Python's internals:
  ``__import__``, ``__globals__``, ``__class__``, ``_judge``, ...);
* names a way out of the answer (``eval``, ``open``, ``os``, ``getattr``, ``super``,
  ...: :data:`~flashlib.course.registry.ALWAYS_FORBIDDEN`), or reaches one as an
  attribute (``torch.sys.modules``: :data:`~flashlib.course.registry.ESCAPE_ATTRIBUTES`),
  names, as a name or an attribute, a function that finds code by a string or runs it
  (``operator.attrgetter``, ``pkgutil.resolve_name``, ``.exec``:
  :data:`~flashlib.course.registry.STRING_ACCESS`), SDPA as an attribute, or
  what the exercise forbids (its finished implementation, ``softmax`` where the
  exercise is to write one: ``Exercise.forbidden``, as names or attributes, and in any
  case and with or without underscores, so that the class ``torch.nn.Softmax`` goes with
  the function ``softmax``: :func:`same_name`; a long forbidden name inside a longer one
  read from outside the answer, ``torch.nn.AdaptiveLogSoftmaxWithLoss`` for ``softmax``:
  :func:`holds_name`);
* follows an attribute chain from a name the notebook imported (``torch``, ``tl``, ``F``,
  ``math``) to a module outside the course's own (``torch.functional.operator``,
  ``tl.core.typing``): the chain is followed, without running anything, on the very
  modules the grader holds (:class:`flashlib.course.reach.Chains`), so one rule closes every route through a
  standard-library module that a library happens to import, while methods of the
  answer's own values (``x.copy()``, ``x.select(...)``) stay free. The same rule keeps
  an answer from holding a module as a value (``m = torch.functional``), which would let
  a later ``m.operator`` pass unread;
* uses a name that a given cell bound to flashlib (``from flashlib.x import y``),
  unless the exercise is about using it (``Exercise.uses_flashlib``);
* reads a global that no cell of the course's notebook binds, nor a builtin (``math`` where the notebook
  imports none): the grader runs only the course's cells and the answers, so a name that a learner's own cell
  imported would be missing there, and the answer would pass the notebook's check but not the grader;
* assigns to an attribute of anything but ``self`` (no monkey-patching; loop, ``with`` and comprehension
  targets count), or binds the
  name ``self`` itself (``self = torch``, a nested ``def f(self)``, ``for self in``), which
  would make any object ``self`` and let ``self.exp = ...`` patch it;
* lacks a call the exercise asks for (``flash_attention`` in notebook 08) or uses
  the ``@`` operator where attention must not be written by hand.

The rules on names judge the globals an answer reads. Its own local variables and helpers (bound in its
function) hold only what the answer put there, which is judged where it is put, so they may have any name but a
dunder: ``softmax = e / e.sum(-1, keepdim=True)`` or ``def _scores(q, k)`` is the learner's own work.

These rules are about whose work an answer is. Keeping hostile code from harming
the machine is the sandbox's job (:mod:`flashlib.course.sandbox`), which holds
whatever these rules miss.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import linecache
import re

from . import answers, reach, registry


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why an answer is not accepted: the line and what is wrong there."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def describe(refusals: list[Refusal]) -> str:
    """The feedback of a refused answer, as the grader and the notebook's check cell both give it."""
    lines: dict[str, list[int]] = {}  # one message once, with every line it applies to
    for refusal in refusals:
        lines.setdefault(refusal.message, []).append(refusal.line)
    said = [f"line{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}: {message}" for message, at in lines.items()]
    more = f" (and {len(said) - 3} more)" if len(said) > 3 else ""
    return "answer refused: " + "; ".join(said[:3]) + more


def refusals_in_notebook(exercise: registry.Exercise, learner) -> list[Refusal]:
    """The refusals of the answer regions in the notebook cell that defines ``learner`` (a function, a Triton
    kernel or a class), read from the cell's source as Jupyter keeps it, so that the check cell refuses what
    the grader will refuse. [] where the source cannot be found (code not typed into a cell), or where it has no
    answer markers and is not the exercise's own function typed into a notebook cell. That one is refused: the grader reads the answer only from between the markers of the exercise's own cell, so
    it would not see this code (session 72's audit: a function redefined in a scratch cell got the check's tick
    and the grader's "not attempted"). Any other function is the notebook's to show a check with (notebook 00
    gives one with a wrong scale to show the check's diagnosis).
    The given cells are the course's (:func:`~flashlib.course.answers.course_cells`), as the grader reads them;
    where the record lacks the notebook, they are taken to import what the course's notebooks import."""
    code = _code_of(learner)
    source = "".join(linecache.getlines(code.co_filename)) if code is not None else ""
    lines = source.split("\n")
    pairs = answers.marker_pairs(lines)
    if isinstance(pairs, str):  # markers out of order: the grader reports that, not these rules
        return []
    name = getattr(getattr(learner, "fn", learner), "__name__", None)
    if not pairs and source and is_notebook_cell(code.co_filename) and name == exercise.answer:
        return [Refusal(code.co_firstlineno, f"`{name}` comes from a cell without this exercise's answer markers: "
                                             "the grader reads the answer only between BEGIN YOUR ANSWER and END "
                                             "YOUR ANSWER in the exercise's own cell, so it would not see this "
                                             "code; write it there and run that cell")]
    regions = [(begin + 2, end) for begin, end in pairs  # 1-based lines between the markers
               if not answers.is_unattempted("\n".join(lines[begin + 1:end]))]
    if not regions:
        return []
    course = answers.course_cells(exercise.notebook)
    if course is not None:  # the grader's own view: the course's cells, not what the learner's kernel holds
        given_sources, names = course
        return check_answer(exercise, source, regions, flashlib_names(given_sources), given_sources=given_sources,
                            notebook_names=names)
    module_globals = getattr(getattr(learner, "fn", learner), "__globals__", None) or {}
    given = {name for name, value in module_globals.items()
             if (getattr(value, "__module__", None) or getattr(value, "__name__", "") or "").startswith("flashlib")}
    return check_answer(exercise, source, regions, given)


def is_notebook_cell(filename: str) -> bool:
    """Whether code compiled from ``filename`` was typed into a Jupyter cell: ipykernel names a cell's file
    ``.../ipykernel_<pid>/<hash>.py``, older IPython ``<ipython-input-<n>-<hash>>``."""
    return (re.search(r"ipykernel_\d+[/\\]\d+\.py$", filename) is not None
            or filename.startswith("<ipython-input-"))


def _code_of(learner):
    """The code object of a learner's function, of a Triton kernel's Python function, or of a class's first
    method: its file is the notebook cell."""
    target = getattr(learner, "fn", learner)
    if isinstance(target, type):
        return next((value.__code__ for value in vars(target).values() if hasattr(value, "__code__")), None)
    return getattr(target, "__code__", None)


def flashlib_names(given_sources: list[str]) -> set[str]:
    """Names the given cells bind to flashlib (imports of flashlib or its modules)."""
    names = set()
    for source in given_sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "flashlib":
                names.update(alias.asname or alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "flashlib":
                        names.add(alias.asname or alias.name.split(".")[0])
    return names


def same_name(name: str, forbidden: str) -> bool:
    """Whether ``name`` is ``forbidden`` spelled otherwise: the same letters, in any case, with or without
    underscores. ``Softmax`` is ``softmax`` and ``LogSoftmax`` is ``log_softmax`` (torch's class beside its
    function); ``Softmax2d`` or ``softmin`` are not (an exercise lists those it forbids as well). Only
    equality: a prefix would refuse ``expand`` where ``exp`` is forbidden.

    Applied to what an exercise forbids and to SDPA, never to ALWAYS_FORBIDDEN's short names, where
    ``np`` would refuse a learner's ``n_p``.
    """
    return _spelling(name) == _spelling(forbidden)


#: The shortest forbidden name that :func:`holds_name` looks for inside longer ones.
HELD_NAME_LETTERS = 7


def holds_name(name: str, forbidden: str) -> bool:
    """Whether ``name`` holds ``forbidden`` inside it, spelled as :func:`same_name` reads it, where ``forbidden``
    has at least :data:`HELD_NAME_LETTERS` letters: ``AdaptiveLogSoftmaxWithLoss`` holds ``softmax``, and its
    ``log_prob`` does the max subtraction an exercise on softmax asks the learner to write. A deny list of exact
    names misses such a class (session 72's audit). Applied only to what an answer reads from outside itself
    (attributes, the notebook's names), never to its own locals; shorter names (``torch``, ``grad``) stay exact,
    where ``grad`` inside ``gradient`` would refuse too much.
    """
    held = _spelling(forbidden)
    return len(held) >= HELD_NAME_LETTERS and held in _spelling(name) and held != _spelling(name)


def _spelling(name: str) -> str:
    return name.lower().replace("_", "")


def _enclosing_function(tree: ast.AST, first: int, last: int) -> ast.AST | None:
    """The innermost function whose body holds lines first..last."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body_start = node.body[0].lineno
            if body_start <= first and last <= node.end_lineno:
                if best is None or node.lineno > best.lineno:
                    best = node
    return best


def _in_region(node: ast.AST, regions) -> bool:
    line = getattr(node, "lineno", None)
    return line is not None and any(first <= line <= last for first, last in regions)


def check_answer(exercise: registry.Exercise, source: str, regions: list[tuple[int, int]],
                 given_flashlib: set[str], *, given_sources: list[str] | None = None,
                 notebook_names: set[str] | None = None) -> list[Refusal]:
    """The refusals for the answer regions (1-based line ranges) of one rebuilt cell; [] if accepted.

    ``given_flashlib`` is :func:`flashlib_names` of the given cells. ``given_sources`` are those cells'
    sources themselves (the same list), from which the names they import are read
    (:func:`~flashlib.course.reach.given_imports`) for the rule on modules; left out, the course's usual
    imports (:data:`~flashlib.course.reach.COURSE_IMPORTS`) stand in for them. Imports in the cell itself,
    outside the regions, count too. ``notebook_names`` are the global names the course's cells of the notebook
    bind (:func:`~flashlib.course.answers.names_bound`): given, an answer that reads any other global (but a
    builtin) is refused, since the grader runs no cell of the learner's own; left out, that rule is off.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return [Refusal(error.lineno or 0, f"the cell does not parse: {error.msg}")]
    except (RecursionError, MemoryError):  # Python's parser on 100 000 nested additions
        return [Refusal(regions[0][0] if regions else 0, "the answer is nested too deeply to be read: "
                                                          "write it in shorter expressions")]
    refusals: list[Refusal] = []
    for first, last in regions:
        if last < first:
            continue
        if _enclosing_function(tree, first, last) is None:
            refusals.append(Refusal(first, "the answer must stay inside its function's body"))
    allowed = set(exercise.uses_flashlib)
    forbidden = (set(registry.ALWAYS_FORBIDDEN) | set(registry.STRING_ACCESS) | set(exercise.forbidden)) - allowed
    forbidden_attributes = ((set(registry.ALWAYS_FORBIDDEN_ATTRIBUTES) | set(registry.ESCAPE_ATTRIBUTES)
                             | set(registry.STRING_ACCESS) | set(exercise.forbidden)) - allowed)
    # Spelled differently, the same thing: `Softmax` for `softmax`, `LogSoftmax` for `log_softmax`.
    spellings = {_spelling(name): name for name in (*registry.ALWAYS_FORBIDDEN_ATTRIBUTES, *exercise.forbidden)
                 if name not in allowed}
    forbidden_flashlib = set(given_flashlib) - allowed
    imports = dict(reach.COURSE_IMPORTS if given_sources is None else reach.given_imports(given_sources))
    imports.update(reach.given_imports([source]))
    class_bound: set[int] = set()  # reads in a class body of names the class binds: maybe the class's own
    reads = reach.global_reads(tree, class_bound)
    # What the answer may read as a global: what the course's cells bind (this one as the course wrote it), and
    # Python's builtins. A name bound only by a cell of the learner's own, or by lines the learner added to this
    # cell outside the markers, is not there when the grader runs the answer: the check cell, which reads the
    # learner's cell as edited, once counted the latter (session 72's audit).
    defined = (None if notebook_names is None else set(notebook_names) | (set(dir(builtins)) - _JUPYTER_BUILTINS))
    chains = reach.Chains({name: binding for name, binding in imports.items()
                           if name not in forbidden | forbidden_flashlib and _spelling(name) not in spellings},
                          reads)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    called = set()
    for node in ast.walk(tree):
        if not _in_region(node, regions):
            continue
        line = node.lineno
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            refusals.append(Refusal(line, "imports are not allowed in an answer: use what the notebook "
                                          "imported"))
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            refusals.append(Refusal(line, f"`{type(node).__name__.lower()}` is not allowed in an answer: "
                                          "keep your code inside the function"))
        elif _binds_self(node):
            refusals.append(Refusal(line, "rebinding `self` is not allowed in an answer: `self` is the object "
                                          "the method was called on, the only one whose attributes an "
                                          "answer may set"))
        elif isinstance(node, (ast.Name, ast.Attribute)):
            is_name = isinstance(node, ast.Name)
            word, shown = (node.id, f"`{node.id}`") if is_name else (node.attr, f"`.{node.attr}`")
            own = is_name and id(node) not in reads  # a local of the answer's own (bound or read in its scope)
            if own and not word.startswith("__"):
                continue
            if word.startswith("_") and word != "_":
                refusals.append(Refusal(line, f"{shown}: {'names' if is_name else 'attributes'} starting with _ "
                                              "are not allowed in an answer"))
            elif is_name and word in forbidden_flashlib:
                refusals.append(Refusal(line, f"{shown} is flashlib's finished code: the exercise is to "
                                              "write it yourself"))
            elif word in (forbidden if is_name else forbidden_attributes):
                refusals.append(Refusal(line, f"{shown} is not allowed in this answer" + _why(word, exercise)))
            elif _spelling(word) in spellings:
                name = spellings[_spelling(word)]
                refusals.append(Refusal(line, f"{shown} is not allowed in this answer (it is `{name}` "
                                              "by another spelling)" + _why(name, exercise)))
            elif held := [name for name in exercise.forbidden if name not in allowed and holds_name(word, name)]:
                refusals.append(Refusal(line, f"{shown} is not allowed in this answer (it holds `{held[0]}`, "
                                              "which this exercise forbids)" + _why(held[0], exercise)))
            elif (is_name and defined is not None and id(node) in reads and id(node) not in class_bound
                  and word not in defined):
                refusals.append(Refusal(line, f"{shown} is not defined by the notebook's cells: the grader runs only "
                                              "those and the answers, so a name imported or defined in a cell of "
                                              "your own is missing there (use what the notebook imports, e.g. "
                                              "float('-inf') for -math.inf)"))
            else:
                refusals += [Refusal(*problem) for problem in chains.problems_of(node, parents.get(node))]
        elif (targets := _store_targets(node)) is not None:
            for target in targets:
                for sub in _stored(target):
                    if isinstance(sub, ast.Attribute) and not (isinstance(sub.value, ast.Name)
                                                               and sub.value.id == "self"):
                        refusals.append(Refusal(line, "assigning to attributes of other objects is not "
                                                      "allowed in an answer (only self.x = ...)"))
                        break
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and exercise.no_matmul_operator:
            refusals.append(Refusal(line, "`@`: this exercise is to call flashlib's attention, not to "
                                          "write attention by hand"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            called.add(node.func.id)
    for name in exercise.required_calls:
        if name not in called and not any(r.message.startswith("the cell does not parse") for r in refusals):
            line = regions[0][0] if regions else 0
            refusals.append(Refusal(line, f"the answer must call `{name}` (by that name)"))
    return _unique(refusals)


#: What IPython adds to builtins in a kernel: there in the check cell, not in the grader's worker.
_JUPYTER_BUILTINS = {"display", "get_ipython", "__IPYTHON__"}


def _store_targets(node: ast.AST) -> list[ast.AST] | None:
    """The targets that ``node`` stores into (an assignment, ``del``, a loop, ``with ... as``, a comprehension);
    None for any other node."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        return [node.target]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [item.optional_vars for item in node.items if item.optional_vars is not None]
    if isinstance(node, reach.COMPREHENSIONS):
        return [generator.target for generator in node.generators]
    return None


def _binds_self(node: ast.AST) -> bool:
    """Whether ``node`` gives the name ``self`` a value: an assignment, a loop or ``with`` target, a
    parameter of a nested function or lambda, ``except ... as self``, a ``match`` capture.

    The one attribute assignment an answer may make is ``self.x = ...``; were ``self`` rebindable,
    ``self = torch`` then ``self.exp = ...`` would patch anything.
    """
    if isinstance(node, ast.Name):
        return node.id == "self" and not isinstance(node.ctx, ast.Load)
    if isinstance(node, ast.arg):
        return node.arg == "self"
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return node.name == "self"
    return False


def _why(name: str, exercise: registry.Exercise) -> str:
    if name == "torch" and exercise.kind == registry.KERNEL:
        return ": a kernel's answer is Triton code (tl.*) on the kernel's own pointers"
    if name in registry.HAND_ATTENTION and exercise.required_calls:
        return ": this exercise is to call flashlib's attention, not to write attention by hand"
    if name in exercise.forbidden and exercise.required_calls:
        calls = ", ".join(f"`{call}`" for call in exercise.required_calls)
        return f": the answer must call {calls} itself, not another route to attention"
    if name in exercise.forbidden:
        return ": it would do the exercise for you"
    if name == "type":
        return ": `type(x)` leads to any class's internals; use `x.dtype`, or `isinstance`"
    if name in registry.STRING_ACCESS:
        return ": it finds or runs code from a string (or loads native code), out of the rules' sight"
    return ": it reaches outside the answer"


def _unique(refusals: list[Refusal]) -> list[Refusal]:
    seen, out = set(), []
    for refusal in sorted(refusals, key=lambda r: r.line):
        if (refusal.line, refusal.message) not in seen:
            seen.add((refusal.line, refusal.message))
            out.append(refusal)
    return out


def _stored(target: ast.AST):
    """The nodes a target stores into: through tuples and starred names, and a subscript's object (its index
    is only read, and the rules on names and attributes read it like any other expression)."""
    stack = [target]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Tuple, ast.List)):
            stack += node.elts
        elif isinstance(node, ast.Starred):
            stack.append(node.value)
        elif isinstance(node, ast.Subscript):
            stack.append(node.value)
        else:
            yield node
            if isinstance(node, ast.Attribute):
                stack.append(node.value)
