"""The machinery shared by every exercise check: cases, running the learner's code, judging, hints.

A check is data (:class:`Check`): how to make an exercise's cases with their float64
answers (:class:`Case`), how to call the learner's code on a case, and which
plausible wrong answers to recognise (:class:`Mistake`). Cases are deterministic:
fixed adversarial ones first, then random ones from a generator seeded by the
exercise id, so the notebook and the grader see the same inputs.

Running and judging are two steps, so that they can happen in two processes:
:func:`run_learner` calls the learner's code on every case (in the notebook, or in
the grader's sandbox) and returns plain :class:`Reply` data; :func:`judge`
compares those replies with the reference, where the learner's code cannot reach.
:func:`run_check`, what a notebook's check cell calls, does both in one process and
prints the verdict. It never raises for the learner's mistakes: a check is feedback.

A verdict says *what* is wrong (which case, expected versus got) and, when the
output matches a known wrong answer better than the right one, *why* ("likely
mistake: ..."). A passing verdict holds no number that varies from run to run, so
notebook outputs stay deterministic.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import os
import signal
import sysconfig
import threading
import types
import time
import traceback
from typing import Any, Callable, Sequence

import torch

from .. import registry, results
from ...validation import relative_error

#: Notebook stem -> [(exercise name, max points, one-line title)], in notebook order,
#: as :mod:`flashlib.course.registry` says (the registry is the one source of points).
EXERCISES: dict[str, list[tuple[str, float, str]]] = {}
for _exercise in registry.EXERCISES:
    EXERCISES.setdefault(_exercise.notebook, []).append((_exercise.name, _exercise.points, _exercise.title))
del _exercise

#: Seconds a learner's code may run on one case before it is stopped.
DEFAULT_TIME_LIMIT = 5.0

#: A wrong answer is named when the output is this close to it (relative), and closer
#: than to the right answer; at least 10x the case's tolerance (kernels round).
DIAGNOSE_RTOL = 1e-3

NOT_ATTEMPTED = ("not attempted yet: replace `raise NotImplementedError` with your code, "
                 "run that cell, then run this check again")


def register(notebook: str, name: str, max_points: float, title: str) -> str:
    """The id 'notebook.name' of an exercise of the registry, checked against it.

    Points and titles live in :mod:`flashlib.course.registry`; a check module that
    states other ones is out of date, and fails at import rather than scoring wrongly.
    """
    key = f"{notebook}.{name}"
    known = registry.exercise(key)
    if float(known.points) != float(max_points) or known.title != title:
        raise ValueError(f"exercise {key!r}: the check says {max_points!r} points and title "
                         f"{title!r}, the registry {known.points!r} and {known.title!r}")
    return key


def exercise_info(exercise: str) -> tuple[str, float, str]:
    """(name, max points, title) of a registered exercise id 'notebook.name'."""
    notebook, _, name = exercise.partition(".")
    for entry in EXERCISES.get(notebook, []):
        if entry[0] == name:
            return entry
    raise KeyError(f"exercise {exercise!r} is not registered; known notebooks: {sorted(EXERCISES)}")


# --------------------------------------------------------------------- time limit

class WrongReturn(TypeError):
    """Raised by a check's ``call`` when the learner's function returned a value of the wrong type, dtype or
    shape for the check to compare (a float index, one tensor instead of a pair). It is reported as what was
    returned, in the check's words: the learner's code raised nothing, and "your code raised TypeError" would
    send them looking for an error that is not there."""


class ChangedInput(Exception):
    """Raised by a check's ``call`` that hands the learner copies of its own (one call per key block, per pair of
    partials) when the learner's function changed one of them in place: the case's arguments, which the judge
    compares, cannot show it. The message names the arguments changed."""


#: What a learner whose function changed its input is told to do.
IN_PLACE_ADVICE = ("a function must not modify the tensors it is given: the caller still needs them. Use out-of-place "
                   "operations (x = x - m, not x -= m) or work on a copy")


def raise_if_changed(given: Sequence, originals: Sequence, names: Sequence[str]) -> None:
    """:class:`ChangedInput` naming each tensor of ``given`` (what the learner's function received) that no longer
    equals its counterpart in ``originals``."""
    changed = [name for name, got, original in zip(names, given, originals)
               if isinstance(got, torch.Tensor) and not _same_tensor(got, original)]
    if changed:
        raise ChangedInput(", ".join(changed))


class CheckTimeout(BaseException):
    """Raised inside the learner's code when its time is up.

    A BaseException, so that the learner's ``except Exception`` (or Triton's
    interpreter, which wraps Exceptions) cannot swallow it.
    """


def _alarm_available() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise :class:`CheckTimeout` in the body after ``seconds`` (SIGALRM, main thread).

    Off the main thread, or where SIGALRM does not exist, the body runs without a
    limit (a grader still has its own). An outer alarm is restored afterwards.

    Yields a namespace whose ``fired`` says whether the alarm went off: C code that was
    running when it did (numpy, torch, Triton's interpreter) can swallow the CheckTimeout
    and raise an unrelated error instead, which must still count as the timeout.
    """
    alarm = types.SimpleNamespace(fired=False)
    if not seconds or seconds <= 0 or not _alarm_available():
        yield alarm
        return

    def on_alarm(signum, frame):
        alarm.fired = True
        raise CheckTimeout(seconds)

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_delay, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield alarm
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous_handler)
            if previous_delay > 0:
                remaining = previous_delay - (time.monotonic() - start)
                signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-3))


