"""``serve_api``: the REST API on uvicorn, inside the embedded node's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from anyio import to_thread
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from onbeat.api.app import create_app
from onbeat.api.middleware import MAX_HEAD_BYTES
from onbeat.app import App
from onbeat.metrics import Metrics

ROUTE_THREADS = 8
"""Requests served at once by sync routes: one per connection of the PostgreSQL store's pool
(``onbeat.store.postgres_session.POOL_SIZE``, not imported: an embedded node does not load psycopg)."""


class _BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's protocol on httptools (llhttp, in C), bounded as h11 is: a head still arriving
    is cut off (400) once more than ``MAX_HEAD_BYTES`` of it came in after the read that began
    it, where httptools alone buffers one without limit (it took a 20 MB header). The exact
    limit on a whole head is RequestSizeMiddleware's 431."""

    _head_bytes = 0
    """Bytes read since the read in which the head being parsed began, while it is."""
    _reading_head = False
    _head_began = False
    """Whether a message began in the read being parsed (its head's bytes in it are unknown)."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes, self._reading_head, self._head_began = 0, True, True

    def on_headers_complete(self) -> None:
        self._reading_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        self._head_began = False
        super().data_received(data)
        if not self._reading_head or self._head_began or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self.send_400_response("Request head too large")


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that shares its process: it leaves SIGINT/SIGTERM to the node (which
    stops it through ``stop``) and reports when it listens."""

    def __init__(self, config: uvicorn.Config, ready: asyncio.Event | None) -> None:
        super().__init__(config)
        self._ready = ready

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._ready is not None:
            self._ready.set()


async def serve_api(
    onbeat_app: App,
    host: str = "127.0.0.1",
    port: int = 8000,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    metrics: Metrics | None = None,
) -> None:
    """Serve the API of ``onbeat_app`` on ``host:port`` in the running event loop until ``stop`` is
    set (or the task is cancelled), then close the listener and let in-flight requests finish.
    ``ready`` is set once the socket listens. Raises OSError if it cannot listen (port in use)."""
    config = uvicorn.Config(
        create_app(onbeat_app, metrics=metrics),
        host=host,
        port=port,
        lifespan="off",
        http=_BoundedHeadProtocol,
        log_level="warning",
        log_config=None,  # keep the node's logging setup
        access_log=False,
        # In-flight requests get as long to finish as the worker's runs do.
        timeout_graceful_shutdown=max(1, round(onbeat_app.settings.shutdown_grace)),
    )
    server = _EmbeddedServer(config, ready)
    # Sync routes (and key checks not known yet) run in AnyIO's threads. Its default of 40 lets
    # 32 connections' requests all run at once, to queue for the store's connections and the
    # GIL; as many threads as pooled connections answered more requests for less CPU (W5).
    to_thread.current_default_thread_limiter().total_tokens = ROUTE_THREADS

    async def exit_on_stop(event: asyncio.Event) -> None:
        await event.wait()
        server.should_exit = True

    watcher = asyncio.create_task(exit_on_stop(stop)) if stop is not None else None
    try:
        await server.serve()
    except SystemExit:
        # uvicorn logs the bind error and exits the process; a node with other work must not.
        raise OSError(f"onbeat API cannot listen on {host}:{port} (see the log)") from None
    except asyncio.CancelledError:
        if server.started:
            server.should_exit = True
            await server.shutdown()
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
