"""The verdict on one exercise, as data: what a check returns and the grader reports.

A check cell in a notebook prints its verdict and keeps it in :data:`RECORDED`
(for the learner's own session). Nothing here is written to a file or read by the
grader: the grader computes every verdict itself (:mod:`flashlib.course.grader`),
so nothing a notebook records can change a score.
"""
from __future__ import annotations

import dataclasses
import json


@dataclasses.dataclass(frozen=True)
class ExerciseResult:
    """The verdict on one exercise: id like '01_naive_attention.naive_attention', points, feedback."""

    exercise: str
    passed: bool
    points: float
    max_points: float
    feedback: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


#: Verdicts printed in this process, in order (for the learner's session; never graded).
RECORDED: list[ExerciseResult] = []
