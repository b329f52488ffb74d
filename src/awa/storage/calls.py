"""Client methods written once. A method builds a call without I/O (``awa.storage.db.Call``:
a statement, a flow of them, ...) and the client's driver runs it on a pooled connection:
``AsyncDriver`` (``AsyncClient``) awaits it, ``BlockingDriver`` (``Client``) blocks. Both
clients mix in the same ``ClientMethod``s, so each operation has one definition."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

import psycopg
import psycopg_pool

from awa.errors import AwaError
from awa.storage.db import Call, Operation, run_call_async, run_call_sync, translate_errors

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Recovering(Generic[R]):
    """A call, and its result when the database cannot answer (``recover`` gets the
    AwaError and returns a result or raises); ``wait``: seconds for a pooled connection
    (None: the pool's timeout)."""

    call: Call[R]
    recover: Callable[[AwaError], R]
    wait: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Within(Generic[T, R]):
    """A call built and run inside a context (a tracing span): ``build`` receives what the
    context manager gives, and the context ends when the call has run."""

    context: Callable[[], AbstractContextManager[T]]
    build: Callable[[T], ClientCall[R]]


ClientCall = Call[R] | Recovering[R] | Within[Any, R]


class AsyncDriver:
    """Runs client calls on an asyncio pool (``AsyncClient`` provides ``pool`` and
    ``close``); ``async with client:`` closes it at the end."""

    async def pool(self) -> psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _drive(self, call: ClientCall[R], wait: float | None = None) -> R:
        if isinstance(call, Within):
            with call.context() as value:
                return await self._drive(call.build(value), wait)
        if isinstance(call, Recovering):
            try:
                return await self._drive(call.call, call.wait)
            except AwaError as error:
                return call.recover(error)
        pool = await self.pool()
        with translate_errors():
            async with pool.connection(timeout=wait) as conn:
                return await run_call_async(conn, call)


class BlockingDriver:
    """Runs client calls on a blocking pool (``Client`` provides ``pool`` and ``close``);
    ``with client:`` closes it at the end."""

    def pool(self) -> psycopg_pool.ConnectionPool[psycopg.Connection[Any]]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _drive(self, call: ClientCall[R], wait: float | None = None) -> R:
        if isinstance(call, Within):
            with call.context() as value:
                return self._drive(call.build(value), wait)
        if isinstance(call, Recovering):
            try:
                return self._drive(call.call, call.wait)
            except AwaError as error:
                return call.recover(error)
        with translate_errors(), self.pool().connection(timeout=wait) as conn:
            return run_call_sync(conn, call)


class ClientMethod(Generic[P, R]):
    """A method of both clients: ``build(client, *args)`` makes the call, the client's
    driver runs it. On an ``AsyncDriver`` the bound method is a coroutine function."""

    def __init__(
        self, build: Callable[Concatenate[Any, P], ClientCall[R]], signature: inspect.Signature
    ) -> None:
        self._build = build
        self.__signature__ = signature
        self.__doc__ = build.__doc__
        self.__name__ = build.__name__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.__name__ = name

    @overload
    def __get__(self, client: None, owner: type[Any] | None = None) -> Self: ...

    @overload
    def __get__(
        self, client: AsyncDriver, owner: type[Any] | None = None
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __get__(self, client: BlockingDriver, owner: type[Any] | None = None) -> Callable[P, R]: ...

    def __get__(self, client: Any, owner: type[Any] | None = None) -> Any:
        if client is None:
            return self
        build = self._build
        method: Any
        if isinstance(client, AsyncDriver):

            async def method(*args: Any, **kwargs: Any) -> Any:
                return await client._drive(build(client, *args, **kwargs))

        elif isinstance(client, BlockingDriver):

            def method(*args: Any, **kwargs: Any) -> Any:
                return client._drive(build(client, *args, **kwargs))

        else:
            raise TypeError(f"{self.__name__}() is a method of awa's clients")
        method.__name__ = method.__qualname__ = self.__name__
        method.__doc__ = self.__doc__
        method.__signature__ = self.__signature__
        return method


def client_method(
    build: Callable[Concatenate[Any, P], ClientCall[R]],
) -> ClientMethod[P, R]:
    """Decorator: a function of the client (its first parameter) returning a call becomes
    a method of both clients."""
    signature = inspect.signature(build)
    first, *rest = signature.parameters.values()
    del first  # the client
    return ClientMethod(build, signature.replace(parameters=rest))


def operation_method(op: Operation[P, R]) -> ClientMethod[P, R]:
    """An Operation (``awa.admin``'s and the capabilities') as a method of both clients,
    on a pooled connection."""

    def build(client: Any, /, *args: P.args, **kwargs: P.kwargs) -> ClientCall[R]:
        return op.build(*args, **kwargs)

    build.__name__, build.__doc__ = op.__name__, op.__doc__
    return ClientMethod(build, inspect.signature(op.build))
