"""API keys: each bound to one tenant with one role. Only a hash of a key is ever stored.

A key is ``onb_<id>_<secret>``: the id names the key in lists and revocations, the secret (32
random bytes) makes it unguessable. Keys are high-entropy, so a plain SHA-256 is the right hash:
a slow password hash would only add latency to every request.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

DEFAULT_TENANT = "default"
"""The tenant of jobs submitted without one (the Python API, or the REST API with no keys)."""
KEYS_EXIST_TTL = 1.0
"""Seconds a process keeps its answer to whether an active API key exists (asked on every
request without a key), and an active key it found (asked on every request with one): how late a
key created by another process turns keyless access off, and one revoked there stops working."""
KNOWN_KEYS_MAX = 1024
"""Active keys kept at most; past it, all are forgotten."""


class Role(StrEnum):
    READER = "reader"
    """Reads jobs, executions, dead letters and tasks of its tenant."""
    WRITER = "writer"
    """Also submits, edits, pauses, runs and cancels jobs, and replays or drops dead letters."""
    ADMIN = "admin"
    """Everything a writer can, for its tenant (key management is the CLI's, on the store)."""

    def allows(self, needed: Role) -> bool:
        order = [Role.READER, Role.WRITER, Role.ADMIN]
        return order.index(self) >= order.index(needed)


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    tenant: str
    role: Role
    created_at: datetime
    revoked_at: datetime | None = None


def new_key() -> tuple[str, str]:
    """A fresh (key id, full key)."""
    key_id = secrets.token_hex(6)
    return key_id, f"onb_{key_id}_{secrets.token_urlsafe(32)}"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def is_loopback(host: str) -> bool:
    """Whether an API listening on ``host`` is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class KeyCache:
    """What a process keeps of the store's API keys, each answer for ``KEYS_EXIST_TTL``: whether
    an active key exists, and the active keys found, by hash. Thread-safe: the API's threads
    fill it, its event loop reads it.

    An answer read from the store is kept only if no key was created or revoked through this
    process while it was read (``generation``); creating or revoking one forgets everything."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._exist: tuple[bool, float] | None = None
        self._keys: dict[str, tuple[ApiKey, float]] = {}
        self._generation = 0

    @property
    def generation(self) -> int:
        """Read before a store read, handed back to ``remember_*`` after it."""
        with self._lock:
            return self._generation

    def exist(self) -> bool | None:
        """Whether an active key exists, if known; None if it must be read."""
        with self._lock:
            kept = self._exist
        return kept[0] if kept is not None and self._monotonic() < kept[1] else None

    def key(self, digest: str) -> ApiKey | None:
        """The active key of that hash, if found within ``KEYS_EXIST_TTL``; else None."""
        with self._lock:
            kept = self._keys.get(digest)
        return kept[0] if kept is not None and self._monotonic() < kept[1] else None

    def remember_exist(self, exist: bool, generation: int) -> None:
        until = self._monotonic() + KEYS_EXIST_TTL
        with self._lock:
            if generation == self._generation:
                self._exist = (exist, until)

    def remember_key(self, digest: str, key: ApiKey, generation: int) -> None:
        until = self._monotonic() + KEYS_EXIST_TTL
        with self._lock:
            if generation == self._generation:
                if len(self._keys) >= KNOWN_KEYS_MAX:
                    self._keys.clear()
                self._keys[digest] = (key, until)

    def forget(self) -> None:
        """A key was created or revoked through this process: nothing kept holds."""
        with self._lock:
            self._exist = None
            self._keys.clear()
            self._generation += 1
