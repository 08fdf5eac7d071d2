"""The grader: verdicts it computes itself, answers that must be the learner's own, the sandbox, points.

Learner notebooks here are the course's solution notebooks with one answer region
swapped for the code under test (:func:`learner_notebook`), so every test grades
a notebook a learner could hand in. The slow part, runs in the sandbox, is
grouped into a few module-scoped fixtures.
"""
import dataclasses
import hashlib
import json
import linecache
import math
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

from flashlib.course import answers, grader, policy, registry, sandbox

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"
FRAMEWORK = REPO / "flashlib" / "course" / "checks" / "framework.py"


def learner_notebook(key: str, regions: dict[str, str] | None = None, extra_cells=(), edit_checks=False):
    """The solution notebook of ``key`` with the answer region of some answers replaced.

    ``regions`` maps an answer name (e.g. "naive_attention") to the code that goes
    into its first region (dedented; it is indented to the region's place).
    """
    nb = nbformat.read(SOLUTIONS / f"{key}.ipynb", as_version=4)
    for name, code in (regions or {}).items():
        for cell in nb.cells:
            if cell.cell_type == "code" and answers._defines(cell.source, name):
                lines = cell.source.split("\n")
                (begin, end), *_ = answers.marker_pairs(lines)
                indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
                body = [indent + line if line.strip() else "" for line in textwrap.dedent(code).strip("\n").split("\n")]
                cell.source = "\n".join(lines[: begin + 1] + body + lines[end:])
                break
        else:
            raise AssertionError(f"no cell of {key} defines {name}")
    for code in extra_cells:
        nb.cells.append(nbformat.v4.new_code_cell(code))
    if edit_checks:
        for cell in nb.cells:
            if cell.cell_type == "code" and "checks.check_" in cell.source:
                cell.source += "\nprint('edited')"
    return nb


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def scores(report):
    return {s.exercise.split(".", 1)[1]: s for s in report.exercises}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ taking the answers

def test_answers_are_taken_from_the_marked_regions_only():
    nb = learner_notebook("01_naive_attention", {"naive_attention": "return q"})
    nb.cells[3].source = "import os  # a given line changed\n" + nb.cells[3].source
    canonical = nbformat.read(EXERCISES / "01_naive_attention.ipynb", as_version=4)
    submission = answers.take_answers(nb, canonical, "01_naive_attention")
    [cell] = submission.answer_cells("01_naive_attention.naive_attention")
    assert "import os" not in cell.source  # the grader runs the original given lines
    first, last = cell.regions[0]
    assert cell.source.split("\n")[first - 1:last] == ["    return q"]
    assert any("lines outside the answer markers were changed" in w for w in submission.warnings)


def test_removed_markers_edited_checks_and_extra_cells_are_reported():
    nb = learner_notebook("01_naive_attention", extra_cells=["print('mine')"], edit_checks=True)
    nb.cells[6].source = nb.cells[6].source.replace("### END SOLUTION", "")
    canonical = nbformat.read(EXERCISES / "01_naive_attention.ipynb", as_version=4)
    submission = answers.take_answers(nb, canonical, "01_naive_attention")
    assert "restore the markers" in submission.problems["01_naive_attention.stable_softmax"]
    assert any("check was edited" in w for w in submission.warnings)
    assert any("1 code cell(s) that the exercise does not have were not run" in w for w in submission.warnings)


def test_every_canonical_region_is_inside_a_function():
    for key in registry.notebooks():
        canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
        solution = nbformat.read(SOLUTIONS / f"{key}.ipynb", as_version=4)
        submission = answers.take_answers(solution, canonical, key)
        given_sources = [c.source for c in submission.cells if c.kind != answers.ANSWER]
        given = policy.flashlib_names(given_sources)
        for cell in submission.cells:
            if cell.kind == answers.ANSWER:
                assert policy.check_answer(registry.exercise(cell.exercise), cell.source, cell.regions,
                                           given, given_sources=given_sources) == [], cell.exercise


# ------------------------------------------------------------------ demo cells

@pytest.mark.parametrize("folder", [SOLUTIONS, EXERCISES])
def test_no_graded_cell_uses_a_name_that_a_demo_cell_binds(folder):
    demos = 0
    for key in registry.notebooks():
        canonical = nbformat.read(folder / f"{key}.ipynb", as_version=4)
        assert answers.demo_names_used_later(canonical, key) == [], key
        demos += sum(answers.DEMO_TAG in c.metadata.get("tags", []) for c in canonical.cells)
    assert demos >= 10  # the course's comparisons and figures: the grader runs none of them


@pytest.mark.parametrize("demo, words", [
    ("q = torch.zeros(3)", "cell 3 -> cell 4: q"),                 # rebinds a name a later cell reads
    ("q[0] = 1.0", "cell 3 -> cell 4: q"),                         # changes it in place
    ("import math as q", "cell 3 -> cell 4: q"),
    ("def helper():\n    global q\n    q = 1", "cell 3 -> cell 4: q"),
])
def test_a_demo_cell_whose_names_a_later_cell_uses_is_found(demo, words):
    canonical = nbformat.read(EXERCISES / "01_naive_attention.ipynb", as_version=4)
    cells = [nbformat.v4.new_code_cell("import torch\nq = torch.ones(3)"), nbformat.v4.new_code_cell(demo),
             nbformat.v4.new_code_cell("print(q.sum())")]
    cells[1].metadata["tags"] = [answers.DEMO_TAG]
    canonical.cells[1:1] = [nbformat.v4.new_markdown_cell("x")] + cells
    assert words in answers.demo_names_used_later(canonical, "01_naive_attention")
    cells[1].source = "r = q + 1\nprint(r)"                        # reading q is fine
    assert answers.demo_names_used_later(canonical, "01_naive_attention") == []


@pytest.mark.parametrize("kind", ["answer", "check"])
def test_an_answer_or_check_cell_tagged_demo_is_refused(kind):
    canonical = nbformat.read(EXERCISES / "01_naive_attention.ipynb", as_version=4)
    index = 3 if kind == "answer" else 4
    canonical.cells[index].metadata["tags"] = [answers.DEMO_TAG]
    with pytest.raises(ValueError, match=f"cell {index}: tagged 'demo' but holds"):
        answers.take_answers(canonical, canonical, "01_naive_attention")


def exercises_with_demo_cells(tmp_path, tag: bool) -> Path:
    """A copy of the course's exercise notebooks where 01 gains two given cells before its first answer, tagged demo
    or not: one binds ``SHIFT``, the next raises."""
    folder = tmp_path / ("tagged" if tag else "untagged")
    folder.mkdir()
    for path in EXERCISES.glob("*.ipynb"):
        (folder / path.name).write_bytes(path.read_bytes())
    nb = nbformat.read(folder / "01_naive_attention.ipynb", as_version=4)
    cells = [nbformat.v4.new_code_cell("SHIFT = 0.0"), nbformat.v4.new_code_cell("raise RuntimeError('a demo ran')")]
    for cell in cells:
        cell.metadata["tags"] = [answers.DEMO_TAG] if tag else []
    nb.cells[2:2] = cells
    nbformat.write(nb, folder / "01_naive_attention.ipynb")
    return folder


