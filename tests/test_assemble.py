"""build_forwarder composes the forwarder from typed settings, and run_until_idle (burst mode)
forwards what is due now and returns: on a real server, and on the testing store's fake clock."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import timedelta

import click
import pytest
import redis
from click.testing import CliRunner

from delayq_backends import Config, DelayStore, Envelope
from delayq_backends.assemble import ProcessSettings, build_forwarder
from delayq_backends.cli.forward import ForwardOptions, forward_options
from delayq_backends.errors import ConfigError
from delayq_backends.forwarder import ForwarderSettings
from delayq_backends.targets import Delivery, PublishReport, RedisListTarget
from delayq_backends.testing import FakeClock, TestingForwarder, testing_store
from tests.helpers import PAST


@pytest.fixture
def settings(valkey_url: str, prefix: str) -> Iterator[ProcessSettings]:
    yield ProcessSettings(store=Config(url=valkey_url, prefix=prefix, shards=4), forwarder=ForwarderSettings(batch=2))
    client = redis.Redis.from_url(valkey_url)
    keys = list(client.scan_iter(f"*{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_built_forwarder_forwards_what_is_due_and_returns(settings: ProcessSettings, prefix: str) -> None:
    with build_forwarder(settings) as assembled:
        store, lists = assembled.forwarder.store, f"{prefix}:out"
        for i in range(5):
            store.schedule(f"due{i}", PAST, RedisListTarget.envelope(lists, f"b{i}".encode()))
        store.schedule("later", timedelta(hours=1), RedisListTarget.envelope(lists, b"later"))

        stats = assembled.run_until_idle()  # batch 2: needs several passes on one shard

        assert (stats.forwarded, stats.acked) == (5, 5)
        assert sorted(store.client.lrange(lists, 0, -1)) == [f"b{i}".encode() for i in range(5)]
        assert [item.id for item in store.scheduled()] == ["later"]
        assert assembled.run_until_idle().forwarded == 0  # the call's own stats, not running totals
        assert f"prefix {prefix!r}, 4 shards" in assembled.describe() and "list -> " in assembled.describe()


def test_a_bad_setting_closes_what_was_opened(settings: ProcessSettings, valkey_url: str) -> None:
    store = DelayStore(redis.Redis.from_url(valkey_url), settings.store)
    bad = ProcessSettings(store=settings.store, audit_dir="/tmp/x", audit_stream="s")
    with pytest.raises(ConfigError, match="not both"):
        build_forwarder(bad, store=store)
    store.client.ping()  # a store passed in stays the caller's


class _Down:
    kind = "list"

    def publish_many(self, deliveries: Sequence[Delivery]) -> PublishReport:
        return PublishReport(unsent=[d.id for d in deliveries], broker_error=ConnectionError("down"))

    def close(self) -> None:
        pass


def test_burst_ends_when_the_broker_takes_nothing() -> None:
    """Released items are due again at once: the burst returns instead of claiming them forever."""
    clock = FakeClock()
    store = testing_store(shards=2, clock=clock)
    for i in range(7):
        store.schedule(f"i{i}", timedelta(0), Envelope("list", "q"))
    stats = TestingForwarder(store, [_Down()], batch=2).run_until_idle()
    assert stats.forwarded == 0 and stats.released >= 1
    assert len(store.scheduled()) == 7 and all(item.attempts == 0 for item in store.scheduled())


def test_no_library_module_imports_the_cli() -> None:
    """Imports run one way: interfaces (cli/) above the library, never back, so the library
    works without click and no import cycle can come back."""
    import subprocess
    import sys

    core = "delayq_backends.assemble, delayq_backends.storespec, delayq_backends.testing, delayq_backends.demo"
    adapters = "delayq_backends.celery.periodic, delayq_backends.rq, delayq_backends.web.api"
    code = (
        f"import sys, {core}; core_click = 'click' in sys.modules; import {adapters}; "
        "print(core_click, sorted(m for m in sys.modules if m.startswith('delayq_backends.cli')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "[]"], out


@pytest.mark.parametrize("args, overlap", [((), False), (("--claim-ahead",), True), (("--overlap",), True)])
def test_the_overlap_option_reaches_the_forwarder(
    settings: ProcessSettings, prefix: str, args: tuple[str, ...], overlap: bool
) -> None:
    """``--claim-ahead`` (off by default; ``--overlap``, its old name, still works) turns on claims
    ahead of publishes in the built forwarder, which then forwards as before."""
    seen: list[ForwardOptions] = []
    command = click.command()(forward_options(lambda run: seen.append(run)))
    assert CliRunner().invoke(command, list(args)).exit_code == 0
    built = seen[0].settings(settings)
    with build_forwarder(built) as assembled:
        assert assembled.forwarder.sweeper.overlap is overlap
        lists = f"{prefix}:out"
        for i in range(7):
            assembled.forwarder.store.schedule(f"d{i}", PAST, RedisListTarget.envelope(lists, b"x"))
        assert assembled.run_until_idle().forwarded == 7
