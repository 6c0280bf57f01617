"""End-to-end test of the web dashboard in a real headless Chromium (Playwright's sync API).

A real uvicorn server runs in a background thread over a fresh SQLite ledger; the browser is the
system Chromium (``DPKIT_CHROMIUM``, else what ``scripts/chromium.sh`` finds or installs) —
Playwright never downloads one. Skipped when Playwright or the browser is unavailable.
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the dashboard test needs the server extra (fastapi)")
uvicorn = pytest.importorskip("uvicorn", reason="the dashboard test needs the server extra (uvicorn)")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the dashboard test needs Playwright: pip install playwright"
)
expect = sync_api.expect

import httpx  # noqa: E402

from dpkit.server.app import create_app  # noqa: E402
from dpkit.server.service import Service  # noqa: E402
from server._api import UNPACED  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
XSS = "<img src=x onerror=alert(1)>"
TIMEOUT_MS = 10_000


# ------------------------------------------------------------------------------------------------
# helpers: the browser, the server, the data
# ------------------------------------------------------------------------------------------------


def _chromium_path() -> str:
    path = os.environ.get("DPKIT_CHROMIUM")
    if path:
        if not Path(path).is_file():
            pytest.skip(f"DPKIT_CHROMIUM={path!r} is not a file")
        return path
    script = REPO / "scripts" / "chromium.sh"
    try:
        found = subprocess.run(["bash", str(script)], cwd=REPO, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no system Chromium: scripts/chromium.sh did not run ({exc})")
    if found.returncode != 0 or not found.stdout.strip():
        pytest.skip(
            f"no system Chromium (scripts/chromium.sh: {found.stderr.strip() or 'no path printed'}); set DPKIT_CHROMIUM"
        )
    return found.stdout.strip().splitlines()[-1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Server:
    """uvicorn in a background thread; ``stop()`` sets ``should_exit`` and joins."""

    def __init__(self, app) -> None:
        self.port = _free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off", access_log=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="dashboard-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the uvicorn server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class Env:
    """The running service: its URL, the keys, and the Service itself."""

    def __init__(self, url: str, service: Service, keys: dict[str, str]) -> None:
        self.url, self.service, self.keys = url, service, keys

    def api(self, who: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.keys[who]}"}, timeout=10)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("dashboard")
    rng = random.Random(7)
    rows = ["age,sex"] + [f"{rng.randint(0, 100)},{rng.choice('FM')}" for _ in range(500)]
    (d / "people.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    service = Service(f"sqlite:///{d / 'ledger.sqlite'}")
    service.register_dataset(
        "people",
        d / "people.csv",
        {
            "row_level": True,
            "columns": {
                "age": {"type": "numeric", "lower": 0, "upper": 100},
                "sex": {"type": "categorical", "categories": ["F", "M"]},
            },
        },
    )
    keys = {}
    _, keys["carol"] = service.create_principal("carol", "curator")
    # one analyst per test, so the tests do not depend on each other's spending
    for name in ("alice", "bob", "eve"):
        _, keys[name] = service.create_principal(name, "analyst")
        service.grant(name, "people", epsilon=1.0)
    server = _Server(create_app(service, rate=1000, burst=1000, **UNPACED))
    server.start()
    try:
        yield Env(server.url, service, keys)
    finally:
        server.stop()
        service.close()


@pytest.fixture(scope="module")
def browser():
    executable = _chromium_path()
    try:
        pw = sync_api.sync_playwright().start()
    except Exception as exc:  # pragma: no cover - depends on the installation
        pytest.skip(f"Playwright could not start: {exc}")
    try:
        try:
            instance = pw.chromium.launch(
                executable_path=executable,
                headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            )
        except Exception as exc:  # pragma: no cover - depends on the installation
            pytest.skip(f"the system Chromium at {executable} could not be launched by Playwright: {exc}")
        yield instance
        instance.close()
    finally:
        pw.stop()


class Page:
    """A fresh browser context and page that records dialogs, page errors and CSP violations."""

    def __init__(self, browser, base_url: str, **context_options) -> None:
        self.context = browser.new_context(base_url=base_url, **context_options)
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("dialog", self._on_dialog)
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.page.on("console", self._on_console)

    def _on_dialog(self, dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def _on_console(self, message) -> None:
        if message.type == "error" and ("Content Security Policy" in message.text or "Refused to" in message.text):
            self.errors.append(f"CSP: {message.text}")

    def login(self, key: str) -> None:
        self.page.goto("/")
        self.page.fill("#api-key", key)
        self.page.click("#login")

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def open_page(browser, env):
    pages: list[Page] = []

    def make(**options) -> Page:
        p = Page(browser, env.url, **options)
        pages.append(p)
        return p

    yield make
    for p in pages:
        p.close()
    for p in pages:
        assert not p.errors, p.errors


def _budget(page, dataset: str = "people"):
    view = page.locator("#analyst-view")
    return view.locator(f'.budget-bar[data-dataset="{dataset}"] .budget-fill'), view.locator(
        f'.budget-remaining[data-dataset="{dataset}"]'
    )


def _width(pct: int):
    return re.compile(rf"width:\s*{pct}(\.0+)?%")


def _run_query(page, sql: str, epsilon: str) -> None:
    page.select_option("#query-dataset", "people")
    page.fill("#query-sql", sql)
    page.fill("#query-epsilon", epsilon)
    page.click("#query-run")


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------


def test_analyst_spends_budget_and_is_refused(open_page, env):
    p = open_page()
    page = p.page
    p.login(env.keys["alice"])
    expect(page.locator("#analyst-view")).to_be_visible()
    expect(page.locator("#curator-view")).to_be_hidden()
    expect(page.locator("#login-view")).to_be_hidden()
    fill, remaining = _budget(page)
    expect(fill).to_have_attribute("style", _width(100))
    expect(remaining).to_have_text("remaining ε 1 of 1")
    # defaults of the form
    expect(page.locator("#query-epsilon")).to_have_value("0.1")
    expect(page.locator("#query-delta")).to_have_value("0")

    # a preview spends nothing
    page.select_option("#query-dataset", "people")
    page.fill("#query-sql", "SELECT COUNT(*) FROM people")
    page.fill("#query-epsilon", "0.4")
    page.click("#query-preview")
    expect(page.locator("#query-cost")).to_contain_text("ε 0.4")
    expect(fill).to_have_attribute("style", _width(100))

    _run_query(page, "SELECT COUNT(*) FROM people", "0.4")
    result = page.locator("#query-result")
    expect(result.locator(".result-table th", has_text=re.compile(r"^count$"))).to_be_visible()
    expect(result.locator(".result-table th", has_text="count_low")).to_be_visible()
    expect(result.locator(".result-table th", has_text="count_high")).to_be_visible()
    expect(result.locator(".result-table tbody tr")).to_have_count(1)
    # what the interval covers, right under the table (a row-level count: nothing is bounded)
    expect(result.locator(".table-wrap + p + .bounding")).to_contain_text("intervals cover the exact statistic")
    expect(result).to_contain_text("cost ε 0.4")
    expect(fill).to_have_attribute("style", _width(60))
    expect(remaining).to_have_text("remaining ε 0.6 of 1")

    _run_query(page, "SELECT sex, COUNT(*) FROM people GROUP BY sex", "0.4")
    expect(result.locator(".result-table tbody tr")).to_have_count(2)
    expect(fill).to_have_attribute("style", _width(20))
    expect(remaining).to_have_text("remaining ε 0.2 of 1")
    expect(page.locator("#query-error")).to_be_hidden()

    _run_query(page, "SELECT COUNT(*) FROM people", "0.4")
    error = page.locator("#query-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text(re.compile("budget exceeded", re.IGNORECASE))
    expect(error).to_contain_text("privacy budget exceeded: requested ε=0.4")  # the server's message
    expect(result.locator(".result-table")).to_have_count(0)
    expect(fill).to_have_attribute("style", _width(20))
    expect(remaining).to_have_text("remaining ε 0.2 of 1")

    history = page.locator("#history tbody tr")
    expect(history).to_have_count(4)  # the preview and three queries, newest first
    expect(page.locator('#history tbody tr[data-action="query"]')).to_have_count(3)
    expect(history.first).to_have_attribute("data-status", "409")
    expect(page.locator('#history tbody tr[data-status="200"][data-action="query"]')).to_have_count(2)
    expect(page.locator("#history")).to_contain_text("SELECT sex, COUNT(*) FROM people GROUP BY sex")

    # the key lives in sessionStorage only, and logging out forgets it
    assert page.evaluate("Object.keys(localStorage).length") == 0
    assert page.evaluate("sessionStorage.getItem('dpkit.apiKey')") == env.keys["alice"]
    page.click("#logout")
    expect(page.locator("#login-view")).to_be_visible()
    expect(page.locator("#analyst-view")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0


def test_wrong_key_shows_login_error(open_page):
    p = open_page()
    page = p.page
    p.login("dpk_thisisnotakey")
    error = page.locator("#login-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("not accepted")
    expect(page.locator("#analyst-view")).to_be_hidden()
    expect(page.locator("#curator-view")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0


def test_curator_overview(open_page, env):
    with env.api("bob") as bob:
        r = bob.post(
            "/v1/datasets/people/query", json={"epsilon": 0.3, "delta": 0, "sql": "SELECT COUNT(*) FROM people"}
        )
        assert r.status_code == 200, r.text
    p = open_page()
    page = p.page
    p.login(env.keys["carol"])
    view = page.locator("#curator-view")
    expect(view).to_be_visible()
    expect(page.locator("#analyst-view")).to_be_hidden()
    expect(page.locator('#datasets tbody tr[data-dataset="people"]')).to_contain_text("age")
    bob_row = page.locator('#analysts tbody tr[data-principal="bob"]')
    expect(bob_row).to_contain_text("analyst")
    bob_key = env.service.authenticate(env.keys["bob"]).key_id
    expect(bob_row).to_contain_text(bob_key)
    expect(bob_row).to_contain_text("active")
    budget_row = page.locator('#budgets tbody tr[data-analyst="bob"][data-dataset="people"]')
    expect(budget_row).to_contain_text("0.7 left")
    expect(budget_row.locator(".budget-fill")).to_have_attribute("style", _width(70))
    chart = page.locator("#spending-chart")
    expect(chart.locator("path, polyline").first).to_be_attached()
    expect(chart.locator('.series-line[data-analyst="bob"]')).to_have_count(1)
    expect(chart).to_contain_text("cumulative ε spent")
    expect(chart.locator(".legend")).to_contain_text("bob · people")
    expect(page.locator("#audit tbody tr").first).to_be_visible()
    expect(page.locator("#audit")).to_contain_text("query")

    page.click("#verify-log")
    expect(page.locator("#verify-result")).to_contain_text("OK")

    # the key survives a reload of the tab (sessionStorage)
    page.reload()
    expect(page.locator("#curator-view")).to_be_visible()
    expect(page.locator('#analysts tbody tr[data-principal="bob"]')).to_be_visible()


def test_query_text_is_never_html(open_page, env):
    # CSP is bypassed so that an injected handler *would* run: this tests the escaping itself.
    p = open_page(bypass_csp=True)
    page = p.page
    p.login(env.keys["eve"])
    expect(page.locator("#analyst-view")).to_be_visible()
    _run_query(page, f"SELECT {XSS} FROM people", "0.1")
    error = page.locator("#query-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text(XSS)
    expect(page.locator("#history tbody tr").first).to_contain_text(XSS)
    expect(page.locator("#history tbody tr").first).to_have_attribute("data-status", "400")
    assert page.locator("#analyst-view img").count() == 0
    fill, _ = _budget(page)
    expect(fill).to_have_attribute("style", _width(100))

    # the curator's audit table shows the same text literally too
    c = open_page(bypass_csp=True)
    c.login(env.keys["carol"])
    expect(c.page.locator("#audit tbody")).to_contain_text(XSS)
    assert c.page.locator("#curator-view img").count() == 0

    assert p.dialogs == [] and c.dialogs == []