def test_the_grader_skips_demo_cells_and_reads_the_tag_from_the_course_not_the_learner(tmp_path):
    learner = learner_notebook("01_naive_attention")
    for cell in learner.cells:  # the learner's own tags decide nothing
        cell.metadata["tags"] = [answers.DEMO_TAG]
    path = write(learner, tmp_path / "learner" / "01_naive_attention.ipynb")
    skipped = grader.grade_notebook(path, exercises_dir=exercises_with_demo_cells(tmp_path, tag=True))
    run = grader.grade_notebook(path, exercises_dir=exercises_with_demo_cells(tmp_path, tag=False))
    assert skipped.total == run.total == 4
    assert not any("a demo ran" in w for w in skipped.warnings), skipped.warnings
    assert any("cell 3 raised RuntimeError: a demo ran" in w for w in run.warnings), run.warnings


def test_a_demo_cell_whose_name_the_answer_reads_runs_so_the_verdict_is_the_notebooks(tmp_path):
    """An answer that reads a demo cell's global works in Jupyter, so it must in the grader too: that demo runs."""
    learner = learner_notebook("01_naive_attention", {"naive_attention": """
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + SHIFT
        return torch.softmax(scores, dim=-1) @ v"""})
    path = write(learner, tmp_path / "learner" / "01_naive_attention.ipynb")
    report = grader.grade_notebook(path, exercises_dir=exercises_with_demo_cells(tmp_path, tag=True))
    assert scores(report)["naive_attention"].status == "PASS", report.exercises
    assert not any("a demo ran" in w for w in report.warnings), report.warnings  # only the cell it reads ran


# ------------------------------------------------------------------ whose work it is

def refusals(key, name, code):
    nb = learner_notebook(key, {name: code})
    canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
    submission = answers.take_answers(nb, canonical, key)
    given_sources = [c.source for c in submission.cells if c.kind != answers.ANSWER]
    cell = next(c for c in submission.cells if c.kind == answers.ANSWER
                and registry.exercise(c.exercise).answer == name)
    return " | ".join(str(r) for r in policy.check_answer(registry.exercise(cell.exercise), cell.source,
                                                          cell.regions, policy.flashlib_names(given_sources),
                                                          given_sources=given_sources))


@pytest.mark.parametrize("key, name, code, words", [
    ("01_naive_attention", "naive_attention", "from flashlib.reference import naive_attention\n"
     "return naive_attention(q, k, v)", "imports are not allowed"),
    ("01_naive_attention", "naive_attention", "return flashlib.reference.naive_attention(q, k, v)",
     "`flashlib` is not allowed"),
    ("01_naive_attention", "naive_attention",
     "return torch.nn.functional.scaled_dot_product_attention(q, k, v)", "scaled_dot_product_attention"),
    ("01_naive_attention", "naive_attention", "checks.framework._judge = lambda *a: None\nreturn q",
     "`checks` is flashlib's finished code"),
    ("01_naive_attention", "naive_attention", "exec(open('solutions/01_naive_attention.ipynb').read())",
     "`exec` is not allowed"),
    ("01_naive_attention", "naive_attention", "return __import__('flashlib').reference.naive_attention(q, k, v)",
     "names starting with _"),
    ("01_naive_attention", "naive_attention", "torch.softmax = lambda x, dim: x\nreturn q",
     "assigning to attributes of other objects"),
    ("01_naive_attention", "stable_softmax", "return torch.softmax(x, dim=-1)", "`.softmax` is not allowed"),
    ("03_online_softmax", "online_update", "return reference.online_update(m, l, acc, scores, v)",
     "`reference` is flashlib's finished code"),
    ("02_triton_tiled_matmul", "matmul_kernel", "c = triton_matmul(a_ptr, b_ptr)", "`triton_matmul` is not allowed"),
    ("02_triton_tiled_matmul", "matmul_kernel", "launch_matmul(a_ptr, b_ptr, c_ptr)",
     "`launch_matmul` is flashlib's finished code"),
    ("04_flash_forward", "flash_forward_kernel", "s = np.dot(q, k)", "`np` is not allowed"),
    ("04_flash_forward", "flash_forward_kernel", "s = torch.matmul(q, k)", "`torch` is not allowed"),
    ("08_in_practice", "attend",
     "o = torch.softmax(q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1), -1) @ v.transpose(1, 2)\n"
     "return o.transpose(1, 2) + 0 * flash_attention(q, k, v, causal=True, layout='bnhd')", "`@`"),
    ("08_in_practice", "attend", "return gpt.CausalSelfAttention.attend(q, k, v)",
     "the answer must call `flash_attention`"),
    ("08_in_practice", "GQAttention", "return super().forward(x)", "`super` is not allowed"),
    ("08_in_practice", "GQAttention", "return gpt.CausalSelfAttention.forward(self, x)",
     "`gpt` is flashlib's finished code"),
    # the finished code and the machine, reached through a module that imported sys or os
    ("01_naive_attention", "naive_attention",
     "return torch.sys.modules['flashlib.reference'].naive_attention(q, k, v)", "`.sys` is not allowed"),
    ("09_decoding", "merge_splits", "torch.serialization.os.system('true')\nreturn o_parts, lse_parts",
     "`.os` is not allowed"),
    # monkey-patching through a rebound self: only the method's own object may have attributes set
    ("01_naive_attention", "stable_softmax", "self = torch\nself.exp = lambda t: t\nreturn x",
     "rebinding `self` is not allowed"),
    ("01_naive_attention", "stable_softmax", "def patch(self):\n    self.exp = lambda t: t\npatch(torch)\nreturn x",
     "rebinding `self` is not allowed"),
    ("10_across_devices", "ring_step_merge", "for self in [torch]:\n    self.logaddexp = torch.maximum\nreturn o, lse",
     "rebinding `self` is not allowed"),
])
def test_someone_elses_work_is_refused_with_the_reason(key, name, code, words):
    assert words in refusals(key, name, code)


def test_ordinary_code_is_not_refused():
    code = ("x = x.type(torch.float64)\nrow_max = x.amax(dim=-1, keepdim=True)\n"
            "e = torch.exp(x - torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)))\n"
            "_ = e.shape\nreturn e / e.sum(dim=-1, keepdim=True)")
    assert refusals("01_naive_attention", "stable_softmax", code) == ""


def test_an_inherited_forward_is_not_an_answer():
    nb = learner_notebook("08_in_practice")
    cell = next(c for c in nb.cells if c.cell_type == "code" and answers._defines(c.source, "GQAttention"))
    cell.source = "class GQAttention(gpt.CausalSelfAttention):\n    pass"
    canonical = nbformat.read(EXERCISES / "08_in_practice.ipynb", as_version=4)
    submission = answers.take_answers(nb, canonical, "08_in_practice")
    assert "restore the markers" in submission.problems["08_in_practice.gqa_attention"]
    [rebuilt] = submission.answer_cells("08_in_practice.gqa_attention")
    assert "def forward(self, x):" in rebuilt.source and "NotImplementedError" in rebuilt.source


def test_a_refused_answer_is_not_run_and_scores_zero(tmp_path):
    marker = tmp_path / "ran"
    path = write(learner_notebook("01_naive_attention", {
        "naive_attention": f"open({str(marker)!r}, 'w').write('x')\nreturn flashlib.reference.naive_attention(q, k, v)",
    }), tmp_path / "sub" / "01_naive_attention.ipynb")
    report = grader.grade_notebook(path)
    got = scores(report)
    assert (got["naive_attention"].status, got["naive_attention"].points) == ("REFUSED", 0)
    assert "`open` is not allowed" in got["naive_attention"].feedback
    assert got["stable_softmax"].status == "PASS"  # the other exercise keeps its points
    assert not marker.exists()


