"""What a new user meets first when something is missing or mistyped (issue 22): one line that
says what to do, before anything else, never a traceback.

"Without the extra" runs ``delayq`` in a subprocess whose imports of the extra's modules fail
(``tests/blocked/sitecustomize.py``), as they would where the extra is not installed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from delayq_backends.celery.settings import CelerySettings
from delayq_backends.cli import main
from delayq_backends.errors import ConfigError
from tests.harness.launch import ROOT, checkout_env

BLOCKER = ROOT / "tests" / "blocked"


def without(modules: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``delayq args…`` where ``modules`` (comma-separated top-level names) cannot be imported."""
    env = checkout_env(DELAYQ_TEST_BLOCK=modules)
    env["PYTHONPATH"] = f"{BLOCKER}:{env['PYTHONPATH']}"
    return subprocess.run(
        [sys.executable, "-m", "delayq_backends.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )


def one_hint(result: subprocess.CompletedProcess[str], extra: str) -> str:
    """The single stderr line of a run refused for a missing extra, naming that extra once."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.count("pip install") == 1 and f'in a checkout: pip install ".[{extra}]"' in line, line
    return line


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        pytest.param("pyspark", ["spark", "export", "--out", "unused.jsonl"], "spark", id="spark-export"),
        pytest.param("celery", ["forward", "--celery-broker", "amqp://127.0.0.1:1//"], "celery", id="forward"),
        pytest.param("rq", ["forward", "--rq-redis", "redis://127.0.0.1:1/0"], "rq", id="forward-rq"),
        pytest.param("rq", ["rq-migrate", "--rq-redis", "redis://127.0.0.1:1/0"], "rq", id="rq-migrate"),
        pytest.param("fastapi", ["dashboard"], "web", id="dashboard-fastapi"),
        pytest.param("uvicorn", ["dashboard"], "web", id="dashboard-uvicorn"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(valkey_url: str, blocked: str, args: list[str], extra: str) -> None:
    # no token for the dashboard: the missing extra is said first, not "the dashboard needs a token"
    line = one_hint(without(blocked, *args, "--url", valkey_url), extra)
    assert "token" not in line


def test_a_url_that_is_not_redis_names_the_schemes() -> None:
    result = CliRunner().invoke(main, ["stats", "--url", "amqp://guest:s3cret@h//"])
    assert result.exit_code == 1
    assert "redis://, rediss://, unix://" in result.output and "percent-encode" not in result.output
    assert "s3cret" not in result.output and "amqp://guest:***@h//" in result.output


def test_a_database_the_server_lacks_names_the_url_and_the_count(valkey_url: str) -> None:
    with redis.Redis.from_url(valkey_url) as admin:
        count = int(admin.config_get("databases")["databases"])
    url = valkey_url.replace("redis://", "redis://:s3cret@").rsplit("/", 1)[0] + f"/{count}"
    result = CliRunner().invoke(main, ["stats", "--url", url])
    assert result.exit_code == 1
    assert url.replace("s3cret", "***") in result.output and "s3cret" not in result.output
    assert f"database {count}" in result.output and f"has {count} databases (0..{count - 1})" in result.output


def test_a_mistyped_celery_setting_gets_the_near_name() -> None:
    app = Celery("typo", set_as_current=False)
    app.conf.delayq_min_dely = 5
    with pytest.raises(ConfigError) as raised:
        CelerySettings.of(app)
    assert str(raised.value) == "unknown Celery setting(s): delayq_min_dely (did you mean delayq_min_delay?)"
