"""Configuration errors are not outages nor item failures (issue 21, finding 4).

A wrong password, an unknown vhost or a missing module makes ``delayq forward`` refuse to start
with one line saying what to fix. A password changed while it runs pauses the target: the
waiting tasks and the periodic entry burn no attempt and never become dead letters, the error
is logged once, and everything flows again once the credential is fixed.

RabbitMQ gets a user of the test's own (``rabbitmqctl``, deleted afterwards); the Redis broker is
an embedded Valkey of the test's own with an ACL user. Workers connect with other credentials,
so they keep consuming while the forwarder's login is refused.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from kombu import Connection

from delayq_backends.celery import forget_store, store_for
from delayq_backends.celery.periodic import sync
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.periodic.ops import item_id
from tests.harness import ROOT, checkout_env
from tests.helpers import wait_for
from tests.test_celery.harness import CeleryEnv, delayq_cli, new_env, watched


class Credentials:
    """A broker login of the test's own, whose password the test can change."""

    kind: str

    def url(self, password: str) -> str:
        raise NotImplementedError

    def observer_url(self) -> str:
        """A login the test's workers use, unaffected by the changes."""
        raise NotImplementedError

    def change(self, password: str) -> None:
        """Set the password and drop the user's connections, so the forwarder logs in again."""
        raise NotImplementedError


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


class RabbitUser(Credentials):
    """A user with rights on the test broker's vhost (``DELAYQ_TEST_AMQP_URL``'s), and only there."""

    kind = "rabbitmq"

    def __init__(self, amqp_url: str) -> None:
        self.base = urlsplit(amqp_url)
        self.name = f"dqt-iso-{uuid.uuid4().hex[:8]}"
        rabbitmqctl("add_user", self.name, "right")
        rabbitmqctl("set_permissions", "-p", Connection(amqp_url).virtual_host, self.name, ".*", ".*", ".*")

    def url(self, password: str) -> str:
        """The test broker's URL (its vhost included) with this user's login."""
        host = f"{self.base.hostname}:{self.base.port or 5672}"
        return self.base._replace(netloc=f"{self.name}:{password}@{host}").geturl()

    def observer_url(self) -> str:
        return self.base.geturl()

    def change(self, password: str) -> None:
        rabbitmqctl("change_password", self.name, password)
        rabbitmqctl("close_all_user_connections", self.name, "password changed by a test")

    def delete(self) -> None:
        rabbitmqctl("delete_user", self.name)


class RedisUser(Credentials):
    kind = "redis"

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.admin = redis.Redis(port=server.port)
        self.admin.acl_setuser(
            "fwd", enabled=True, passwords=["+right"], keys=["*"], channels=["*"], commands=["+@all"]
        )

    def url(self, password: str) -> str:
        return f"redis://fwd:{password}@127.0.0.1:{self.server.port}/1"

    def observer_url(self) -> str:
        return f"redis://127.0.0.1:{self.server.port}/1"

    def change(self, password: str) -> None:
        self.admin.acl_setuser("fwd", enabled=True, reset_passwords=True, passwords=[f"+{password}"])
        self.admin.client_kill_filter(user="fwd")


@pytest.fixture(params=["rabbitmq", "redis"])
def credentials(request: pytest.FixtureRequest) -> Iterator[Credentials]:
    if request.param == "rabbitmq":
        user = RabbitUser(str(request.getfixturevalue("rabbitmq_url")))
        try:
            yield user
        finally:
            user.delete()
    else:
        with EmbeddedServer() as server:
            yield RedisUser(server)


