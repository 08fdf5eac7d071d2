"""Every name the project's Python uses is defined: pyflakes' undefined-name check over ``flashlib/``, ``benchmarks/``
and ``tests/``.

Why: much of ``benchmarks/`` (the Gluon A/B scripts, the GPU backlog's steps) runs only on a Hopper GPU, so a
NameError there surfaces only after a machine has been started and device time spent. A constant deleted with its
comment left behind (``gluon_bwd_ab.REGISTER_OPERAND_HEAD_DIMS``, session 63) stopped that script at its first
point, and no CPU test imports and runs it. Other pyflakes messages (unused imports, most of them deliberate
``import flashlib`` lines that choose the interpreter) are not this test's business.
"""
import ast
from pathlib import Path

from pyflakes import checker as pyflakes_checker
from pyflakes import messages

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(path for folder in ("flashlib", "benchmarks", "tests") for path in (ROOT / folder).rglob("*.py"))
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


def undefined_names(source: str, filename: str) -> list[str]:
    """pyflakes' undefined-name messages for one file's ``source``."""
    checker = pyflakes_checker.Checker(ast.parse(source, filename=filename), filename=filename)
    return [str(message) for message in checker.messages if isinstance(message, UNDEFINED)]


def test_the_check_finds_a_name_used_but_never_defined():
    assert undefined_names("HEAD_DIMS = (64,)\n\ndef f(d):\n    return d in HEAD_DIM\n", "x.py") == [
        "x.py:4:17: undefined name 'HEAD_DIM'"]
    assert undefined_names("HEAD_DIMS = (64,)\n\ndef f(d):\n    return d in HEAD_DIMS\n", "x.py") == []


def test_no_python_file_uses_an_undefined_name():
    assert len(SOURCES) > 100
    found = [line for path in SOURCES for line in undefined_names(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []
