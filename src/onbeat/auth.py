"""API keys: each bound to one tenant with one role. Only a hash of a key is ever stored.

A key is ``onb_<id>_<secret>``: the id names the key in lists and revocations, the secret (32
random bytes) makes it unguessable. Keys are high-entropy, so a plain SHA-256 is the right hash:
a slow password hash would only add latency to every request.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

DEFAULT_TENANT = "default"
"""The tenant of jobs submitted without one (the Python API, or the REST API with no keys)."""


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
