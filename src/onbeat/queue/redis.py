"""The Redis delay queue: sorted sets per (shard, priority tier), claimed atomically by Lua.

``open_queue("redis://host:port/db?prefix=onbeat")`` returns one (Redis >= 6.2). The key
layout is in ``redis_layout``, the scripts in ``lua/`` and the calls that run them in
``redis_scripts``; the choices, and why:

- **Shards are the truth.** Each shard (``QueueItem.shard``, fixed by the store per job) has its
  own keys under the hash tag ``{<shard>}``, and every change to a shard is one script, so a
  claim is atomic and hands an id to one caller only, across processes; a Redis Cluster can
  spread the shards over its nodes. Times are the queue's injected ``Clock``, passed as ARGV
  (never Redis ``TIME``), so the contract suite drives it with a ``FakeClock``.
- **An index says which shards to visit.** A Cluster cannot run one script across slots, and
  asking 1,024 shards on every claim costs 39 ms even pipelined (measured: one pipeline of 1,024
  ZRANGEs; a single command is ~0.3 ms). So ``{index}`` keys mirror each (tier, shard)'s
  earliest due time; a claim asks the index for the due (tier, shard) pairs, highest tier then
  earliest head first, then claims from up to ``ROUND_WIDTH`` shards per round (one script
  call on a single Redis; one call per shard, pipelined, with ``?per_shard_calls=1``, the
  pattern a Cluster needs): about 3 round trips per claim whatever the shard count, and within
  a tier the claim's limit is split among the shards. Every shard script returns a versioned
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
- **Wake-ups across processes** use pub/sub on ``<prefix>:wake`` (see ``redis_wake``): a
  waiter sleeps on the injected clock until the earliest due time or its timeout, and wakes
  early only for an arrival due by then. No polling.
- **size()** asks every registered shard (``HLEN`` each): the product does not call it, so
  the hot path keeps no counter for it.
- **No visibility timeout.** A claimed id leaves the queue. If its worker dies before
  ``Store.execution_claim`` flips it to running, the store still says ``queued`` and the
  scheduler's sweep re-enqueues it after ``sweep_overdue`` (the same path that refills a Redis
  that lost its data); once running, its lease and the reaper cover it. A visibility timeout
  would cost an acknowledgement write per claim to duplicate those two mechanisms.
- **Redis losing its data** while up (``FLUSHALL``, a restart without persistence or with an
  ``appendfsync everysec`` AOF, which may lose its last second) is what ``lost_data()`` tells: it
  compares Redis's ``run_id`` and a generation key (a random token, set anew by whoever finds it
  missing) with what it saw last. The failover queue asks every second, so the scheduler can
  refill Redis at once instead of after ``sweep_overdue``.
- **Redis down** raises ``QueueUnavailableError`` naming the URL (password hidden), so callers
  retry with backoff or fall back; the queue reconnects by itself once Redis is back. What
  Redis lost meanwhile, the sweep refills.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from onbeat.clock import Clock
from onbeat.errors import QueueUnavailableError, ValidationError
from onbeat.queue.base import QueueItem, horizon
from onbeat.queue.redis_layout import Keys, from_us, to_us
from onbeat.queue.redis_scripts import CHUNK, Call, Group, Scripts, ShardReport, chunks
from onbeat.queue.redis_wake import Waiters, WakeListener

__all__ = ["RedisDelayQueue"]

log = logging.getLogger(__name__)

ROUND_WIDTH = 32
"""Shards claimed from in one pipelined round; a claim's limit is split among them."""
MAX_ROUNDS = 8
"""Rounds per claim (one tier per round): a claim spanning more returns what it has."""
PICK_SPARE = 2
"""A claim of ``limit`` ids asks the index for up to ``PICK_SPARE * limit`` due shards (at most
``ROUND_WIDTH * MAX_ROUNDS``): workers claiming at once read the same earliest shards, and a
claim whose first shards another just emptied goes on to the next ones instead of returning
short (two fleet workers at 1,000 runs/s took ~31 ids per claim with exactly ``limit`` shards,
against ~50 with the table queue: more claims, each a store transaction)."""
REPAIR_INTERVAL = 10.0
"""Seconds between ``repair()`` passes started by ``wait()``."""
CONNECT_TIMEOUT = 2.0
"""Seconds to connect, or to get the wake-up subscription confirmed, before giving up."""
COMMAND_TIMEOUT = 10.0
"""Seconds a command may take before the connection counts as broken."""

