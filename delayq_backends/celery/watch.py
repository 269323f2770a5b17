"""Dead Celery workers' tasks given back within two beats, on a Redis broker.

With ``task_acks_late`` a task stays unacknowledged until it ran; kombu's Redis transport keeps
each unacknowledged message in its ``unacked`` hash. When a whole worker dies (every process
SIGKILLed, a lost machine), nothing acks or rejects them: kombu restores them only in a live
worker's sweep, which takes a message older than ``visibility_timeout`` (an hour by default) and
scans about every 100 s (``unacked_restore_interval`` x ``unacked_restore_throttle``): 81.6 s
measured with a 10 s ``visibility_timeout``. A batch waited that long for its sub-job's end.
(RabbitMQ gives a dead consumer's messages back when its connection closes: nothing to do there.)

``install(app)`` starts, in each worker's main process once it is ready, a thread that every
``delayq_worker_beat`` seconds (5 by default):

- **beats**: sets ``delayq:worker_beat:<node name>`` (PX two beats) and records the delivery tag
  of each message the worker holds (``celery.worker.state.reserved_requests``: prefetched and
  running) in the hash ``delayq:unacked_owner`` (tag -> node name); a message is also recorded
  there as it is received (``task_received``), so one received just before the death is known;
- **sweeps** (a page of records a round trip): a tag whose owner's beat key is gone (two beats
  missed) is restored now, by kombu's own ``restore_by_tag`` (a WATCH transaction: a message
  restored by two sweeps, or by kombu's, is restored once), to the front of its queue, as
  kombu's sweep restores it; a tag no longer unacknowledged (acked) is dropped from the hash.

The task then runs again on a live worker and its end is reported to its batch then (with
``delayq_dedupe`` a run that had started is not run twice). Only tasks of workers that ran the
watch are restored early: a worker without it (no ``install``) keeps kombu's timing. A live
worker stalled past two beats (SIGSTOP, a frozen machine) is taken for dead and its tasks run
elsewhere, as after ``visibility_timeout``, only sooner; ``delayq_worker_beat`` sets the trade.
Without ``acks_late`` a task is acked when received: a dead worker's task is lost to Celery, and
its batch waits (``delayq batches fail KEY ID``). The keys live in the broker's Redis, beside
kombu's (its ``global_keyprefix`` applies to them too).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery
from celery.signals import task_received, worker_ready, worker_shutdown
from celery.worker import state

from .settings import CelerySettings

__all__ = ["BEAT_KEY", "OWNER_KEY", "use_watch"]

log = logging.getLogger("delayq.celery.watch")

#: The beat of a worker (its node name appended), in the broker's Redis.
BEAT_KEY = "delayq:worker_beat:"
#: Delivery tag -> the node name of the worker holding it, in the broker's Redis.
OWNER_KEY = "delayq:unacked_owner"
#: Beats a worker may miss before it is dead.
MISSED_BEATS = 2
#: Owner records one round trip of a sweep reads (HSCAN COUNT).
PAGE = 500

_stop = threading.Event()
#: (the watch's broker channel, this worker's node name) once the watch runs in this process
_watching: list[tuple[Any, str]] = []


def use_watch(app: Celery) -> None:
    """Start the watch in a worker's main process once it is ready (``install`` calls this)."""
    worker_ready.connect(_ready, weak=False, dispatch_uid="delayq-worker-watch")
    worker_shutdown.connect(lambda **_: _stop.set(), weak=False, dispatch_uid="delayq-worker-watch-stop")
    task_received.connect(_received, weak=False, dispatch_uid="delayq-worker-watch-received")


def _received(request: Any = None, **_: Any) -> None:
    """Record the owner of a message as it arrives (the beat would only a beat later)."""
    if not _watching or request is None or request.message is None:
        return
    channel, node = _watching[0]
    try:
        with channel.conn_or_acquire() as client:
            client.hset(OWNER_KEY, request.message.delivery_tag, node)
    except Exception as exc:  # a worker hook: log, never raise; the next beat records it
        log.warning("worker %s: the owner of task %s was not recorded (%s)", node, request.id, exc)


def _ready(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None:
        return
    beat = CelerySettings.of(app).worker_beat_s
    connection = app.connection_for_write()
    if connection.transport.driver_type != "redis":
        connection.release()
        return
    node = getattr(sender, "hostname", None) or app.conf.get("worker_hostname") or "?"
    thread = threading.Thread(
        target=_watch, args=(connection, str(node), beat), name="delayq-worker-watch", daemon=True
    )
    thread.start()


def _watch(connection: Any, node: str, beat: float) -> None:
    _stop.clear()
    channel = connection.default_channel
    _watching[:] = [(channel, node)]
    log.info("worker %s: beats every %s s; a worker that missed %d is dead", node, beat, MISSED_BEATS)
    while True:
        try:
            with channel.conn_or_acquire() as client:
                _beat(client, node, beat)
                _sweep(client, channel, node)
        except Exception:  # a thread of the worker: it must go on beating whatever one sweep met
            log.exception("worker %s: the beat or the sweep of dead workers failed; trying again", node)
        if _stop.wait(beat):
            connection.release()
            return


def _beat(client: Any, node: str, beat: float) -> None:
    client.set(BEAT_KEY + node, str(int(time.time() * 1000)), px=int(MISSED_BEATS * beat * 1000))
    tags = {request.message.delivery_tag: node for request in list(state.reserved_requests) if request.message}
    if tags:
        client.hset(OWNER_KEY, mapping=tags)


def _sweep(client: Any, channel: Any, node: str) -> None:
    """Page through the owner records (:data:`PAGE` a round trip, whatever the hash holds): one
    HMGET tells which of a page's tags are still unacknowledged, one HDEL drops the settled."""
    # kombu's client prefixes the keys of the commands it lists (SET, HSET, HGET, HDEL), not of
    # HSCAN, HMGET and EXISTS: those get the prefix here
    prefix = getattr(client, "global_keyprefix", "")
    qos, alive, cursor = channel.qos, {node: True}, 0
    while True:
        cursor, page = client.hscan(prefix + OWNER_KEY, cursor, count=PAGE)
        owners = {tag.decode(): owner.decode() for tag, owner in page.items()}
        if owners:
            tags = list(owners)
            unacked = dict(zip(tags, client.hmget(prefix + qos.unacked_key, tags)))
            for owner in set(owners.values()) - alive.keys():
                alive[owner] = bool(client.exists(prefix + BEAT_KEY + owner))
            settled = [tag for tag in tags if unacked[tag] is None or not alive[owners[tag]]]
            restored = [tag for tag in settled if unacked[tag] is not None]
            for tag in restored:
                qos.restore_by_tag(tag, client, leftmost=True)
            if restored:
                dead = sorted({owners[tag] for tag in restored})
                log.warning(
                    "worker %s: %s missed %d beats; %d unacked tasks went back", node, dead, MISSED_BEATS, len(restored)
                )
            if settled:  # acked (no longer anyone's to restore), or restored just now
                client.hdel(OWNER_KEY, *settled)
        if not cursor:
            return
