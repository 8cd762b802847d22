"""``serve_api``: the API on a real socket, in the caller's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from onbeat import App
from onbeat.api import serve_api
from onbeat.api.middleware import MAX_HEAD_BYTES


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_serve_api__serves_until_stopped(onbeat_app: App) -> None:
    port = _free_port()
    ready, stop = asyncio.Event(), asyncio.Event()
    server = asyncio.create_task(serve_api(onbeat_app, "127.0.0.1", port, ready, stop))
    await asyncio.wait_for(ready.wait(), 10)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/api/v1") as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        created = await client.post("/jobs", json={"task": "echo"})
        assert created.status_code == 201
    stop.set()
    await asyncio.wait_for(server, 10)
    with socket.socket() as again:  # the listener is closed
        again.bind(("127.0.0.1", port))


async def test_serve_api__port_in_use_raises_oserror(onbeat_app: App) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ready = asyncio.Event()
        with pytest.raises(OSError, match="cannot listen"):
            await asyncio.wait_for(serve_api(onbeat_app, "127.0.0.1", port, ready), 10)
        assert not ready.is_set()


async def test_serve_api__cancelling_closes_the_listener(onbeat_app: App) -> None:
    port = _free_port()
    ready = asyncio.Event()
    server = asyncio.create_task(serve_api(onbeat_app, "127.0.0.1", port, ready))
    await asyncio.wait_for(ready.wait(), 10)
    server.cancel()
    with pytest.raises(asyncio.CancelledError):
        await server
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


@contextlib.asynccontextmanager
async def _serving(
    onbeat_app: App,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """The API served on a free port, and a raw connection to it."""
    port = _free_port()
    ready, stop = asyncio.Event(), asyncio.Event()
    server = asyncio.create_task(serve_api(onbeat_app, "127.0.0.1", port, ready, stop))
    await asyncio.wait_for(ready.wait(), 10)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        stop.set()
        await asyncio.wait_for(server, 10)


async def test_serve_api__a_head_still_arriving_is_cut_off_at_the_limit(onbeat_app: App) -> None:
    """A header that never ends is answered 400 once the server holds about MAX_HEAD_BYTES of
    it, rather than buffered for ever: the API parses with httptools, which alone has no such
    limit (it took a 20 MB header)."""
    async with _serving(onbeat_app) as (reader, writer):
        writer.write(b"GET /api/v1/healthz HTTP/1.1\r\nHost: onbeat\r\nX-Note: ")
        sent = 0
        with contextlib.suppress(ConnectionError):  # refused while we were still sending
            while sent < 64 * MAX_HEAD_BYTES and not reader.at_eof():
                writer.write(b"n" * 4096)
                await writer.drain()
                sent += 4096
                await asyncio.sleep(0)  # let the server read it piece by piece
        assert sent < 4 * MAX_HEAD_BYTES  # ended before long, not after 2 MiB
        with contextlib.suppress(ConnectionError):  # a reset may overtake the answer
            status = await asyncio.wait_for(reader.readline(), 10)
            assert status == b"" or status.startswith(b"HTTP/1.1 400"), status


async def test_serve_api__heads_under_the_limit_arriving_slowly_are_served(onbeat_app: App) -> None:
    """The bound counts one head at a time: requests on one kept-alive connection, each with
    headers of three quarters of MAX_HEAD_BYTES sent in small pieces, are all answered."""
    note = b"n" * (MAX_HEAD_BYTES * 3 // 4)
    async with _serving(onbeat_app) as (reader, writer):
        for _ in range(5):
            head = b"GET /api/v1/healthz HTTP/1.1\r\nHost: onbeat\r\nX-Note: " + note + b"\r\n\r\n"
            for start in range(0, len(head), 1024):
                writer.write(head[start : start + 1024])
                await writer.drain()
                await asyncio.sleep(0)
            status = await asyncio.wait_for(reader.readline(), 10)
            assert status.startswith(b"HTTP/1.1 200"), status
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
