"""Structured exercise results: what a check writes and the grader reads.

A check records one :class:`ExerciseResult` per call. Results are kept in memory
(for the notebook) and, when the grader runs a notebook, appended as JSON lines
to the file named by the environment variable ``FLASHLIB_RESULTS_FILE``. The grader
sets that variable for the kernel it starts, so nothing is written into the
learner's notebook or next to it.
"""
from __future__ import annotations

import dataclasses
import json
import os

RESULTS_ENV = "FLASHLIB_RESULTS_FILE"


@dataclasses.dataclass(frozen=True)
class ExerciseResult:
    """The verdict on one exercise: id like '01.naive_attention', points, feedback."""

    exercise: str
    passed: bool
    points: float
    max_points: float
    feedback: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> "ExerciseResult":
        return cls(**json.loads(line))


#: Results recorded in this process, in order (the last one per exercise counts).
RECORDED: list[ExerciseResult] = []


def record(result: ExerciseResult) -> ExerciseResult:
    """Keep ``result`` in memory and append it to the grader's file if one is set."""
    RECORDED.append(result)
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(result.to_json() + "\n")
    return result


def read_results(path: str) -> dict[str, ExerciseResult]:
    """The last result per exercise id from a results file (missing file → empty)."""
    results: dict[str, ExerciseResult] = {}
    if not os.path.exists(path):
        return results
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line:
                result = ExerciseResult.from_json(line)
                results[result.exercise] = result
    return results
