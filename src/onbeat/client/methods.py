"""How one endpoint description becomes a method of both clients: a description turns the
method's arguments into a :class:`_Request`; the :class:`_Endpoint` and :class:`_Pages` descriptors
send it through whichever client they are read from -- a blocking one returns the result, an async
one returns a coroutine (or an async iterator) -- so the two clients cannot drift."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Self, TypeVar, overload

from onbeat.client.results import Json, Page

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class _Request(Generic[T]):
    """One API call: what to send, and how to read a successful answer's JSON (``None`` for an
    empty body) into the method's result."""

    method: str
    path: str
    parse: Callable[[Json], T]
    params: Mapping[str, str | int] | None = None
    body: Json = None
    headers: Mapping[str, str] | None = None


class _BlockingSender(ABC):
    """A client that sends a request and returns its result (:class:`Client`)."""

    @abstractmethod
    def _send(self, call: _Request[T]) -> T: ...


class _AsyncSender(ABC):
    """A client that sends a request as a coroutine (:class:`AsyncClient`)."""

    @abstractmethod
    async def _send(self, call: _Request[T]) -> T: ...


class _ClientMember:
    """A member of both clients, built from one describing function whose name, docstring and
    signature the bound methods carry (for help() and editors)."""

    kind = "member"

    def __init__(self, describe: Callable[..., Any]) -> None:
        self.__doc__ = describe.__doc__
        self.__name__ = describe.__name__
        self._signature = inspect.signature(describe).replace(
            return_annotation=inspect.Signature.empty
        )

    def __repr__(self) -> str:
        return f"<onbeat API {self.kind} {self.__name__}>"

    def _described(self, method: Callable[..., Any]) -> Any:
        method.__name__ = method.__qualname__ = self.__name__
        method.__doc__ = self.__doc__
        method.__signature__ = self._signature  # type: ignore[attr-defined]
        return method


class _Endpoint(_ClientMember, Generic[P, T]):
    """Makes ``build(*args) -> _Request[T]`` a method of both clients: on a :class:`Client` it
    returns ``T``; on an :class:`AsyncClient` it is a coroutine function returning ``T``."""

    kind = "method"

    def __init__(self, build: Callable[P, _Request[T]]) -> None:
        super().__init__(build)
        self._build = build

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: _BlockingSender, owner: type[Any]) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, client: _AsyncSender, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, client: _BlockingSender | _AsyncSender | None, owner: type[Any]) -> Any:
        if client is None:
            return self
        build = self._build
        method: Callable[..., Any]
        if isinstance(client, _AsyncSender):
            async_client = client

            async def method(*args: P.args, **kwargs: P.kwargs) -> T:
                return await async_client._send(build(*args, **kwargs))

        else:
            sync_client = client

            def method(*args: P.args, **kwargs: P.kwargs) -> T:
                return sync_client._send(build(*args, **kwargs))

        return self._described(method)


PageAt = Callable[[str | None], _Request[Page[T]]]
"""The request for the page at a cursor (``None``: the first page)."""


class _Pages(_ClientMember, Generic[P, T]):
    """Makes ``pages(*args) -> PageAt[T]`` an iterator over every item of every page: an
    ``Iterator[T]`` on a :class:`Client`, an ``AsyncIterator[T]`` on an :class:`AsyncClient`.
    Pages are fetched as the iteration reaches them."""

    kind = "iterator"

    def __init__(self, pages: Callable[P, PageAt[T]]) -> None:
        super().__init__(pages)
        self._pages = pages

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: _BlockingSender, owner: type[Any]) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(self, client: _AsyncSender, owner: type[Any]) -> Callable[P, AsyncIterator[T]]: ...
    def __get__(self, client: _BlockingSender | _AsyncSender | None, owner: type[Any]) -> Any:
        if client is None:
            return self
        pages = self._pages
        method: Callable[..., Any]
        if isinstance(client, _AsyncSender):
            async_client = client

            async def method(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
                page_at, cursor = pages(*args, **kwargs), None
                while True:
                    page = await async_client._send(page_at(cursor))
                    for item in page.items:
                        yield item
                    cursor = _next_cursor(cursor, page)
                    if cursor is None:
                        return

        else:
            sync_client = client

            def method(*args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
                page_at, cursor = pages(*args, **kwargs), None
                while True:
                    page = sync_client._send(page_at(cursor))
                    yield from page.items
                    cursor = _next_cursor(cursor, page)
                    if cursor is None:
                        return

        return self._described(method)


def _next_cursor(previous: str | None, page: Page[Any]) -> str | None:
    if page.next_cursor is not None and page.next_cursor == previous:
        raise RuntimeError(f"the API returned the cursor {previous!r} again; stopping")
    return page.next_cursor
