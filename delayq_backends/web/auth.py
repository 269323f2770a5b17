"""Bearer-token check of every API route.

The dashboard's HTML shell is public (it holds no data); every JSON route needs the token, so a
dashboard bound beyond loopback never shows or changes the store for someone without it. The
check runs twice: in :class:`~delayq_backends.web.guard.Guard`, before the body is read (what
keeps an unauthenticated client from costing anything), and as this route dependency, which puts
the scheme in the OpenAPI schema and guards a route should the app be mounted without the Guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .guard import check_bearer

__all__ = ["require_token"]

_bearer = HTTPBearer(auto_error=False, description="The dashboard token (--token, DELAYQ_API_TOKEN or --token-file).")


def require_token(token: str | None) -> Callable[..., None]:
    """A dependency that accepts only ``Authorization: Bearer <token>`` (anything when ``token`` is None).

    No header is 401; a wrong token is 403 (see :func:`~delayq_backends.web.guard.check_bearer`).
    """
    expected = None if token is None else token.encode("utf-8")

    def check(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        if expected is None:
            return
        header = None if credentials is None else f"{credentials.scheme} {credentials.credentials}"
        refusal = check_bearer(header, expected)
        if refusal is not None:
            headers = {"WWW-Authenticate": "Bearer"} if refusal.www_authenticate else None
            raise HTTPException(refusal.status, refusal.detail, headers=headers)

    return check