# ------------------------------------------------------------------ cases, mistakes

@dataclasses.dataclass
class Case:
    """One input of a check, with its answer.

    ``args`` go to the learner (copies, by the default call); ``expected`` is the
    float64 reference: a tensor, or a tuple of tensors for code that returns several
    (e.g. (O, lse) or (dQ, dK, dV), named by ``output_names``); ``tolerance`` is the
    allowed relative error; ``description`` says in words what the input is (shapes,
    dtype, flags); ``shape_words`` names the expected shape, e.g. '(B, H, N_q, D)';
    ``out_dtype`` is the dtype the output must have (None: not checked);
    ``shape_words`` and ``out_dtype`` may be tuples, one per output.
    ``context`` holds whatever a check's own call needs (block sizes, buffers).
    """

    description: str
    args: tuple
    expected: torch.Tensor | tuple[torch.Tensor, ...]
    tolerance: float
    shape_words: str | tuple[str, ...] = ""
    out_dtype: torch.dtype | tuple[torch.dtype | None, ...] | None = None
    output_names: tuple[str, ...] = ()
    context: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Mistake:
    """A plausible wrong answer: what a typical bug computes, and what to say about it.

    ``compute(*case.args)`` returns what the bug produces for that case (a tensor,
    or a tuple like the case's ``expected``), a *list* of such variants, or None
    where the bug cannot be told apart there; an exception while computing it also
    means 'not applicable'. ``message`` completes 'likely mistake: ...'.
    ``stub`` marks what the exercise's untouched stub produces ("not attempted yet?").
    """

    name: str
    message: str
    compute: Callable[..., Any]
    stub: bool = False


def copy_tensors(value):
    """``value`` with every tensor in it (in tuples, lists, dicts) cloned: for the learner to touch."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(copy_tensors(item) for item in value)
    if isinstance(value, dict):
        return {key: copy_tensors(item) for key, item in value.items()}
    return value


def call_with_copies(learner, case: Case):
    """The default call: ``learner(*args)``; the args are already copies (see :func:`run_learner`)."""
    return learner(*case.args)


def accept_callable(learner) -> str | None:
    """The default gate: the learner's object must be callable."""
    if not callable(learner):
        return f"expected a function, got {type(learner).__name__} {learner!r:.60}"
    return None


