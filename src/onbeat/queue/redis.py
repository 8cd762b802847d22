"""The Redis delay queue: sorted sets per (shard, priority tier), claimed atomically by Lua.

``open_queue("redis://host:port/db?prefix=onbeat&shards=1024")`` returns one. The key layout is
in ``redis_layout`` and the scripts in ``lua/``; the choices, and why:

- **Shards are the truth.** Each shard (``QueueItem.shard``, fixed by the store per job) has its
  own keys under the hash tag ``{<shard>}``, and every change to a shard is one script, so a
  claim is atomic and hands an id to one caller only, across processes; a Redis Cluster can
  spread the shards over its nodes. Times are the queue's injected ``Clock``, passed as ARGV
  (never Redis ``TIME``), so the contract suite drives it with a ``FakeClock``.
- **An index says which shards to visit.** A Cluster cannot run one script across slots, and
  asking 1,024 shards on every claim costs 39 ms even pipelined (measured: one pipeline of 1,024
  ZRANGEs; a single command is ~0.3 ms). So ``{index}`` keys mirror each (tier, shard)'s
  earliest due time; a claim asks the index for the due (tier, shard) pairs, highest tier then
  earliest head first, then claims from up to ``ROUND_WIDTH`` shards per pipelined round: about
  3 round trips per claim whatever the shard count. Every shard script returns a versioned
  report of what it changed and the index keeps only the newest report per (tier, shard), so
  reports from many processes may land in any order. Before writing ids, an enqueue lowers the
  index heads first (``index_lower.lua``): a writer that dies between the two steps leaves the
  index early (the next claim visits, finds the truth, corrects it), not late. The one case left
  (such a death while another process claims from the same shard) is fixed by ``repair()``,
  which any waiting process runs every ``REPAIR_INTERVAL``: it re-reads every registered shard.
- **Shards are discovered** from the items enqueued (the index registers each shard it is told
  about), so the queue needs no shard count; ``?shards=N`` only makes ``repair()`` also read
  shards 0..N-1, for a Cluster that lost the index's node but not the shards' nodes.
- **missing(ids) and remove(ids)** get no shard, so ``{where:<bucket>}`` hashes map id -> shard.
  They are a hint: ``missing`` reports an id as held only if its shard says so, so a stale or
  lost entry can only make the sweep re-enqueue an id it holds already (idempotent), never
  leave a lost run unreported.
- **Wake-ups across processes** use pub/sub on ``<prefix>:wake`` (see ``redis_wake``).
- **No visibility timeout.** A claimed id leaves the queue. If its worker dies before
  ``Store.execution_claim`` flips it to running, the store still says ``queued`` and the
  scheduler's sweep re-enqueues it after ``sweep_overdue`` (the same path that refills a Redis
  that lost its data); once running, its lease and the reaper cover it. A visibility timeout
  would cost an acknowledgement write per claim to duplicate those two mechanisms.
- **Redis down** raises ``QueueUnavailableError`` naming the URL (password hidden), so callers
  retry with backoff or fall back; the queue reconnects by itself once Redis is back. What
  Redis lost meanwhile, the sweep refills.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from onbeat.clock import Clock
from onbeat.errors import QueueUnavailableError, ValidationError
from onbeat.queue.base import QueueItem
from onbeat.queue.redis_layout import Keys, from_us, load_lua, to_us
from onbeat.queue.redis_wake import Waiters, WakeListener

__all__ = ["RedisDelayQueue"]

ROUND_WIDTH = 32
"""Shards claimed from in one pipelined round; a claim's limit is split among them."""
MAX_ROUNDS = 8
"""Rounds per claim (one tier per round): a claim spanning more returns what it has."""
CHUNK = 1000
"""Ids per shard script call or look-up command, so no single call blocks Redis for long."""
CALL_ARGS = 3 * CHUNK
"""Arguments per script call: on a single Redis, groups of several shards share a call up to this."""
REPAIR_INTERVAL = 10.0
"""Seconds between ``repair()`` passes started by ``wait()``."""
CONNECT_TIMEOUT = 2.0
"""Seconds to connect, or to get the wake-up subscription confirmed, before giving up."""
COMMAND_TIMEOUT = 10.0
"""Seconds a command may take before the connection counts as broken."""