# ------------------------------------------------------------------ verdicts are the grader's

def test_recording_results_editing_checks_and_extra_cells_earn_nothing(tmp_path):
    nb = nbformat.read(EXERCISES / "01_naive_attention.ipynb", as_version=4)
    forged = ("from flashlib.course import results\n"
              "for name in ('naive_attention', 'stable_softmax'):\n"
              "    results.RECORDED.append(results.ExerciseResult('01_naive_attention.' + name, True, 2, 2, 'ok'))\n"
              "import os\nopen(os.environ.get('FLASHLIB_RESULTS_FILE', 'results.jsonl'), 'a').write('{}')\n"
              "from flashlib.course.checks import framework\nframework.judge = lambda *a: (True, 'ok', [])\n")
    nb.cells.append(nbformat.v4.new_code_cell(forged))
    for cell in nb.cells:
        if cell.cell_type == "code" and "checks.check_" in cell.source:
            cell.source = "print('✓ correct (2/2 points)')"
    report = grader.grade_notebook(write(nb, tmp_path / "01_naive_attention.ipynb"))
    assert report.total == 0 and report.max_total == 4
    assert [s.status for s in report.exercises] == ["FAIL", "FAIL"]
    assert all("not attempted" in s.feedback for s in report.exercises)
    assert sum("check was edited" in w for w in report.warnings) == 2


WRONG_ANSWERS = [
    # (notebook, answer, code): plausible wrong answers that once passed on some seeds or always
    ("01_naive_attention", "stable_softmax",
     "e = torch.exp(x - x.max())\nreturn e / e.sum(dim=-1, keepdim=True)"),
    ("03_online_softmax", "online_update",
     "m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)\n"
     "m_new = torch.maximum(m_safe, scores.amax(dim=-1))\n"
     "alpha = torch.exp(m - m_new)\np = torch.exp(scores - m_new[:, None])\n"
     "return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + p @ v"),
    # C comes out right; only the loads past M and N, counted where the kernel ran, give it away
    ("02_triton_tiled_matmul", "matmul_kernel",
     "for k0 in range(0, K, BLOCK_K):\n"
     "    a = tl.load(a_ptrs, mask=offs_k[None, :] + k0 < K, other=0.0)\n"
     "    b = tl.load(b_ptrs, mask=offs_k[:, None] + k0 < K, other=0.0)\n"
     "    acc += tl.dot(a, b)\n    a_ptrs += BLOCK_K * stride_ak\n    b_ptrs += BLOCK_K * stride_bk"),
    # A learner audit's answers that passed (session 53): right values, inputs changed in place (the check handed
    # each block's call copies)
    ("03_online_softmax", "online_update",
     "m_new = torch.maximum(m, scores.amax(-1))\nm_safe = torch.where(torch.isneginf(m_new), 0.0, m_new)\n"
     "alpha = torch.exp(m - m_safe)\nscores.sub_(m_safe[:, None]).exp_()\n"
     "return m_new, alpha * l + scores.sum(-1), alpha[:, None] * acc + scores @ v"),
    # O right, K loaded past N_K (its scores are masked): counted where the kernel ran
    ("04_flash_forward", "flash_forward_kernel",
     "cols = start_n + offs_n\n"
     "k = tl.load(k_ptrs + start_n * stride_kn, mask=cols[None, :] <= N_K, other=0.0)\n"
     "v = tl.load(v_ptrs + start_n * stride_vn, mask=cols[:, None] < N_K, other=0.0)\n"
     "s = tl.where(cols[None, :] < N_K, tl.dot(q, k) * sm_scale, float('-inf'))\n"
     "m_new = tl.maximum(m_i, tl.max(s, 1))\nalpha = tl.exp(m_i - m_new)\np = tl.exp(s - m_new[:, None])\n"
     "l_i = l_i * alpha + tl.sum(p, 1)\nacc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)\nm_i = m_new"),
    # no casts to dO's and Q's dtype: right in float32, refused by tl.dot in float16
    ("05_flash_backward", "flash_dkdv_kernel",
     "rows = start_m + offs_m\n"
     "q = tl.load(q_ptrs + start_m * stride_qn, mask=rows[:, None] < N_Q, other=0.0)\n"
     "do = tl.load(do_ptrs + start_m * stride_don, mask=rows[:, None] < N_Q, other=0.0)\n"
     "lse = tl.load(l_ptrs + start_m, mask=rows < N_Q, other=0.0)\n"
     "delta = tl.load(delta_ptrs + start_m, mask=rows < N_Q, other=0.0)\n"
     "p = tl.exp(tl.dot(q, kT) * sm_scale - lse[:, None])\ndv += tl.dot(tl.trans(p), do)\n"
     "ds = p * (tl.dot(do, vT) - delta[:, None])\ndk += tl.dot(tl.trans(ds), q) * sm_scale"),
    # float64 out of float32 inputs
    ("05_flash_backward", "ds", "return p.double() * (dp.double() - d.double()[..., None])"),
    ("01_naive_attention", "stable_softmax",
     "x = x.double()\ne = torch.exp(x - x.amax(-1, keepdim=True))\nreturn e / e.sum(-1, keepdim=True)"),
]


@pytest.mark.parametrize("key, name, code", WRONG_ANSWERS)
def test_the_notebook_and_the_grader_give_the_same_verdict(key, name, code, tmp_path):
    from flashlib.course import checks
    from flashlib.course.checks.framework import run_check

    nb = learner_notebook(key, {name: code})
    report = grader.grade_notebook(write(nb, tmp_path / f"{key}.ipynb"))
    exercise = next(e for e in registry.exercises_of(key) if e.answer == name)
    graded = next(s for s in report.exercises if s.exercise == exercise.key)
    # The same answer, run in this process as the notebook's check cell runs it.
    canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
    submission = answers.take_answers(nb, canonical, key)
    namespace = {}
    exec(submission.cells[0].source, namespace)  # the notebook's imports
    answer_cell = submission.answer_cells(exercise.key)[0].source
    filename = f"<answer of {key}>"  # as Jupyter does, the cell's lines are known (feedback quotes the failing one)
    linecache.cache[filename] = (len(answer_cell), None, answer_cell.splitlines(True), filename)
    exec(compile(answer_cell, filename, "exec"), namespace)
    mine = run_check(checks.CHECKS[exercise.key], namespace[name])
    assert not mine.passed and not graded.passed
    assert graded.feedback == grader._short(mine.feedback)


