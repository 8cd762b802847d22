"""An API probe for the service-fault scenarios (S5, S6): a request every ``1 / rate`` seconds
while Redis or PostgreSQL is hit, every answer written down (wall time, status, whether a 503
carried ``Retry-After``). A keyed create is sent again on a 503 or a cut connection with the
same ``Idempotency-Key``, as a careful client would, so the checker can count duplicates."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

RETRY_PAUSE = 0.25
"""Seconds between tries of one keyed create."""
GIVE_UP = 60.0
"""Seconds after which a keyed create still unanswered counts as failed."""
REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    index: int
    wall: float
    """When the answer arrived."""
    status: int | None
    """None: the connection failed or timed out."""
    retry_after: bool
    body: dict[str, Any] | None = None
    error: str | None = None
    """Why there is no status (a timeout, a refused or reset connection)."""
    sent: float = 0.0


Request = Callable[[int], tuple[str, str, dict[str, Any] | None]]
"""Request ``index`` -> (method, path, JSON body)."""


@dataclass
class ApiProbe:
    """Sends ``request(i)`` at ``rate`` per second from ``start`` to ``stop``, in a thread of its
    own. With ``key_prefix``, request ``i`` carries the Idempotency-Key ``key_prefix + i`` and is
    tried again (same key) until a 2xx or a 4xx answer, or ``GIVE_UP``."""

    api: str
    request: Request
    rate: float = 10.0
    key_prefix: str | None = None
    on_ack: Callable[[dict[str, Any]], None] | None = None
    """Called with each 2xx answer's body of a keyed request as it arrives (an ack log)."""
    answers: list[ProbeAnswer] = field(default_factory=list)
    acked: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Keyed requests answered 2xx: index -> the answer's body."""
    failed: list[int] = field(default_factory=list)
    """Keyed requests given up on."""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="api-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Send no new request; wait for the retries under way (once; again: nothing)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        began = time.monotonic()
        pending: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(base_url=self.api, timeout=REQUEST_TIMEOUT) as client:
            index = 0
            while not self._stop.is_set():
                await asyncio.sleep(max(0.0, began + index / self.rate - time.monotonic()))
                task = asyncio.create_task(self._one(client, index))
                pending.add(task)
                task.add_done_callback(pending.discard)
                index += 1
            if pending:
                await asyncio.gather(*pending)

    async def _one(self, client: httpx.AsyncClient, index: int) -> None:
        method, path, body = self.request(index)
        keyed = self.key_prefix is not None
        headers = {"Idempotency-Key": f"{self.key_prefix}{index}"} if keyed else {}
        deadline = time.monotonic() + GIVE_UP
        while True:
            sent = time.time()
            try:
                response = await client.request(method, path, json=body, headers=headers)
                status: int | None = response.status_code
                answer = ProbeAnswer(
                    index,
                    time.time(),
                    status,
                    "retry-after" in response.headers,
                    response.json() if response.is_success else None,
                    sent=sent,
                )
            except httpx.TransportError as error:
                status = None
                why = f"{type(error).__name__}: {error}"
                answer = ProbeAnswer(index, time.time(), None, False, error=why, sent=sent)
            self.answers.append(answer)
            if not keyed:
                return
            if status is not None and status < 500:
                if answer.body is not None:
                    self.acked[index] = answer.body
                    if self.on_ack is not None:
                        self.on_ack(answer.body)
                return
            if time.monotonic() > deadline:
                self.failed.append(index)
                return
            await asyncio.sleep(RETRY_PAUSE)

    def metrics(self, windows: list[tuple[float, float]], prefix: str = "probe_") -> dict[str, Any]:
        """Counts over every answer, and over those that arrived within ``windows`` (the
        faults, from injection to recovery), named ``prefix`` + what they count."""

        def inside(answer: ProbeAnswer) -> bool:
            return any(lo <= answer.wall <= hi for lo, hi in windows)

        faulted = [a for a in self.answers if inside(a)]
        counts = {
            "probe_answers": len(self.answers),
            "probe_answers_in_faults": len(faulted),
            "probe_ok": sum(a.status is not None and a.status < 300 for a in self.answers),
            "probe_503": sum(a.status == 503 for a in self.answers),
            "probe_503_no_retry_after": sum(
                a.status == 503 and not a.retry_after for a in self.answers
            ),
            "probe_5xx_other": sum(
                a.status is not None and a.status >= 500 and a.status != 503 for a in self.answers
            ),
            "probe_4xx": sum(a.status is not None and 400 <= a.status < 500 for a in self.answers),
            "probe_cut": sum(a.status is None for a in self.answers),
        }
        return {prefix + key.removeprefix("probe_"): value for key, value in counts.items()}

    def write(self, path: Path) -> None:
        """Every answer, a JSON line each in the order they arrived: when each try was sent and
        answered, and (a 2xx) the body, whose ``created_at`` tells a request the server took late
        from one the probe sent late."""
        with path.open("w") as out:
            for answer in self.answers:
                out.write(json.dumps(asdict(answer)) + "\n")

    def cuts(self, limit: int = 10) -> list[str]:
        """The first cut requests: when sent, how long until cut, why."""
        return [
            f"{a.sent:.3f} +{a.wall - a.sent:.2f}s {a.error}"
            for a in self.answers
            if a.status is None
        ][:limit]

    def first_ok_after(self, wall: float) -> float | None:
        """When the first 2xx answer at or after ``wall`` arrived."""
        oks = [
            a.wall
            for a in self.answers
            if a.status is not None and a.status < 300 and a.wall >= wall
        ]
        return min(oks, default=None)
