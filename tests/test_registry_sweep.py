"""Junk in the periodic registry cannot hold a starting forwarder: a real ``delayq forward
--rq-cron`` with 200,000 junk registry fields (written by the producer role, which may write the
registry, or by an admin where it may not) forwards its first item within 5 s of start, says how
far its registry sweep got, and finishes the sweep in the background; and a sweep is resumable
step by step, so each call's work is bounded."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import redis

from delayq_backends import DelayStore
from delayq_backends.embedded import EmbeddedServer
from delayq_backends.keys import periodic_key
from delayq_backends.periodic import ops
from delayq_backends.periodic.registry import PAGE
from delayq_backends.rq.cron import load_config
from delayq_backends.rq.cron import sync as sync_rq
from delayq_backends.targets import RedisListTarget
from tests.harness import Launcher, make_store
from tests.helpers import PAST, wait_for
from tests.test_security import Admin, user_url

JUNK = 200_000
#: how soon after its start a forwarder must forward, whatever the registry holds
START_LIMIT = 5.0
CONFIG = """
    from delayq_backends.rq import cron
    from tests.test_rq.jobs import record

    cron.register(record, "{q}", args=("tick",), interval=3600, name="{q}-tick")
"""


def plant_junk(admin: Admin, prefix: str, count: int) -> str:
    """``count`` registry fields naming no entry, written with the producer role's credential
    (an admin's where a newer ACL refuses the producer that write); returns who wrote them."""
    key = periodic_key(prefix)
    writer, who = redis.Redis.from_url(user_url(admin, prefix, "producer")), "producer"
    try:
        writer.hset(key, "junk-probe", "x")
    except redis.exceptions.NoPermissionError:
        writer, who = admin.client, "admin"
    for start in range(0, count, 20_000):
        writer.hset(key, mapping={f"junk-{n}": f"periodic:junk-{n}" for n in range(start, min(start + 20_000, count))})
    writer.hdel(key, "junk-probe")
    return who


def test_a_forwarder_forwards_within_5s_of_start_whatever_junk_the_registry_holds(
    valkey_server: EmbeddedServer, prefix: str, procs: Launcher, tmp_path: Path
) -> None:
    url = valkey_server.url
    admin = Admin(redis.Redis.from_url(url), url, valkey_server.port)
    admin.install_functions()
    try:
        plant_junk(admin, prefix, JUNK)
        store = make_store(url, prefix, shards=4)
        assert store.client.hlen(periodic_key(prefix)) == JUNK
        out = f"{prefix}:out"
        store.schedule("first", PAST, RedisListTarget.envelope(out, b"first"))
        config = tmp_path / "cron_config.py"
        config.write_text(textwrap.dedent(CONFIG.format(q=prefix)))
        log = tmp_path / "forward.log"
        args = ["forward", "--url", url, "--prefix", prefix, "--shards", "4", "--list-redis", url]
        args += ["--rq-redis", url, "--rq-cron", str(config), "--poll", "0.2", "--log-level", "info"]
        started = time.monotonic()
        proc = procs.delayq(*args, log=log)
        wait_for(lambda: store.client.llen(out) > 0, 60, lambda: f"the first item; log: {log.read_text()[-2000:]}")
        took = time.monotonic() - started
        assert took <= START_LIMIT, f"first item forwarded {took:.1f} s after start; log: {log.read_text()[-2000:]}"
        shown = log.read_text()
        assert "registry sweep:" in shown and "the rest in the background" in shown, shown[-2000:]
        assert shown.count("removed: junk-") <= 100 and "more" in shown  # the counts say the rest
        wait_for(lambda: store.client.hlen(periodic_key(prefix)) == 1, 120, "the background sweep to end")
        wait_for(lambda: "; done" in log.read_text(), 10, lambda: f"its last line; log: {log.read_text()[-2000:]}")
        assert [s.name for s in ops.statuses(store)] == [f"{prefix}-tick"]
        assert proc.poll() is None
    finally:
        admin.clean_up()


def test_a_sweep_is_bounded_per_step_and_resumable(valkey_url: str, prefix: str, tmp_path: Path) -> None:
    store: DelayStore = make_store(valkey_url, prefix, shards=4)
    key = periodic_key(prefix)
    store.client.hset(key, mapping={f"junk-{n}": "x" for n in range(5 * PAGE)})
    store.client.hset(key, b"\xff\xfe", b"x")  # no UTF-8: reported with its fix, never removed
    empty = tmp_path / "empty_config.py"
    empty.write_text("")
    # an empty config keeps every code entry, but a line naming no item is no entry: removed
    report = sync_rq(store, load_config(str(empty)), sweep_seconds=0)
    assert report.sweep is not None and report.sweep.checked == 0 and store.client.hlen(key) == 5 * PAGE + 1
    assert report.sweep.run()
    assert report.kept == 0 and len(report.removed) == 5 * PAGE and store.client.hlen(key) == 1
    store.client.hset(key, mapping={f"junk-{n}": "x" for n in range(5 * PAGE)})
    config = tmp_path / "cron_config.py"
    config.write_text(textwrap.dedent(CONFIG.format(q=prefix)))
    report = sync_rq(store, load_config(str(config)), sweep_seconds=0)
    sweep = report.sweep
    assert sweep is not None and report.added == [f"{prefix}-tick"]
    steps = 0
    while not sweep.done:
        sweep.step()
        steps += 1
        assert sweep.checked <= steps * 2 * PAGE  # HSCAN's COUNT is a hint: about a page a step
    assert steps >= 3 and len(report.removed) == 5 * PAGE
    assert sorted(store.client.hkeys(key)) == [f"{prefix}-tick".encode(), b"\xff\xfe"]
    assert any('"\\xff\\xfe"' in shown for shown in report.errors)
    assert f"{5 * PAGE + 2} fields checked (2 registered now), {5 * PAGE} code entries removed" in sweep.progress()