@pytest.mark.parametrize("key, name, code", [
    ("01_naive_attention", "stable_softmax", "return torch.softmax(x, dim=-1)"),
    ("03_online_softmax", "merge_partials", "m = torch.maximum(m_a, m_b)\nreturn m, torch.logsumexp(l_a, -1), o_a"),
    ("02_triton_tiled_matmul", "matmul_kernel", "acc += tl.str_to_ty('fp32', None)"),
    # notebook 09 imports no math: the learner's scratch cell did (below), which the grader never runs
    ("09_decoding", "merge_splits", "return -math.inf"),
])
def test_the_notebooks_check_refuses_what_the_grader_refuses_in_its_words(key, name, code, tmp_path):
    """A check cell once gave 2/2 to torch.softmax, which the grader refuses: both now read the cell's answer
    regions with the same rules, and say the same."""
    import linecache

    from flashlib.course import checks
    from flashlib.course.checks.framework import run_check

    nb = learner_notebook(key, {name: code})
    report = grader.grade_notebook(write(nb, tmp_path / f"{key}.ipynb"))
    exercise = next(e for e in registry.exercises_of(key) if e.answer == name)
    graded = next(s for s in report.exercises if s.exercise == exercise.key)
    assert graded.status == "REFUSED"
    canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
    submission = answers.take_answers(nb, canonical, key)
    namespace = {}
    exec(submission.cells[0].source + "\nimport math  # a scratch cell of the learner's", namespace)
    source = submission.answer_cells(exercise.key)[0].source
    filename = f"<notebook cell {key}>"  # as Jupyter keeps a cell's source for inspect and tracebacks
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    mine = run_check(checks.CHECKS[exercise.key], namespace[name])
    assert not mine.passed and mine.points == 0
    assert graded.feedback in grader._short(mine.feedback), (graded.feedback, mine.feedback)


def _run_as_a_cell(source: str, namespace: dict, cell_number: int) -> None:
    """Run ``source`` as ipykernel runs a cell: compiled under a file name of its own kind, its lines kept."""
    filename = f"/tmp/ipykernel_4242/{3141592 + cell_number}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)


def _imports_of(key: str) -> str:
    canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
    return answers.take_answers(canonical, canonical, key).cells[0].source


def test_a_helper_added_outside_the_markers_is_refused_by_the_check_as_by_the_grader(tmp_path):
    """Session 72's audit: a helper defined in the answer cell above the function, outside the markers, got the
    check cell's tick (it read the cell as edited) and the grader's refusal (it runs the cell as the course wrote
    it, plus the answer regions). The check now reads only the course's names, as the grader does."""
    from flashlib.course import checks
    from flashlib.course.checks.framework import run_check

    key, name = "01_naive_attention", "stable_softmax"
    nb = learner_notebook(key, {name: "e = torch.exp(x - row_max(x))\nreturn e / e.sum(dim=-1, keepdim=True)"})
    cell = next(c for c in nb.cells if c.cell_type == "code" and answers._defines(c.source, name))
    cell.source = "def row_max(x):\n    return x.amax(dim=-1, keepdim=True)\n\n\n" + cell.source
    graded = scores(grader.grade_notebook(write(nb, tmp_path / f"{key}.ipynb")))[name]
    namespace = {}
    exec(_imports_of(key), namespace)
    _run_as_a_cell(cell.source, namespace, 1)
    mine = run_check(checks.CHECKS[f"{key}.{name}"], namespace[name])
    assert graded.status == "REFUSED" and not mine.passed and mine.points == 0
    for feedback in (graded.feedback, mine.feedback):
        assert "`row_max` is not defined by the notebook's cells" in feedback, feedback


def test_a_function_redefined_in_a_cell_without_markers_fails_the_check_as_it_fails_the_grader(tmp_path):
    """Session 72's audit: a scratch cell that redefined the answer's function (here with torch.softmax, which
    the exercise forbids) got the check cell's tick, and the grader, which reads only the marked cell, gave
    "not attempted". The check now says where the grader looks."""
    from flashlib.course import checks
    from flashlib.course.checks.framework import run_check

    key, name = "01_naive_attention", "naive_attention"
    scratch = ("def naive_attention(q, k, v):\n"
               "    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1) @ v")
    nb = learner_notebook(key, extra_cells=[scratch])
    for cell in nb.cells:  # the marked cell left as the exercise gives it
        if cell.cell_type == "code" and answers._defines(cell.source, name) and answers.marker_pairs(
                cell.source.split("\n")):
            canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
            cell.source = next(c.source for c in canonical.cells if c.cell_type == "code"
                               and answers._defines(c.source, name))
    graded = scores(grader.grade_notebook(write(nb, tmp_path / f"{key}.ipynb")))[name]
    namespace = {}
    exec(_imports_of(key), namespace)
    _run_as_a_cell(scratch, namespace, 2)
    mine = run_check(checks.CHECKS[f"{key}.{name}"], namespace[name])
    assert not graded.passed and "not attempted" in graded.feedback
    assert not mine.passed and mine.points == 0
    assert "comes from a cell without this exercise's answer markers" in mine.feedback, mine.feedback
    # a function of a file, not a cell (the library's reference, as a demo passes it), is not held to the markers
    from flashlib.reference import naive_attention as reference

    assert policy.refusals_in_notebook(registry.BY_KEY[f"{key}.{name}"], reference) == []


def test_notebook_cells_are_told_by_the_file_names_jupyter_gives_them():
    assert policy.is_notebook_cell("/tmp/ipykernel_812/2471389642.py")
    assert policy.is_notebook_cell("<ipython-input-3-5d1c1a2f9e0b>")
    assert not policy.is_notebook_cell("/work/flashlib/reference.py") and not policy.is_notebook_cell("<string>")


def test_a_blank_exercise_is_not_attempted_in_the_notebook_not_refused():
    """The placeholder of a generated exercise is no answer to read: the check cell says not attempted."""
    import linecache

    from flashlib.course import checks
    from flashlib.course.checks.framework import run_check

    key, name = "01_naive_attention", "stable_softmax"
    canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
    submission = answers.take_answers(canonical, canonical, key)
    exercise = next(e for e in registry.exercises_of(key) if e.answer == name)
    source = submission.answer_cells(exercise.key)[0].source
    filename = "<notebook cell blank>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {}
    exec(submission.cells[0].source, namespace)
    exec(compile(source, filename, "exec"), namespace)
    assert policy.refusals_in_notebook(exercise, namespace[name]) == []
    result = run_check(checks.CHECKS[exercise.key], namespace[name])
    assert not result.passed and "not attempted" in result.feedback and "refused" not in result.feedback


# ------------------------------------------------------------------ points as data

def test_points_are_clamped_and_nan_safe():
    assert registry.clamp_points(math.nan, 2) == 0.0
    assert registry.clamp_points(math.inf, 2) == 0.0
    assert registry.clamp_points(1000, 2) == 2.0
    assert registry.clamp_points(-1, 2) == 0.0
    assert registry.clamp_points("2", 2) == 2.0 and registry.clamp_points(None, 2) == 0.0
    report = grader.NotebookReport("x.ipynb", "01_naive_attention", grader.GRADED, [
        grader.ExerciseScore("01_naive_attention.naive_attention", math.nan, 2, True, "PASS", ""),
        grader.ExerciseScore("01_naive_attention.stable_softmax", 1000, 2, True, "PASS", "")], [])
    assert report.total == 2 and report.max_total == 4
    assert json.loads(json.dumps(grader.to_json([report])))["total"] == 2


def test_the_file_name_beats_the_metadata():
    nb = nbformat.v4.new_notebook()
    nb.metadata["flashlib"] = {"notebook": "08_in_practice"}
    key, warning = grader.notebook_key(nb, Path("alice_01_naive_attention.ipynb"))
    assert key == "01_naive_attention" and "metadata says '08_in_practice'" in warning
    assert grader.notebook_key(nb, Path("homework.ipynb")) == ("08_in_practice", None)
    nb.metadata["flashlib"] = {"notebook": "99_bonus"}
    assert grader.notebook_key(nb, Path("homework.ipynb")) == (None, None)


