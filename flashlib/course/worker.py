"""The learner's side of grading: run a rebuilt notebook, then the learner's answers on the grader's cases.

``python -m flashlib.course.worker WORKDIR`` runs inside the grader's sandbox
(:mod:`flashlib.course.sandbox`), in a temporary folder that holds

* ``job.json``: the code cells to run (the course's own, with the learner's
  answer regions in them; no check cells) and the exercises to answer;
* ``cases/<exercise>.pt``: the inputs of every case (never the expected outputs).

It runs the cells in order in one namespace (a cell that raises or runs past its
time limit is noted, and the rest go on), then calls each answer on its cases with
:func:`~flashlib.course.checks.framework.run_learner` and writes
``replies/<exercise>.pt`` and ``cells.pt``. It decides nothing: the grader
judges the replies against its own reference. The replies are outputs only, and
what an answer can compute them with is bounded by the policy
(:mod:`flashlib.course.policy`), which keeps it from reaching finished code or this
process's own machinery (its ``wire``, its files) before anything runs.
"""
from __future__ import annotations

import json
import linecache
import os
import sys
import traceback


def _run_cell(source: str, filename: str, namespace: dict, limit: float, time_limit, timeout_error):
    """Execute one cell; None, or a one-line description of what went wrong."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    alarm = None
    try:
        code = compile(source, filename, "exec")
        with time_limit(limit) as alarm:
            exec(code, namespace)  # noqa: S102 - the course's cells, with regions the grader vetted
    except BaseException as error:  # noqa: BLE001 - a cell's failure is reported, never fatal
        # the timeout, also when the code it interrupted turned it into another error on its way out
        if isinstance(error, timeout_error) or (alarm is not None and alarm.fired):
            return f"ran past its {limit:g} s limit"
        if isinstance(error, (KeyboardInterrupt,)):
            return "interrupted"
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == filename]
        where = f" (line {frames[-1].lineno})" if frames else ""
        return f"{type(error).__name__}: {str(error)[:300]}{where}"
    return None


def main(workdir: str) -> int:
    os.chdir(workdir)
    with open("job.json", encoding="utf-8") as handle:
        job = json.load(handle)
    import flashlib  # noqa: F401 - before triton: picks the interpreter where there is no GPU
    from flashlib.course import checks, wire
    from flashlib.course.checks.framework import CheckTimeout, Reply, run_learner, time_limit

    devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - the learner's prints go nowhere
    real_stdout, real_stderr = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = devnull
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    cell_errors = {}
    for cell in job["cells"]:
        problem = _run_cell(cell["source"], f"<cell {cell['index']}>", namespace,
                            float(job["cell_time_limit"]), time_limit, CheckTimeout)
        if problem:
            cell_errors[str(cell["index"])] = problem
    wire.save("cells.pt", {"errors": cell_errors})
    os.makedirs("replies", exist_ok=True)
    for key in job["exercises"]:
        check = checks.CHECKS[key]
        answer = job["answers"][key]
        cases = wire.load_cases(os.path.join("cases", f"{key}.pt"))
        if answer not in namespace:
            replies = [Reply("raised", headline=f"{answer} is not defined: its cell did not run to the end")]
        else:
            replies = run_learner(check, namespace[answer], cases)
        wire.save(os.path.join("replies", f"{key}.pt"), [wire.reply_to_wire(r) for r in replies])
    sys.stdout, sys.stderr = real_stdout, real_stderr
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
