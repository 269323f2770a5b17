"""The ASGI app: the dashboard page, its static files and the ``/api/v1`` routes.

Errors become JSON ``{"detail": ...}`` with a 4xx for what the client sent and a 503 for a
store that cannot be reached or refuses a write, each saying what to do; see :func:`create_app`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import redis
from fastapi import Depends, FastAPI, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.middleware.trustedhost import TrustedHostMiddleware

from .. import __version__
from ..connection import redact_url
from ..errors import (
    ConfigError,
    DelayqError,
    EnvelopeError,
    InvalidIdError,
    InvalidSlotError,
    InvalidTimeError,
    NotDurableError,
    PayloadTooLargeError,
    ShardMismatchError,
    StoreFullError,
)
from ..periodic.options import OPTION_FIELDS
from ..store import DelayStore, SlotKeyList
from ..store.groupboard import GroupKeyList
from ..store.keylist import KeyList
from . import batches, groups, periodic, periodic_history, slots
from .api import Services, UnreadableData, router
from .auth import require_token
from .guard import Guard, Limits
from .producers import CeleryProducer, FunctionAllowlist, FunctionRefused, ProducerUnavailable, RQProducer

__all__ = ["LOOPBACK_NAMES", "create_app"]

HERE = Path(__file__).parent

#: Why ``POST /api/v1/rq`` answers 501 on a server started without RQ's Redis.
NO_RQ = ProducerUnavailable(
    "this server does not schedule RQ jobs: start `delayq dashboard` with --rq-redis URL (RQ's Redis)"
)

#: Host header values an API without a token answers.
LOOPBACK_NAMES = ["127.0.0.1", "localhost", "[::1]"]

#: The page loads only its own files: no CDN, no inline script, nothing framed elsewhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def create_app(
    store: DelayStore,
    *,
    token: str | None,
    celery_broker: str | None = None,
    rq_connection: redis.Redis | None = None,
    audit_stream: str | None = None,
    rq_allow: Sequence[str] = (),
    limits: Limits | None = None,
) -> FastAPI:
    """The dashboard and API of ``store``.

    Args:
        token: the bearer token every API call must send; None turns auth off (the command
            allows that only on a loopback address). Without a token, only requests for a
            loopback host name are served: a web page elsewhere cannot reach the API through
            DNS rebinding (a name of its own that resolves to 127.0.0.1).
        celery_broker: the Celery workers' broker URL, which shapes the routing of tasks
            scheduled through ``POST /api/v1/celery``.
        rq_connection: RQ's Redis; without it ``POST /api/v1/rq`` answers 501.
        rq_allow: the RQ functions the API may schedule (module or function paths, see
            :class:`~.producers.FunctionAllowlist`); empty, ``POST /api/v1/rq`` refuses every one (403).
        limits: the body cap and body timeout (default :class:`~.guard.Limits`) of
            :class:`~.guard.Guard`, which checks cross-site writes, the token, the content type
            and the size of every request before it is read.
        audit_stream: the forwarders' audit stream on the store's server, for ``/api/v1/lateness``.
    """
    allowed = FunctionAllowlist.parse(rq_allow)
    services = Services(
        store=store,
        celery=_producer(lambda: CeleryProducer(store, celery_broker)),
        rq=_producer(lambda: RQProducer(store, rq_connection, allowed)) if rq_connection is not None else NO_RQ,
        audit_stream=audit_stream,
        slot_keys=SlotKeyList(store, ttl=slots.SLOT_KEYS_TTL),
        batch_keys=KeyList(store.batch_keys_in_use, ttl=batches.BATCH_KEYS_TTL),
        group_keys=GroupKeyList(store),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if isinstance(services.celery, CeleryProducer):
            services.celery.close()

    app = FastAPI(
        lifespan=lifespan,
        title="delayq",
        version=__version__,
        description="Schedule, inspect and repair delayed Celery tasks and RQ jobs held in a delayq store.",
        openapi_url="/api/v1/openapi.json",
        docs_url=None,  # Swagger UI and ReDoc load from a CDN; the schema is enough offline
        redoc_url=None,
    )
    app.state.services = services
    # an entry's history before the entry: /periodic/a/b/history is the history of "a/b" (.entry_paths)
    for routes in (router, slots.router, groups.router, batches.router, periodic_history.router, periodic.router):
        app.include_router(routes, dependencies=[Depends(require_token(token))])
    if token is None:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_NAMES)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=str(HERE / "templates"))

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard(request: Request) -> Response:
        """The page shell: no data in it, so it needs no token; its scripts call the API with one."""
        # the entry form's run options are generated from the one definition the API and CLI use
        context = {"auth": token is not None, "version": __version__, "run_options": OPTION_FIELDS}
        return templates.TemplateResponse(request, "dashboard.html", context)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    _add_error_handlers(app, redact_url(store.config.url or "the store's URL"))
    app.add_middleware(Guard, token=token, limits=limits or Limits())  # added last: outermost, runs first
    return app


def _producer(make: Callable[[], Any]) -> Any:
    """The producer, or the reason it cannot be made (reported by the route that needs it)."""
    try:
        return make()
    except ProducerUnavailable as exc:
        return exc


def _error(code: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=code)


def _add_error_handlers(app: FastAPI, url: str) -> None:
    """Map every error a route can meet to a 4xx or a 503 that says what to do.

    Starlette picks the handler of the most specific class in an exception's MRO, so the
    subclasses registered here win over :class:`DelayqError` and ``ValueError``.
    """

    def handle(exc_class: type[Exception], code: int, text: Callable[[Any], str] = str) -> None:
        async def handler(request: Request, exc: Any) -> JSONResponse:
            return _error(code, text(exc))

        app.add_exception_handler(exc_class, handler)

    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    for bad_input in (ConfigError, EnvelopeError, InvalidIdError, InvalidSlotError, InvalidTimeError):
        handle(bad_input, status.HTTP_400_BAD_REQUEST)
    handle(PayloadTooLargeError, 413)
    handle(ProducerUnavailable, status.HTTP_501_NOT_IMPLEMENTED)
    handle(FunctionRefused, status.HTTP_403_FORBIDDEN)
    for unavailable in (DelayqError, ShardMismatchError, StoreFullError, NotDurableError, UnreadableData):
        handle(unavailable, status.HTTP_503_SERVICE_UNAVAILABLE)
    handle(
        redis.ConnectionError,
        status.HTTP_503_SERVICE_UNAVAILABLE,
        lambda exc: (
            f"the delay store at {url} cannot be reached ({exc}): check that it runs and that --url points at it"
        ),
    )
    handle(
        redis.TimeoutError,
        status.HTTP_503_SERVICE_UNAVAILABLE,
        lambda exc: f"the delay store at {url} did not answer in time ({exc}): check its load and the network",
    )
    handle(
        redis.ResponseError,
        status.HTTP_503_SERVICE_UNAVAILABLE,
        lambda exc: (
            f"the delay store at {url} refused the command ({exc}): "
            + (
                "a key under the prefix holds a value of the wrong type (not written by delayq): "
                "find it with `redis-cli --scan --pattern '<prefix>:*'` and TYPE"
                if "WRONGTYPE" in str(exc)
                else "check the server's log and ACL"
            )
        ),
    )
    handle(
        redis.RedisError,
        status.HTTP_503_SERVICE_UNAVAILABLE,
        lambda exc: f"the delay store at {url} refused the command ({exc}): check the server's log and ACL",
    )


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with one readable line per problem (``body.eta: Input should have timezone info``)."""
    errors = [
        {
            "loc": [str(part) for part in error.get("loc", ())],
            "msg": str(error.get("msg", "")),
            "type": str(error.get("type", "")),
        }
        for error in exc.errors()
    ]
    detail = "\n".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors) or "the request does not match the schema"
    return JSONResponse({"detail": detail, "errors": errors}, status_code=422)