def test_unknown_notebooks_and_duplicates_are_reported_not_scored(tmp_path):
    bonus = nbformat.v4.new_notebook()
    bonus.metadata["flashlib"] = {"notebook": "99_bonus", "max_points": 1000}
    unknown = grader.grade_notebook(write(bonus, tmp_path / "bonus.ipynb"))
    assert unknown.status == grader.UNKNOWN and unknown.total == 0 and unknown.max_total == 0
    first = write(learner_notebook("07_performance"), tmp_path / "dup" / "07_performance.ipynb")
    second = write(learner_notebook("07_performance"), tmp_path / "dup" / "copy_07_performance.ipynb")
    reports = grader.grade([first, second])
    assert [r.status for r in reports] == [grader.DUPLICATE] * 2
    summary = grader.to_json(reports)
    assert (summary["total"], summary["max_total"]) == (0, 0)
    assert "2 submissions of 07_performance" in reports[0].warnings[0]


# ------------------------------------------------------------------ the sandbox

HOSTILE = """
import os, signal, subprocess, shutil
for attempt in (
    lambda: subprocess.Popen(["sleep", "4242"], start_new_session=True),
    lambda: subprocess.Popen(["sh", "-c", "sleep 2; echo hacked > {report}"], start_new_session=True),
    lambda: os.fork() == 0 and (os.setsid(), os.execvp("sleep", ["sleep", "4243"])),
    lambda: shutil.rmtree({neighbours!r}),
    lambda: open({framework!r}, "a").write("\\nEXERCISES.clear()\\n"),
    lambda: open({report!r}, "w").write("hacked"),
    lambda: os.kill({grader_pid}, signal.SIGSTOP),
    lambda: os.kill({grader_pid}, signal.SIGKILL),
    lambda: os.kill(os.getppid(), signal.SIGSTOP),
    lambda: print("x" * 100_000_000),
):
    try:
        attempt()
    except BaseException:
        pass
os._exit(0)
"""


def _sleepers():
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"sleep 424" in cmdline or b"echo hacked" in cmdline:
            found.append((entry, cmdline))
    return found


def _modes():
    modes = []
    for mode in ("bwrap", "user"):
        try:
            sandbox.pick_mode(mode)
            modes.append(pytest.param(mode))
        except ValueError as error:
            modes.append(pytest.param(mode, marks=pytest.mark.skip(reason=str(error))))
    return modes


@pytest.fixture(scope="module", params=_modes())
def hostile_run(request, tmp_path_factory):
    mode = request.param
    root = tmp_path_factory.mktemp(f"hostile-{mode}")
    neighbours = root / "neighbours"
    neighbour = write(learner_notebook("07_performance"), neighbours / "07_performance.ipynb")
    report_path = root / "report.json"
    report_path.write_text("{}")
    code = HOSTILE.format(report=str(report_path), neighbours=str(neighbours), framework=str(FRAMEWORK),
                          grader_pid=os.getpid())
    learner = write(learner_notebook("01_naive_attention", {"naive_attention": code}),
                    root / "learner" / "01_naive_attention.ipynb")
    before = {p: digest(p) for p in (learner, neighbour, FRAMEWORK, report_path)}
    started = time.monotonic()
    report = grader.grade_notebook(learner, timeout=120, mode=mode, enforce_policy=False, hide=[root])
    elapsed = time.monotonic() - started
    time.sleep(2.5)  # the delayed writer would have written by now
    later = grader.grade_notebook(neighbour, mode=mode)
    return dict(report=report, later=later, elapsed=elapsed, before=before, mode=mode)


def test_hostile_code_is_refused_by_the_policy(tmp_path):
    code = HOSTILE.format(report="r", neighbours="n", framework="f", grader_pid=1)
    assert "imports are not allowed" in refusals("01_naive_attention", "naive_attention", code)


def test_hostile_code_ends_in_bounded_time(hostile_run):
    assert hostile_run["elapsed"] < 120
    assert hostile_run["report"].sandbox == hostile_run["mode"]
    assert hostile_run["report"].total == 0  # os._exit: no answers came back


def test_hostile_code_leaves_no_process(hostile_run):
    assert _sleepers() == []


def test_hostile_code_changes_nothing_outside_its_copy(hostile_run):
    for path, before in hostile_run["before"].items():
        assert path.exists() and digest(path) == before, path  # learner, neighbour, flashlib, report


def test_the_next_notebook_keeps_its_points(hostile_run):
    later = hostile_run["later"]
    assert later.total == later.max_total == 5, grader.format_report(later)


def test_even_the_weakest_sandbox_leaves_no_process(tmp_path):
    """The session mode (no bubblewrap, not root) cannot stop signals or writes, but kills every leftover."""
    code = ("import os, subprocess\n"
            "subprocess.Popen(['sleep', '4242'], start_new_session=True)\n"
            "if os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '4243'])\n"
            "os._exit(3)")
    path = write(learner_notebook("01_naive_attention", {"naive_attention": code}), tmp_path / "01_naive_attention.ipynb")
    report = grader.grade_notebook(path, mode="session", enforce_policy=False)
    assert report.sandbox == "session" and report.total == 0
    assert any("process(es) left behind by the notebook were killed" in w for w in report.warnings)
    assert _sleepers() == []


def test_an_endless_loop_costs_only_its_exercise(tmp_path):
    path = write(learner_notebook("01_naive_attention", {"naive_attention": "while True:\n    pass"}),
                 tmp_path / "01_naive_attention.ipynb")
    started = time.monotonic()
    report = grader.grade_notebook(path)
    assert time.monotonic() - started < 60
    got = scores(report)
    assert got["naive_attention"].status == "FAIL" and "took longer than" in got["naive_attention"].feedback
    assert got["stable_softmax"].status == "PASS"


def test_the_notebook_time_limit_stops_a_given_cell_that_hangs(tmp_path):
    path = write(learner_notebook("01_naive_attention", {"naive_attention": "while True:\n    pass"}),
                 tmp_path / "01_naive_attention.ipynb")
    report = grader.grade_notebook(path, timeout=4)
    assert report.total == 0
    assert any("ran past its 4 s limit" in w for w in report.warnings)
    assert [s.status for s in report.exercises] == ["NOT RUN", "NOT RUN"]


# ------------------------------------------------------------------ the hidden case

def _lookup_table_answer(key: str) -> str:
    """stable_softmax as a table of the public cases' float64 outputs, keyed by the input's shape and dtype."""
    from flashlib.course.checks import CHECKS
    from flashlib.course.checks.framework import make_cases

    table = {(tuple(case.args[0].shape), str(case.args[0].dtype)): case.expected.tolist()
             for case in make_cases(CHECKS[key])}
    assert len(table) == len(make_cases(CHECKS[key]))  # one entry per public case
    return (f"table = {table!r}\n"
            "return torch.tensor(table[(tuple(x.shape), str(x.dtype))], dtype=x.dtype)")


