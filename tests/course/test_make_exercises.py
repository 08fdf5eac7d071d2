"""The exercise generator: marker replacement, cleared outputs, byte-stable files, drift."""
import ast
import json
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell

from flashlib.course import make_exercises as mk
from flashlib.course.make_exercises import MarkerError, make_exercise_notebook, sync

REPO = Path(__file__).resolve().parents[2]
PLACEHOLDER = 'raise NotImplementedError("Exercise: write your code here")'


def solution_notebook():
    """A solution notebook with outputs, metadata and every kind of marker use."""
    nb = new_notebook(cells=[
        new_markdown_cell("# Title\n### BEGIN SOLUTION\nprose that mentions the markers\n### END SOLUTION"),
        new_code_cell(
            "import torch\n"
            "\n"
            "def softmax(x):\n"
            "    \"\"\"Rows of x to probabilities.\"\"\"\n"
            "    ### BEGIN SOLUTION\n"
            "    m = x.amax(-1, keepdim=True)\n"
            "    e = (x - m).exp()\n"
            "    return e / e.sum(-1, keepdim=True)\n"
            "    ### END SOLUTION\n"
            "\n"
            "print('defined')",
            outputs=[new_output("stream", name="stdout", text="defined\n")],
            execution_count=3,
            metadata={"tags": ["keep-me"], "execution": {"iopub.status.busy": "2025-01-01T00:00:00Z"}},
        ),
        new_code_cell(
            "@triton.jit\n"
            "def kernel(x_ptr, BLOCK: tl.constexpr):\n"
            "    for k in range(0, 4):\n"
            "        ### BEGIN SOLUTION stub: pass\n"
            "        acc += tl.load(x_ptr + k)\n"
            "        ### END SOLUTION\n"
            "    x = 1\n"
            "    ### BEGIN SOLUTION stub: y = tl.zeros((BLOCK,), dtype=tl.float32)\n"
            "    y = tl.load(x_ptr + tl.arange(0, BLOCK))\n"
            "    ### END SOLUTION\n"
            "    return",
            outputs=[new_output("execute_result", data={"text/plain": "42"}, execution_count=4)],
            execution_count=4,
        ),
        new_code_cell("### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION\nprint(answer)", execution_count=5),
        new_raw_cell("### BEGIN SOLUTION (raw cells are left alone)"),
    ])
    nb.metadata["flashlib"] = {"notebook": "99_test"}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    return nb


def test_solution_regions_are_replaced_and_the_rest_kept_exactly():
    exercise = make_exercise_notebook(solution_notebook())
    assert exercise.cells[1].source == (
        "import torch\n"
        "\n"
        "def softmax(x):\n"
        "    \"\"\"Rows of x to probabilities.\"\"\"\n"
        f"    {mk.ANSWER_BEGIN}\n"
        f"    {PLACEHOLDER}\n"
        f"    {mk.ANSWER_END}\n"
        "\n"
        "print('defined')"
    )
    assert exercise.cells[2].source == (
        "@triton.jit\n"
        "def kernel(x_ptr, BLOCK: tl.constexpr):\n"
        "    for k in range(0, 4):\n"
        f"        {mk.ANSWER_BEGIN}\n"
        "        pass\n"
        f"        {mk.ANSWER_END}\n"
        "    x = 1\n"
        f"    {mk.ANSWER_BEGIN}\n"
        "    y = tl.zeros((BLOCK,), dtype=tl.float32)\n"
        f"    {mk.ANSWER_END}\n"
        "    return"
    )
    assert exercise.cells[3].source == f"{mk.ANSWER_BEGIN}\n{PLACEHOLDER}\n{mk.ANSWER_END}\nprint(answer)"


def test_markdown_and_raw_cells_are_untouched():
    solution = solution_notebook()
    exercise = make_exercise_notebook(solution)
    assert exercise.cells[0] == solution.cells[0]
    assert exercise.cells[4] == solution.cells[4]


def test_outputs_cleared_metadata_and_ids_kept():
    solution = solution_notebook()
    exercise = make_exercise_notebook(solution)
    for cell in exercise.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert exercise.cells[1].metadata == {"tags": ["keep-me"]}  # nbclient timing dropped
    assert exercise.metadata["flashlib"] == {"notebook": "99_test"}
    assert exercise.metadata["kernelspec"]["name"] == "python3"
    assert "widgets" not in exercise.metadata
    assert [c.id for c in exercise.cells] == [c.id for c in solution.cells]
    nbformat.validate(exercise)
    # the solution itself is not modified
    assert solution.cells[1].outputs and "### BEGIN SOLUTION" in solution.cells[1].source


def test_generated_code_cells_still_compile():
    for cell in make_exercise_notebook(solution_notebook()).cells:
        if cell.cell_type == "code":
            compile(TransformerManager().transform_cell(cell.source), "<cell>", "exec")


