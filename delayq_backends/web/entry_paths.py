"""Periodic entry names in URL paths: any name, ``/`` included (Celery ``beat_schedule`` keys
such as ``reports/daily``), spaces, ``%`` and any Unicode.

The routes take ``{name:path}`` and match it against the path as the client sent it (ASGI
``raw_path``), percent-decoding the name after: an encoded ``/`` (``%2F``, what
``encodeURIComponent`` writes, as the dashboard does) is part of the name, a literal ``/``
separates segments. Servers decode ``%2F`` in the path they route on, which would make
``/periodic/a%2Fhistory`` (the entry ``a/history``) the history of ``a``.

So an encoded name is never ambiguous. A client that does not encode (curl with a literal
slash) reaches every route too: the routes with a suffix (``/history``, ``/pause``, ``/resume``,
``/run``, ``/backfill``) are tried first, so ``GET /periodic/a/b/history`` is the history of
``a/b``, and the entry named ``a/b/history`` itself is reached encoded
(``/periodic/a%2Fb%2Fhistory``). Actions are POSTs and an entry has no POST of its own, so
``POST /periodic/a/pause`` is always the pause of ``a``.
"""

from __future__ import annotations

from urllib.parse import unquote

from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Scope

__all__ = ["EntryRoute"]


class EntryRoute(APIRoute):
    """A route whose path parameters are matched on the raw path, then percent-decoded."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        raw = scope.get("raw_path")
        if scope["type"] != "http" or not raw:
            return super().matches(scope)
        try:
            path = raw.decode("ascii")
        except UnicodeDecodeError:  # not a path an HTTP client encodes: route it as the server decoded it
            return super().matches(scope)
        match, child = super().matches({**scope, "path": path})
        if match is not Match.NONE:
            child["path_params"] = {k: unquote(v) for k, v in child["path_params"].items()}
        return match, child