def forward(valkey_url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``delayq forward`` on a fresh prefix of the embedded Valkey, run to its end."""
    cmd = [sys.executable, "-m", "delayq_backends.cli", "forward", "--url", valkey_url]
    cmd += ["--prefix", f"dqt{uuid.uuid4().hex[:10]}", "--shards", "4", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env or checkout_env(), capture_output=True, text=True, timeout=60)


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a forwarder that refused to start."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_a_wrong_password_refuses_the_start_in_one_line(credentials: Credentials, valkey_url: str) -> None:
    line = refused(forward(valkey_url, "--celery-broker", credentials.url("wrong")))
    assert "target 'celery'" in line and "refused the login" in line and "fix the user and password" in line
    assert "wrong" not in line, "no password in the message"


def test_celery_delayq_forward_refuses_the_start_in_one_line_too(
    credentials: Credentials, valkey_server: EmbeddedServer
) -> None:
    env = new_env(credentials.kind, credentials.url("wrong"), valkey_server)
    line = refused(delayq_cli(env, "forward", "--no-periodic-sync"))
    assert "target 'celery'" in line and "refused the login" in line


def test_an_unknown_vhost_refuses_the_start_in_one_line(rabbitmq_url: str, valkey_url: str) -> None:
    broker = urlsplit(rabbitmq_url)._replace(path=f"/dqt-no-such-vhost-{uuid.uuid4().hex[:6]}").geturl()
    line = refused(forward(valkey_url, "--celery-broker", broker))
    assert "refused the vhost" in line and "create it or fix the vhost" in line


def test_a_missing_transport_module_refuses_the_start_in_one_line(valkey_url: str, tmp_path: Path) -> None:
    """kombu's Redis transport imports ``packaging``; here an import of it fails, as where it is
    not installed."""
    (tmp_path / "packaging.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'packaging'\", name='packaging')\n"
    )
    env = checkout_env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{tmp_path}"
    line = refused(forward(valkey_url, "--celery-broker", f"{valkey_url.rsplit('/', 1)[0]}/1", env=env))
    assert "module 'packaging' is missing" in line and "pip install packaging" in line


def test_a_wrong_rq_redis_password_refuses_the_start_in_one_line(valkey_url: str) -> None:
    with EmbeddedServer() as server:
        RedisUser(server)
        line = refused(forward(valkey_url, "--rq-redis", f"redis://fwd:wrong@127.0.0.1:{server.port}/0"))
    assert "fwd:***@" in line and "wrong" not in line.replace("WRONGPASS", "")


def test_a_password_changed_while_running_pauses_and_burns_no_attempt(
    credentials: Credentials, valkey_server: EmbeddedServer, tmp_path: Path
) -> None:
    env = new_env(credentials.kind, credentials.url("right"), valkey_server)
    workers: CeleryEnv = replace(env, broker=credentials.observer_url())
    app = env.app()
    store = store_for(app)
    tag = uuid.uuid4().hex[:6]
    tick = f"tick-{tag}"
    app.conf.beat_schedule = {tick: {"task": "dqt.record", "schedule": 1.0, "args": [f"{tag}-tick"]}}
    log = tmp_path / "forwarder.log"

    def ran(prefix: str) -> list[dict[str, object]]:
        return [r for r in env.records() if str(r["tag"]).startswith(prefix)]

    with watched(workers):
        workers.start_worker(tmp_path)
        sync(app, store)
        env.start_forwarder(tmp_path)
        wait_for(lambda: len(ran(f"{tag}-tick")) >= 1, 60, f"the periodic entry to fire:\n{env.tail()}")

        credentials.change("changed")
        wait_for(lambda: "paused by a configuration error" in log.read_text(), 60, f"the pause:\n{env.tail()}")
        waiting = [app.send_task("dqt.record", args=[f"{tag}-late", i], countdown=0.2).id for i in range(20)]
        ticks = len(ran(f"{tag}-tick"))
        time.sleep(8)  # the entry falls due ~8 times and the tasks come due while the login is refused
        assert len(ran(f"{tag}-tick")) <= ticks + 1, "no run while the login is refused (one may be in flight)"
        assert ran(f"{tag}-late") == []

        def no_attempts() -> bool:
            items = [store.get(i) for i in [*waiting, item_id(tick)]]
            return all(item is not None and item.attempts == 0 for item in items)

        wait_for(no_attempts, 10, "the waiting items to show no attempt counted")
        assert store.dead_letters() == []

        credentials.change("right")
        wait_for(lambda: len(ran(f"{tag}-late")) == 20, 60, f"the waiting tasks to run:\n{env.tail()}")
        after = len(ran(f"{tag}-tick"))
        wait_for(lambda: len(ran(f"{tag}-tick")) > after, 30, "the periodic entry to fire again")

    text = log.read_text()
    assert text.count("paused by a configuration error") == 1, "logged once, not per retry"
    assert "Traceback" not in text and "works again" in text
    assert store.dead_letters() == [] and store.get(item_id(tick)) is not None
    forget_store(app)