@pytest.mark.parametrize("source, line, words", [
    ("x = 1\n### END SOLUTION", 2, "without a '### BEGIN SOLUTION'"),
    ("def f():\n    ### BEGIN SOLUTION\n    return 1", 2, "never closed"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", 2, "inside the region opened at line 1"),
    ("### BEGIN SOLUTIONS\n### END SOLUTION", 1, "expected '### BEGIN SOLUTION' or"),
    ("### BEGIN SOLUTION stub:\n### END SOLUTION", 1, "expected '### BEGIN SOLUTION' or"),
    ("### BEGIN SOLUTION\n### END SOLUTION here", 2, "expected '### END SOLUTION'"),
])
def test_unbalanced_or_malformed_markers_name_notebook_cell_and_line(source, line, words):
    nb = new_notebook(cells=[new_markdown_cell("intro"), new_code_cell(source)])
    with pytest.raises(MarkerError) as info:
        make_exercise_notebook(nb, "solutions/07_x.ipynb")
    message = str(info.value)
    assert f"solutions/07_x.ipynb: cell 1, line {line}" in message
    assert words in message
    assert isinstance(info.value, ValueError)


def write(path, nb):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def test_output_is_byte_for_byte_deterministic(tmp_path):
    write(tmp_path / "src" / "a.ipynb", solution_notebook())
    assert sync(tmp_path / "src", tmp_path / "one") != []
    assert sync(tmp_path / "src", tmp_path / "two") != []
    first = (tmp_path / "one" / "a.ipynb").read_bytes()
    assert first == (tmp_path / "two" / "a.ipynb").read_bytes()
    assert first.endswith(b"\n")
    # and a second run finds nothing to change
    assert sync(tmp_path / "src", tmp_path / "one") == []
    assert (tmp_path / "one" / "a.ipynb").read_bytes() == first


def test_cells_without_ids_get_stable_ids(tmp_path):
    raw = json.loads(nbformat.writes(solution_notebook()))
    for cell in raw["cells"]:
        del cell["id"]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.ipynb").write_text(json.dumps(raw), encoding="utf-8")
    sync(tmp_path / "src", tmp_path / "one")
    sync(tmp_path / "src", tmp_path / "two")
    text = (tmp_path / "one" / "a.ipynb").read_bytes()
    assert text == (tmp_path / "two" / "a.ipynb").read_bytes()
    assert [c["id"] for c in json.loads(text)["cells"]] == [f"cell-{i}" for i in range(5)]


def test_check_reports_missing_stale_and_extra_and_writes_nothing(tmp_path):
    src, dst = tmp_path / "solutions", tmp_path / "exercises"
    write(src / "01_a.ipynb", solution_notebook())
    write(src / "02_b.ipynb", solution_notebook())
    write(src / "03_c.ipynb", solution_notebook())
    assert len(sync(src, dst)) == 3
    assert sync(src, dst, check=True) == []

    stale = solution_notebook()
    stale.cells[3].source = "answer = 41\nprint(answer)"
    write(src / "02_b.ipynb", stale)               # solution changed: exercise stale
    (dst / "03_c.ipynb").unlink()                   # exercise missing
    write(dst / "04_gone.ipynb", solution_notebook())  # solution removed: exercise extra
    before = {p.name: p.read_bytes() for p in dst.iterdir()}

    problems = sync(src, dst, check=True)
    assert len(problems) == 3
    assert any("02_b.ipynb: stale" in p for p in problems)
    assert any("03_c.ipynb: missing" in p for p in problems)
    assert any("04_gone.ipynb: extra" in p for p in problems)
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before

    assert len(sync(src, dst)) == 3
    assert sorted(p.name for p in dst.iterdir()) == ["01_a.ipynb", "02_b.ipynb", "03_c.ipynb"]
    assert sync(src, dst, check=True) == []
    assert "answer = 41" in (dst / "02_b.ipynb").read_text() and "answer = 42" not in (dst / "02_b.ipynb").read_text()


def test_a_marker_error_leaves_the_exercises_untouched(tmp_path):
    src, dst = tmp_path / "solutions", tmp_path / "exercises"
    write(src / "01_a.ipynb", solution_notebook())
    broken = new_notebook(cells=[new_code_cell("### BEGIN SOLUTION\nx = 1")])
    write(src / "02_broken.ipynb", broken)
    with pytest.raises(MarkerError, match=r"02_broken\.ipynb: cell 0, line 1"):
        sync(src, dst)
    assert not dst.exists()


def test_command_line(tmp_path, capsys):
    src, dst = tmp_path / "solutions", tmp_path / "exercises"
    write(src / "01_a.ipynb", solution_notebook())
    assert mk.main([str(src), str(dst), "--check"]) == 1
    assert "01_a.ipynb: missing" in capsys.readouterr().err
    assert not dst.exists()
    assert mk.main([str(src), str(dst)]) == 0
    assert mk.main([str(src), str(dst), "--check"]) == 0
    write(src / "02_broken.ipynb", new_notebook(cells=[new_code_cell("### END SOLUTION")]))
    assert mk.main([str(src), str(dst)]) == 1
    assert "02_broken.ipynb: cell 0, line 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        mk.main([str(tmp_path / "nowhere"), str(dst)])
    assert info.value.code == 2


def test_exercises_folder_is_up_to_date_with_solutions():
    """Drift: exercises/ must be exactly what `python -m flashlib.course.make_exercises` makes."""
    problems = sync(REPO / "solutions", REPO / "exercises", check=True)
    assert problems == [], (
        "exercises/ drifted from solutions/; run `python -m flashlib.course.make_exercises`:\n"
        + "\n".join(problems)
    )


def test_real_exercise_notebooks_have_no_solutions_and_compile():
    notebooks = sorted((REPO / "exercises").glob("*.ipynb"))
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            assert "### BEGIN SOLUTION" not in cell.source, f"{path.name} cell {index}"
            assert not cell.outputs, f"{path.name} cell {index} has outputs"
            compile(TransformerManager().transform_cell(cell.source), f"{path.name} cell {index}", "exec")


def test_solutions_and_the_registry_must_agree(tmp_path):
    from flashlib.course import registry

    nb = mk.read_solution(REPO / "solutions" / "07_performance.ipynb")
    mk.check_against_registry(make_exercise_notebook(nb), "07_performance")  # agrees
    for cell in nb.cells:
        if cell.cell_type == "code" and "def achieved_tflops" in cell.source:
            cell.source = cell.source.replace("def achieved_tflops", "def tflops_achieved")
    with pytest.raises(MarkerError, match="07_performance, cell 6: answer markers in a cell that defines no registered"):
        mk.check_against_registry(make_exercise_notebook(nb), "07_performance")
    assert "07_performance" in registry.notebooks()


def _calls_outside_a_placeholder_guard(tree, names):
    """Lines of ``tree`` that read one of ``names`` outside a ``try`` that catches NotImplementedError. A function
    the cell defines runs what its body reads only when called, so its own calls are judged in their place."""
    names = set(names)
    while True:
        callers = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                   and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))}
        if callers <= names:
            break
        names |= callers

    def guarded(handlers):
        return any(isinstance(h.type, ast.Name) and h.type.id == "NotImplementedError" for h in handlers)

    unguarded = []

    def walk(node, inside):
        if isinstance(node, ast.Name) and node.id in names and not inside:
            unguarded.append((node.id, node.lineno))
        if isinstance(node, ast.FunctionDef) and node.name in names:
            return
        if isinstance(node, ast.Try):
            for child in node.body:
                walk(child, inside or guarded(node.handlers))
            for child in (*node.handlers, *node.orelse, *node.finalbody):
                walk(child, inside)
            return
        for child in ast.iter_child_nodes(node):
            walk(child, inside)

    walk(tree, False)
    return unguarded


