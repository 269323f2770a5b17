"""The checks every request passes before the app reads a byte of its body.

An ASGI middleware, outermost, so that what an attacker sends costs the server nothing:

1. **Cross-site writes are refused** (403), with or without a token: a state-changing request
   whose ``Sec-Fetch-Site`` is not ``same-origin``/``none``, or whose ``Origin`` is not the
   server's own host, came from another web page. ``same-site`` is refused too: a page on another
   port of 127.0.0.1 is "same site" to a browser. Clients that are not browsers send neither
   header and pass.
2. **The token** (401 without, 403 wrong), before the body is read: an unauthenticated client
   cannot make the server buffer or parse anything.
3. **Writes are JSON** (415 otherwise): a browser sends ``text/plain``, form data or no content
   type without a CORS preflight, so requiring ``application/json`` leaves a foreign page no
   simple request that changes the store. A ``DELETE`` without a body needs no content type:
   no page can send one cross-site without a CORS preflight, which this server never grants, and
   clients generated from the schema (which has no body for it) send none.
4. **Bodies are capped** (413): a ``Content-Length`` over the cap is refused unread, a streamed
   body is counted and refused once past it, so at most the cap is ever buffered; a body that
   does not arrive within the body timeout is a 408.

Every refusal closes the connection (``Connection: close``), so an unread body is not drained.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["API_PREFIX", "Guard", "Limits", "Refusal", "check_bearer", "cross_site", "is_json"]

API_PREFIX = "/api/v1"
#: The schema is public, like the page: it holds no data.
PUBLIC_API_PATHS = frozenset({f"{API_PREFIX}/openapi.json"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Limits:
    """What one request may cost the server."""

    #: Largest request body read (the API's bodies are small: an RQ call with its arguments).
    max_body_bytes: int = 1 << 20
    #: Seconds a client has to send a whole body once its headers are in.
    body_timeout: float = 30.0


@dataclass(frozen=True)
class Refusal:
    """A request refused before the app saw it."""

    status: int
    detail: str
    www_authenticate: bool = False


def check_bearer(authorization: str | None, expected: bytes) -> Refusal | None:
    """None when ``authorization`` is ``Bearer <expected>``; compared in constant time
    (``hmac.compare_digest``), so response times leak nothing about how much of a guess was right."""
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return Refusal(
            401,
            "missing token: send the header 'Authorization: Bearer <token>' (the dashboard's --token)",
            www_authenticate=True,
        )
    if not hmac.compare_digest(credentials.strip().encode("utf-8"), expected):
        return Refusal(403, "wrong token: use the token the dashboard was started with")
    return None


def cross_site(headers: Headers) -> Refusal | None:
    """A refusal when a browser says the request comes from another site's page.

    The ``Origin`` is compared with the ``Host`` the request was sent to (scheme aside, so a TLS
    proxy in front still matches; the proxy must pass ``Host`` on).
    """
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return Refusal(
            403,
            f"cross-site write refused (Sec-Fetch-Site: {site}): only the dashboard's own page, "
            "or a client that is not a browser, may change the store",
        )
    origin = headers.get("origin")
    if origin is not None:
        host = headers.get("host", "").lower()
        try:
            netloc = urlsplit(origin).netloc.lower()
        except ValueError:
            netloc = ""
        if not netloc or netloc != host:
            return Refusal(
                403,
                f"cross-site write refused (Origin {origin!r} is not this server, {host!r}): only the "
                "dashboard's own page, or a client that is not a browser, may change the store",
            )
    return None


def is_json(content_type: str | None) -> bool:
    """``application/json`` or a ``+json`` type, parameters aside."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class Guard:
    """The outermost ASGI layer: cross-site, token, content type and size checks (see the module)."""

    def __init__(self, app: ASGIApp, *, token: str | None, limits: Limits) -> None:
        self.app = app
        self.expected = None if token is None else token.encode("utf-8")
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        writes = scope["method"] not in SAFE_METHODS
        refusal = self._refusal(scope, headers, writes)
        if refusal is not None:
            await _refuse(send, refusal)
            return
        if not writes:
            await self.app(scope, receive, send)
            return
        try:
            body = await asyncio.wait_for(self._read_body(receive), self.limits.body_timeout)
        except _TooLarge:
            await _refuse(send, self._too_large())
            return
        except asyncio.TimeoutError:
            await _refuse(send, Refusal(408, f"the body did not arrive within {self.limits.body_timeout:g} s"))
            return
        if body is None:  # the client went away
            return
        await self.app(scope, _replay(body, receive), send)

    def _refusal(self, scope: Scope, headers: Headers, writes: bool) -> Refusal | None:
        path: str = scope["path"]
        if writes:
            refusal = cross_site(headers)
            if refusal is not None:
                return refusal
        if self.expected is not None and path.startswith(API_PREFIX) and path not in PUBLIC_API_PATHS:
            refusal = check_bearer(headers.get("authorization"), self.expected)
            if refusal is not None:
                return refusal
        if writes and _needs_json(scope["method"], headers) and not is_json(headers.get("content-type")):
            return Refusal(
                415,
                f"a write must be JSON: send 'Content-Type: application/json' "
                f"(got {headers.get('content-type') or 'no content type'})",
            )
        length = headers.get("content-length")
        if length is not None:
            if not (length.isascii() and length.isdigit()):
                return Refusal(400, f"Content-Length {length!r} is not a number of bytes")
            if int(length) > self.limits.max_body_bytes:
                return self._too_large()
        return None

    def _too_large(self) -> Refusal:
        return Refusal(
            413,
            f"the request body is over {self.limits.max_body_bytes} bytes "
            "(delayq dashboard --max-body-bytes): schedule large batches in several requests",
        )

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, counting as it streams in; at most the cap is ever held."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > self.limits.max_body_bytes:
                raise _TooLarge
            if not message.get("more_body", False):
                return bytes(body)


def _needs_json(method: str, headers: Headers) -> bool:
    """Every write but a body-less DELETE (see the module's point 3)."""
    has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
    return method != "DELETE" or has_body


class _TooLarge(Exception):
    pass


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then waits as the server would."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _refuse(send: Send, refusal: Refusal) -> None:
    payload = json.dumps({"detail": refusal.detail}).encode("utf-8")
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode("ascii")),
        (b"connection", b"close"),  # an unread body is not drained
    ]
    if refusal.www_authenticate:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
