"""A TCP forwarder a test can shut: while shut, connections to it are refused and the ones it
carried are reset, as when a database server goes down; opened again, it forwards on the same
port. It stands between a process's pools and a real server, so a test can take the server away
without stopping it for everyone else. ``cut_at_commit`` cuts the connection that next sends a
COMMIT, with or without letting the server have it first: the two ways a client can lose its
COMMIT's answer."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpGate", "tcp_gate"]


COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"
"""The simple-protocol query message psycopg sends to commit a transaction."""


class TcpGate:
    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener: socket.socket | None = None
        self._carried: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut: _Cut | None = None
        """Armed by ``cut_at_commit``."""
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
        with self._lock:
            listener, self._listener = self._listener, None
            carried, self._carried = self._carried, set()
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        _reset(*carried)

    def cut_at_commit(
        self, delivered: bool, shut: bool = False, after: bytes = b""
    ) -> threading.Event:
        """Reset the next connection that sends a COMMIT, and only it: the COMMIT of a
        transaction that sent ``after`` (a statement's text; psycopg sends it while the
        statement is not prepared, the first 5 times on a connection), so another session's
        COMMIT does not take the cut. ``delivered``: the server gets the COMMIT and its answer is dropped
        (it committed; the client cannot know), else the COMMIT is dropped (the server sees the
        connection end and rolls back). ``shut``: the gate shuts with the cut (the server stays
        away until ``open``). The event returned is set once the cut is made."""
        self._cut = _Cut(delivered, shut, after)
        return self._cut.made

    def _take_cut(self, link: _Link) -> _Cut | None:
        """The armed cut, disarmed, if this COMMIT ends a transaction it is for."""
        with self._lock:
            cut = self._cut
            if cut is None or cut.after not in link.sent:
                return None
            self._cut = None
        return cut

    def _make(self, cut: _Cut, link: _Link) -> None:
        if cut.shut:
            self.shut()  # first: no new connection gets through between the cut and the shut
        _reset(link.client, link.server)
        cut.made.set()

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
                if self._listener is not listener:  # shut while this one was accepted
                    _reset(client, server)
                    return
                self._carried |= {client, server}
            link = _Link(client, server)
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._answers, args=(link,), daemon=True).start()

    def _requests(self, link: _Link) -> None:
        """Client to server, watching for the COMMIT to cut."""
        with contextlib.suppress(OSError):
            while data := link.client.recv(65536):
                link.sent += data
                cut = self._take_cut(link) if COMMIT in data else None
                if COMMIT in data:
                    link.sent = b""  # a transaction ended: what it sent no longer counts
                if cut is not None and not cut.delivered:
                    self._make(cut, link)
                    return
                link.cut = cut  # before the server can answer
                link.server.sendall(data)
        with contextlib.suppress(OSError):
            link.server.shutdown(socket.SHUT_WR)

    def _answers(self, link: _Link) -> None:
        """Server to client, dropping the answer to a cut COMMIT."""
        with contextlib.suppress(OSError):
            while data := link.server.recv(65536):
                if link.cut is not None:
                    self._make(link.cut, link)
                    return
                link.client.sendall(data)
        with contextlib.suppress(OSError):
            link.client.shutdown(socket.SHUT_WR)


@dataclass
class _Cut:
    delivered: bool
    shut: bool
    after: bytes
    made: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Link:
    """One carried connection: the client's socket and the server's."""

    client: socket.socket
    server: socket.socket
    sent: bytes = b""
    """What the client sent since its last COMMIT."""
    cut: _Cut | None = None
    """A delivered cut: the server's next answer is dropped and the connection reset."""


def _reset(*socks: socket.socket) -> None:
    """Close with a RST, as a server or network that went away does (SO_LINGER 0). The
    shutdown first wakes the thread blocked reading the socket, which would otherwise hold the
    socket open past ``close``."""
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


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
