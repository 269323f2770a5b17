"""``delayq dashboard``: a token is required, read once from one place, and auth can be turned off
only on loopback; the running command serves the page and enforces its token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from delayq_backends.cli import main
from delayq_backends.cli.dashboard import is_loopback
from tests.test_web.conftest import TOKEN


@pytest.mark.parametrize(
    "args, words",
    [
        ([], "needs a token"),
        (["--token", "short"], "under 16"),
        (["--no-auth", "--host", "0.0.0.0"], "only on a loopback address"),
        (["--no-auth", "--host", "192.168.1.5"], "only on a loopback address"),
        (["--no-auth", "--token", TOKEN], "contradict"),
        (["--token", TOKEN, "--token-file", "/nonexistent"], "not both"),
        (["--token-file", "/nonexistent/token"], "cannot read"),
    ],
)
def test_refused_before_anything_starts(args: list[str], words: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELAYQ_API_TOKEN", raising=False)
    result = CliRunner().invoke(main, ["dashboard", "--url", "redis://127.0.0.1:1/0", *args])
    assert result.exit_code == 2, result.output
    assert words in result.output


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "example.com", ""])
def test_other_hosts(host: str) -> None:
    assert not is_loopback(host)


def test_the_running_command_serves_the_page_and_enforces_the_token(dashboard_factory: Callable[..., Any]) -> None:
    dashboard = dashboard_factory()
    assert "delayq" in httpx.get(f"{dashboard.base}/").text
    assert httpx.get(f"{dashboard.base}/api/v1/stats").status_code == 401
    stats = httpx.get(f"{dashboard.base}/api/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    assert stats.status_code == 200 and stats.json()["totals"]["scheduled"] == 0
