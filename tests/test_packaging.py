"""The environment files agree with each other and the Makefile offers the README's commands."""
import pathlib
import re

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pyproject_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in ("lab", "test"):
        reqs += project["optional-dependencies"][extra]
    return reqs


def _environment_pip_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml should have one pip: section"
    return [r for r in pip_sections[0] if not r.startswith("-e")], pip_sections[0]


def _normalise(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_lists_exactly_the_pyproject_packages():
    pyproject = sorted(_normalise(r) for r in _pyproject_requirements())
    environment, _ = _environment_pip_requirements()
    assert sorted(_normalise(r) for r in environment) == pyproject


def test_environment_yml_installs_flashlib_itself():
    _, raw = _environment_pip_requirements()
    assert "-e ." in raw


def test_python_versions_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert project["requires-python"] == ">=3.10"
    assert "python>=3.10" in env["dependencies"]


def test_makefile_has_the_course_targets():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("lab", "test", "demo", "grade", "exercises", "bench", "bench-all", "report", "gpu-info", "experiment",
                   "advanced", "test-browser"):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"make {target} is missing"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme
    assert re.search(r"^make test\b", ci, re.M)