_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)


@dataclass(slots=True)
class _Report:
    """What a shard script says about its shard after the call, for index_update.lua."""

    shard: int
    version: int
    heads: list[tuple[str, str]]  # (tier, earliest due as Redis prints it, "" when empty)
    full: bool = False

    def args(self) -> list[str | int]:
        out: list[str | int] = [self.shard, self.version, int(self.full), len(self.heads)]
        for tier, head in self.heads:
            out += [tier, head]
        return out


def _parse_report(shard: int, reply: list[Any], full: bool = False) -> tuple[_Report, list[Any]]:
    """Split a shard script's reply into its report and what follows it (claimed ids)."""
    n = int(reply[1])
    heads = [(str(reply[2 + 2 * i]), str(reply[3 + 2 * i])) for i in range(n)]
    return _Report(shard, int(reply[0]), heads, full), reply[2 + 2 * n :]


@dataclass(slots=True)
class _Call:
    """One command of a pipeline: a script call (``script`` set) or a plain command."""

    script: AsyncScript | None
    args: Sequence[str | int]
    keys: Sequence[str] = field(default_factory=list)

    def add_to(self, pipe: Pipeline) -> None:
        if self.script is None:
            pipe.execute_command(*self.args)
        else:
            pipe.evalsha(self.script.sha, len(self.keys), *self.keys, *self.args)


