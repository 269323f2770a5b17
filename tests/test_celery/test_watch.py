"""The dead-worker watch's sweep (``delayq_backends.celery.watch``) against a real server and
kombu's own Redis transport: what it restores, what it drops, and that its work is paged (the
whole-worker SIGKILL proofs with real workers are in ``test_batches.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kombu import Connection

from delayq_backends.celery import watch
from delayq_backends.embedded import EmbeddedServer


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    """A server of its own: the test counts the commands the sweep sends."""
    with EmbeddedServer() as embedded:
        yield embedded


def calls(client: object, command: str) -> int:
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.parametrize("prefix", ["", "app1:"])
def test_a_sweep_restores_a_dead_workers_tasks_drops_the_acked_and_pages_its_reads(
    server: EmbeddedServer, prefix: str
) -> None:
    """1,200 owner records: 300 unacked tasks of a worker whose beat is gone go back to the front
    of their queue, 600 acked ones of the live worker are dropped, 300 unacked ones of the live
    worker stay. The reads are paged (HSCAN + one HMGET a page), not one HGET a record: a
    sweep's round trips do not grow with what the hash holds, only the restores do."""
    options = {"global_keyprefix": prefix} if prefix else {}
    with Connection(server.url, transport_options=options) as conn:
        channel = conn.default_channel
        queue = conn.SimpleQueue("work")
        for i in range(600):
            queue.put({"n": i})
        held = [queue.get(timeout=5) for _ in range(600)]  # unacked: in kombu's unacked hash
        dead, live = held[:300], held[300:]
        with channel.conn_or_acquire() as client:
            client.set(watch.BEAT_KEY + "live", "1")
            owners = {m.delivery_tag: "ghost" for m in dead} | {m.delivery_tag: "live" for m in live}
            owners |= {f"acked-{i}": "live" for i in range(600)}
            client.hset(watch.OWNER_KEY, mapping=owners)
            hmgets, hgets = calls(client, "hmget"), calls(client, "hget")
            watch._sweep(client, channel, "live")
            read_pages = calls(client, "hmget") - hmgets
            assert 0 < read_pages <= 1_200 // watch.PAGE + 2, read_pages
            # kombu's restore_by_tag reads its message once; the sweep adds no read per record
            assert calls(client, "hget") - hgets == 300
            left = client.hgetall(prefix + watch.OWNER_KEY)
        assert {tag.decode() for tag in left} == {m.delivery_tag for m in live}
        assert channel.qos.can_consume()  # nothing broke kombu's own bookkeeping
        back = [queue.get(timeout=5).payload["n"] for _ in range(300)]
        assert sorted(back) == list(range(300))
        with pytest.raises(queue.Empty):  # restored once each
            queue.get(block=False)
        queue.close()
