"""What the operator UI's pages and actions share: the client, the templates, the mode."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import jinja2
import psycopg
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from awa.client.asyncio_client import AsyncClient
from awa.ui.links import path_for
from awa.ui.security import clear_flash, csrf_token, pending_flash, remember_csrf

STATEMENT_TIMEOUT_MS = 5000
"""A page's statements stop after this long (a text search over a huge table, say); the page
then says so instead of hanging."""


@dataclasses.dataclass(slots=True)
class Ui:
    """What every page and action uses: the client, the templates, the mode."""

    client: AsyncClient
    templates: Jinja2Templates
    read_only: bool
    title: str
    refresh_seconds: float
    owns_client: bool

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection in a transaction whose statements are time-limited."""
        async with self.client.connection() as conn, conn.transaction():
            await conn.execute(
                "SELECT set_config('statement_timeout', %s, true)", (str(STATEMENT_TIMEOUT_MS),)
            )
            yield conn

    def render(
        self, request: Request, template: str, context: Mapping[str, Any], status: int = 200
    ) -> Response:
        message = pending_flash(request)
        values = {"ui": self, "csrf_token": csrf_token(request), "flash": message, **context}
        response = self.templates.TemplateResponse(request, template, values, status_code=status)
        if message is not None:
            clear_flash(request, response)
        remember_csrf(request, response)
        return response


def ui_of(request: Request) -> Ui:
    ui: Ui = request.app.state.awa_ui
    return ui


def _ago(value: dt.datetime | float | None) -> str:
    """ "3 s ago", "in 2 min", or "—"."""
    if value is None:
        return "—"
    if isinstance(value, dt.datetime):
        seconds = (dt.datetime.now(dt.UTC) - value).total_seconds()
    else:
        seconds = float(value)
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 1:
        text = f"{seconds * 1000:.0f} ms"
    elif seconds < 120:
        text = f"{seconds:.0f} s"
    elif seconds < 7200:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 172800:
        text = f"{seconds / 3600:.0f} h"
    else:
        text = f"{seconds / 86400:.0f} d"
    return f"in {text}" if future else f"{text} ago"


def _iso(value: dt.datetime | None) -> str:
    return value.isoformat(timespec="milliseconds") if value is not None else ""


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


@jinja2.pass_context
def _path_for(context: jinja2.runtime.Context, name: str, /, **params: Any) -> str:
    return path_for(context["request"], name, **params)


def _no_url_for(*args: Any, **kwargs: Any) -> str:
    # Starlette's url_for builds absolute URLs from the Host header and leaves path
    # parameters unencoded: the templates use path_for.
    raise RuntimeError("the UI's templates build links with path_for, not url_for")


def templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("awa.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["ago"] = _ago
    env.filters["iso"] = _iso
    env.filters["pretty"] = _pretty
    env.filters["first_line"] = lambda text: str(text or "").split("\n", 1)[0]
    env.globals["path_for"] = _path_for
    env.globals["url_for"] = _no_url_for
    return Jinja2Templates(env=env)