def test_outputs_looked_up_in_a_table_pass_the_notebook_but_not_the_grader(tmp_path):
    """The public cases are the same in the notebook and in the grader, so a table of their outputs passes the
    notebook's check; the grader's hidden case, from a seed the learner never sees, fails it."""
    from flashlib.course import checks
    from flashlib.course.checks.framework import run_check

    code = _lookup_table_answer("01_naive_attention.stable_softmax")
    namespace = {}
    exec("import torch\ndef stable_softmax(x):\n" + textwrap.indent(code, "    "), namespace)
    assert run_check(checks.CHECKS["01_naive_attention.stable_softmax"], namespace["stable_softmax"]).passed
    path = write(learner_notebook("01_naive_attention", {"stable_softmax": code}), tmp_path / "01_naive_attention.ipynb")
    report = grader.grade_notebook(path, case_seed=11)
    got = scores(report)
    assert got["stable_softmax"].status == "FAIL" and report.case_seed == 11
    assert "right on the notebook's cases, not on a case only the grader draws" in got["stable_softmax"].feedback
    assert got["naive_attention"].status == "PASS"


@pytest.mark.parametrize("seed", [0, 3, 11])  # 0 once gave the public seed itself (session 72's review)
def test_every_exercise_gets_hidden_cases_the_notebook_never_ran(seed):
    """Formula exercises draw plain numbers, not tensors; their hidden case was once taken for a public one (only
    tensors were compared), so four exercises had none and a table of their public outputs passed the grader."""
    from flashlib.course.checks import CHECKS
    from flashlib.course.checks.framework import hidden_cases, make_cases

    for key, check in CHECKS.items():
        hidden = hidden_cases(check, grader.hidden_seed(seed, key))
        assert hidden, key
        for case in hidden:
            assert not any(case.description == public.description and equal_values(case.args, public.args)
                           for public in make_cases(check)), key


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_table_of_the_public_outputs_with_any_named_mistake_elsewhere_fails_the_hidden_cases(seed):
    """The audit of session 72: the one hidden case was the smallest fresh one, always the easy kind (float32
    standard normal values for the softmax, S = 1 for the merge of splits), so the public outputs in a table and
    the mistake the hard cases are made for everywhere else (no max subtracted, no merge at all) got full points.
    Every named mistake of every function exercise must now fail on the hidden cases alone, in each of its
    variants. The three kernel exercises are left out: the check launches their kernel and notes its buffers
    in the reply, which a table of outputs has no way to fill, and a kernel body is no place for a table."""
    from flashlib.course.checks import CHECKS
    from flashlib.course.checks.framework import Reply, accept_callable, copy_tensors, hidden_cases, make_cases

    kernels = {"02_triton_tiled_matmul.matmul_kernel", "04_flash_forward.inner_loop", "05_flash_backward.dkdv_loop"}
    assert all(CHECKS[key].accept is not accept_callable for key in kernels)  # each takes a kernel, not a function
    for key, check in CHECKS.items():
        if key in kernels or key == GRAPH_CHECKED:
            continue
        public = make_cases(check)
        hidden = hidden_cases(check, grader.hidden_seed(seed, key))
        table = [Reply("ok", out=_right_output(case), args=copy_tensors(case.args)) for case in public]
        assert grader.judge_with_hidden(check, (public, hidden), table + [
            Reply("ok", out=_right_output(case), args=copy_tensors(case.args)) for case in hidden])[0], key
        for mistake in check.mistakes:
            outputs = [_mistake_outputs(mistake, case) for case in hidden]
            variants = max((len(o) for o in outputs if o is not None), default=0)
            assert variants, f"{key}: mistake {mistake.name!r} cannot be told apart on any hidden case"
            for variant in range(variants):
                replies = [Reply("ok", out=_right_output(case) if o is None else o[min(variant, len(o) - 1)],
                                 args=copy_tensors(case.args)) for case, o in zip(hidden, outputs)]
                passed, headline, _ = grader.judge_with_hidden(check, (public, hidden), table + replies)
                assert not passed, f"{key}: mistake {mistake.name!r} (variant {variant}) passed the hidden cases"
                assert headline.startswith("right on the notebook's cases, not on a case only the grader draws")


#: The exercise whose check follows the output's autograd graph back to q, k and v: a table's tensors have none.
GRAPH_CHECKED = "08_in_practice.attend"


def test_a_table_of_public_outputs_fails_the_public_cases_where_the_check_follows_the_autograd_graph():
    from flashlib.course.checks import CHECKS
    from flashlib.course.checks.framework import judge, make_cases, run_learner

    check = CHECKS[GRAPH_CHECKED]
    public = make_cases(check)

    def table(*args):
        for case in public:
            if equal_values(tuple(a.detach() if hasattr(a, "detach") else a for a in args), case.args):
                return _right_output(case)
        raise AssertionError("an input the table does not hold")

    passed, headline, _ = judge(check, public, run_learner(check, table, public))
    assert not passed and "gradient" in headline


def _right_output(case):
    """The case's float64 reference in the dtype the check wants back: what a table of outputs would hold."""
    import torch

    def cast(value, dtype):
        return value.clone() if dtype is None or not isinstance(value, torch.Tensor) else value.to(dtype)

    if isinstance(case.expected, tuple):
        dtypes = case.out_dtype if isinstance(case.out_dtype, tuple) else (case.out_dtype,) * len(case.expected)
        return tuple(cast(value, dtype) for value, dtype in zip(case.expected, dtypes))
    return cast(case.expected, case.out_dtype)


def _mistake_outputs(mistake, case) -> list | None:
    """What ``mistake`` returns for ``case`` as a list of variants, or None where it cannot be told apart."""
    from flashlib.course.checks.framework import copy_tensors

    try:
        produced = mistake.compute(*copy_tensors(case.args))
    except Exception:  # noqa: BLE001 - a mistake that cannot run on a case does not apply to it
        return None
    if produced is None:
        return None
    return produced if isinstance(produced, list) else [produced]