_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)


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
        parts = urlsplit(url)
        self.url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        """The URL without credentials, as errors show it."""
        self._client_url = url
        self._instance = uuid.uuid4().hex[:12]
        self._redis = self._client(COMMAND_TIMEOUT, f"onbeat-queue-{self._instance}")
        self._scripts = Scripts(self._redis, self._keys, per_shard_calls)
        self._waiters = Waiters()
        self._listener = WakeListener(
            # Blocks on pub/sub reads as long as it takes; named, so operators can find it.
            # no reconnect inside the client: a lost subscription must end the listen, which
            # wakes the waiters and subscribes again (redis-py's asyncio Retry would resubscribe
            # silently, and wake no one for what was published meanwhile)
            lambda: self._client(None, f"onbeat-wake-{self._instance}", reconnects=0),
            self._keys.wake_channel,
            self._instance,
            self._waiters,
            clock,
        )
        self._last_repair = -math.inf
        self._generation: tuple[str | None, str | None] | None = None
        """(generation token, Redis run_id) as ``lost_data`` last saw them."""
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

    def _client(self, read_timeout: float | None, name: str, reconnects: int = 1) -> aioredis.Redis:
        return aioredis.Redis.from_url(
            self._client_url,
            client_name=name,
            decode_responses=True,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=read_timeout,
            socket_keepalive=True,  # a peer that vanished is noticed by the OS, eventually
            retry=Retry(NoBackoff(), reconnects),  # callers retry with backoff
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
        calls = [Call(self._scripts["index_lower"], lower_args, lower_keys)]
        where_calls = self._scripts.where_calls(by_bucket)
        calls += where_calls
        groups = []
        for shard, shard_items in by_shard.items():
            for chunk in chunks(shard_items):
                args: list[str | int] = [self._keys.shard(shard).due_prefix, len(chunk)]
                for item in chunk:
                    args += [item.execution_id, to_us(item.due_at), str(item.priority)]
                groups.append(Group(shard, args))
        shard_calls = self._scripts.shard_calls("shard_enqueue", now, groups)
        calls += [call for call, _ in shard_calls]
        with self._reaching():
            # One round trip: lowering the index first, so a writer that dies mid-way leaves
            # the index early, not late (see index_lower.lua).
            replies = await self._scripts.run(calls)
            first = 1 + len(where_calls)
            reports = [
                ShardReport.parse(shard, reply)[0]
                for shard, reply in self._scripts.group_replies(shard_calls, replies[first:])
            ]
            moved: dict[int, list[str]] = {}
            for reply in replies[1:first]:
                for eid, old in zip(reply[::2], reply[1::2], strict=True):
                    moved.setdefault(int(old), []).append(eid)
            reports += await self._scripts.remove_from_shards(moved, now)
            earliest = min(lowest.values())
            publish = ["PUBLISH", self._keys.wake_channel, f"{self._instance} {earliest}"]
            await self._scripts.run([self._scripts.index_update(reports), Call(None, publish)])
        self._waiters.arrived(earliest)

    async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
        self._check_open()
        if limit < 0:
            raise ValidationError("limit", f"must be >= 0, got {limit}")
        early = horizon(ahead)
        if limit == 0:
            return []
        current = self._clock.now()
        # ``until`` bounds what is due; ``now`` stays the clock's: it floors the shards'
        # versions, which must not run ahead of it (see shard_common.lua).
        now, until = to_us(current), to_us(current + early)
        claimed: list[str] = []
        reports: list[ShardReport] = []
        try:
            pairs = await self._scripts["index_pick"](
                keys=[self._keys.index_tiers],
                args=[
                    self._keys.index_due_prefix,
                    until,
                    min(PICK_SPARE * limit, ROUND_WIDTH * MAX_ROUNDS),
                ],
            )
            candidates = deque(
                (str(tier), int(shard)) for tier, shard in zip(pairs[::2], pairs[1::2], strict=True)
            )
            for _ in range(MAX_ROUNDS):
                if not candidates or len(claimed) >= limit:
                    break
                claimed_now, more = await self._claim_round(
                    candidates, limit - len(claimed), now, until
                )
                for report, ids in claimed_now:
                    reports.append(report)
                    claimed += ids
                candidates.extendleft(reversed(more))
            if reports:
                calls = [self._scripts.index_update(reports)]
                by_bucket: dict[int, list[str]] = {}
                for eid in claimed:
                    by_bucket.setdefault(Keys.bucket_of(eid), []).append(eid)
                calls += [
                    Call(None, ["HDEL", self._keys.where(bucket), *ids])
                    for bucket, ids in by_bucket.items()
                ]
                await self._scripts.run(calls)
        except _UNREACHABLE as error:
            if not claimed:
                raise self._unavailable(str(error) or type(error).__name__) from error
            # These ids have left Redis: hand them out rather than leave them to the sweep. The
            # index is left early (the next claim corrects it), the look-up entries stale
            # (``missing`` checks the shards, so it still reports these ids).
            log.warning("delay queue: claimed %d ids, then lost Redis (%s)", len(claimed), error)
        return claimed

    async def remove(self, execution_ids: Sequence[str]) -> None:
        self._check_open()
        if not execution_ids:
            return
        now = to_us(self._clock.now())
        with self._reaching():
            shards = await self._scripts.look_up_shards(execution_ids, take=True)
            by_shard: dict[int, list[str]] = {}
            for eid, shard in shards.items():
                by_shard.setdefault(shard, []).append(eid)
            reports = await self._scripts.remove_from_shards(by_shard, now)
            if reports:
                await self._scripts.run([self._scripts.index_update(reports)])

    async def missing(self, execution_ids: Sequence[str]) -> list[str]:
        if not execution_ids:
            return []
        held: set[str] = set()
        with self._reaching():
            shards = await self._scripts.look_up_shards(execution_ids, take=False)
            by_shard: dict[int, list[str]] = {}
            for eid, shard in shards.items():
                by_shard.setdefault(shard, []).append(eid)
            calls = [
                Call(None, ["HMGET", self._keys.shard(shard).items, *chunk])
                for shard, ids in by_shard.items()
                for chunk in chunks(ids, 10 * CHUNK)
            ]
            asked = [chunk for ids in by_shard.values() for chunk in chunks(ids, 10 * CHUNK)]
            for chunk, tiers in zip(asked, await self._scripts.run(calls), strict=True):
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
            calls = [Call(None, ["HLEN", self._keys.shard(shard).items]) for shard in shards]
            return sum(await self._scripts.run(calls)) if calls else 0

    async def wait(self, timeout: float, ahead: float = 0.0) -> None:
        early = horizon(ahead)
        if self._closed:
            return
        start = self._clock.monotonic()
        waiter = self._waiters.add()  # before reading anything: no arrival slips in between
        planning = asyncio.ensure_future(self._plan_wait(start, timeout, early))
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

    async def lost_data(self) -> bool:
        """Whether Redis may have lost items since the previous call: it restarted (its
        ``run_id`` changed) or was emptied (the generation key is gone, or another process
        found it gone and set a new token). The first call only takes note."""
        self._check_open()
        with self._reaching():
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.set(self._keys.generation, uuid.uuid4().hex, nx=True)
                pipe.get(self._keys.generation)
                pipe.info("server")
                _, token, server = await pipe.execute(raise_on_error=False)
        # INFO may be renamed away on a managed Redis: the generation key still tells a flush.
        run_id = server.get("run_id") if isinstance(server, dict) else None
        seen = (token if isinstance(token, str) else None, run_id)
        before, self._generation = self._generation, seen
        return before is not None and before != seen

    async def repair(self) -> None:
        """Re-read every registered shard (and 0..shards-1 if the URL gave ``shards``) and
        make the index mirror it: fixes what a writer that died mid-way left behind."""
        self._check_open()
        now = to_us(self._clock.now())
        with self._reaching():
            registered = await self._redis.smembers(self._keys.index_shards)
            shards = sorted({int(s) for s in registered} | set(range(self._repair_shards)))
            for batch in chunks(shards, 256):
                groups = [Group(shard, [self._keys.shard(shard).due_prefix]) for shard in batch]
                states = await self._scripts.run_shards("shard_state", now, groups, full=True)
                await self._scripts.run([self._scripts.index_update([r for r, _ in states])])

    # -- internals -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("RedisDelayQueue is closed")

    def _unavailable(self, reason: str) -> QueueUnavailableError:
        return QueueUnavailableError(f"cannot reach the delay queue at {self.url}: {reason}")

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """Turn "cannot reach Redis" into one clear onbeat error naming the URL."""
        try:
            yield
        except _UNREACHABLE as error:
            raise self._unavailable(str(error) or type(error).__name__) from error

    async def _claim_round(
        self, candidates: deque[tuple[str, int]], wanted: int, now: int, until: int
    ) -> tuple[list[tuple[ShardReport, list[str]]], list[tuple[str, int]]]:
        """Claim ids due by ``until`` from the first candidates of the first candidate's tier,
        ``wanted`` split among them. Returns what each gave, and the candidates that may hold
        more."""
        tier = candidates[0][0]
        batch: list[tuple[str, int]] = []
        while candidates and candidates[0][0] == tier and len(batch) < min(ROUND_WIDTH, wanted):
            batch.append(candidates.popleft())
        share, extra = divmod(wanted, len(batch))
        allotments = [share + (i < extra) for i in range(len(batch))]
        groups = [
            Group(shard, [self._keys.shard(shard).due_prefix, tier, allotment, until])
            for (_, shard), allotment in zip(batch, allotments, strict=True)
        ]
        out: list[tuple[ShardReport, list[str]]] = []
        more: list[tuple[str, int]] = []
        replies = await self._scripts.run_shards("shard_claim", now, groups)
        for (report, ids), allotment in zip(replies, allotments, strict=True):
            out.append((report, [str(eid) for eid in ids]))
            if len(ids) == allotment:
                more.append((tier, report.shard))
        return out, more

    async def _plan_wait(
        self, start: float, timeout: float, early: timedelta
    ) -> tuple[float, float]:
        """Subscribe (first call), repair if it is time, then read the earliest due time.
        Returns the monotonic deadline to sleep until (``early`` before that due time, at the
        latest) and the latest due time (us) of an arrival that must wake the waiter sooner:
        the deadline on the wall clock, plus ``early``."""
        with self._reaching():
            try:
                await self._listener.until_subscribed(CONNECT_TIMEOUT)
            except TimeoutError:
                raise self._unavailable("no wake-up subscription") from None
        if self._clock.monotonic() - self._last_repair >= REPAIR_INTERVAL:
            self._last_repair = self._clock.monotonic()
            await self.repair()
        due = await self.next_due_at()
        mono, now = self._clock.monotonic(), self._clock.now()  # read together, after the I/O
        deadline = start + timeout
        if due is not None:
            deadline = min(deadline, mono + (due - early - now).total_seconds())
        return deadline, to_us(now + early) + (deadline - mono) * 1e6

    async def _sleep_until(self, deadline: float) -> None:
        """Sleep on the injected clock until its monotonic time reaches ``deadline``; reads the
        clock when it starts, so time that passed before it was scheduled is not slept twice."""
        while (left := deadline - self._clock.monotonic()) > 0:
            await self._clock.sleep(left)