def _chunks(values: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


@dataclass(slots=True)
class _Group:
    """One shard's (or where-bucket's) part of a grouped script call: its ARGV slice."""

    key: int  # the shard, or the where-bucket
    args: list[str | int]


class RedisDelayQueue:
    """A ``DelayQueue`` in Redis, shared by every process that opens the same URL and prefix.

    Among due items: highest priority first (across all shards), then earliest ``due_at``
    within a shard; across the shards of one tier, a claim takes from the shards whose earliest
    due time is oldest, splitting its limit among them. After ``close()``, ``wait()`` returns
    at once and the other calls raise ``RuntimeError``.
    """

    def __init__(
        self,
        url: str,
        clock: Clock,
        *,
        prefix: str = "onbeat",
        shards: int = 0,
        per_shard_calls: bool = False,
    ) -> None:
        self._clock = clock
        self._keys = Keys(prefix)
        self._repair_shards = shards
        self._per_shard_calls = per_shard_calls
        parts = urlsplit(url)
        self.url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        """The URL without credentials, as errors show it."""
        self._client_url = url
        self._instance = uuid.uuid4().hex[:12]
        self._redis = self._client(COMMAND_TIMEOUT, f"onbeat-queue-{self._instance}")
        self._scripts = {
            name: self._redis.register_script(load_lua(name))
            for name in (
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
        }
        self._waiters = Waiters()
        self._listener = WakeListener(
            # Blocks on pub/sub reads as long as it takes; named, so operators can find it.
            lambda: self._client(None, f"onbeat-wake-{self._instance}"),
            self._keys.wake_channel,
            self._instance,
            self._waiters,
            clock,
        )
        self._last_repair = -math.inf
        self._closed = False

    @classmethod
    def from_url(cls, url: str, clock: Clock) -> RedisDelayQueue:
        """``redis://[user:password@]host:port/db?prefix=P&shards=N&per_shard_calls=1``; every
        option is optional. ``per_shard_calls=1`` sends one shard per script call, the pattern a
        Redis Cluster needs (onbeat opens single-node clients only, so it is there to test it)."""
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        prefix = query.pop("prefix", "onbeat")
        per_shard_calls = query.pop("per_shard_calls", "0") in ("1", "true", "yes")
        shards_text = query.pop("shards", "0")
        try:
            shards = int(shards_text)
        except ValueError:
            raise ValidationError(
                "queue_url", f"shards must be an integer: {shards_text!r}"
            ) from None
        if shards < 0:
            raise ValidationError("queue_url", f"shards must be >= 0, got {shards}")
        try:
            Keys(prefix)
        except ValueError as error:
            raise ValidationError("queue_url", str(error)) from None
        plain = urlunsplit(parts._replace(query=urlencode(query)))
        return cls(plain, clock, prefix=prefix, shards=shards, per_shard_calls=per_shard_calls)

    def _client(self, read_timeout: float | None, name: str) -> aioredis.Redis:
        return aioredis.Redis.from_url(
            self._client_url,
            client_name=name,
            decode_responses=True,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=read_timeout,
            retry=Retry(NoBackoff(), 1),  # one reconnect; callers retry with backoff
        )

    # -- DelayQueue ------------------------------------------------------------------------

    async def enqueue(self, items: Sequence[QueueItem]) -> None:
        self._check_open()
        for item in items:  # validate the whole batch first: all or nothing
            if item.due_at.utcoffset() is None:
                raise ValidationError(
                    "due_at", f"{item.execution_id}: needs a timezone-aware datetime"
                )
            if not isinstance(item.shard, int) or item.shard < 0:
                raise ValidationError("shard", f"{item.execution_id}: must be an int >= 0")
        latest = {item.execution_id: item for item in items}  # last write wins
        if not latest:
            return
        by_shard: dict[int, list[QueueItem]] = {}
        by_bucket: dict[int, list[str | int]] = {}
        lowest: dict[tuple[str, int], int] = {}
        for item in latest.values():
            by_shard.setdefault(item.shard, []).append(item)
            by_bucket.setdefault(Keys.bucket_of(item.execution_id), []).extend(
                (item.execution_id, item.shard)
            )
            head = (str(item.priority), item.shard)
            due = to_us(item.due_at)
            lowest[head] = min(due, lowest.get(head, due))
        lower_args: list[str | int] = [self._keys.index_due_prefix]
        for (tier, shard), due in lowest.items():
            lower_args += [tier, shard, due]
        now = to_us(self._clock.now())
        lower_keys = [self._keys.index_tiers, self._keys.index_shards]
        calls = [_Call(self._scripts["index_lower"], lower_args, lower_keys)]
        where_calls = self._pack_where(by_bucket)
        calls += where_calls
        groups = []
        for shard, shard_items in by_shard.items():
            for chunk in _chunks(shard_items):
                args: list[str | int] = [self._keys.shard(shard).due_prefix, len(chunk)]
                for item in chunk:
                    args += [item.execution_id, to_us(item.due_at), str(item.priority)]
                groups.append(_Group(shard, args))
        shard_calls = self._pack_shards("shard_enqueue", now, groups)
        calls += [call for call, _ in shard_calls]
        with self._reaching():
            replies = await self._pipeline(calls)
            first = 1 + len(where_calls)
            reports = [
                _parse_report(shard, reply)[0]
                for shard, reply in self._unpack(shard_calls, replies[first:])
            ]
            moved: dict[int, list[str]] = {}
            for reply in replies[1:first]:
                for eid, old in zip(reply[::2], reply[1::2], strict=True):
                    moved.setdefault(int(old), []).append(eid)
            reports += await self._remove_from_shards(moved, now)
            earliest = min(lowest.values())
            publish = ["PUBLISH", self._keys.wake_channel, f"{self._instance} {earliest}"]
            await self._pipeline([self._index_update(reports), _Call(None, publish)])
        self._waiters.arrived(earliest)

    async def claim_due(self, limit: int) -> list[str]:
        self._check_open()
        if limit < 0:
            raise ValidationError("limit", f"must be >= 0, got {limit}")
        if limit == 0:
            return []
        now = to_us(self._clock.now())
        claimed: list[str] = []
        reports: list[_Report] = []
        with self._reaching():
            pairs = await self._scripts["index_pick"](
                keys=[self._keys.index_tiers],
                args=[self._keys.index_due_prefix, now, min(limit, ROUND_WIDTH * MAX_ROUNDS)],
            )
            candidates = deque(
                (str(tier), int(shard)) for tier, shard in zip(pairs[::2], pairs[1::2], strict=True)
            )
            for _ in range(MAX_ROUNDS):
                if not candidates or len(claimed) >= limit:
                    break
                claimed_now, more = await self._claim_round(candidates, limit - len(claimed), now)
                for report, ids in claimed_now:
                    reports.append(report)
                    claimed += ids
                candidates.extendleft(reversed(more))
            if reports:
                calls = [self._index_update(reports)]
                by_bucket: dict[int, list[str]] = {}
                for eid in claimed:
                    by_bucket.setdefault(Keys.bucket_of(eid), []).append(eid)
                calls += [
                    _Call(None, ["HDEL", self._keys.where(bucket), *ids])
                    for bucket, ids in by_bucket.items()
                ]
                await self._pipeline(calls)
        return claimed

    async def remove(self, execution_ids: Sequence[str]) -> None:
        self._check_open()
        if not execution_ids:
            return
        now = to_us(self._clock.now())
        with self._reaching():
            shards = await self._look_up_shards(execution_ids, take=True)
            by_shard: dict[int, list[str]] = {}
            for eid, shard in shards.items():
                by_shard.setdefault(shard, []).append(eid)
            reports = await self._remove_from_shards(by_shard, now)
            if reports:
                await self._pipeline([self._index_update(reports)])

    async def missing(self, execution_ids: Sequence[str]) -> list[str]:
        if not execution_ids:
            return []
        held: set[str] = set()
        with self._reaching():
            shards = await self._look_up_shards(execution_ids, take=False)
            by_shard: dict[int, list[str]] = {}
            for eid, shard in shards.items():
                by_shard.setdefault(shard, []).append(eid)
            calls = [
                _Call(None, ["HMGET", self._keys.shard(shard).items, *chunk])
                for shard, ids in by_shard.items()
                for chunk in _chunks(ids, 10 * CHUNK)
            ]
            asked = [chunk for ids in by_shard.values() for chunk in _chunks(ids, 10 * CHUNK)]
            for chunk, tiers in zip(asked, await self._pipeline(calls), strict=True):
                held.update(eid for eid, tier in zip(chunk, tiers, strict=True) if tier is not None)
        return [eid for eid in execution_ids if eid not in held]

    async def next_due_at(self) -> datetime | None:
        with self._reaching():
            head = await self._scripts["index_head"](
                keys=[self._keys.index_tiers], args=[self._keys.index_due_prefix]
            )
        return None if head is None else from_us(head)

    async def size(self) -> int:
        """Asks every registered shard: a diagnostic, not for the hot path."""
        with self._reaching():
            shards = sorted(
                int(shard) for shard in await self._redis.smembers(self._keys.index_shards)
            )
            calls = [_Call(None, ["HLEN", self._keys.shard(shard).items]) for shard in shards]
            return sum(await self._pipeline(calls)) if calls else 0

    async def wait(self, timeout: float) -> None:
        if self._closed:
            return
        start = self._clock.monotonic()
        waiter = self._waiters.add()  # before reading anything: no arrival slips in between
        planning = asyncio.ensure_future(self._plan_wait(start, timeout))
        sleeper: asyncio.Future[None] | None = None
        try:
            await asyncio.wait((planning, waiter.woken), return_when=asyncio.FIRST_COMPLETED)
            if waiter.woken.done():
                return
            deadline, target_us = planning.result()
            waiter.target_us = target_us
            if deadline <= self._clock.monotonic():
                await asyncio.sleep(0)  # due already: still yield, so a caller cannot spin
                return
            sleeper = asyncio.ensure_future(self._sleep_until(deadline))
            await asyncio.wait((sleeper, waiter.woken), return_when=asyncio.FIRST_COMPLETED)
            error = sleeper.exception() if sleeper.done() and not sleeper.cancelled() else None
            if error is not None:  # a broken clock must not pass for a timeout
                raise error
        except QueueUnavailableError:
            if not self._closed:
                raise
        finally:
            self._waiters.discard(waiter)
            for task in (planning, sleeper):
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.gather(
                *(t for t in (planning, sleeper) if t is not None), return_exceptions=True
            )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._waiters.wake_all()
        await self._listener.close()
        with contextlib.suppress(*_UNREACHABLE):
            await self._redis.aclose()

    # -- recovery --------------------------------------------------------------------------

    async def repair(self) -> None:
        """Re-read every registered shard (and 0..shards-1 if the URL gave ``shards``) and
        make the index mirror it: fixes what a writer that died mid-way left behind."""
        self._check_open()
        now = to_us(self._clock.now())
        with self._reaching():
            registered = await self._redis.smembers(self._keys.index_shards)
            shards = sorted({int(s) for s in registered} | set(range(self._repair_shards)))
            for batch in _chunks(shards, 256):
                groups = [_Group(shard, [self._keys.shard(shard).due_prefix]) for shard in batch]
                shard_calls = self._pack_shards("shard_state", now, groups)
                replies = await self._pipeline([call for call, _ in shard_calls])
                reports = [
                    _parse_report(shard, reply, full=True)[0]
                    for shard, reply in self._unpack(shard_calls, replies)
                ]
                await self._pipeline([self._index_update(reports)])

    # -- internals -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("RedisDelayQueue is closed")

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """Turn "cannot reach Redis" into one clear onbeat error naming the URL."""
        try:
            yield
        except _UNREACHABLE as error:
            raise QueueUnavailableError(self.url, str(error) or type(error).__name__) from error

    async def _pipeline(self, calls: Sequence[_Call]) -> list[Any]:
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

    def _index_update(self, reports: Sequence[_Report]) -> _Call:
        args: list[str | int] = [self._keys.index_due_prefix]
        for report in reports:
            args += report.args()
        return _Call(self._scripts["index_update"], args, self._keys.index_keys)

    async def _claim_round(
        self, candidates: deque[tuple[str, int]], wanted: int, now: int
    ) -> tuple[list[tuple[_Report, list[str]]], list[tuple[str, int]]]:
        """Claim from the first candidates of the first candidate's tier, ``wanted`` split
        among them. Returns what each gave, and the candidates that may hold more."""
        tier = candidates[0][0]
        batch: list[tuple[str, int]] = []
        while candidates and candidates[0][0] == tier and len(batch) < min(ROUND_WIDTH, wanted):
            batch.append(candidates.popleft())
        share, extra = divmod(wanted, len(batch))
        allotments = [share + (i < extra) for i in range(len(batch))]
        groups = [
            _Group(shard, [self._keys.shard(shard).due_prefix, tier, allotment])
            for (_, shard), allotment in zip(batch, allotments, strict=True)
        ]
        shard_calls = self._pack_shards("shard_claim", now, groups)
        replies = await self._pipeline([call for call, _ in shard_calls])
        out: list[tuple[_Report, list[str]]] = []
        more: list[tuple[str, int]] = []
        for (shard, reply), allotment in zip(
            self._unpack(shard_calls, replies), allotments, strict=True
        ):
            report, ids = _parse_report(shard, reply)
            out.append((report, [str(eid) for eid in ids]))
            if len(ids) == allotment:
                more.append((tier, shard))
        return out, more

    async def _remove_from_shards(self, by_shard: dict[int, list[str]], now: int) -> list[_Report]:
        groups = [
            _Group(shard, [self._keys.shard(shard).due_prefix, len(chunk), *chunk])
            for shard, ids in by_shard.items()
            for chunk in _chunks(ids)
        ]
        if not groups:
            return []
        shard_calls = self._pack_shards("shard_remove", now, groups)
        replies = await self._pipeline([call for call, _ in shard_calls])
        return [
            _parse_report(shard, reply)[0] for shard, reply in self._unpack(shard_calls, replies)
        ]

    def _pack_shards(
        self, script: str, now: int, groups: Sequence[_Group]
    ) -> list[tuple[_Call, list[int]]]:
        """Script calls for ``groups`` (shard parts, in order): one shard per call with
        ``per_shard_calls`` (a Cluster runs a script in one slot), else as many as fit
        ``CALL_ARGS``. Returns each call with the shards of its groups."""
        packed: list[tuple[_Call, list[int]]] = []
        keys: list[str] = []
        args: list[str | int] = [now]
        shards: list[int] = []
        for group in groups:
            if shards and (self._per_shard_calls or len(args) + len(group.args) > CALL_ARGS):
                packed.append((_Call(self._scripts[script], args, keys), shards))
                keys, args, shards = [], [now], []
            keys += self._keys.shard(group.key).keys
            args += group.args
            shards.append(group.key)
        if shards:
            packed.append((_Call(self._scripts[script], args, keys), shards))
        return packed

    def _pack_where(self, by_bucket: dict[int, list[str | int]]) -> list[_Call]:
        """where_set.lua calls for (id, shard) pairs by bucket, packed like ``_pack_shards``."""
        packed: list[_Call] = []
        keys: list[str] = []
        args: list[str | int] = []
        for bucket, pairs in by_bucket.items():
            if keys and (self._per_shard_calls or len(args) + len(pairs) > CALL_ARGS):
                packed.append(_Call(self._scripts["where_set"], args, keys))
                keys, args = [], []
            keys.append(self._keys.where(bucket))
            args += [len(pairs) // 2, *pairs]
        if keys:
            packed.append(_Call(self._scripts["where_set"], args, keys))
        return packed

    @staticmethod
    def _unpack(
        shard_calls: Sequence[tuple[_Call, list[int]]], replies: Sequence[Any]
    ) -> Iterator[tuple[int, list[Any]]]:
        """(shard, its group's reply) for every group of ``shard_calls``, in order."""
        for (_, shards), reply in zip(shard_calls, replies, strict=True):
            yield from zip(shards, reply, strict=True)

    async def _look_up_shards(self, execution_ids: Sequence[str], take: bool) -> dict[str, int]:
        """id -> shard from the where-buckets, for the ids they know; ``take`` also deletes."""
        by_bucket: dict[int, list[str]] = {}
        for eid in dict.fromkeys(execution_ids):
            by_bucket.setdefault(Keys.bucket_of(eid), []).append(eid)
        asked: list[Sequence[str]] = []
        calls: list[_Call] = []
        for bucket, ids in by_bucket.items():
            for chunk in _chunks(ids, 10 * CHUNK):
                asked.append(chunk)
                calls.append(_Call(None, ["HMGET", self._keys.where(bucket), *chunk]))
                if take:
                    calls.append(_Call(None, ["HDEL", self._keys.where(bucket), *chunk]))
        replies = await self._pipeline(calls)
        step = 2 if take else 1
        found: dict[str, int] = {}
        for chunk, shards in zip(asked, replies[::step], strict=True):
            found.update(
                (eid, int(shard)) for eid, shard in zip(chunk, shards, strict=True) if shard
            )
        return found

    async def _plan_wait(self, start: float, timeout: float) -> tuple[float, float]:
        """Subscribe (first call), repair if it is time, then read the earliest due time.
        Returns the monotonic deadline to sleep until and its wall-clock target (us)."""
        with self._reaching():
            try:
                await self._listener.until_subscribed(CONNECT_TIMEOUT)
            except TimeoutError:
                raise QueueUnavailableError(self.url, "no wake-up subscription") from None
        if self._clock.monotonic() - self._last_repair >= REPAIR_INTERVAL:
            self._last_repair = self._clock.monotonic()
            await self.repair()
        due = await self.next_due_at()
        mono, now = self._clock.monotonic(), self._clock.now()  # read together, after the I/O
        deadline = start + timeout
        if due is not None:
            deadline = min(deadline, mono + (due - now).total_seconds())
        return deadline, to_us(now) + (deadline - mono) * 1e6

    async def _sleep_until(self, deadline: float) -> None:
        """Sleep on the injected clock until its monotonic time reaches ``deadline``; reads the
        clock when it starts, so time that passed before it was scheduled is not slept twice."""
        while (left := deadline - self._clock.monotonic()) > 0:
            await self._clock.sleep(left)