def equal_values(a, b) -> bool:
    """Tensors by torch.equal, containers item by item, anything else by ==."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(equal_values, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal_values(a[k], b[k]) for k in a)
    return a == b


def test_a_table_of_a_formula_exercises_public_outputs_fails_the_grader(tmp_path):
    from flashlib.course import checks
    from flashlib.course.checks.framework import make_cases, run_check

    key = "07_performance.attention_flops"
    table = {(shape, kwargs["causal"], kwargs["mode"]): float(value)
             for case in make_cases(checks.CHECKS[key])
             for (shape, kwargs), value in zip(case.args[0], case.expected.tolist())}
    code = f"table = {table!r}\nreturn table[((batch, heads, n, d), causal, mode)]"
    namespace = {}
    exec('def attention_flops(batch, heads, n, d, causal=False, mode="fwd"):\n' + textwrap.indent(code, "    "),
         namespace)
    assert run_check(checks.CHECKS[key], namespace["attention_flops"]).passed
    path = write(learner_notebook("07_performance", {"attention_flops": code}), tmp_path / "07_performance.ipynb")
    got = scores(grader.grade_notebook(path, case_seed=5))
    assert got["attention_flops"].status == "FAIL"
    assert "right on the notebook's cases, not on a case only the grader draws" in got["attention_flops"].feedback
    assert got["achieved_tflops"].status == "PASS"


def test_the_hidden_cases_are_new_reproducible_and_judged_after_the_public_ones():
    from flashlib.course.checks import CHECKS
    from flashlib.course.checks.framework import hidden_cases, judge, make_cases, run_learner
    from flashlib.reference import stable_softmax

    key = "01_naive_attention.stable_softmax"
    check, public = CHECKS[key], make_cases(CHECKS[key])
    seeds = [grader.hidden_seed(run, key) for run in (1, 2)]
    assert seeds[0] != seeds[1] and grader.hidden_seed(1, key) == seeds[0]
    hidden = hidden_cases(check, seeds[0])
    assert hidden and not any(torch_equal_args(case, old) for case in hidden for old in public)
    again = hidden_cases(check, seeds[0])  # the same seed, the same cases
    assert len(again) == len(hidden) and all(map(torch_equal_args, hidden, again))
    # the designed case (rows near +-800) is drawn again: the same structure, other values
    designed = [case for case in hidden if "very different offsets" in case.description]
    assert len(designed) == 1 and not torch_equal_args(designed[0], public[0])
    assert designed[0].description == public[0].description
    replies = run_learner(check, stable_softmax, public + hidden)
    assert grader.judge_with_hidden(check, (public, hidden), replies) == judge(check, public, replies[:len(public)])
    wrong_on_hidden = replies[:-1] + [dataclasses.replace(replies[-1], out=replies[-1].out * 2)]
    passed, headline, _ = grader.judge_with_hidden(check, (public, hidden), wrong_on_hidden)
    assert not passed and headline.startswith("right on the notebook's cases, not on a case only the grader draws")


def torch_equal_args(a, b) -> bool:
    import torch

    return a.description == b.description and all(
        torch.equal(x, y) for x, y in zip(a.args, b.args) if isinstance(x, torch.Tensor))


# ------------------------------------------------------------------ one learner cannot stop the class run

def test_an_output_the_checks_cannot_read_fails_only_its_exercise(tmp_path):
    """A float8 tensor passes the policy, and judging it once raised out of the grader, ending the class run."""
    code = "return torch.zeros(seq_lens.shape[0], 1, n_q, n_k).to(torch.float8_e4m3fn)"
    path = write(learner_notebook("06_masking", {"padding_mask": code}), tmp_path / "06_masking.ipynb")
    report = grader.grade_notebook(path)
    got = scores(report)
    assert got["padding_mask"].status == "FAIL" and "could not be judged" in got["padding_mask"].feedback
    assert report.total == report.max_total - got["padding_mask"].max_points  # the other exercises keep theirs


def test_an_answer_nested_too_deeply_to_parse_is_refused(tmp_path):
    """Python's parser raises RecursionError (not SyntaxError) on 100 000 nested additions."""
    path = write(learner_notebook("01_naive_attention", {"stable_softmax": "return " + "x + " * 100_000 + "x"}),
                 tmp_path / "01_naive_attention.ipynb")
    got = scores(grader.grade_notebook(path))
    assert got["stable_softmax"].status == "REFUSED" and "nested too deeply" in got["stable_softmax"].feedback
    assert got["naive_attention"].status == "PASS"


def test_a_forged_cells_file_is_read_as_data_only(tmp_path):
    """The learner's process writes cells.pt; keys that are not cell numbers once crashed the grader's sort."""
    code = ("torch.save({'errors': {'not-a-number': 'x', '3': 5, '4': 'forged'}}, 'cells.pt')\n"
            "return flashlib.reference.naive_attention(q, k, v)")
    path = write(learner_notebook("01_naive_attention", {"naive_attention": code}), tmp_path / "01_naive_attention.ipynb")
    report = grader.grade_notebook(path, enforce_policy=False)  # as if the policy had been got around
    assert report.status == grader.GRADED
    assert [w for w in report.warnings if w.startswith("cell ")] == ["cell 4 raised forged"]


def test_a_learners_cell_of_blank_lines_is_searched_in_linear_time():
    """answers._defines once took time quadratic in the lines of a cell (300 000 newlines: minutes)."""
    started = time.monotonic()
    assert not answers._defines("\n" * 300_000 + "x = 1", "naive_attention")
    assert time.monotonic() - started < 2
    assert answers._defines("  async def naive_attention(q):", "naive_attention")


def test_symbolic_links_are_reported_and_never_read(tmp_path):
    """A notebook or a learner's folder that links to another learner's work is not graded, and says why."""
    bob = write(learner_notebook("07_performance"), tmp_path / "class" / "bob" / "07_performance.ipynb")
    alice = tmp_path / "class" / "alice"
    alice.mkdir()
    (alice / "07_performance.ipynb").symlink_to(bob)
    (tmp_path / "class" / "carol").symlink_to(bob.parent, target_is_directory=True)
    report = grader.grade_notebook(alice / "07_performance.ipynb")
    assert (report.status, report.total, report.counted) == (grader.LINKED, 0, False)
    assert report.notebook == "07_performance" and "symbolic link" in report.warnings[0]
    assert [s.status for s in report.exercises] == ["NOT RUN"] * len(report.exercises)
    assert grader.find_notebooks(alice) == [alice / "07_performance.ipynb"]  # listed, so that it is reported
    from flashlib.course import gradebook
    learners = {name: (notebooks, linked) for name, notebooks, linked in gradebook.find_learners(tmp_path / "class")}
    assert learners["carol"] == ([], True) and learners["alice"][1] is False
    carol = gradebook.LearnerResult("carol", [], linked=True)
    assert carol.notes() == ["the folder is a symbolic link: not graded"] and carol.total == 0


def test_a_file_name_that_is_not_utf8_is_reported_with_escapes(tmp_path, capsys):
    """Bytes that are not UTF-8 in a name once left the --json file empty and stopped the printing."""
    folder = tmp_path / "learner"
    folder.mkdir()
    name = os.fsdecode(b"bonus\xff.ipynb")
    nbformat.write(nbformat.v4.new_notebook(), folder / name)
    out = tmp_path / "scores.json"
    assert grader.main([str(folder), "--json", str(out), "--sandbox", "session"]) == 0
    [notebook] = json.loads(out.read_text(encoding="utf-8"))["notebooks"]
    assert notebook["path"].endswith("bonus\\udcff.ipynb") and notebook["status"] == grader.UNKNOWN
    assert "bonus\\udcff.ipynb" in capsys.readouterr().out


@pytest.mark.parametrize("limit, words", [({"folder_bytes": 8 * 2**20}, "more than 8 MiB"),
                                          ({"folder_entries": 200}, "more than 200 files and folders")])
def test_a_job_that_fills_its_folder_is_stopped(tmp_path, limit, words):
    """file_bytes bounds one file; many files once filled the disk until the notebook's time was up."""
    code = ("import itertools\n"
            "for i in itertools.count():\n"
            "    open(f'junk{i}', 'wb').write(b'x' * 2**20)\n")
    started = time.monotonic()
    outcome = sandbox.run([sys.executable, "-c", code], tmp_path, {"PATH": os.environ["PATH"]},
                          sandbox.Limits(wall_seconds=60, **limit), mode="session")
    assert time.monotonic() - started < 30 and not outcome.timed_out
    assert words in outcome.disk_exceeded


