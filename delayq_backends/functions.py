"""Installing the scripts as a Redis/Valkey Function library (Redis 7+), for an admin.

Once :data:`~delayq_backends.scripts.LIBRARY` is on every primary, stores call ``FCALL`` and the
role users need no ``EVAL`` (``delayq acl`` prints such rules). Functions are kept in RDB/AOF
and replicated, but a server started empty (no persistence) needs the install again; until
then stores fall back to EVAL, which FCALL-only users may not send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.cluster import RedisCluster

from .scripts import LIBRARY, library_code

__all__ = ["NodeFunctions", "install_functions", "functions_status"]


@dataclass(frozen=True)
class NodeFunctions:
    """The delayq libraries found on one server.

    Attributes:
        node: ``host:port`` of the server (of each primary, on a cluster).
        libraries: names of the ``delayq_*`` libraries loaded there, sorted.
    """

    node: str
    libraries: tuple[str, ...]

    @property
    def current(self) -> bool:
        """Whether this package version's library is there."""
        return LIBRARY in self.libraries


def install_functions(client: Any) -> list[NodeFunctions]:
    """Load this version's library (``FUNCTION LOAD REPLACE``) on the server, or on every primary
    of a cluster; libraries of other versions are left for the clients still using them.

    Returns what each server holds afterwards.
    """
    for node in _primaries(client):
        node.redis_connection.function_load(library_code(), replace=True)
    return functions_status(client)


def functions_status(client: Any) -> list[NodeFunctions]:
    """The delayq libraries on the server, or on each primary of a cluster."""
    out = []
    for node in _primaries(client):
        found = node.redis_connection.function_list(library="delayq_*")
        names = sorted(_text(_field(lib, "library_name")) for lib in found)
        out.append(NodeFunctions(node.name, tuple(names)))
    return out


class _Single:
    """A plain client dressed as a cluster node, so both kinds go through one loop."""

    def __init__(self, client: Any) -> None:
        self.redis_connection = client
        kwargs = client.connection_pool.connection_kwargs
        self.name = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"


def _primaries(client: Any) -> list[Any]:
    if isinstance(client, RedisCluster):
        return list(client.get_primaries())
    return [_Single(client)]


def _field(library: Any, name: str) -> Any:
    """A field of one FUNCTION LIST entry (a dict under RESP3, a flat list under RESP2)."""
    if isinstance(library, dict):
        return library.get(name, library.get(name.encode()))
    pairs = dict(zip(library[::2], library[1::2]))
    return pairs.get(name, pairs.get(name.encode()))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
