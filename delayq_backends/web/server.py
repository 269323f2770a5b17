"""uvicorn, bounded: how many connections, how long a request may take to arrive, how big its head.

uvicorn times out idle keep-alive connections but not a request that never finishes its head: a
client that sends ``GET / HTTP/1.1\\r\\n`` and stops holds its connection (and a slot of
``limit_concurrency``) for ever. :class:`HeadTimeoutH11` closes a connection whose request head is
not complete within ``head_timeout`` seconds of the connection or of the previous response. The
body's own deadline is the :class:`~.guard.Guard`'s.

Connections still waiting for a head have their own budget: past it, a new connection drops the
oldest waiting one. Nobody is known to hold a token before its head is in, so with one shared
budget a client refreshing half-open connections made every authenticated request a 503; now it
only pushes out its own oldest connections, and a request whose head has arrived (then checked
by the Guard) is refused only when ``max_connections`` requests are already running.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HeadTimeoutH11", "ServerLimits", "serve"]


@dataclass(frozen=True)
class ServerLimits:
    """What clients may hold of the server (``delayq dashboard`` options)."""

    #: Connections waiting for a request head (a new one past it drops the oldest), and requests
    #: running at once (a request over it gets a 503).
    max_connections: int = 100
    #: Seconds a request head may take to arrive.
    head_timeout: float = 10.0
    #: Seconds an idle keep-alive connection stays open.
    keep_alive: int = 5
    #: Largest request head (request line and headers) in bytes.
    max_head_bytes: int = 16 * 1024


class HeadTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol that drops a connection whose request head does not arrive in time."""

    head_timeout = ServerLimits.head_timeout
    max_waiting = ServerLimits.max_connections
    #: The server's connections waiting for a request head, oldest first (one dict per server).
    waiting: OrderedDict[HeadTimeoutH11, None] = OrderedDict()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self.waiting.pop(self, None)  # its head is in: a request, no longer on the waiting budget

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request's head has the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self.waiting.pop(self, None)
        super().connection_lost(exc)

    def _arm(self) -> None:
        """Start waiting for a head: its deadline, and a place on the waiting budget."""
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_overdue)
        self.waiting[self] = None
        while len(self.waiting) > self.max_waiting:
            oldest, _ = self.waiting.popitem(last=False)
            oldest.transport.close()

    def _head_overdue(self) -> None:
        waiting = self.cycle is None or self.cycle.response_complete  # no request under way
        if waiting and not self.transport.is_closing():
            self.transport.close()


def serve(app: Any, host: str, port: int, limits: ServerLimits) -> None:
    """Run ``app`` until interrupted, within ``limits``."""
    budget = {"head_timeout": limits.head_timeout, "max_waiting": limits.max_connections, "waiting": OrderedDict()}
    protocol = type("BoundedH11", (HeadTimeoutH11,), budget)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=protocol,
        # uvicorn counts every open connection: the waiting ones are capped above, so this leaves
        # max_connections for running requests
        limit_concurrency=2 * limits.max_connections,
        timeout_keep_alive=limits.keep_alive,
        h11_max_incomplete_event_size=limits.max_head_bytes,
    )
