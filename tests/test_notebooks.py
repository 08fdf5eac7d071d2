"""The notebooks as files: what nbval compares, what learners see, what the grader relies on."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


def code_cells(path):
    return [cell for cell in json.loads(path.read_text(encoding="utf-8"))["cells"] if cell["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_volatile_cells_are_tagged_not_commented(path):
    for cell in code_cells(path):
        source = "".join(cell["source"])
        assert "NBVAL_IGNORE_OUTPUT" not in source, "use the cell tag nbval-ignore-output, not a comment learners see"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_library_source_shown_in_a_notebook_is_compared(path):
    for cell in code_cells(path):
        if "inspect.getsource(" in "".join(cell["source"]):
            assert "nbval-ignore-output" not in cell.get("metadata", {}).get("tags", []), (
                "a cell that prints library source must be compared by nbval, so that it cannot drift")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_figure_a_cell_shows_is_stored(path):
    """A cell that ends by showing a figure has it in its stored output (a figure closed unshown is a bug)."""
    for index, cell in enumerate(code_cells(path)):
        last = "".join(cell["source"]).strip().split("\n")[-1].strip()
        if last in ("fig", "fig;") or last.startswith(("report.plot_", "viz.plot_")):
            images = [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
            assert images, f"code cell {index} ends with {last!r} but stores no figure"
