"""A TCP forwarder a test can shut: while shut, connections to it are refused and the ones it
carried are reset, as when a database server goes down; opened again, it forwards on the same
port. It stands between a process's pools and a real server, so a test can take the server away
without stopping it for everyone else."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpGate", "tcp_gate"]


class TcpGate:
    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener: socket.socket | None = None
        self._carried: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.port = 0

    def open(self) -> None:
        """Accept and forward connections (on the port of the first ``open``)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def shut(self) -> None:
        """Refuse new connections and reset every carried one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            carried, self._carried = self._carried, set()
        for sock in carried:
            # SO_LINGER 0: close() sends a RST, as a server that went away does.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.close()

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by this gate's."""
        parts = urlsplit(url)
        user, at, _ = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{user}{at}127.0.0.1:{self.port}"))

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # shut
            server = socket.create_connection(self._target)
            with self._lock:
                self._carried |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def tcp_gate(url: str) -> Iterator[TcpGate]:
    """An open gate in front of ``url``'s server (shut on exit)."""
    parts = urlsplit(url)
    gate = TcpGate((parts.hostname or "127.0.0.1", parts.port or 5432))
    gate.open()
    try:
        yield gate
    finally:
        gate.shut()
