"""``delayq dashboard``: serve the dashboard and the HTTP API of a delay store.

Auth is on unless turned off explicitly, and turning it off is refused on any address other
than loopback: the API schedules and cancels jobs, so it must never be open to a network.
FastAPI and uvicorn are imported when the command runs, so ``delayq`` starts without them.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import click

from ..connection import connect_rq, redact_url
from ..errors import ConfigError, MissingExtraError
from ..storespec import StoreSpec
from .options import celery_broker_option, closing, open_store, rq_redis_option, store_options

__all__ = ["dashboard", "is_loopback", "resolve_token"]

#: Shorter tokens can be guessed; ``secrets.token_urlsafe(32)`` gives 43 characters.
MIN_TOKEN_LENGTH = 16
MAKE_ONE = "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(token: str | None, token_file: Path | None, no_auth: bool, host: str) -> str | None:
    """The token the API will require, or None when auth is off (loopback only).

    Raises:
        click.UsageError: a missing, short or doubly given token, or ``--no-auth`` off loopback.
    """
    if no_auth:
        if token or token_file:
            raise click.UsageError("--no-auth and a token contradict each other: drop one")
        if not is_loopback(host):
            raise click.UsageError(
                f"--no-auth is allowed only on a loopback address (127.0.0.1, ::1, localhost), not {host!r}: "
                "anyone who reaches the port could schedule and cancel jobs; pass --token instead"
            )
        return None
    if token and token_file:
        raise click.UsageError("pass the token once: --token/DELAYQ_API_TOKEN or --token-file, not both")
    if token_file:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"cannot read {token_file}: {exc}", param_hint="--token-file") from exc
    if not token:
        raise click.UsageError(
            f"the dashboard needs a token: pass --token, DELAYQ_API_TOKEN or --token-file ({MAKE_ONE}); "
            "on a loopback host, --no-auth turns auth off"
        )
    if len(token) < MIN_TOKEN_LENGTH:
        raise click.UsageError(f"the token is {len(token)} characters, under {MIN_TOKEN_LENGTH}: {MAKE_ONE}")
    return token


def _web() -> Any:
    """The web extra, or a :class:`MissingExtraError` naming it (once)."""
    try:
        from ..web import create_app
        from ..web.server import serve
    except MissingExtraError:
        raise
    except ImportError as exc:
        raise MissingExtraError(f"delayq dashboard needs the web extra ({exc})", "web") from exc
    return serve, create_app


@click.command()
@store_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Port to listen on.")
@click.option("--token", envvar="DELAYQ_API_TOKEN", show_envvar=True, default=None, help="Bearer token of the API.")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Read the token from this file (keeps it out of the process list).",
)
@click.option("--no-auth", is_flag=True, help="No token at all; allowed only on a loopback --host.")
@celery_broker_option(
    "Celery's broker_url: routes tasks scheduled through POST /api/v1/celery as the workers' app would."
)
@rq_redis_option("Redis of the RQ queues, for POST /api/v1/rq (may equal --url). [default: --url, unless a cluster]")
@click.option(
    "--audit-stream",
    envvar="DELAYQ_AUDIT_STREAM",
    show_envvar=True,
    default=None,
    metavar="KEY",
    help="The forwarders' audit stream on the store's server: shows recent lateness.",
)
@click.option(
    "--rq-allow",
    multiple=True,
    envvar="DELAYQ_RQ_ALLOW",
    show_envvar=True,
    metavar="MODULE",
    help="RQ functions POST /api/v1/rq may schedule: a module path (its functions) or a function path; "
    "repeatable (the env var takes several, space-separated). None: RQ scheduling over HTTP is off.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1024),
    default=1 << 20,
    show_default=True,
    help="Largest request body; larger ones get 413 unread.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="Connections waiting for a request head (a new one drops the oldest), and running requests (more get 503).",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="Seconds a request's head may take to arrive (its body: 3 times that); slower connections are closed.",
)
def dashboard(
    spec: StoreSpec,
    host: str,
    port: int,
    token: str | None,
    token_file: Path | None,
    no_auth: bool,
    celery_broker: str | None,
    rq_redis: str | None,
    audit_stream: str | None,
    rq_allow: tuple[str, ...],
    max_body_bytes: int,
    max_connections: int,
    request_timeout: float,
) -> None:
    """Serve the dashboard (/) and the HTTP API (/api/v1, schema at /api/v1/openapi.json)."""
    serve, create_app = _web()  # a missing extra first: no token asked for a command that cannot run
    required = resolve_token(token, token_file, no_auth, host)
    from ..web.guard import Limits
    from ..web.producers import FunctionAllowlist
    from ..web.server import ServerLimits

    try:
        FunctionAllowlist.parse(rq_allow)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--rq-allow") from exc
    store = open_store(spec, writes=True, socket_timeout=5)  # a hung store: 503, not a frozen page
    rq_url = rq_redis or (None if store.cluster else spec.url)
    try:
        rq_connection = None if rq_url is None else connect_rq(rq_url, store)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--rq-redis") from exc
    if rq_connection is not None and rq_connection is not store.client:
        closing(rq_connection)
    app = create_app(
        store,
        token=required,
        celery_broker=celery_broker,
        rq_connection=rq_connection,
        audit_stream=audit_stream,
        rq_allow=rq_allow,
        limits=Limits(max_body_bytes=max_body_bytes, body_timeout=3 * request_timeout),
    )
    click.echo(
        f"delayq dashboard of {redact_url(spec.url)} (prefix {spec.prefix!r}) on http://{host}:{port}/ "
        f"- auth {'on' if required else 'off'}, RQ functions allowed: {', '.join(rq_allow) or 'none'}",
        err=True,
    )
    serve(app, host, port, ServerLimits(max_connections=max_connections, head_timeout=request_timeout))
