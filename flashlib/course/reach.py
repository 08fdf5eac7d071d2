"""What an answer's attribute chains reach: followed statically on the modules the grader holds.

:mod:`flashlib.course.policy` refuses an answer that reaches, through a chain of attributes
(``torch.functional.operator``, ``tl.core.typing``), a module outside the course's own or one
that leads out of the answer. A deny list of names cannot keep up with every standard-library
module a library happens to import; following the chain on the real module objects can. This
module does that following, without running anything of the answer or of the libraries:

* :func:`given_imports`: what the notebook's given cells bind (``tl`` is ``triton.language``);
* :func:`global_reads`: which names of the answer really are those globals (Python's scope rules),
  so that a learner's own variable named ``F`` is not taken for the module;
* :class:`Chains`: each chain followed with :func:`inspect.getattr_static`, and why what it
  reaches is refused.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import importlib.util
import inspect
import sys
import types

from . import registry


#: What the course's notebooks import, for a caller that does not pass the given cells
#: (``check_answer(..., given_sources=None)``): each name as (module, attributes after it).
COURSE_IMPORTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "math": ("math", ()), "copy": ("copy", ()), "torch": ("torch", ()), "triton": ("triton", ()),
    "tl": ("triton.language", ()), "F": ("torch.nn.functional", ()),
}


def given_imports(given_sources: list[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """What each name the given cells bind at their top level is, as (module, attributes after it).

    ``import triton.language as tl`` binds ``tl`` to ``("triton.language", ())``, ``import torch.nn``
    binds ``torch`` to ``("torch", ())``, ``from flashlib import flash_attention`` binds ``flash_attention``
    to ``("flashlib", ("flash_attention",))``, and ``F = torch.nn.functional`` follows what ``torch`` is
    to ``("torch", ("nn", "functional"))``. Read, never run; a later binding wins, as when the notebook
    runs. A name a ``def`` or ``class`` rebinds stops being one of these; one that any other statement
    rebinds (``F = something()``) stays: what it then holds cannot be read, and it may be the module.
    """
    bound: dict[str, tuple[str, tuple[str, ...]]] = {}
    for source in given_sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in _top_level(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        bound[alias.asname] = (alias.name, ())
                    else:
                        bound[alias.name.split(".")[0]] = (alias.name.split(".")[0], ())
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        bound[alias.asname or alias.name] = (node.module, (alias.name,))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                chain = _dotted(node.value)
                if chain and chain[0] in bound:
                    module, attributes = bound[chain[0]]
                    bound[node.targets[0].id] = (module, attributes + chain[1:])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.pop(node.name, None)
    return bound


def _top_level(tree: ast.AST):
    """The nodes of a cell that may bind its globals, in the order they run: all but those inside a function
    or a class. Without recursion, like every walk here: a learner's cell may nest thousands deep."""
    stack = list(reversed(list(ast.iter_child_nodes(tree))))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _dotted(node: ast.AST) -> tuple[str, ...] | None:
    """``a.b.c`` as ("a", "b", "c"); None for anything but a name and its attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return (node.id, *reversed(parts)) if isinstance(node, ast.Name) else None


def _chain_text(node: ast.AST, most: int = 100) -> str:
    """``a.b.c`` as the answer spells it, for a message (its end only, past ``most`` characters)."""
    parts = _dotted(node) or ("...",)
    text = ".".join(parts)
    return text if len(text) <= most else "..." + text[-most:]


#: A chain the grader cannot follow (a local value, a call's result, a name nobody imported): the rule on
#: modules says nothing about it, the rules on names still apply.
_UNKNOWN = object()


#: A chain already refused at a shorter prefix (or by a rule on names): nothing more to say about it.
_STOP = object()


@dataclasses.dataclass(frozen=True)
class _Unseen:
    """An attribute that exists only once the answer runs (a lazy import, a module's ``__getattr__``)."""

    why: str


#: The builtins that lead out of the answer, whatever name an answer reaches them by (``torch.x.exec``
#: where some module did ``exec = builtins.exec``): compared by identity.
_ESCAPE_BUILTINS = tuple((name, getattr(builtins, name))
                         for name in (*registry.ALWAYS_FORBIDDEN, *registry.STRING_ACCESS, "__import__", "input")
                         if callable(getattr(builtins, name, None)))


class Chains:
    """Follows an answer's attribute chains (``torch.functional.operator``) in the grader's own process.

    A chain rooted at a name the given cells import is followed, attribute by attribute, on the module
    objects that the grader holds (it imports flashlib, hence torch and triton, as the learner's process
    does), with :func:`inspect.getattr_static`: no property, module ``__getattr__`` or descriptor runs,
    nothing is imported on the answer's behalf, and a missing attribute ends the chain (the answer would
    raise AttributeError there). Every object reached is judged by :meth:`problem`: a module outside
    :data:`~flashlib.course.registry.ANSWER_MODULES`, one of their internals (a module named with ``_``),
    anything of :data:`~flashlib.course.registry.ESCAPE_MODULES`, an object defined outside the course's
    modules, an escape builtin. So ``torch.functional.operator``, ``tl.core.typing`` and every other
    standard-library module some library imported are refused by one rule, with no list of their names,
    while the methods of the answer's own values (``x.copy()``, ``x.select()``) are never looked at.

    A module is allowed only as the start of a chain (``torch.functional.x(...)``), never as a value
    (``m = torch.functional``, ``f(torch)``, ``[tl][0]``): held in a variable, it would take a later
    ``m.operator`` out of this rule's sight. So is an object that holds a module as a public attribute
    (:func:`_held_module`; in the libraries of today, Triton's ``TritonSemantic`` and its ``lang``).
    """

    def __init__(self, imports: dict[str, tuple[str, tuple[str, ...]]], global_reads: set[int] = frozenset()):
        self.imports, self.global_reads = imports, global_reads
        self.reached: dict[int, object] = {}
        self.problems: dict[int, str] = {}

    def problems_of(self, node: ast.AST, parent: ast.AST | None) -> list[tuple[int, str]]:
        """What is wrong with the object that ``node`` (a name or an attribute, read) reaches: (line, why)."""
        if not isinstance(getattr(node, "ctx", None), ast.Load):
            return []
        target = self.reach(node)
        out = []
        if id(node) in self.problems:
            out.append((node.lineno, self.problems[id(node)]))
        elif not (isinstance(parent, ast.Attribute) and parent.value is node):
            text = _chain_text(node)
            if _is_module(target):
                out.append((node.lineno, f"`{text}` is a module: an answer may use what is in it "
                                                f"(`{text}.name`), not hold or pass the module itself"))
            elif target is not _UNKNOWN and target is not _STOP and _held_module(target):
                out.append((node.lineno, f"`{text}` holds a module (`{text}.{_held_module(target)}`): "
                                                "an answer may use what is in it, not hold or pass it"))
        return out

    def reach(self, node: ast.AST) -> object:
        """The object ``node`` is in the grader's process, _UNKNOWN or _STOP; records the first problem.

        Walked from the chain's root outwards, without recursion: a chain may be thousands of attributes long.
        """
        chain = [node]
        while isinstance(chain[-1], ast.Attribute) and id(chain[-1]) not in self.reached:
            chain.append(chain[-1].value)
        for link in reversed(chain):
            if id(link) in self.reached:
                continue
            if isinstance(link, ast.Name) and link.id in self.imports and id(link) in self.global_reads:
                target = self._root(*self.imports[link.id])
            elif isinstance(link, ast.Attribute) and not link.attr.startswith("_"):
                owner = self.reached[id(link.value)]
                target = owner if owner is _UNKNOWN or owner is _STOP else _attribute(owner, link.attr)
            elif isinstance(link, ast.Attribute):
                target = _STOP  # refused by the rule on names starting with _
            else:
                target = _UNKNOWN
            if target is not _UNKNOWN and target is not _STOP:
                problem = self.problem(target, _chain_text(link), root=isinstance(link, ast.Name))
                if problem:
                    self.problems[id(link)] = problem
                    target = _STOP
            self.reached[id(link)] = target
        return self.reached[id(node)]

    @staticmethod
    def _root(module: str, attributes: tuple[str, ...]) -> object:
        """What a given cell bound: the module as loaded here (a course module is imported if it is not
        yet), then its attributes; _UNKNOWN where that cannot be found."""
        target = sys.modules.get(module)
        if target is None:
            if module.split(".")[0] not in (*registry.ANSWER_MODULES, "flashlib"):
                return _Unloaded(module) if not attributes else _UNKNOWN
            try:
                target = importlib.import_module(module)
            except Exception:  # noqa: BLE001 - what cannot be imported cannot be followed
                return _UNKNOWN
        for name in attributes:
            target = _attribute(target, name)
            if target is _UNKNOWN or isinstance(target, _Unseen):
                return _UNKNOWN
        return target

    @staticmethod
    def problem(target: object, text: str, root: bool = False) -> str | None:
        """Why an answer may not reach ``target`` (what ``text`` is), or None.

        A root (a name the notebook bound to a function or an object, like ``flash_attention``) is the
        notebook's to give; only its being a module is judged.
        """
        if isinstance(target, _Unseen):
            return f"`{text}` cannot be checked before the answer runs ({target.why})"
        if isinstance(target, _Unloaded) or _is_module(target):
            name = target.name if isinstance(target, _Unloaded) else _module_name(target)
            if name is None or name.split(".")[0] not in registry.ANSWER_MODULES:
                return (f"`{text}` is the module `{name}`: an answer may reach only the modules the course "
                        f"uses ({', '.join(registry.ANSWER_MODULES)})")
            if any(part.startswith("_") for part in name.split(".")):
                return f"`{text}` is the module `{name}`, one of the library's internals"
            if _within(name, registry.ESCAPE_MODULES):
                return (f"`{text}` is the module `{name}`, which leads out of the answer (it loads code or "
                        "files, or starts processes)")
            return None
        if root:
            return None
        for name, escape in _ESCAPE_BUILTINS:
            if target is escape:
                return f"`{text}` is the builtin `{name}`, which leads out of the answer"
        home = _home_module(target)
        if home is None or (home.split(".")[0] not in registry.ANSWER_MODULES and home != "builtins"):
            return (f"`{text}` comes from the module `{home}`: an answer may reach only what the course's "
                    f"modules define ({', '.join(registry.ANSWER_MODULES)})")
        if _within(home, registry.ESCAPE_MODULES):
            return (f"`{text}` comes from `{home}`, which leads out of the answer (it loads code or files, "
                    "or starts processes)")
        return None


@dataclasses.dataclass(frozen=True)
class _Unloaded:
    """A module a given cell imports that the grader has not loaded and does not load (not the course's)."""

    name: str


def _is_module(target: object) -> bool:
    return issubclass(type(target), types.ModuleType)


def _module_name(module: types.ModuleType) -> str | None:
    name = inspect.getattr_static(module, "__name__", None)
    return name if isinstance(name, str) else None


def _held_module(target: object) -> str | None:
    """The name of a public attribute of ``target`` (not a module) that is a module, if it has one: its own, or
    its class's. Such an object, held as a value, would take the module out of :class:`Chains`' sight
    (``s = tl.semantic.TritonSemantic`` then ``s.lang.typing``). Read statically, like every step of a chain."""
    kind = type(target)
    classes = type.__dict__["__mro__"].__get__(target if issubclass(kind, type) else kind)
    namespaces = [type.__dict__["__dict__"].__get__(cls) for cls in classes]
    if not issubclass(kind, type):
        try:
            own = object.__getattribute__(target, "__dict__")
        except Exception:  # noqa: BLE001 - an object without a __dict__ holds only what its class does
            own = None
        if isinstance(own, dict):
            namespaces.insert(0, own)
    for namespace in namespaces:
        for name, value in list(namespace.items()):
            if isinstance(name, str) and not name.startswith("_") and _is_module(value):
                return name
    return None


def _within(name: str, families) -> bool:
    return any(name == family or name.startswith(family + ".") for family in families)


def _home_module(target: object) -> str | None:
    """The module that defines ``target``: a function's or class's own ``__module__``, else its type's.
    Read through the C-level descriptors, so that no property of the object runs."""
    kind = type(target)
    try:
        if issubclass(kind, (types.FunctionType, types.BuiltinFunctionType)):
            home = target.__module__
            if home is None:
                home = type.__dict__["__module__"].__get__(kind)
        elif issubclass(kind, type):
            home = type.__dict__["__module__"].__get__(target)
        else:
            home = type.__dict__["__module__"].__get__(kind)
    except Exception:  # noqa: BLE001 - an object that will not say where it comes from is not reached
        return None
    return home if isinstance(home, str) else None


def _attribute(owner: object, name: str) -> object:
    """``owner.name`` as the grader's process holds it, found without running anything of ``owner``.

    A module's attribute missing from its namespace may still be there when the answer runs. A submodule is
    taken from ``sys.modules``, or, when nobody has imported it yet, imported here if its name alone allows
    it (:func:`may_import`: the course's families, public, not an escape), else judged by that name
    (:class:`_Unloaded`). So the verdict on ``torch.onnx`` is the same whatever this process happened to load
    before. Anything else a module's ``__getattr__`` would make comes back as :class:`_Unseen`, which is
    refused; anything else missing is _UNKNOWN: the answer would raise AttributeError there.
    """
    try:
        return inspect.getattr_static(owner, name)
    except AttributeError:
        pass
    except Exception:  # noqa: BLE001 - an object that cannot be read statically ends the chain
        return _UNKNOWN
    if not _is_module(owner):
        return _UNKNOWN
    module = _module_name(owner)
    if module is None:
        return _UNKNOWN
    submodule = f"{module}.{name}"
    loaded = sys.modules.get(submodule)
    if loaded is not None:
        return loaded
    namespace = types.ModuleType.__dict__["__dict__"].__get__(owner)
    if sys.modules.get(module) is owner and "__path__" in namespace:
        try:
            spec = importlib.util.find_spec(submodule)
        except Exception:  # noqa: BLE001 - no module found: the attribute is simply missing
            spec = None
        if spec is not None:
            if not may_import(submodule):
                return _Unloaded(submodule)
            try:
                return importlib.import_module(submodule)
            except Exception:  # noqa: BLE001 - a submodule that will not import cannot be followed
                return _Unseen(f"`{submodule}` cannot be imported here to be checked")
    dynamic = "__getattr__" in namespace or any(
        "__getattr__" in vars(kind) or "__getattribute__" in vars(kind)
        for kind in type(owner).__mro__ if kind not in (types.ModuleType, object))
    if dynamic:
        return _Unseen(f"`{module}` makes its attributes on demand; "
                       "an answer may use only what the notebook's imports have loaded")
    return _UNKNOWN


def may_import(name: str) -> bool:
    """Whether the grader may import module ``name`` to follow a chain through it: one of the course's
    families (:data:`~flashlib.course.registry.ANSWER_MODULES`), no internal part, no escape module."""
    return (name.split(".")[0] in registry.ANSWER_MODULES and not any(part.startswith("_") for part in name.split("."))
            and not _within(name, registry.ESCAPE_MODULES))


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


#: Comprehensions: each has its own scope, and its targets store like a ``for`` loop's.
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def global_reads(tree: ast.AST, class_bound: set[int] | None = None) -> set[int]:
    """The ids of the names in ``tree`` that are read as globals: those the notebook's imports bound.

    Python decides statically, scope by scope, whether a name is local; this follows the same rules
    (a binding anywhere in a function makes the name local in all of it; a class body's names are not
    seen by its methods; a comprehension has its own scope, but its first iterable is read outside it),
    so that a learner's own variable named ``copy`` or ``F`` is not taken for the module, and a global
    ``torch`` is never taken for a local. A class body's read of a name that the class binds is a global
    read too (the global until the class binds it); ``class_bound``, where given, gets those ids, since the
    name may be the class's own by the time it is read.
    """
    reads: set[int] = set()
    stack: list[tuple[ast.AST, tuple[tuple[str, frozenset[str]], ...]]] = [(tree, ())]
    while stack:
        node, scopes = stack.pop()
        if isinstance(node, ast.Name):
            # a name the class body binds is read with LOAD_NAME: the class's dict, then globals and builtins,
            # never the enclosing function's local of that name
            own_class = bool(scopes) and scopes[-1][0] == "class" and node.id in scopes[-1][1]
            if isinstance(node.ctx, ast.Load) and (
                    own_class or not any(node.id in names for kind, names in scopes if kind != "class")):
                reads.add(id(node))
                if own_class and class_bound is not None:
                    class_bound.add(id(node))
        elif isinstance(node, ast.AnnAssign) and scopes and scopes[-1][0] == "function":
            # a local's annotation is never evaluated in a function
            stack += [(child, scopes) for child in (node.target, node.value) if child is not None]
        elif isinstance(node, _FUNCTIONS):
            outside = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            if not isinstance(node, ast.Lambda):
                outside += [*node.decorator_list, *(a.annotation for a in _arguments(node.args) if a.annotation)]
                outside += [node.returns] if node.returns else []
            inner = (*scopes, ("function", frozenset(_bound_in(node))))
            stack += [(child, scopes) for child in outside]
            stack += [(child, inner) for child in (node.body if isinstance(node.body, list) else [node.body])]
        elif isinstance(node, ast.ClassDef):
            inner = (*scopes, ("class", frozenset(_bound_in(node))))
            stack += [(child, scopes) for child in [*node.decorator_list, *node.bases, *node.keywords]]
            stack += [(child, inner) for child in node.body]
        elif isinstance(node, COMPREHENSIONS):
            inner = (*scopes, ("comprehension", frozenset(name.id for generator in node.generators
                                                          for name in ast.walk(generator.target)
                                                          if isinstance(name, ast.Name)
                                                          and isinstance(name.ctx, ast.Store))))
            rest = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for index, generator in enumerate(node.generators):
                rest += [generator.target, *generator.ifs] + ([generator.iter] if index else [])
            stack.append((node.generators[0].iter, scopes))
            stack += [(child, inner) for child in rest]
        else:
            stack += [(child, scopes) for child in ast.iter_child_nodes(node)]
    return reads


def _arguments(args: ast.arguments) -> list[ast.arg]:
    return [*args.posonlyargs, *args.args, *([args.vararg] if args.vararg else []), *args.kwonlyargs,
            *([args.kwarg] if args.kwarg else [])]


def _bound_in(scope: ast.AST) -> set[str]:
    """The names a function or class body binds in its own scope (its parameters too), as Python counts
    them: nested functions and classes bind only their own name, a comprehension only its ``:=`` targets;
    a ``global`` name is not the scope's."""
    names = {arg.arg for arg in _arguments(scope.args)} if isinstance(scope, _FUNCTIONS) else set()
    declared_global = set()
    stack = [(statement, False) for statement in (scope.body if isinstance(scope.body, list) else [scope.body])]
    while stack:
        node, in_comprehension = stack.pop()
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            if not isinstance(node, ast.Lambda):
                names.add(node.name)
            continue
        if isinstance(node, ast.NamedExpr):
            names.add(node.target.id)
        elif in_comprehension:
            pass
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        elif isinstance(node, ast.Global):
            declared_global.update(node.names)
        inside = in_comprehension or isinstance(node, COMPREHENSIONS)
        stack += [(child, inside) for child in ast.iter_child_nodes(node)]
    return names - declared_global
