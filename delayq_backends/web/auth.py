"""Bearer-token check of every API route.

The dashboard's HTML shell is public (it holds no data); every JSON route needs the token, so a
dashboard bound beyond loopback never shows or changes the store for someone without it.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Callable, Optional

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

__all__ = ["require_token"]

_bearer = HTTPBearer(auto_error=False, description="The dashboard token (--token, DELAYQ_API_TOKEN or --token-file).")


def require_token(token: Optional[str]) -> Callable[..., None]:
    """A dependency that accepts only ``Authorization: Bearer <token>`` (anything when ``token`` is None).

    The comparison is constant-time (``hmac.compare_digest``), so response times leak nothing
    about how much of a guess was right. No header is 401; a wrong token is 403.
    """
    expected = None if token is None else token.encode("utf-8")

    def check(credentials: Annotated[Optional[HTTPAuthorizationCredentials], Depends(_bearer)]) -> None:
        if expected is None:
            return
        if credentials is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing token: send the header 'Authorization: Bearer <token>' (the dashboard's --token)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(credentials.credentials.encode("utf-8"), expected):
            raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong token: use the token the dashboard was started with")

    return check
