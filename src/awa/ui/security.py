"""Who may use the operator UI and how its forms are protected.

- CSRF: a random token in a cookie of the UI's own path (``SameSite=Strict``, HTTP only)
  that every form repeats in a hidden field; a POST whose field does not match is refused
  with 403. A page on another origin can neither read the cookie nor forge the field.
- Read-only: any request other than GET or HEAD gets 403, and templates hide the actions.
- Authentication (``awa ui --auth``): a bearer token, or basic-auth credentials. The app
  mounted into another application leaves authentication to that application.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from awa.errors import ValidationError

CSRF_COOKIE = "awa_csrf"
CSRF_FIELD = "csrf_token"
FLASH_COOKIE = "awa_flash"
SAFE_METHODS = frozenset({"GET", "HEAD"})

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def cookie_path(request: Request) -> str:
    """The UI's own path (its mount prefix), so its cookies stay out of the host app's."""
    return (request.scope.get("root_path") or "") + "/"


def csrf_token(request: Request) -> str:
    """The request's CSRF token: the cookie's, or a new one (set by ``remember_csrf``)."""
    token = request.cookies.get(CSRF_COOKIE)
    if not token or len(token) != 43:
        token = request.state.__dict__.setdefault("new_csrf", secrets.token_urlsafe(32))
    return token


def remember_csrf(request: Request, response: Response) -> None:
    new = request.state.__dict__.get("new_csrf")
    if new is not None:
        response.set_cookie(
            CSRF_COOKIE, new, path=cookie_path(request), httponly=True, samesite="strict"
        )


def csrf_valid(request: Request, submitted: object) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not isinstance(submitted, str):
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())


def flash(request: Request, response: Response, message: str) -> None:
    """Show ``message`` on the next page this browser renders."""
    response.set_cookie(
        FLASH_COOKIE,
        urllib.parse.quote(message[:500]),
        path=cookie_path(request),
        httponly=True,
        samesite="strict",
    )


def pending_flash(request: Request) -> str | None:
    """The message an action left for this page, if any."""
    value = request.cookies.get(FLASH_COOKIE)
    return urllib.parse.unquote(value) if value is not None else None


def clear_flash(request: Request, response: Response) -> None:
    response.delete_cookie(FLASH_COOKIE, path=cookie_path(request))


class OwnRouter:
    """Makes ``url_for`` resolve the UI's own route names wherever it is mounted: Starlette
    looks names up in the outermost application's router, where a named mount would
    require qualified names; the UI's router with the mount's root path gives the same
    URLs under any prefix."""

    def __init__(self, app: ASGIApp, router: Any) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope["router"] = self.router
            scope["app_root_path"] = scope.get("root_path", "")  # URLs start at the mount
        await self.app(scope, receive, send)


class ReadOnly:
    """Answers every request but GET and HEAD with 403."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            response = PlainTextResponse("this awa UI is read-only", status_code=403)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def parse_credentials(value: str) -> tuple[str | None, str]:
    """``user:password`` (basic auth) or a bare token (bearer, or basic with any user)."""
    value = value.strip()
    if not value:
        raise ValidationError("the UI's credentials are empty")
    user, colon, password = value.partition(":")
    if colon:
        if not user or not password:
            raise ValidationError("basic-auth credentials must be user:password, both non-empty")
        return user, password
    return None, value


class Authenticated:
    """Lets through requests that carry the credentials; asks the browser for them else."""

    def __init__(self, app: ASGIApp, credentials: str) -> None:
        self.app = app
        self.user, self.secret = parse_credentials(credentials)

    def _allowed(self, header: str) -> bool:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.user is None:
            return hmac.compare_digest(value.strip().encode(), self.secret.encode())
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, _, password = decoded.partition(":")
        user_ok = self.user is None or hmac.compare_digest(user.encode(), self.user.encode())
        return user_ok and hmac.compare_digest(password.encode(), self.secret.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            header = headers.get(b"authorization", b"").decode("latin-1")
            if not self._allowed(header):
                response = PlainTextResponse(
                    "authentication required",
                    status_code=401,
                    headers={"WWW-Authenticate": 'Basic realm="awa"'},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