@dataclasses.dataclass
class Check:
    """Everything a check needs; :func:`run_check` does the rest.

    ``make_cases(gen)`` builds fresh cases from a torch.Generator (simplest first:
    the first failing case is the one reported). ``call(learner, case)`` runs the
    learner's code and returns its output. ``accept(learner)`` may refuse the
    learner's object before anything runs (message) or accept it (None).
    ``inspect(case, out)`` adds requirements beyond the values (message or None).
    ``explain(case, out)`` adds detail lines when the values are wrong.
    ``nonfinite_hint`` is said when the output holds NaN/inf and no mistake matched.
    """

    exercise: str
    make_cases: Callable[[torch.Generator], Sequence[Case]]
    mistakes: Sequence[Mistake] = ()
    call: Callable[[Any, Case], Any] = call_with_copies
    accept: Callable[[Any], str | None] = accept_callable
    inspect: Callable[[Case, Any], str | None] | None = None
    explain: Callable[[Case, Any], list[str]] | None = None
    nonfinite_hint: str = ""
    time_limit: float = DEFAULT_TIME_LIMIT


# ----------------------------------------------------------------------- comparing

def distance(out: torch.Tensor, target: torch.Tensor) -> float:
    """Relative distance of ``out`` from ``target``, NaN-aware (for diagnosis).

    inf unless both have the same shape and NaN/±inf at the same places; then
    max |out - target| / max |target| over the finite entries (0 if there are none).
    """
    if tuple(out.shape) != tuple(target.shape):
        return math.inf
    o, t = out.detach().double().cpu(), target.detach().double().cpu()
    for same_places in (torch.isnan, torch.isposinf, torch.isneginf):
        if not torch.equal(same_places(o), same_places(t)):
            return math.inf
    finite = torch.isfinite(t)
    if not finite.any():
        return 0.0
    o, t = o[finite], t[finite]
    scale = t.abs().max().clamp_min(torch.finfo(torch.float64).tiny)
    return ((o - t).abs().max() / scale).item()


