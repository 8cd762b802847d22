"""How the Redis delay queue talks to Redis: its Lua scripts, packed into pipelined calls.

A shard script takes one or more shards per call ("groups"): on a single Redis one call carries
as many shards as fit ``CALL_ARGS``; with ``per_shard_calls`` each call carries one shard, the
pattern a Redis Cluster needs (a script's keys must share a slot). The replies come back as one
``ShardReport`` per group, which ``index_update.lua`` mirrors in the index.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from onbeat.queue.redis_layout import Keys, load_lua

__all__ = ["CHUNK", "Call", "Group", "Scripts", "ShardReport", "chunks"]

CHUNK = 1000
"""Ids per shard group or look-up command, so no single call blocks Redis for long."""
CALL_ARGS = 3 * CHUNK
"""Arguments per script call on a single Redis: groups of several shards share a call up to it."""

_SCRIPT_NAMES = (
    "shard_enqueue",
    "shard_claim",
    "shard_remove",
    "shard_state",
    "index_lower",
    "index_update",
    "index_pick",
    "index_head",
    "where_set",
)


@dataclass(slots=True)
class ShardReport:
    """What a shard script says about its shard after the call, for index_update.lua."""

    shard: int
    version: int
    heads: list[tuple[str, str]]  # (tier, earliest due as Redis prints it, "" when empty)
    full: bool = False  # lists every tier the shard holds (repair): others are empty there

    @classmethod
    def parse(
        cls, shard: int, reply: list[Any], full: bool = False
    ) -> tuple[ShardReport, list[Any]]:
        """Split a group's reply into its report and what follows it (claimed ids)."""
        n = int(reply[1])
        heads = [(str(reply[2 + 2 * i]), str(reply[3 + 2 * i])) for i in range(n)]
        return cls(shard, int(reply[0]), heads, full), reply[2 + 2 * n :]

    def args(self) -> list[str | int]:
        out: list[str | int] = [self.shard, self.version, int(self.full), len(self.heads)]
        for tier, head in self.heads:
            out += [tier, head]
        return out


@dataclass(slots=True)
class Call:
    """One command of a pipeline: a script call (``script`` set) or a plain command."""

    script: AsyncScript | None
    args: Sequence[str | int]
    keys: Sequence[str] = field(default_factory=list)

    def add_to(self, pipe: Pipeline) -> None:
        if self.script is None:
            pipe.execute_command(*self.args)
        else:
            pipe.evalsha(self.script.sha, len(self.keys), *self.keys, *self.args)


@dataclass(slots=True)
class Group:
    """One shard's part of a grouped shard script call: its slice of ARGV."""

    shard: int
    args: list[str | int]


