"""What crosses the sandbox's boundary: the grader's cases in, plain data out.

The grader writes cases for the learner's process (:func:`save_cases`: the inputs
only, never the expected outputs; pickled, since the grader wrote them) and reads
back its replies. Replies come from code the grader does not trust, so they are
loaded with
``torch.load(weights_only=True)``, which builds only tensors, numbers, strings
and containers (never runs code), from a file of bounded size. Whatever the
learner's code returns that is not such data travels as the name of its type, so
the verdict can still say "returned a ndarray, expected a torch.Tensor".
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import zipfile

import torch

from .checks.framework import Case, Reply

UNPORTABLE = "unportable type"
MAX_REPLY_BYTES = 64 * 2**20


def to_wire(value, depth: int = 0):
    """``value`` as plain data: CPU tensors (detached), numbers, strings, containers."""
    if depth > 8:
        return {UNPORTABLE: "deeply nested object"}
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").as_subclass(torch.Tensor).clone()
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    if type(value) in (tuple, list):  # exactly: a namedtuple or a list subclass travels as its type's name
        return type(value)(to_wire(item, depth + 1) for item in value)
    if type(value) is dict and all(isinstance(k, str) for k in value):
        return {key: to_wire(item, depth + 1) for key, item in value.items()}
    return {UNPORTABLE: type(value).__name__}


def from_wire(value):
    """The inverse of :func:`to_wire`; an unportable value becomes an object of a class of its type's name."""
    if isinstance(value, dict):
        if set(value) == {UNPORTABLE}:
            return type(str(value[UNPORTABLE])[:60] or "object", (), {})()
        return {key: from_wire(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(from_wire(item) for item in value)
    return value


def save(path: str | os.PathLike, value) -> None:
    """Write ``value`` (plain data) atomically: a reader never sees half a file."""
    tmp = f"{path}.part"
    torch.save(value, tmp)
    os.replace(tmp, path)


def load(path: str | os.PathLike, max_bytes: int = MAX_REPLY_BYTES):
    """Read plain data written by :func:`save`, refusing files over ``max_bytes`` and any code.

    ``torch.save`` stores its archive uncompressed; one with compressed entries (a few kilobytes that
    unpack to gigabytes) or whose entries add up to more than ``max_bytes`` is refused before it is read.
    """
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ValueError(f"{path}: {size} bytes, more than the {max_bytes} allowed")
    with zipfile.ZipFile(path) as archive:
        entries = archive.infolist()
    if any(entry.compress_type != zipfile.ZIP_STORED for entry in entries):
        raise ValueError(f"{path}: compressed entries, which torch.save never writes")
    unpacked = sum(entry.file_size for entry in entries)
    if unpacked > max_bytes:
        raise ValueError(f"{path}: {unpacked} bytes unpacked, more than the {max_bytes} allowed")
    return torch.load(path, weights_only=True, map_location="cpu")


def save_cases(path: str | os.PathLike, cases) -> None:
    """The cases' inputs (description, args, context), without their expected outputs."""
    stripped = [Case(case.description, case.args, None, case.tolerance, context=case.context)
                for case in cases]
    with open(path, "wb") as handle:
        pickle.dump(stripped, handle, protocol=pickle.HIGHEST_PROTOCOL)


def load_cases(path: str | os.PathLike) -> list[Case]:
    """The cases :func:`save_cases` wrote (the learner's side reads what the grader wrote)."""
    with open(path, "rb") as handle:
        return pickle.load(handle)  # noqa: S301 - written by the grader, read by its own worker


def reply_to_wire(reply: Reply) -> dict:
    return {"status": str(reply.status), "out": to_wire(reply.out), "args": to_wire(tuple(reply.args)),
            "context": to_wire(dict(reply.context)), "headline": str(reply.headline)[:2000],
            "details": [str(line)[:2000] for line in list(reply.details)[:20]]}


def reply_from_wire(data) -> Reply:
    """A Reply from untrusted plain data; anything malformed becomes a failed reply."""
    if not isinstance(data, dict):
        return Reply("raised", headline="unreadable reply from the learner's process")
    fields = {field.name for field in dataclasses.fields(Reply)}
    data = {key: from_wire(value) for key, value in data.items() if key in fields}
    if data.get("status") not in ("ok", "raised", "timeout", "not attempted", "refused"):
        return Reply("raised", headline="unreadable reply from the learner's process")
    if not isinstance(data.get("context", {}), dict):
        data["context"] = {}
    if not isinstance(data.get("args", ()), (tuple, list)):
        data["args"] = ()
    if not isinstance(data.get("details", []), list):
        data["details"] = []
    data["headline"] = str(data.get("headline", ""))
    return Reply(**data)