def error_from(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The error judged against the tolerance: :func:`~flashlib.validation.relative_error`,
    or, when the reference itself holds ±inf (e.g. the logsumexp of a fully masked row),
    :func:`distance`, which asks for the same infinities at the same places."""
    if torch.isfinite(ref).all():
        return relative_error(out, ref)
    return distance(out, ref)


def first_difference(out: torch.Tensor, ref: torch.Tensor, tolerance: float):
    """(index, expected, got) of the first element that is off by more than the tolerance."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(r)
    scale = r[finite].abs().max() if finite.any() else torch.tensor(1.0, dtype=torch.float64)
    scale = scale.clamp_min(torch.finfo(torch.float64).tiny)
    close = finite & torch.isfinite(o) & ((o - r).abs() <= tolerance * scale)
    same_infinity = ~finite & (o == r)
    bad = ~(close | same_infinity)
    if not bad.any():
        bad = (o != r)
    index = tuple(int(i) for i in bad.nonzero()[0])
    return index, r[index].item(), o[index].item()


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _index(index: tuple) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


def _shape(shape) -> str:
    return str(tuple(int(s) for s in shape))


def _distance_any(out, target) -> float:
    """:func:`distance` for one tensor, or the largest over a tuple of outputs."""
    if isinstance(target, tuple):
        if not isinstance(out, (tuple, list)) or len(out) != len(target):
            return math.inf
        return max((_distance_any(o, t) for o, t in zip(out, target)), default=0.0)
    return distance(out, target) if isinstance(out, torch.Tensor) else math.inf


def diagnosis_radius(case: Case) -> float:
    """How close (relative distance) an output must come to what a mistake computes for the mistake to be named:
    ten times the case's tolerance, and never less than :data:`DIAGNOSE_RTOL`."""
    return max(10 * case.tolerance, DIAGNOSE_RTOL)


def _diagnose(check: Check, case: Case, out, error_from_right: float) -> list[Mistake]:
    """The known mistakes that fit ``out``: close to it, and closer than the right answer.

    The closest comes first; a second one is named too when it fits about as well
    (within 2x the closest distance), since the output cannot tell them apart.
    """
    fits: dict[str, tuple[float, Mistake]] = {}
    for mistake in check.mistakes:
        try:
            produced = mistake.compute(*(copy_tensors(a) for a in case.args))
        except Exception:  # the bug cannot even be computed on this case: not applicable
            continue
        variants = produced if isinstance(produced, list) else [produced]
        for variant in variants:
            if variant is None:
                continue
            d = _distance_any(out, variant)
            if d < fits.get(mistake.name, (math.inf, None))[0]:
                fits[mistake.name] = (d, mistake)
    close_enough = diagnosis_radius(case)
    ranked = sorted((d, i, m) for i, (d, m) in enumerate(fits.values())
                    if d <= close_enough and d < error_from_right)
    if not ranked:
        return []
    best = ranked[0][0]
    return [m for d, _, m in ranked[:2] if d <= 2 * best + 1e-12]


@dataclasses.dataclass
class _Failure:
    headline: str
    details: list[str]
    mistakes: list[Mistake] = dataclasses.field(default_factory=list)


def _nth(value, i):
    """Per-output setting: value[i] for a tuple, else the same value for every output."""
    return value[i] if isinstance(value, tuple) else value


def _outputs(case: Case, out):
    """[(name, got, expected)] for every output, or a _Failure if ``out`` has the wrong form."""
    if not isinstance(case.expected, tuple):
        return [("", out, case.expected)]
    count = len(case.expected)
    names = case.output_names or tuple(f"output {i}" for i in range(count))
    if out is None:
        return _Failure(f"returned None, expected {count} tensors: {', '.join(names)}", ["is a `return` missing?"])
    if not isinstance(out, (tuple, list)) or len(out) != count:
        what = f"{len(out)} values" if isinstance(out, (tuple, list)) else f"a {type(out).__name__}"
        return _Failure(f"returned {what}, expected {count} tensors: {', '.join(names)}", [])
    return list(zip(names, out, case.expected))


def _judge_form(case: Case, i: int, name: str, got, want) -> _Failure | None:
    """Type, shape and dtype of one output."""
    prefix = f"{name}: " if name else ""
    if not isinstance(got, torch.Tensor):
        if got is None:
            return _Failure(f"{prefix}returned None", ["is a `return` missing?"])
        return _Failure(f"{prefix}returned a {type(got).__name__}, expected a torch.Tensor", [])
    if tuple(got.shape) != tuple(want.shape):
        words = _nth(case.shape_words, i)
        words = f" = {words}" if words else ""
        return _Failure(f"{prefix}wrong shape",
                        [f"{prefix}expected shape {_shape(want.shape)}{words}, got {_shape(got.shape)}"])
    dtype = _nth(case.out_dtype, i)
    if dtype is not None and got.dtype != dtype:
        return _Failure(f"{prefix}wrong dtype",
                        [f"{prefix}expected {dtype}, got {got.dtype} (keep the inputs' dtype)"])
    return None


def _judge(check: Check, case: Case, out) -> _Failure | None:
    """None if ``out`` is right for ``case``, else what is wrong with it."""
    outputs = _outputs(case, out)
    if isinstance(outputs, _Failure):
        return outputs
    for i, (name, got, want) in enumerate(outputs):
        failure = _judge_form(case, i, name, got, want)
        if failure is not None:
            if failure.headline.endswith("wrong shape"):
                failure.mistakes = _diagnose(check, case, out, math.inf)
            return failure
    errors = [error_from(got, want) for _, got, want in outputs]
    for (name, got, want), error in zip(outputs, errors):
        if error <= case.tolerance:
            continue
        prefix = f"{name}: " if name else ""
        index, expected, value = first_difference(got, want, case.tolerance)
        nonfinite = bool((~torch.isfinite(got.detach().cpu()) & torch.isfinite(want.cpu())).any())
        headline = prefix + ("NaN or inf in the output" if nonfinite else "wrong values")
        details = [f"{prefix}first difference at {_index(index)}: expected {_fmt(expected)}, got {_fmt(value)}"
                   + ("" if nonfinite or not want.is_floating_point() else   # indices are right or wrong
                      f" (relative error {_fmt(error)}, allowed {case.tolerance:g})")]
        if check.explain is not None:
            details += check.explain(case, out)
        mistakes = _diagnose(check, case, out, max(errors))
        if not mistakes and nonfinite and check.nonfinite_hint:
            details.append(check.nonfinite_hint)
        return _Failure(headline, details, mistakes)
    if check.inspect is not None:
        problem = check.inspect(case, out)
        if problem:
            return _Failure(problem, [])
    return None


# --------------------------------------------------------------- learner exceptions

def _library_dirs() -> tuple[str, ...]:
    """Folders whose frames are not the learner's: flashlib, the stdlib, site-packages."""
    flashlib_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = sysconfig.get_paths()
    dirs = {flashlib_dir, paths.get("stdlib", ""), paths.get("purelib", ""), paths.get("platlib", "")}
    return tuple(os.path.join(os.path.abspath(d), "") for d in dirs if d)


def _learner_frame(exc: BaseException):
    """The innermost traceback frame in the learner's code (a notebook cell, a test)."""
    library = _library_dirs()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        name = frame.filename
        if name.startswith("<frozen") or os.path.abspath(name).startswith(library):
            continue
        return frame
    return None


def _unwrap(exc: BaseException) -> BaseException:
    """The learner's own exception, out of Triton's interpreter wrapper."""
    while type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


#: Known messages whose cause the learner cannot guess: substring -> hint.
_EXCEPTION_HINTS = {
    "Cannot call @triton.jit'd outside of the scope of a kernel": (
        "hint: if this is inside your kernel, triton was imported before flashlib, so "
        "triton.language's own helpers (tl.cdiv, ...) were not made for the interpreter: "
        "restart the kernel and `import flashlib` before `import triton`"),
}


def _describe_exception(exc: BaseException, max_lines: int = 8) -> list[str]:
    """'Type: message' (a few lines: Triton's compile errors quote the source), then the learner's line."""
    message = [line[:200] for line in str(exc).strip().splitlines()]
    if len(message) > max_lines:
        message = message[:max_lines - 1] + ["..."]
    head = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    lines = ["\n    ".join([head] + message[1:])]
    frame = _learner_frame(exc)
    if frame is not None:
        where = f"in {frame.name}, line {frame.lineno}"
        lines.append(f"{where}: {frame.line.strip()}" if frame.line else where)
    lines += [hint for known, hint in _EXCEPTION_HINTS.items() if known in str(exc)]
    return lines


# ------------------------------------------------------------------------ running

class CheckResult(results.ExerciseResult):
    """An ExerciseResult that shows nothing as a notebook cell's value.

    The check has already printed its verdict; without this, a check cell would
    print it twice (once more as the returned object's repr).
    """

    def _ipython_display_(self):
        pass

    def __eq__(self, other):
        if isinstance(other, results.ExerciseResult):
            return dataclasses.astuple(self) == dataclasses.astuple(other)
        return NotImplemented

    __hash__ = results.ExerciseResult.__hash__


def case_generator(exercise: str, seed: int | None = None) -> torch.Generator:
    """The CPU generator of an exercise's cases, seeded from its id (or ``seed``, in tests).

    The same id gives the same cases in the learner's notebook and in the grader, so
    both give the same verdict for the same code.
    """
    return torch.Generator().manual_seed(registry.seed_of(exercise) if seed is None else seed)


#: The seed the designed cases are drawn again from, while :func:`hidden_cases` draws (None: the public ones).
_REDRAW_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("redraw_seed", default=None)


def fixed_generator(fixed_seed: int) -> torch.Generator:
    """The generator of a check's designed cases (rows at +-800, a fully masked block, a key tail over NaN).

    Their structure is written in the check; their random values come from ``fixed_seed``, the same in
    every run, so the notebook shows them as the grader does. While :func:`hidden_cases` draws, the seed is
    mixed with the hidden one: the same structure with values the learner has never seen, so an answer that
    looks the designed cases' outputs up in a table fails there, where the mistake they are built for shows.
    """
    redraw = _REDRAW_SEED.get()
    seed = fixed_seed if redraw is None else (fixed_seed * 1_000_003 + redraw) % 2**62
    return torch.Generator().manual_seed(seed)


def make_cases(check: Check, seed: int | None = None) -> list[Case]:
    """The check's cases: its designed adversarial ones and its seeded random ones."""
    return list(check.make_cases(case_generator(check.exercise, seed)))


def hidden_cases(check: Check, seed: int) -> list[Case]:
    """Cases the learner has never seen: every case of the check drawn again from ``seed``, the designed
    ones included (:func:`fixed_generator`), less any that equals a public one (:func:`make_cases` without a
    seed, which the notebook's check cell runs too). The grader adds them, from a seed of its own.

    All of them, not one: a single hidden case, once the smallest, was always the easy kind (float32
    standard normal values), so a table of the public outputs of the hard cases, with the very mistake
    those cases are made for everywhere else, passed the grader. Drawn again, every family of the check
    is in the hidden part."""
    public = make_cases(check)
    token = _REDRAW_SEED.set(seed)
    try:
        drawn = make_cases(check, seed)
    finally:
        _REDRAW_SEED.reset(token)
    return [case for case in drawn if not any(_same_case(case, old) for old in public)]


def tensors_in(value) -> list[torch.Tensor]:
    """Every tensor in ``value`` (in tuples, lists and dict values), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    return []


def _same_case(a: Case, b: Case) -> bool:
    return a.description == b.description and _same_value(a.args, b.args)


def _same_value(a, b) -> bool:
    """Whether two case arguments are equal: tensors element by element (NaN equal to NaN), containers item by
    item, anything else by ``==``. The formula exercises draw plain numbers, not tensors, so these count too."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _same_tensor(a, b)
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same_value(x, y) for x, y in zip(a, b)))
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
                and all(_same_value(a[key], b[key]) for key in a))
    return a == b or (a != a and b != b)  # NaN equal to NaN


# ------------------------------------------------------------ the learner's side

@dataclasses.dataclass
class Reply:
    """What the learner's code did on one case; plain data, so it can cross a process boundary.

    ``status`` is "ok" (``out`` holds what it returned), "raised", "timeout",
    "not attempted" or "refused" (``headline`` and ``details`` say why). ``args`` are
    the case's inputs after the call (for the in-place mutation check) and
    ``context`` what the check's call noted (buffers, memory). A reply is only ever
    believed in the direction of failing: the verdict comes from comparing ``out``
    with the judge's own reference.
    """

    status: str
    out: Any = None
    args: tuple = ()
    context: dict = dataclasses.field(default_factory=dict)
    headline: str = ""
    details: list = dataclasses.field(default_factory=list)


def _fresh_copy(case: Case) -> Case:
    """The case with copies of its tensors (args and context): the learner may touch them freely."""
    return dataclasses.replace(case, args=copy_tensors(case.args), context=copy_tensors(case.context))


def _timeout_reply(limit: float) -> Reply:
    """The verdict of a case stopped by the time limit (one wording, wherever the timeout surfaced)."""
    return Reply("timeout", headline=f"took longer than {limit:g} s (an infinite loop? a too-large grid?)")


def run_learner(check: Check, learner, cases: Sequence[Case], limit: float | None = None) -> list[Reply]:
    """Run the learner's object on every case, in order, under a time limit per case.

    This is the part that runs where the learner's code lives (the notebook's
    process, or the grader's sandbox). It stops at the first case that raises or
    times out. It never judges values: :func:`judge` does, with the reference.
    """
    limit = check.time_limit if limit is None else limit
    refusal = check.accept(learner)
    if refusal:
        return [Reply("refused", headline=refusal)]
    replies = []
    for case in cases:
        work = _fresh_copy(case)
        try:
            with time_limit(limit) as alarm:
                out = check.call(learner, work)
        except CheckTimeout:
            replies.append(_timeout_reply(limit))
            break
        except Exception as raised:  # the learner's code failed: explain, never raise
            if alarm.fired:  # the timeout, turned into another error by the code it interrupted
                replies.append(_timeout_reply(limit))
                break
            exc = _unwrap(raised)
            if isinstance(exc, NotImplementedError):
                replies.append(Reply("not attempted", headline=NOT_ATTEMPTED))
            elif isinstance(exc, ChangedInput):
                replies.append(Reply("raised", headline=f"your code changed its input in place ({exc})",
                                     details=[IN_PLACE_ADVICE]))
            elif isinstance(exc, WrongReturn):
                replies.append(Reply("raised", headline="your code returned a value the exercise does not ask for",
                                     details=[str(exc)]))
            else:
                replies.append(Reply("raised", headline=f"your code raised {type(exc).__name__}",
                                     details=_describe_exception(exc)))
            break
        replies.append(Reply("ok", out=out, args=work.args, context=work.context))
    return replies