def chunks(values: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class Scripts:
    """The queue's scripts, registered on its client, and the pipelines that run them."""

    def __init__(self, client: aioredis.Redis, keys: Keys, per_shard_calls: bool) -> None:
        self._redis = client
        self._keys = keys
        self._per_shard_calls = per_shard_calls
        self._scripts = {name: client.register_script(load_lua(name)) for name in _SCRIPT_NAMES}

    def __getitem__(self, name: str) -> AsyncScript:
        return self._scripts[name]

    def values(self) -> Iterator[AsyncScript]:
        return iter(self._scripts.values())

    async def run(self, calls: Sequence[Call]) -> list[Any]:
        """Run ``calls`` in one round trip (not a transaction). Scripts Redis does not have
        (it restarted, or SCRIPT FLUSH) are loaded and their calls run again: a call that
        failed with NOSCRIPT never ran."""
        pipe = self._redis.pipeline(transaction=False)
        for call in calls:
            call.add_to(pipe)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        again = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if again:
            for script in {id(calls[i].script): calls[i].script for i in again}.values():
                assert script is not None
                script.sha = await self._redis.script_load(script.script)
            pipe = self._redis.pipeline(transaction=False)
            for i in again:
                calls[i].add_to(pipe)
            for i, reply in zip(again, await pipe.execute(raise_on_error=False), strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def shard_calls(
        self, script: str, now: int, groups: Sequence[Group]
    ) -> list[tuple[Call, list[int]]]:
        """Calls of a shard script for ``groups`` (in order), each with the shards it carries."""
        packed: list[tuple[Call, list[int]]] = []
        keys: list[str] = []
        args: list[str | int] = [now]
        shards: list[int] = []
        for group in groups:
            if shards and (self._per_shard_calls or len(args) + len(group.args) > CALL_ARGS):
                packed.append((Call(self._scripts[script], args, keys), shards))
                keys, args, shards = [], [now], []
            keys += self._keys.shard(group.shard).keys
            args += group.args
            shards.append(group.shard)
        if shards:
            packed.append((Call(self._scripts[script], args, keys), shards))
        return packed

    @staticmethod
    def group_replies(
        shard_calls: Sequence[tuple[Call, list[int]]], replies: Sequence[Any]
    ) -> Iterator[tuple[int, list[Any]]]:
        """(shard, its group's reply) for every group of ``shard_calls``, in order."""
        for (_, shards), reply in zip(shard_calls, replies, strict=True):
            yield from zip(shards, reply, strict=True)

    async def run_shards(
        self, script: str, now: int, groups: Sequence[Group], full: bool = False
    ) -> list[tuple[ShardReport, list[Any]]]:
        """Run a shard script over ``groups`` in one round trip; each group's report and the
        rest of its reply."""
        if not groups:
            return []
        shard_calls = self.shard_calls(script, now, groups)
        replies = await self.run([call for call, _ in shard_calls])
        return [
            ShardReport.parse(shard, reply, full)
            for shard, reply in self.group_replies(shard_calls, replies)
        ]

    def where_calls(self, by_bucket: dict[int, list[str | int]]) -> list[Call]:
        """where_set.lua calls for (id, shard) pairs by bucket, packed like ``shard_calls``."""
        packed: list[Call] = []
        keys: list[str] = []
        args: list[str | int] = []
        for bucket, pairs in by_bucket.items():
            if keys and (self._per_shard_calls or len(args) + len(pairs) > CALL_ARGS):
                packed.append(Call(self._scripts["where_set"], args, keys))
                keys, args = [], []
            keys.append(self._keys.where(bucket))
            args += [len(pairs) // 2, *pairs]
        if keys:
            packed.append(Call(self._scripts["where_set"], args, keys))
        return packed

    def index_update(self, reports: Sequence[ShardReport]) -> Call:
        args: list[str | int] = [self._keys.index_due_prefix]
        for report in reports:
            args += report.args()
        return Call(self._scripts["index_update"], args, self._keys.index_keys)

    async def look_up_shards(self, execution_ids: Sequence[str], take: bool) -> dict[str, int]:
        """id -> shard from the where-buckets, for the ids they know; ``take`` also deletes."""
        by_bucket: dict[int, list[str]] = {}
        for eid in dict.fromkeys(execution_ids):
            by_bucket.setdefault(Keys.bucket_of(eid), []).append(eid)
        asked: list[Sequence[str]] = []
        calls: list[Call] = []
        for bucket, ids in by_bucket.items():
            for chunk in chunks(ids, 10 * CHUNK):
                asked.append(chunk)
                calls.append(Call(None, ["HMGET", self._keys.where(bucket), *chunk]))
                if take:
                    calls.append(Call(None, ["HDEL", self._keys.where(bucket), *chunk]))
        replies = await self.run(calls)
        found: dict[str, int] = {}
        for chunk, shards in zip(asked, replies[:: 2 if take else 1], strict=True):
            found.update(
                (eid, int(shard)) for eid, shard in zip(chunk, shards, strict=True) if shard
            )
        return found

    async def remove_from_shards(
        self, by_shard: dict[int, list[str]], now: int
    ) -> list[ShardReport]:
        groups = [
            Group(shard, [self._keys.shard(shard).due_prefix, len(chunk), *chunk])
            for shard, ids in by_shard.items()
            for chunk in chunks(ids)
        ]
        return [report for report, _ in await self.run_shards("shard_remove", now, groups)]
