"""``serve_api``: the API on a real socket, in the caller's event loop."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from onbeat import App
from onbeat.api import serve_api


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
