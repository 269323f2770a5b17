"""The dashboard and HTTP API of a delay store: one ASGI app, served by ``delayq dashboard``.

Install with ``pip install "delayq_backends[web]"`` (FastAPI, uvicorn, Jinja2). Nothing is
imported from them until :func:`create_app` is used, so the ``delayq`` command, which registers
``delayq dashboard`` from here, starts without the extra.
"""

from typing import Any

from ..errors import MissingExtraError

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name != "create_app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from .app import create_app
    except ImportError as exc:
        raise MissingExtraError(f"delayq_backends.web needs FastAPI, uvicorn and Jinja2 ({exc})", "web") from exc
    return create_app