@pytest.mark.skipif(not sandbox._bwrap_works(), reason="bubblewrap cannot make its namespaces here")
def test_the_private_tmp_of_bubblewrap_holds_a_bounded_amount(tmp_path):
    """/tmp in the sandbox is a tmpfs, which lives in the machine's memory: it is sized (where bwrap can)."""
    code = ("written = 0\n"
            "try:\n"
            "    for i in range(64):\n"
            "        with open(f'/tmp/junk{i}', 'wb') as f:\n"
            "            for _ in range(16):\n"
            "                f.write(b'x' * 2**20); f.flush(); written += 1\n"
            "except OSError as error:\n"
            "    open('result', 'w').write(f'stopped after {written} MiB: {error.strerror}')\n")
    outcome = sandbox.run([sys.executable, "-c", code], tmp_path, {"PATH": os.environ["PATH"]},
                          sandbox.Limits(wall_seconds=60), mode="bwrap")
    assert outcome.returncode == 0
    result = (tmp_path / "result").read_text()
    assert result.startswith("stopped after") and "No space left" in result, result
    assert int(result.split()[2]) <= sandbox.TMPFS_BYTES // 2**20


# ------------------------------------------------------------------ the whole course, by the CLI

def cpu_seconds_of(argv) -> float:
    """The CPU time (user + system) that ``argv`` and every process it started spent."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, capture_output=True, cwd=REPO, timeout=600, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def python_start_seconds() -> float:
    """What one sandboxed worker costs before it runs a cell: a Python that imports flashlib and its checks
    (torch, mostly). The least of three, taken beside the grading it calibrates."""
    return min(cpu_seconds_of([sys.executable, "-c", "import flashlib.course.checks"]) for _ in range(3))


def grade_folder(folder, tmp_path_factory):
    """The CLI's report on ``folder``, with ``seconds``: the CPU time the grader and every process it started spent
    (user + system), and ``start_seconds``: what one Python with flashlib costs on this machine now.

    CPU time, not wall time, so a job beside it costs nothing; and measured against the start of a Python, because
    the same grading took 50 s of CPU one day and 80 s another on the same 2-core machine (and 65 s in CI), with the
    start of a Python 3.0 s and 3.9 s: most of grading is the eleven Pythons it starts."""
    json_path = tmp_path_factory.mktemp("course") / f"{folder}.json"
    start_seconds = python_start_seconds()
    started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "flashlib.grade", folder, "--json", str(json_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(json_path.read_text())
    data["wall_seconds"] = time.monotonic() - started
    data["seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    data["start_seconds"] = min(start_seconds, python_start_seconds())
    data["stdout"] = proc.stdout
    return data


@pytest.fixture(scope="module")
def graded_solutions(tmp_path_factory):
    return grade_folder("solutions", tmp_path_factory)


@pytest.fixture(scope="module")
def graded_exercises(tmp_path_factory):
    return grade_folder("exercises", tmp_path_factory)


@pytest.mark.slow
def test_solutions_get_full_marks_for_at_most_twice_the_cost_of_starting_their_pythons(graded_solutions):
    """Grading runs one worker per notebook and the grader itself: eleven Pythons that import flashlib. Their cells,
    the cases and the judging together may cost at most as much again (measured: 1.35 times the starts, 60 s of CPU
    on 2 cores with a start of 4.1 s; 1.8 times before the demo cells were skipped)."""
    assert graded_solutions["total"] == graded_solutions["max_total"] == sum(e.points for e in registry.EXERCISES)
    for report in graded_solutions["notebooks"]:
        assert report["status"] == "graded"
        assert [e["exercise"] for e in report["exercises"]] == [
            e.key for e in registry.exercises_of(report["notebook"])]
        assert all(e["status"] == "PASS" for e in report["exercises"]), report
    pythons = len(graded_solutions["notebooks"]) + 1
    budget = 2 * pythons * graded_solutions["start_seconds"]
    assert 0 < graded_solutions["seconds"] < budget, {
        key: graded_solutions[key] for key in ("seconds", "wall_seconds", "start_seconds")}
    assert "sandbox: " in graded_solutions["stdout"] and "grand total: 40/40" in graded_solutions["stdout"]


@pytest.mark.slow
def test_blank_exercises_get_zero(graded_exercises):
    assert graded_exercises["total"] == 0 and graded_exercises["max_total"] == 40
    for report in graded_exercises["notebooks"]:
        for exercise in report["exercises"]:
            assert exercise["points"] == 0 and "not attempted" in exercise["feedback"], exercise


@pytest.mark.parametrize("argv, words", [
    (["no/such/notebook.ipynb"], "does not exist"),
    ([str(REPO / "README.md")], "expected an .ipynb file or a folder"),
    (["solutions", "--timeout", "0"], "expected a positive number of seconds"),
    (["solutions", "--exercises", "no/such/folder"], "is not a folder of exercise notebooks"),
    (["solutions", "--sandbox", "nope"], "invalid choice"),
    (["solutions", "--seed", "-1"], "--seed: expected a whole number of at least 0, got -1"),
])
def test_usage_errors_exit_2(argv, words, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as info:
        grader.main(argv)
    assert info.value.code == 2
    assert words in capsys.readouterr().err


def test_empty_folder_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        grader.main([str(tmp_path)])
    assert info.value.code == 2 and "no *.ipynb files" in capsys.readouterr().err


@pytest.mark.parametrize("key", sorted(registry.BY_KEY))
def test_every_exercise_has_a_check_whose_cases_reach_the_worker_intact(key, tmp_path):
    from flashlib.course import wire
    from flashlib.course.checks import CHECKS
    from flashlib.course.checks.framework import make_cases, tensors_in

    cases = make_cases(CHECKS[key])
    wire.save_cases(tmp_path / "cases.pt", cases)
    loaded = wire.load_cases(tmp_path / "cases.pt")
    assert [c.description for c in loaded] == [c.description for c in cases]
    assert all(c.expected is None for c in loaded)  # the worker never sees the answers
    for case, back in zip(cases, loaded):
        flat, flat_back = tensors_in(case.args), tensors_in(back.args)
        assert len(flat) == len(flat_back) and all(
            a.equal(b) or (a.isnan() == b.isnan()).all() for a, b in zip(flat, flat_back))


def test_bubblewrap_keeps_python_and_flashlib_visible_when_they_live_in_tmp(monkeypatch):
    """A checkout in /tmp (as CI may make one): bound back after /tmp's tmpfs, its graded folder still hidden."""
    monkeypatch.setattr(sandbox, "_needed_paths", lambda: ["/tmp/ci/.venv", "/usr/lib/python3", "/tmp/ci"])
    monkeypatch.setattr(sandbox, "_bwrap_sizes_tmpfs", lambda: False)  # an old bwrap; with --size: the same, sized
    views = sandbox._bwrap_views("/tmp/flashlib-grade-x", hide=["/tmp/ci/solutions", "/tmp/ci"])
    assert views == ["--ro-bind", "/tmp/ci", "/tmp/ci", "--ro-bind", "/tmp/ci/.venv", "/tmp/ci/.venv",
                     "--tmpfs", "/tmp/ci/solutions",  # hidden after the bind that holds it; /tmp/ci holds Python
                     "--bind", "/tmp/flashlib-grade-x", "/tmp/flashlib-grade-x"]


def test_what_an_answer_raised_survives_the_reports_cut(tmp_path):
    """The report keeps the start of the feedback; the case's long description once came first and cut the
    exception's own words ("NameError: name 'math' is not defined") from it."""
    path = write(learner_notebook("01_naive_attention", {"stable_softmax": "return x.no_such_method()"}),
                 tmp_path / "01_naive_attention.ipynb")
    got = scores(grader.grade_notebook(path))["stable_softmax"]
    assert got.status == "FAIL" and len(got.feedback) <= grader.MESSAGE_CHARS
    assert "object has no attribute 'no_such_method'" in got.feedback, got.feedback
