"""``serve_api``: the REST API on uvicorn, inside the embedded node's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from anyio import to_thread

from onbeat.api.app import create_app
from onbeat.api.middleware import MAX_HEAD_BYTES
from onbeat.app import App
from onbeat.metrics import Metrics

ROUTE_THREADS = 8
"""Requests served at once by sync routes: one per connection of the PostgreSQL store's pool
(``onbeat.store.postgres_session.POOL_SIZE``, not imported: an embedded node does not load psycopg)."""


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
        # h11 answers 400 once a head still arriving holds more than this; uvicorn's default
        # parser whenever it is importable (httptools, as with uvicorn[standard]) buffers a head
        # without limit (it took a 20 MB header). The exact limit is RequestSizeMiddleware's.
        http="h11",
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
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
