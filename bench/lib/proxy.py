"""A loopback TCP proxy that tests and benches cut and restore, to stand for a network or broker outage."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

from delayq_backends.embedded import free_port

__all__ = ["TcpProxy"]


class TcpProxy:
    """Relays ``127.0.0.1:<port>`` to ``upstream``. :meth:`cut` drops every connection and, until
    :meth:`restore`, drops each new one at once (clients see a reset: the link is down). The port
    stays bound the whole time, so nothing else can take it during a cut. ``delay`` (seconds,
    settable at any time) holds every chunk that long: a slow link."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self.delay = 0.0
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._up = True
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def restore(self) -> None:
        self._up = True

    def cut(self) -> None:
        with self._lock:
            self._up = False
            conns, self._conns = self._conns, []
        for conn in conns:
            _drop(conn)

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._up:
                _drop(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if not self._up:
                    _drop(client)
                    _drop(server)
                    continue
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def _drop(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
        conn.shutdown(socket.SHUT_RDWR)
    conn.close()
