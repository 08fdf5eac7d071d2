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
    for extra in ("lab", "test", "hf"):
        reqs += project["optional-dependencies"][extra]
    return reqs


def _environment_pip_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml should have one pip: section"
    return [r for r in pip_sections[0] if not r.startswith("-")], pip_sections[0]


def _normalise(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_lists_exactly_the_pyproject_packages():
    pyproject = sorted({_normalise(r) for r in _pyproject_requirements()})
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


def test_the_tested_versions_live_in_one_constraints_file():
    constraints = (ROOT / "constraints.txt").read_text()
    assert re.search(r"^torch[<>=]", constraints, re.M) and re.search(r"^triton[<>=]", constraints, re.M)
    _, raw = _environment_pip_requirements()
    assert "-c constraints.txt" in raw
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def _torch_choice():
    import importlib.util

    spec = importlib.util.spec_from_file_location("torch_choice", ROOT / "tools" / "torch_choice.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_machine_without_an_nvidia_gpu_gets_the_cpu_build():
    choice = _torch_choice()
    assert choice.pip_args("torch", "auto", nvidia=False) == [
        "torch", "-c", "constraints.txt", "--index-url", choice.CPU_INDEX]
    assert choice.pip_args("torch", "auto", nvidia=True) == ["torch", "-c", "constraints.txt"]
    assert choice.pip_args("torch==2.13.0", "default", nvidia=False) == ["torch==2.13.0", "-c", "constraints.txt"]
    assert choice.pip_args("torch", "https://example.org/simple", nvidia=True)[-1] == "https://example.org/simple"
    assert "200 MB" in choice.describe("torch", "auto", nvidia=False)
    import pytest

    with pytest.raises(ValueError, match="TORCH_INDEX: expected auto, default or an index URL, got 'cpu'"):
        choice.pip_args("torch", "cpu", nvidia=False)


def test_a_changed_torch_choice_reinstalls():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(VENV\)/\.installed:.*\$\(TORCH_STAMP\)", makefile, re.M)
    assert "TORCH_INDEX" in (ROOT / ".ci" / "run").read_text()


def test_the_test_extra_holds_what_the_tests_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    test_extra = {re.split(r"[<>=;\s]", r)[0].lower() for r in project["optional-dependencies"]["test"]}
    assert {"matplotlib", "ipywidgets", "pytest", "nbval", "hypothesis"} <= test_extra


def test_the_container_sets_up_with_the_same_make_target_as_ci():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^RUN make install$", dockerfile, re.M)
    assert re.search(r"^make install\b", (ROOT / ".ci" / "run").read_text(), re.M)
    assert '"dockerfile": "../Dockerfile"' in (ROOT / ".devcontainer" / "devcontainer.json").read_text()
