"""Who may use the operator UI and how its forms are protected.

- CSRF: a random token in a cookie of the UI's own path (``SameSite=Strict``, HTTP only)
  that every form repeats in a hidden field; a POST whose field does not match is refused
  with 403. A page on another origin can neither read the cookie nor forge the field.
- Same origin: beside the token, every request other than GET and HEAD must come from a
  page of the UI's own origin. Its ``Origin`` header (or, when a browser sent none, the
  ``Referer``'s origin) must name the host the request was sent to (the ``Host`` header,
  port included); ``Origin: null`` (sandboxed frames, some redirects) is another origin.
  The scheme is not compared, because a proxy that terminates TLS forwards the forms of an
  ``https`` page as plain ``http``. A request with neither header is let through to the
  CSRF check: browsers send ``Origin`` on every POST, so only a client that is not a
  browser (curl, a script) sends none, and no other site can make it send one.
- Headers on every response: a Content-Security-Policy that allows scripts, styles and
  requests from the UI's own origin only (no inline script or style, no plugin, no
  ``<base>``, no framing, forms posting only to the UI), ``X-Frame-Options: DENY``,
  ``Referrer-Policy: same-origin`` and ``X-Content-Type-Options: nosniff``.
- Bounded bodies: a request other than GET or HEAD whose body passes ``MAX_FORM_BYTES``
  gets 413, read no further (the form parser would otherwise hold all of it in memory).
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
MAX_FLASH = 300
"""Characters of a flash message kept (names in it may be long)."""
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ]
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"x-content-type-options", b"nosniff"),
)

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
    # Cut short: every character may take up to 12 bytes encoded, and a browser drops a
    # cookie over 4 kB.
    response.set_cookie(
        FLASH_COOKIE,
        urllib.parse.quote(message[:MAX_FLASH]),
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


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every response (those of the other guards included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {name.lower() for name, _ in headers}
                headers += [pair for pair in SECURITY_HEADERS if pair[0] not in present]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


def _host_port(netloc: str) -> str:
    """``host[:port]`` lowercased, without a default port (80, 443)."""
    netloc = netloc.strip().lower()
    for default in (":80", ":443"):
        if netloc.endswith(default):
            return netloc[: -len(default)]
    return netloc


def _origin_of(url: str) -> str | None:
    """The ``host[:port]`` of an Origin or Referer value; None for ``null`` or anything that
    is not an http(s) URL."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return _host_port(f"{host}:{port}" if port is not None else host)


def request_host(scope: Scope) -> str | None:
    """The ``host[:port]`` the request was sent to (its Host header, else the server's)."""
    for name, value in scope.get("headers") or []:
        if name == b"host":
            return _host_port(value.decode("latin-1"))
    server = scope.get("server")
    if server:
        host, port = server
        return _host_port(f"{host}:{port}" if port is not None else str(host))
    return None


def foreign_origin(scope: Scope) -> str | None:
    """Why a request other than GET or HEAD is refused as coming from another origin (see
    the module's docstring), or None when it may go on to the CSRF check."""
    headers = {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in scope.get("headers") or []
    }
    claimed = headers.get("origin")
    header = "Origin"
    if claimed is None:
        claimed = headers.get("referer")
        header = "Referer"
    if claimed is None:
        return None  # not a browser: the CSRF token decides
    origin = _origin_of(claimed)
    own = request_host(scope)
    if origin is not None and own is not None and origin == own:
        return None
    return f"refused: the request comes from another origin ({header}: {claimed[:200]!r})"


class SameOrigin:
    """Answers 403 to a request other than GET or HEAD sent from another origin."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            reason = foreign_origin(scope)
            if reason is not None:
                await PlainTextResponse(reason, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


MAX_FORM_BYTES = 64 * 1024
"""The largest body an action accepts: its forms carry a token, a few names and ids (a
name is 200 characters at most, a batch of ids a few thousand)."""


class BoundedBody:
    """Answers 413 to a request other than GET or HEAD whose body is over ``limit`` bytes,
    by its Content-Length or, without one, once that much has arrived; smaller bodies are
    read here and handed on whole."""

    def __init__(self, app: ASGIApp, limit: int = MAX_FORM_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        refusal = PlainTextResponse(
            f"refused: the request body is over {self.limit} bytes", status_code=413
        )
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await refusal(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.limit:
                await refusal(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        handed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal handed
            if handed:
                return await receive()
            handed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)