def test_demo_cells_print_a_line_while_their_exercise_is_unfinished():
    """A demo cell that runs the learner's function catches the placeholder's NotImplementedError and says to
    finish the exercise first: a learner who runs it early, or runs all cells of a fresh exercise notebook,
    reads one line instead of a traceback (through torch.nn.Module's internals in 08), and Run All goes on to
    the next exercise's cells. Kernel answers are left out: their stubs compile and raise nothing."""
    from flashlib.course import registry

    answers = {}
    for exercise in registry.EXERCISES:
        if exercise.kind != registry.KERNEL:
            answers.setdefault(exercise.notebook, set()).add(exercise.answer)
    checked = 0
    for path in sorted((REPO / "exercises").glob("*.ipynb")):
        names = answers.get(path.stem, set())
        for cell in nbformat.read(path, as_version=4).cells:
            if "demo" not in cell.metadata.get("tags", []):
                continue
            tree = ast.parse(TransformerManager().transform_cell(cell.source))
            assert _calls_outside_a_placeholder_guard(tree, names) == [], f"{path.name} cell {cell.id}"
            checked += any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(tree))
    assert checked == 11    # the demo cells of 03 (2), 05, 06 (2), 07, 08 (2), 09 (2) and 10


def test_the_placeholder_guard_finds_an_unguarded_call():
    tree = ast.parse("x = 1\ntry:\n    y = f(x)\nexcept ValueError:\n    pass\n"
                     "try:\n    z = f(y)\nexcept NotImplementedError:\n    print(f)\n")
    assert _calls_outside_a_placeholder_guard(tree, {"f"}) == [("f", 3), ("f", 9)]
    defined = ast.parse("def g():\n    return f()\n\ntry:\n    g()\nexcept NotImplementedError:\n    pass\ng()\n")
    assert _calls_outside_a_placeholder_guard(defined, {"f"}) == [("g", 8)]
