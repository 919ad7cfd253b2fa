"""The HTML report in headless Chromium (Debian's `chromium` package): it loads from a file with no console
errors and no request beyond the file itself, and every plot is drawn with as many marks as its info holds.

Chromium is driven through the DevTools protocol over a pipe (`--remote-debugging-pipe`: NUL-terminated JSON
on file descriptors 3 and 4), so the test needs nothing beyond the standard library and the browser: no
webdriver, no websocket package. With CI=true a missing browser fails the test instead of skipping it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import optuna
import pytest

from autotune.report import compute_infos, load_view, write_report

DATA = Path(__file__).parent / "data"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PLOTS = ("history", "importance", "parallel", "heatmap", "registers", "outcomes")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,1024",
    # Plotly's parallel coordinates draw their lines with WebGL; without a GPU that is SwiftShader, which
    # Chromium no longer falls back to on its own. The page is our own file, so the opt-in is safe.
    "--enable-unsafe-swiftshader",
)
TIMEOUT = 60.0  # seconds for any one step; a loaded CI box can be slow to start a browser


def _find_browser() -> str | None:
    explicit = os.environ.get("AUTOTUNE_CHROMIUM")
    if explicit:
        return explicit
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


@pytest.fixture(scope="module")
def browser() -> str:
    path = _find_browser()
    if path is None:
        message = ("headless Chromium is needed to check the HTML report: apt-get install chromium "
                   f"(looked for {', '.join(BROWSERS)} on PATH and $AUTOTUNE_CHROMIUM)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)  # CI installs it (.ci/run): missing means the check silently stopped running
        pytest.skip(message)
    return path


class DevTools:
    """A minimal DevTools-protocol client over Chromium's debugging pipe: commands, replies, and the events
    that arrive meanwhile (kept in `events`)."""

    def __init__(self, binary: str, profile_dir: str):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def pipe_fds():  # in the child: the protocol reads fd 3 and writes fd 4
            # dup first: a pipe end may itself be fd 3 or 4 and would be closed by dup2 onto the other
            read_end, write_end = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile_dir}", "--remote-debugging-pipe", "about:blank"],
            preexec_fn=pipe_fds, close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def close(self) -> str:
        """Stop the browser; returns what it wrote to stderr (for failure messages)."""
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err.decode(errors="replace")[-3000:]

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + TIMEOUT
        while True:
            event = self._receive(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed the debugging pipe (it exited)")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)


@dataclasses.dataclass
class Page:
    plots: dict[str, dict]   # plot kind -> what the probe counted in its div
    top_rows: int
    errors: list[str]        # console errors, uncaught exceptions, error-level log entries
    requests: list[str]      # every URL the page asked for


# What is drawn inside each plot div: generic (container, svg) and per kind of mark.
PROBE = """JSON.stringify(Object.fromEntries([...document.querySelectorAll('.plotly-graph-div')].map(d => [d.id, {
  containers: d.querySelectorAll('.plot-container').length,
  svgChildren: [...d.querySelectorAll('svg.main-svg')].reduce((n, s) => n + s.childElementCount, 0),
  points: d.querySelectorAll('.scatterlayer .trace .point').length,
  bars: d.querySelectorAll('.barlayer .trace .point').length,
  heatmaps: d.querySelectorAll('.heatmaplayer image').length,
  parcoordsAxes: d.querySelectorAll('.parcoords .axis').length,
  canvases: [...d.querySelectorAll('canvas')].filter(c => c.width > 0 && c.height > 0).length,
  annotations: [...d.querySelectorAll('.annotation-text')].map(a => a.textContent),
}])))"""
TOP_ROWS = "document.querySelectorAll('table.top tbody tr').length"


def load(devtools: DevTools, html: Path) -> Page:
    target = devtools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = devtools.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Runtime", "Log", "Page", "Network"):
        devtools.call(f"{domain}.enable", session=session)
    devtools.events.clear()
    devtools.call("Page.navigate", {"url": html.resolve().as_uri()}, session=session)
    devtools.wait_for("Page.loadEventFired")

    def evaluate(expression: str):
        result = devtools.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        return result["result"].get("value")

    deadline = time.monotonic() + TIMEOUT
    while True:  # Plotly draws on load; give a slow machine a moment before judging
        plots = json.loads(evaluate(PROBE))
        if all(p["containers"] and p["svgChildren"] for p in plots.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    top_rows = evaluate(TOP_ROWS)
    devtools.call("Target.closeTarget", {"targetId": target})

    errors, requests = [], []
    for event in devtools.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            errors.append("exception: " + details.get("exception", {}).get("description", details.get("text", "")))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            errors.append("log: " + params["entry"]["text"])
        elif method == "Network.requestWillBeSent":
            requests.append(params["request"]["url"])
    return Page({k.removeprefix("plot-"): v for k, v in plots.items()}, top_rows, errors, requests)


@pytest.fixture(scope="module")
def devtools(browser):
    with tempfile.TemporaryDirectory(prefix="autotune-chromium-") as profile:  # a fresh, empty profile
        client = DevTools(browser, profile)
        try:
            client.call("Browser.getVersion")  # fails fast, with the browser's stderr, if it did not start
        except (EOFError, TimeoutError) as e:
            pytest.fail(f"Chromium did not start ({e}); its stderr:\n{client.close()}")
        yield client
        client.close()


@pytest.fixture(scope="module")
def fixture_report(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("report_fixture", DATA / "report_fixture.py")
    report_fixture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report_fixture)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{out / 'studies.db'}"
    report_fixture.build(url, n_valid=30, n_invalid=8)
    view = load_view(optuna.load_study(study_name=report_fixture.STUDY_NAME, storage=url))
    return write_report(view, out, png=False).html, compute_infos(view)


def _assert_clean(page: Page, html: Path) -> None:
    assert page.errors == [], "the page logged errors"
    # Offline: the page asks for itself and nothing else (plotly's own data: URIs live inside it).
    fetched = [url for url in page.requests if not url.startswith(("data:", "blob:"))]
    assert fetched == [html.resolve().as_uri()], "the page fetched something besides itself"
    assert set(page.plots) == set(PLOTS)
    for kind, drawn in page.plots.items():
        assert drawn["containers"] == 1 and drawn["svgChildren"] > 0, f"{kind} was not drawn: {drawn}"


def test_report_draws_every_plot(devtools, fixture_report):
    html, infos = fixture_report
    page = load(devtools, html)
    _assert_clean(page, html)
    plots, info = page.plots, infos.plots
    assert plots["history"]["points"] == len(info["history"].numbers) + len(info["history"].failed_numbers)
    assert plots["importance"]["bars"] == len(info["importance"].params) > 0
    assert plots["parallel"]["parcoordsAxes"] == len(info["parallel"].axes) + 1  # + the TFLOPS axis
    assert plots["parallel"]["canvases"] > 0  # the lines (WebGL)
    assert plots["heatmap"]["heatmaps"] == 1
    assert plots["registers"]["points"] == len(info["registers"].points)
    assert plots["outcomes"]["bars"] == len(info["outcomes"].counts)
    assert page.top_rows == len(info["top"].rows) == 10
    baselines = [a for a in plots["history"]["annotations"] if a.startswith("SDPA")]
    assert sorted(baselines) == ["SDPA cuDNN 588", "SDPA flash (FA2) 342"]


def test_report_of_an_empty_study_draws_placeholders(devtools, tmp_path):
    view = load_view(optuna.create_study(study_name="empty", direction="maximize"))
    html = write_report(view, tmp_path, png=False).html
    page = load(devtools, html)
    _assert_clean(page, html)
    infos = compute_infos(view).plots
    for kind, drawn in page.plots.items():
        assert drawn["annotations"] == [infos[kind].placeholder], kind
    assert page.top_rows == 0
