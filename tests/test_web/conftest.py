"""Fixtures of the dashboard and API tests: the app in process (for API tests and schemathesis),
a real ``delayq dashboard`` process, and headless Chromium driven by Playwright.

Chromium is Debian's (/usr/bin/chromium): Playwright never downloads a browser here. Without it
the browser tests skip, unless ``DELAYQ_REQUIRE_BROWSER=1`` (CI), which makes them fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from delayq_backends import DelayStore
from delayq_backends.embedded import free_port
from delayq_backends.web import create_app
from tests.harness import ROOT, Launcher, make_store
from tests.helpers import wait_for

ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHARDS = 4
TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def web_store(valkey_url: str, prefix: str) -> Iterator[DelayStore]:
    store = make_store(valkey_url, prefix, shards=SHARDS)
    yield store
    store.client.close()


#: The module of the RQ test jobs: the only functions the test apps let the API schedule.
RQ_JOBS = "tests.test_rq.jobs"


@pytest.fixture
def app(web_store: DelayStore) -> FastAPI:
    """The app with auth on and RQ scheduling of the test jobs on the store's own server."""
    return create_app(web_store, token=TOKEN, rq_connection=web_store.client, rq_allow=[RQ_JOBS])  # type: ignore[arg-type]


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


class Dashboard:
    """A ``delayq dashboard`` process on a free port, stopped by the launcher at teardown."""

    def __init__(self, procs: Launcher, url: str, prefix: str, tmp: Path, *extra: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        token_file = tmp / "token"
        token_file.write_text(TOKEN + "\n")
        auth = [] if "--no-auth" in extra else ["--token-file", str(token_file)]
        self.log = tmp / "dashboard.log"
        self.proc = procs.delayq(
            "dashboard", "--url", url, "--prefix", prefix, "--shards", str(SHARDS), "--port", str(self.port),
            *auth, *extra, log=self.log,
        )  # fmt: skip
        wait_for(
            self._up, 30, lambda: f"the dashboard to answer; its log: {self.log.read_text()[-2000:]}", interval=0.1
        )

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the dashboard exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            return httpx.get(f"{self.base}/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture
def dashboard_factory(valkey_url: str, prefix: str, tmp_path: Path, procs: Launcher) -> Any:
    def start(*extra: str) -> Dashboard:
        return Dashboard(procs, valkey_url, prefix, tmp_path, *extra)

    return start


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium, shared by the session's browser tests."""
    if not CHROMIUM.exists():
        if os.environ.get("DELAYQ_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing and DELAYQ_REQUIRE_BROWSER=1 requires it: apt-get install chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id="UTC", locale="en-GB")
    page = context.new_page()
    yield page
    context.close()