# ----------------------------------------------------------------- the judge's side

def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def changed_inputs(before: tuple, after) -> list[int]:
    """Positions of the tensor arguments that the learner's code changed in place."""
    if not isinstance(after, (tuple, list)) or len(after) != len(before):
        return []
    return [i for i, (a, b) in enumerate(zip(before, after))
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and not _same_tensor(a, b)]


def judge(check: Check, cases: Sequence[Case], replies: Sequence[Reply]) -> tuple[bool, str, list[str]]:
    """(passed, headline, detail lines): the learner's replies against the reference of every case."""
    if replies and replies[0].status == "refused":
        return False, replies[0].headline, list(replies[0].details)
    for number, case in enumerate(cases, start=1):
        where = f"case {number} of {len(cases)}: {case.description}"
        if number > len(replies):
            return False, ("no answer for this case: the run stopped before it "
                           "(time limit, crash or exit)"), [where]
        reply = replies[number - 1]
        if reply.status == "not attempted":
            return False, NOT_ATTEMPTED, []
        if reply.status != "ok":  # what was raised, then where: the report keeps only the feedback's start
            return False, reply.headline or f"the run ended with status {reply.status!r}", \
                [str(line) for line in reply.details] + [where]
        # The judge's own context wins: a reply may only add what the call noted.
        judged = dataclasses.replace(case, context={**dict(reply.context or {}), **case.context})
        failure = _judge(check, judged, reply.out)
        if failure is not None:
            details = [where] + failure.details
            headline = failure.headline
            mistakes = failure.mistakes
            if mistakes:
                details.append("likely mistake: " + "\n  or: ".join(m.message for m in mistakes))
                if all(m.stub for m in mistakes):
                    headline = "not attempted yet? " + headline
            return False, headline, details
        changed = changed_inputs(case.args, reply.args)
        if changed:
            which = ", ".join(f"argument {i + 1}" for i in changed)
            return False, f"right values, but your code changed its input in place ({which})", [
                where, IN_PLACE_ADVICE]
    plural = "s" if len(cases) != 1 else ""
    return True, f"correct on {len(cases)} case{plural}", []


