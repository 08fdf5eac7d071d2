"""The course as a learner meets it: JupyterLab in a real (headless) Chromium.

nbval checks what a notebook prints; it cannot see whether the page works. These
tests do what a learner does, in JupyterLab started (on loopback, in a temporary
copy of the course root with outputs cleared) as ``make lab`` starts it:

* notebook 03: Run > Run All Cells, no error on screen, and moving the
  online-softmax stepper with the keyboard redraws its picture;
* notebook 01: follow its link to the exercise notebook, type an answer into the
  exercise cell, run the notebook and read the check's verdict on the page.

Screenshots are kept as test artefacts (``test-artifacts/`` or ``$FLASHLIB_ARTIFACTS``).

Needs Playwright for Python (test extra) and a Chromium binary (Debian's
``chromium`` at /usr/bin/chromium, or ``CHROMIUM=/path``); skipped without them.
``.ci/run`` installs Chromium (and sets FLASHLIB_REQUIRE_BROWSER=1, so that it is not
skipped there). Run alone with ``make test-browser``.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import nbformat
import pytest

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "03_online_softmax.ipynb"
LESSON = ROOT / "notebooks" / "01_naive_attention.ipynb"
EXERCISE = ROOT / "exercises" / "01_naive_attention.ipynb"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps trying to reach Google's
# services, which a closed network refuses; none of them matter to the test.
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SERVER_START_S = 60      # JupyterLab answering /api/status
PAGE_LOAD_S = 60         # the notebook open, its kernel idle
RUN_ALL_S = 120          # every cell run (about 10 s of work on a laptop CPU)
WIDGET_S = 30            # one redraw of the stepper

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError:
    _MISSING = "Playwright for Python is not installed (pip install -e '.[test]')"
else:
    _MISSING = None
if _MISSING is None and not os.access(CHROMIUM, os.X_OK):
    _MISSING = (f"no Chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM=/path/to/chromium); "
                "Playwright's own browser download is not used")
if _MISSING:
    if os.environ.get("FLASHLIB_REQUIRE_BROWSER") == "1":  # .ci/run sets it when it installed Chromium
        raise RuntimeError(f"FLASHLIB_REQUIRE_BROWSER=1 but the browser test cannot run: {_MISSING}")
    pytest.skip(f"browser test skipped: {_MISSING}", allow_module_level=True)


def artifacts_dir() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("FLASHLIB_ARTIFACTS", ROOT / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_lab_settings(settings_dir: pathlib.Path) -> None:
    """User settings: no "Select Kernel" dialog (as after ticking "Always start the preferred
    kernel"), and nothing fetched from the network (no news, no extension index)."""
    settings = {
        # every cell rendered at once, so that a link far down the page is in the page
        "@jupyterlab/notebook-extension/tracker": {"autoStartDefaultKernel": True, "windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/extensionmanager-extension/plugin": {"enabled": False},
    }
    for name, values in settings.items():
        path = settings_dir / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _copy_notebook_without_outputs(source: pathlib.Path, course: pathlib.Path) -> None:
    """The learner's starting point: the notebook, at its place in the course, with no outputs and no widget state."""
    nb = nbformat.read(source, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    dest = course / source.relative_to(ROOT)
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)


def _log_tail(log: pathlib.Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 at a temporary course root: notebooks 01 and 03, exercise 01."""
    work = tmp_path_factory.mktemp("lab")
    notebooks, home = work / "course", work / "jupyter"
    notebooks.mkdir()
    for source in (NOTEBOOK, LESSON, EXERCISE):
        _copy_notebook_without_outputs(source, notebooks)
    _write_lab_settings(home / "user-settings")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ,
               JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebooks}",
           "--ServerApp.terminals_enabled=False", "--ServerApp.open_browser=False",
           f"--LabApp.user_settings_dir={home / 'user-settings'}",
           f"--LabApp.workspaces_dir={home / 'workspaces'}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly",
           "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp: to see when the kernel is connected
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
        cmd.append("--ServerApp.allow_root=True")
    log = work / "jupyterlab.log"
    with open(log, "w") as log_file:
        server = subprocess.Popen(cmd, cwd=notebooks, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with code {server.returncode} before answering; "
                            f"its log:\n{_log_tail(log)}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer on {base} within {SERVER_START_S} s; "
                            f"its log:\n{_log_tail(log)}")
            time.sleep(0.3)
        yield {"base": base, "token": token, "log": log}
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)


def _wait_for(page, js: str, arg, timeout_s: float, what: str, lab) -> None:
    """Wait until the JavaScript predicate holds, or fail saying what was awaited."""
    try:
        page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000, polling=200)
    except PlaywrightTimeout:
        pytest.fail(f"timed out after {timeout_s} s waiting for {what}; JupyterLab log:\n{_log_tail(lab['log'])}")


# The page's kernel is usable once its websocket is connected and the kernel idle.
# (Clicking Run All before that may be lost: the first websocket of a fresh
# kernel can fail and be reopened.) The toolbar's indicator alone turns idle too early.
def _poll(predicate, timeout_s: float, what: str, lab) -> None:
    """Wait until ``predicate()`` holds (it may read the page afresh each time), or fail."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}; JupyterLab log:\n"
                        f"{_log_tail(lab['log'])}")
        time.sleep(0.2)


KERNEL_IDLE = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const kernel = panel && panel.sessionContext && panel.sessionContext.session
        && panel.sessionContext.session.kernel;
    const shown = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
    return Boolean(kernel) && kernel.connectionStatus === 'connected' && kernel.status === 'idle'
        && shown !== null && shown.getAttribute('data-status') === 'idle';
}"""
PROMPTS = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
    .map(p => p.textContent.trim())"""
# An error output is rendered as stderr (its traceback); stderr with "Error" in it counts too.
ERROR_OUTPUTS = """() => [...document.querySelectorAll(
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], '
        + '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]')]
    .map(o => o.textContent).filter(t => /Traceback|Error/.test(t))"""
# Run All is over when every code cell has a number, or when it stopped: an error
# shown, or nothing running or queued ([*]) any more once something has run.
RUN_ALL_OVER = f"""(nCode) => {{
    const prompts = ({PROMPTS})();
    const errors = ({ERROR_OUTPUTS})();
    const numbered = prompts.filter(p => /^\\[\\d+\\]:$/.test(p)).length;
    return errors.length > 0 || (prompts.length === nCode && numbered === nCode)
        || (numbered > 0 && !prompts.includes('[*]:') && ({KERNEL_IDLE})());
}}"""


@contextlib.contextmanager
def learner_page(failure_png: str):
    """A page of headless Chromium; on a failure a full-page screenshot ``failure_png`` is kept."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(WIDGET_S * 1000)
        try:
            yield page
        except (AssertionError, PlaywrightError, pytest.fail.Exception):
            failed = artifacts_dir() / failure_png
            try:
                page.screenshot(path=str(failed), full_page=True)
                print(f"screenshot of the failure: {failed}")
            except PlaywrightError:
                pass
            raise
        finally:
            browser.close()


def _run_all_cells(page) -> None:
    """Run > Run All Cells, through the menu bar as a learner would."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def test_notebook_03_runs_in_jupyterlab_and_the_stepper_redraws(lab):
    url = f"{lab['base']}/lab/tree/notebooks/{NOTEBOOK.name}?token={lab['token']}"
    screenshot = artifacts_dir() / "browser_03_online_softmax.png"
    n_code = sum(c.cell_type == "code" for c in nbformat.read(NOTEBOOK, as_version=4).cells)
    times, start = {}, time.monotonic()
    with learner_page("browser_03_online_softmax_failure.png") as page:
        page.goto(url, wait_until="domcontentloaded", timeout=PAGE_LOAD_S * 1000)
        _wait_for(page, KERNEL_IDLE, None, PAGE_LOAD_S, "the notebook to open with an idle kernel", lab)
        times["open"] = time.monotonic() - start

        _run_all_cells(page)
        _wait_for(page, RUN_ALL_OVER, n_code, RUN_ALL_S, f"Run All to go through the {n_code} code cells", lab)
        errors = page.evaluate(ERROR_OUTPUTS)
        assert not errors, "cells show errors after Run All:\n" + "\n---\n".join(e[-1500:] for e in errors)
        prompts = page.evaluate(PROMPTS)
        assert len(prompts) == n_code and all(p[1:-2].isdigit() for p in prompts), (
            f"Run All left code cells without an execution count: {prompts} ({n_code} code cells)")
        _wait_for(page, KERNEL_IDLE, None, RUN_ALL_S, "the kernel to be idle after Run All", lab)
        times["run all"] = time.monotonic() - start - times["open"]

        cell = page.locator(".jp-CodeCell", has_text="online_softmax_stepper(")
        assert cell.count() == 1, f"expected one cell building the stepper, found {cell.count()}"
        cell.scroll_into_view_if_needed()
        handle, readout = cell.locator(".noUi-handle"), cell.locator(".widget-readout")
        image = cell.locator(".widget-output img")
        try:
            image.wait_for(state="visible")
        except PlaywrightTimeout:
            pytest.fail(f"the stepper shows no slider picture within {WIDGET_S} s; its cell reads:\n"
                        f"{cell.inner_text()[-1500:]}")
        first_src, first_value = image.get_attribute("src"), readout.inner_text().strip()
        assert first_value == "1", f"the stepper should start at block 1, its readout shows {first_value!r}"

        # One key press at a time, each redraw awaited: every block read gives a new picture.
        handle.focus()
        pictures = [first_src]
        for value in ("2", "3", "4"):
            page.keyboard.press("ArrowRight")
            _poll(lambda: readout.inner_text().strip() == value, WIDGET_S,
                  f"the slider readout to show {value} after pressing ArrowRight", lab)
            _poll(lambda: image.count() == 1 and image.get_attribute("src") not in pictures, WIDGET_S,
                  f"the stepper's picture to change when the slider moved to {value}", lab)
            pictures.append(image.get_attribute("src"))
        page.screenshot(path=str(screenshot))

        for _ in range(3):
            page.keyboard.press("ArrowLeft")
        _poll(lambda: image.count() == 1 and image.get_attribute("src") == first_src, WIDGET_S,
              "the first picture to come back after moving the slider back to 1", lab)
        errors = page.evaluate(ERROR_OUTPUTS)
        assert not errors, "errors after moving the slider:\n" + "\n---\n".join(e[-1500:] for e in errors)
        times["slider"] = time.monotonic() - start - times["open"] - times["run all"]
    print(f"screenshot: {screenshot}")
    print("browser test: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in times.items()))
    assert screenshot.stat().st_size > 10_000, f"the screenshot {screenshot} looks empty"


CURRENT_PATH = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    return panel && panel.context ? panel.context.path : null;
}"""
ANSWER = "return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v"


def test_a_learner_follows_notebook_01_to_its_exercise_answers_and_reads_the_verdict(lab):
    url = f"{lab['base']}/lab/tree/notebooks/{LESSON.name}?token={lab['token']}"
    screenshot = artifacts_dir() / "browser_01_exercise_verdict.png"
    n_code = sum(c.cell_type == "code" for c in nbformat.read(EXERCISE, as_version=4).cells)
    with learner_page("browser_01_exercise_failure.png") as page:
        page.goto(url, wait_until="domcontentloaded", timeout=PAGE_LOAD_S * 1000)
        _wait_for(page, KERNEL_IDLE, None, PAGE_LOAD_S, "notebook 01 to open with an idle kernel", lab)

        # The link at the end of notebook 01 opens the exercise inside JupyterLab. Markdown cells are
        # rendered after the kernel may already be idle: wait for the link rather than count at once.
        selector = f'.jp-RenderedMarkdown a[href*="exercises/{EXERCISE.name}"]'
        _wait_for(page, "(selector) => document.querySelector(selector) !== null", selector, PAGE_LOAD_S,
                  "notebook 01 to show its link to the exercise notebook", lab)
        link = page.locator(selector)
        assert link.count() >= 1, "notebook 01 shows no link to its exercise notebook"
        link.first.scroll_into_view_if_needed()
        link.first.click()
        _wait_for(page, f"() => ({CURRENT_PATH})() === 'exercises/{EXERCISE.name}'", None, PAGE_LOAD_S,
                  "the link to open exercises/01_naive_attention.ipynb", lab)
        _wait_for(page, KERNEL_IDLE, None, PAGE_LOAD_S, "the exercise to open with an idle kernel", lab)

        # Type the answer in place of the `raise NotImplementedError` line of naive_attention.
        cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell",
                            has_text="def naive_attention(")
        assert cell.count() == 1, f"expected one cell defining naive_attention, found {cell.count()}"
        line = cell.locator(".cm-line", has_text="raise NotImplementedError")
        line.scroll_into_view_if_needed()
        line.click()
        page.keyboard.press("End")
        page.keyboard.press("Shift+Home")  # the line's text, its indentation kept
        page.keyboard.insert_text(ANSWER)
        page.keyboard.press("Escape")
        assert ANSWER in cell.inner_text()

        _run_all_cells(page)
        _wait_for(page, RUN_ALL_OVER, n_code, RUN_ALL_S, f"Run All to go through the {n_code} code cells", lab)
        check = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell",
                             has_text="checks.check_naive_attention(")
        _poll(lambda: "naive_attention:" in check.locator(".jp-OutputArea").inner_text(), RUN_ALL_S,
              "the check cell to print its verdict", lab)
        verdict = check.locator(".jp-OutputArea").inner_text().strip()
        assert verdict.startswith("✓ naive_attention: correct on"), verdict
        assert verdict.endswith("(2/2 points)"), verdict
        other = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell",
                             has_text="checks.check_stable_softmax(")
        assert "not attempted yet" in other.locator(".jp-OutputArea").inner_text()
        check.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshot))
    print(f"screenshot: {screenshot}")
