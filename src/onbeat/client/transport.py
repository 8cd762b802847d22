"""The two clients: :class:`Client` sends each request with ``httpx.Client``,
:class:`AsyncClient` with ``httpx.AsyncClient``; the methods both have come from :class:`_Api`."""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from onbeat.client.endpoints import _Api
from onbeat.client.errors import ApiError, Problem, _api_error, _connection_error
from onbeat.client.methods import _AsyncSender, _BlockingSender, _Request

API_PREFIX = "/api/v1"
DEFAULT_TIMEOUT = 10.0
_USER_AGENT = "onbeat-client/1"

T = TypeVar("T")


def _response_json(call: _Request[T], response: httpx.Response) -> T:
    """The result of a call from the server's answer; raises ``ApiError`` for an error status."""
    if response.is_error:
        raise _api_error(response)
    try:
        doc = response.json() if response.content else None
        return call.parse(doc)
    except (ValueError, KeyError, TypeError) as exc:
        # Not onbeat's API (another service on that port?) or an incompatible version.
        problem = Problem(
            "about:blank",
            "Unexpected response",
            response.status_code,
            f"{call.method} {call.path} answered what this client cannot read "
            f"({type(exc).__name__}: {exc}); is {response.url.host}:{response.url.port} an "
            "onbeat API of a compatible version?",
            [],
        )
        raise ApiError(
            response.status_code, problem, method=call.method, url=str(response.url)
        ) from exc


def _api_url(base_url: str) -> str:
    url = httpx.URL(base_url)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(
            f"base_url must be an http(s) URL such as http://127.0.0.1:8000, got {base_url!r}"
        )
    path = url.path.rstrip("/")
    if not path.endswith(API_PREFIX):
        path += API_PREFIX
    return str(url.copy_with(path=path, query=None, fragment=None))


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _url(base: str, call: _Request[Any]) -> str:
    return base + call.path


def _content(call: _Request[Any]) -> tuple[bytes | None, dict[str, str]]:
    """The body bytes (strict JSON: NaN is refused here, not sent) and per-call headers."""
    headers = dict(call.headers or {})
    if call.body is None:
        return None, headers
    headers["Content-Type"] = "application/json"
    return json.dumps(call.body, allow_nan=False).encode(), headers


class Client(_Api, _BlockingSender):
    """Blocking client of an onbeat API. Use it as a context manager, or call :meth:`close`.

    ``api_key`` is sent as ``Authorization: Bearer KEY``; ``timeout`` (seconds) bounds each
    request. ``transport`` replaces the HTTP transport (tests: ``httpx.MockTransport``)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = _api_url(base_url)
        self._http = httpx.Client(headers=_headers(api_key), timeout=timeout, transport=transport)

    def _send(self, call: _Request[T]) -> T:
        url = _url(self.base_url, call)
        content, headers = _content(call)
        try:
            response = self._http.request(
                call.method, url, params=call.params, content=content, headers=headers
            )
        except httpx.TransportError as exc:
            raise _connection_error(exc, url) from exc
        return _response_json(call, response)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"


class AsyncClient(_Api, _AsyncSender):
    """The same methods as :class:`Client`, as coroutines (``iter_*``: async iterators). Use it as
    an async context manager, or await :meth:`aclose`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = _api_url(base_url)
        self._http = httpx.AsyncClient(
            headers=_headers(api_key), timeout=timeout, transport=transport
        )

    async def _send(self, call: _Request[T]) -> T:
        url = _url(self.base_url, call)
        content, headers = _content(call)
        try:
            response = await self._http.request(
                call.method, url, params=call.params, content=content, headers=headers
            )
        except httpx.TransportError as exc:
            raise _connection_error(exc, url) from exc
        return _response_json(call, response)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r})"
