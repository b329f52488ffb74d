"""The operator UI as an ASGI application."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from awa.client.asyncio_client import AsyncClient
from awa.ui import actions, pages
from awa.ui.context import Ui, templates
from awa.ui.security import (
    Authenticated,
    BoundedBody,
    ReadOnly,
    SameOrigin,
    SecurityHeaders,
    parse_credentials,
)


def create_app(
    client_or_url: AsyncClient | str | None = None,
    *,
    read_only: bool = False,
    title: str = "awa",
    refresh_seconds: float = 5.0,
    auth: str | None = None,
) -> Starlette:
    """The operator UI as an ASGI app; mount it under any prefix (Starlette, FastAPI, Django).

    ``client_or_url``: an ``AsyncClient`` whose pool the UI borrows, or a database URL (None:
    ``DATABASE_URL``) for a client of the UI's own, closed with the app's lifespan.
    ``read_only``: no actions are shown and every mutating request gets 403.
    ``auth``: credentials every request must carry (``user:password`` for basic auth, or a
    token for ``Authorization: Bearer``); mounted in another app, leave it None and protect
    the mount with that app's own authentication.
    """
    if refresh_seconds <= 0:
        raise ValueError("refresh_seconds must be positive")
    if auth is not None:
        parse_credentials(auth)  # a bad value fails here, not at the first request
    owns = not isinstance(client_or_url, AsyncClient)
    client = (
        AsyncClient(client_or_url, application_name="awa-ui")
        if not isinstance(client_or_url, AsyncClient)
        else client_or_url
    )
    ui = Ui(client, templates(), read_only, title, refresh_seconds, owns)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if ui.owns_client:
                await ui.client.close()

    routes = [
        *pages.routes(),
        *([] if read_only else actions.routes()),
        Mount("/static", StaticFiles(packages=[("awa.ui", "static")]), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=pages.ERROR_HANDLERS)
    app.state.awa_ui = ui
    # The last added runs first: headers go on every answer, the guards' refusals included.
    app.add_middleware(BoundedBody)
    app.add_middleware(SameOrigin)
    if read_only:
        app.add_middleware(ReadOnly)
    if auth is not None:
        app.add_middleware(Authenticated, credentials=auth)
    app.add_middleware(SecurityHeaders)
    return app
