"""FastAPI and Starlette: run a worker with the application, mount the UI and the callback
receiver under a prefix. Both frameworks take the same lifespan and ``mount``.

    client = awa.AsyncClient()
    app = FastAPI(lifespan=awa.contrib.fastapi.lifespan(client, {"email": 4}))
    awa.contrib.fastapi.mount(app, client, prefix="/awa", callback_secret=SECRET)

Inside a request, insert with the application's own transaction through ``awa.producer.bridge``
(``await awa.bridge.insert_job(session, args, client=client)``): the job exists if the
request's transaction commits, and never did if it rolls back.

Needs the ``fastapi`` extra (``pip install 'awa-py[fastapi]'``); without it, importing this
module raises ``awa.errors.MissingExtra`` saying so.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from awa.client.asyncio_client import AsyncClient, QueuesSpec
from awa.core.arguments import check_flag, check_seconds
from awa.core.extras import missing_extra
from awa.errors import MissingExtra, ValidationError

try:
    from awa.callbacks.http import Secret
    from awa.callbacks.http import create_app as create_callback_app
    from awa.ui import create_app as create_ui_app
except MissingExtra as error:
    raise missing_extra("fastapi", "awa.contrib.fastapi") from error

Lifespan = Callable[[Any], AbstractAsyncContextManager[None]]


class Mountable(Protocol):
    """A Starlette or FastAPI application (anything with ``mount(path, app)``)."""

    def mount(self, path: str, app: Any, name: str | None = None) -> None: ...


@contextlib.asynccontextmanager
async def running(
    client: AsyncClient,
    queues: QueuesSpec = None,
    *,
    worker: bool = True,
    migrate: bool = False,
    shutdown_timeout: float = 30.0,
    **start_options: Any,
) -> AsyncIterator[AsyncClient]:
    """The client, with its worker running (``worker=False``: a producer only) for the
    block; at exit the worker shuts down gracefully (running jobs get ``shutdown_timeout``
    seconds) and the client closes. ``migrate=True`` applies the schema first (convenient
    in development; production runs ``awa migrate`` before deploying)."""
    _check_lifespan(client, worker, migrate, shutdown_timeout)
    try:
        if migrate:
            await client.migrate()
        if worker:
            await client.start(queues, **start_options)
        yield client
    finally:
        if client.runtime is not None:
            await client.shutdown(shutdown_timeout)
        await client.close()


def lifespan(
    client: AsyncClient,
    queues: QueuesSpec = None,
    *,
    worker: bool = True,
    migrate: bool = False,
    shutdown_timeout: float = 30.0,
    inner: Lifespan | None = None,
    **start_options: Any,
) -> Lifespan:
    """A lifespan for ``FastAPI(lifespan=...)`` or ``Starlette(lifespan=...)``: the worker
    runs while the application serves (see ``running``). ``inner`` is the application's own
    lifespan, entered after the worker starts and left before it stops. Bad arguments raise
    ValidationError here, not when the application starts."""
    _check_lifespan(client, worker, migrate, shutdown_timeout)
    if inner is not None and not callable(inner):
        raise ValidationError(f"inner must be a lifespan (callable), not {type(inner).__name__}")

    @contextlib.asynccontextmanager
    async def app_lifespan(app: Any) -> AsyncIterator[None]:
        async with running(
            client,
            queues,
            worker=worker,
            migrate=migrate,
            shutdown_timeout=shutdown_timeout,
            **start_options,
        ):
            if inner is None:
                yield
            else:
                async with inner(app):
                    yield

    return app_lifespan


def mount(
    app: Mountable,
    client: AsyncClient,
    *,
    prefix: str = "/awa",
    ui: bool = True,
    read_only: bool = False,
    callback_secret: Secret | None = None,
    allow_unsigned_callbacks: bool = False,
) -> None:
    """Mount awa's HTTP parts under ``prefix``: the callback receiver at
    ``{prefix}/callbacks/{callback_id}/{action}`` when a secret is given (or unsigned
    callbacks are allowed), and the operator UI at ``{prefix}/`` when ``ui``. Put the
    prefix behind your application's authentication: neither part authenticates operators
    (the receiver checks the callback signature). ``prefix`` is a plain path: segments of
    letters, digits and ``-._~`` (no ``..``), at most 200 characters."""
    base = mount_prefix(prefix)
    for name, flag in (("ui", ui), ("read_only", read_only)):
        check_flag(name, flag)
    check_flag("allow_unsigned_callbacks", allow_unsigned_callbacks)
    if callback_secret is not None or allow_unsigned_callbacks:
        receiver = create_callback_app(
            client, secret=callback_secret, allow_unsigned=allow_unsigned_callbacks, prefix=""
        )
        # Mounted first: the UI's mount below would otherwise take these paths.
        app.mount(base + "/callbacks", receiver, name="awa-callbacks")
    if ui:
        app.mount(base, create_ui_app(client, read_only=read_only), name="awa-ui")


MAX_PREFIX = 200
_PREFIX_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")


def mount_prefix(prefix: object) -> str:
    """``prefix`` as a mount path (``"awa/"`` -> ``"/awa"``); ValidationError (a ValueError)
    for anything but plain path segments: no ``..``, no percent-escapes, spaces, control
    characters or NUL, which would put the UI somewhere other than where it seems."""
    if not isinstance(prefix, str):
        raise ValidationError(f"prefix must be a string, not {type(prefix).__name__}")
    if len(prefix) > MAX_PREFIX:
        raise ValidationError(f"prefix is {len(prefix)} characters long; the limit is {MAX_PREFIX}")
    segments = prefix.strip("/").split("/")
    if segments == [""]:
        raise ValidationError(
            "mount() needs a prefix such as '/awa' (the UI takes every path below)"
        )
    for segment in segments:
        if segment in ("", ".", "..") or not set(segment) <= _PREFIX_CHARACTERS:
            raise ValidationError(
                f"prefix {prefix!r} is not a plain path: each segment between slashes takes "
                "letters, digits and -._~ (and is not '.' or '..')"
            )
    return "/" + "/".join(segments)


def _check_lifespan(client: object, worker: object, migrate: object, timeout: object) -> None:
    if not isinstance(client, AsyncClient):
        raise ValidationError(f"client must be an awa.AsyncClient, not {type(client).__name__}")
    check_flag("worker", worker)
    check_flag("migrate", migrate)
    check_seconds("shutdown_timeout", timeout)
