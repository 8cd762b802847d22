"""A real embedded node (scheduler, worker and REST API on a socket) in a background thread with
its own event loop, on a fresh SQLite file: the sync Client can block on it, and the AsyncClient
can drive it from the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from onbeat import App, TaskContext
from onbeat.client import Client
from onbeat.node import Node

T = TypeVar("T")
START_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(read: Callable[[], T], done: Callable[[T], bool], what: str, timeout: float = 10) -> T:
    """Call ``read`` until ``done`` holds for its result; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {value!r}")
        time.sleep(0.05)


@dataclass
class LiveNode:
    app: App
    url: str
    """The server, e.g. http://127.0.0.1:PORT (no /api/v1)."""


def make_app(path: Path) -> App:
    app = App(f"sqlite:///{path}", poll_interval=0.05, shutdown_grace=1)

    @app.task(name="echo", max_attempts=5, timeout=30, backoff=2.0, backoff_max=60)
    def echo(ctx: TaskContext, **params: Any) -> dict[str, Any]:
        return params

    @app.task(name="fail", max_attempts=1)
    def fail(ctx: TaskContext) -> None:
        raise RuntimeError(f"boom {ctx.attempt}")

    return app


@contextlib.contextmanager
def serving(path: Path) -> Iterator[LiveNode]:
    """A node on a fresh store at ``path`` and a free port, until the block ends."""
    app = make_app(path)
    port = free_port()
    started = threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        node = Node(app)
        state["loop"], state["stop"] = asyncio.get_running_loop(), node.stop
        running = asyncio.create_task(node.run(("127.0.0.1", port)))
        ready = asyncio.create_task(node.api_ready.wait())
        await asyncio.wait([running, ready], return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        started.set()
        await running

    def thread_main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # reported by the fixture, not lost in the thread
            state["error"] = exc
            started.set()

    thread = threading.Thread(target=thread_main, name="onbeat-node", daemon=True)
    thread.start()
    try:
        if not started.wait(START_TIMEOUT) or "error" in state:
            raise RuntimeError(f"the node did not start: {state.get('error')!r}")
        yield LiveNode(app, f"http://127.0.0.1:{port}")
    finally:
        if "loop" in state and thread.is_alive():
            state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(START_TIMEOUT)
        app.close()
    assert not thread.is_alive(), "the node did not stop"
    if "error" in state:
        raise state["error"]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveNode]:
    """A node of this test's own: for tests that see every job, or turn authentication on."""
    with serving(tmp_path / "db") as node:
        yield node


@pytest.fixture(scope="module")
def shared_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveNode]:
    """A node shared by a module's tests that only look at the jobs they create."""
    with serving(tmp_path_factory.mktemp("shared") / "db") as node:
        yield node


@pytest.fixture
def client(shared_live: LiveNode) -> Iterator[Client]:
    with Client(shared_live.url) as c:
        yield c


@pytest.fixture
def own_client(live: LiveNode) -> Iterator[Client]:
    with Client(live.url) as c:
        yield c