def run_check(check: Check, learner, *, seed: int | None = None,
              time_limit_s: float | None = None) -> results.ExerciseResult:
    """Run ``check`` on the learner's function or kernel; print and return the verdict.

    An answer the grader's rules refuse (:func:`flashlib.course.policy.refusals_in_notebook`) is refused here
    too, in the grader's words, and not run. The cases are the exercise's own (seeded from its id, so the
    grader sees the same ones); ``seed`` picks other random ones (tests); ``time_limit_s`` overrides
    the check's time limit per case. Never raises for mistakes in the learner's code.
    The grader does not read this verdict: it computes its own (see
    :mod:`flashlib.course.grader`).
    """
    from .. import policy  # the grader's rules on whose work an answer is, read from the notebook cell

    exercise = registry.BY_KEY.get(check.exercise)  # a check of the course's (not a test's own)
    refused = policy.refusals_in_notebook(exercise, learner) if exercise is not None else []
    if refused:  # the grader would not run it: neither does the check
        return verdict(check.exercise, False, policy.describe(refused), [], echo=True)
    cases = make_cases(check, seed)
    passed, headline, details = judge(check, cases, run_learner(check, learner, cases, time_limit_s))
    return verdict(check.exercise, passed, headline, details, echo=True)


def verdict(exercise: str, passed: bool, headline: str, details: Sequence[str],
            echo: bool = False) -> results.ExerciseResult:
    """The ExerciseResult of a judged exercise: full points or none, with the feedback text."""
    name, max_points, _ = exercise_info(exercise)
    points = float(max_points) if passed else 0.0
    mark = "✓" if passed else "✗"
    text = f"{mark} {name}: {headline} ({points:g}/{float(max_points):g} points)"
    text = "\n  ".join([text] + [str(line) for line in details])
    result = CheckResult(exercise=exercise, passed=passed, points=points,
                         max_points=float(max_points), feedback=text)
    if echo:
        print(text)
        results.RECORDED.append(result)
    return result
