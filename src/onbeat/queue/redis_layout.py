"""The Redis delay queue's key schema, time encoding and Lua scripts, in one place.

Every key starts with the queue's prefix (``onbeat`` unless the URL says ``?prefix=``) and
carries a hash tag, so a Redis Cluster can hold them and each script's keys share one slot:

=================================  =======  ===================================================
key                                type     holds
=================================  =======  ===================================================
``P:{<shard>}:items``              HASH     execution id -> the priority tier it is held in
``P:{<shard>}:tiers``              SET      tiers of that shard holding at least one id
``P:{<shard>}:version``            STRING   the shard's state version (see ``index_update.lua``)
``P:{<shard>}:due:<tier>``         ZSET     execution ids scored by due time (microseconds)
``P:{index}:tiers``                ZSET     every tier some shard holds (score = tier)
``P:{index}:due:<tier>``           ZSET     shards scored by the earliest due time of their tier
``P:{index}:head_version``         HASH     ``<tier>:<shard>`` -> version of that head
``P:{index}:shards``               SET      every shard ever used (``repair``, ``size``)
``P:{index}:generation``           STRING   a random token, set anew when found missing (``lost_data``)
``P:{where:<bucket>}:shard``       HASH     execution id -> shard (bucket = crc32(id) mod 16)
``P:wake``                         channel  pub/sub: "<queue instance> <earliest due>" on enqueue
=================================  =======  ===================================================

The shard keys are the truth; the ``{index}`` keys and the ``{where:*}`` buckets live in other
slots (a script cannot update them together in a Cluster), so they are kept as hints that are
checked or corrected against the shards; see ``onbeat.queue.redis`` for how.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources

__all__ = ["WHERE_BUCKETS", "Keys", "ShardKeys", "from_us", "load_lua", "to_us"]

WHERE_BUCKETS = 16
"""Buckets of the id -> shard look-up: enough to spread it over a small Cluster, few enough
that a claim of 256 ids deletes its look-up entries in at most 16 commands."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_us(when: datetime) -> int:
    """Microseconds since the epoch, exactly (sorted-set scores are doubles: exact to 2**53 us,
    the year 2255)."""
    return (when - _EPOCH) // _MICROSECOND


def from_us(value: str | int | float) -> datetime:
    """The inverse of ``to_us``; accepts a score as Redis prints it."""
    return _EPOCH + timedelta(microseconds=int(float(value)))


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one shard, in the order the shard_*.lua scripts take them."""

    items: str
    tiers: str
    version: str
    due_prefix: str  # + tier

    @property
    def keys(self) -> list[str]:
        return [self.items, self.tiers, self.version]


class Keys:
    """Key names for one queue prefix."""

    def __init__(self, prefix: str) -> None:
        if not prefix or any(c in prefix for c in "{} "):
            raise ValueError(f"prefix: must be non-empty, without braces or spaces: {prefix!r}")
        self.prefix = prefix
        index = f"{prefix}:{{index}}"
        self.index_tiers = f"{index}:tiers"
        self.index_due_prefix = f"{index}:due:"
        self.index_head_version = f"{index}:head_version"
        self.index_shards = f"{index}:shards"
        self.generation = f"{index}:generation"
        self.wake_channel = f"{prefix}:wake"
        self._shards: dict[int, ShardKeys] = {}

    def shard(self, shard: int) -> ShardKeys:
        keys = self._shards.get(shard)
        if keys is None:
            base = f"{self.prefix}:{{{shard}}}"
            keys = ShardKeys(f"{base}:items", f"{base}:tiers", f"{base}:version", f"{base}:due:")
            self._shards[shard] = keys
        return keys

    @staticmethod
    def bucket_of(execution_id: str) -> int:
        return zlib.crc32(execution_id.encode()) % WHERE_BUCKETS

    def where(self, bucket: int) -> str:
        return f"{self.prefix}:{{where:{bucket}}}:shard"

    @property
    def index_keys(self) -> list[str]:
        """The keys of index_update.lua, in order."""
        return [self.index_tiers, self.index_head_version]


def load_lua(name: str) -> str:
    """The text of ``lua/<name>.lua``; shard scripts get ``shard_common.lua`` prepended."""
    folder = resources.files("onbeat.queue") / "lua"
    text = (folder / f"{name}.lua").read_text(encoding="utf-8")
    if name.startswith("shard_"):
        text = (folder / "shard_common.lua").read_text(encoding="utf-8") + "\n" + text
    return text
