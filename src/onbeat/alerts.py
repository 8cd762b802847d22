"""Webhook alerts: dead letters and skipped fire times, delivered from the store's outbox.

The transaction that records a dead letter or a skip writes its alert in the same commit
(``Store.alert_claim`` says where), so an alert exists exactly when its event does and no restart
loses one. Schedulers deliver them here, off every worker's path: claim a batch (held, so a
sender that dies leaves them for another after the hold), POST each as JSON signed with
HMAC-SHA256, forget the delivered ones, and retry the others with capped exponential backoff and
full jitter until ``alert_max_attempts``. A receiver may see an alert twice (at least once, like
everything in onbeat): ``Onbeat-Alert-Id`` names it, so it can ignore repeats.

Signature (Stripe's scheme): ``Onbeat-Signature: t=<unix seconds>,v1=<hex>`` where ``<hex>`` is
HMAC-SHA256 of ``"<t>." + body`` under the shared secret; :func:`verify_signature` checks one.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from datetime import timedelta

import httpx

from onbeat.clock import Clock
from onbeat.metrics import Metrics
from onbeat.model import RetryPolicy
from onbeat.retry import backoff_delay
from onbeat.settings import Settings
from onbeat.store.base import PendingAlert, Store

log = logging.getLogger("onbeat.alerts")

ALERT_BATCH = 50
"""Most alerts one pass claims and sends (concurrently)."""
DELIVERY_TIMEOUT = 10.0
"""Seconds one POST may take before it counts as failed."""
HOLD = 60.0
"""Seconds claimed alerts are held: more than a batch's delivery can take."""
BACKOFF = RetryPolicy(max_attempts=1, backoff_base=5.0, backoff_cap=3600.0)
SIGNATURE_TOLERANCE = 300.0
"""Seconds a signature's timestamp may be off for :func:`verify_signature` (replay window)."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Onbeat-Signature`` header of ``body`` sent at ``timestamp`` (unix seconds)."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify_signature(secret: str, header: str, body: bytes, *, now: float | None = None) -> bool:
    """Whether ``header`` (``Onbeat-Signature``) signs ``body`` under ``secret`` and was made
    within ``SIGNATURE_TOLERANCE`` seconds of ``now``: for receivers of onbeat's webhooks."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > SIGNATURE_TOLERANCE:
        return False
    expected = signature(secret, timestamp, body)
    return hmac.compare_digest(expected, header.strip())


class AlertSender:
    """Delivers the outbox's alerts to ``settings.alert_webhook_url`` (one pass per call)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        clock: Clock,
        metrics: Metrics,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if settings.alert_webhook_url is None or settings.alert_webhook_secret is None:
            raise ValueError("an AlertSender needs alert_webhook_url and alert_webhook_secret")
        self.store = store
        self.url = settings.alert_webhook_url
        self._secret = settings.alert_webhook_secret.get_secret_value()
        self.max_attempts = settings.alert_max_attempts
        self.send_skipped = settings.alert_skipped
        self.clock = clock
        self.metrics = metrics
        self._http = httpx.AsyncClient(timeout=DELIVERY_TIMEOUT, transport=transport)

    async def close(self) -> None:
        await self._http.aclose()

    async def deliver_due(self) -> int:
        """Send every alert due now; returns how many were delivered."""
        delivered = 0
        while True:
            alerts = await asyncio.to_thread(self.store.alert_claim, ALERT_BATCH, HOLD)
            if not alerts:
                return delivered
            errors = await asyncio.gather(*(self._send(a) for a in alerts))
            done: list[int] = []
            retries = {}
            for alert, error in zip(alerts, errors, strict=True):
                outcome = self._outcome(alert, error)
                self.metrics.alerts.labels(alert.kind, outcome).inc()
                if outcome == "retried":
                    delay = backoff_delay(BACKOFF, alert.attempts)
                    retries[alert.id] = (self.clock.now() + timedelta(seconds=delay), error or "")
                else:
                    done.append(alert.id)
                    delivered += outcome == "delivered"
            await asyncio.to_thread(self.store.alert_done, done)
            await asyncio.to_thread(self.store.alert_retry, retries)
            if len(alerts) < ALERT_BATCH:
                return delivered

    def _outcome(self, alert: PendingAlert, error: str | None) -> str:
        if error is None:
            return "delivered" if self._wanted(alert) else "ignored"
        if alert.attempts >= self.max_attempts:
            log.error(
                "alert %d (%s of job %s) given up after %d attempts: %s",
                alert.id,
                alert.kind,
                alert.job_id,
                alert.attempts,
                error,
            )
            return "given_up"
        log.warning(
            "alert %d (%s of job %s) not delivered (attempt %d of %d): %s",
            alert.id,
            alert.kind,
            alert.job_id,
            alert.attempts,
            self.max_attempts,
            error,
        )
        return "retried"

    def _wanted(self, alert: PendingAlert) -> bool:
        return alert.kind == "dead_letter" or self.send_skipped

    async def _send(self, alert: PendingAlert) -> str | None:
        """POST one alert; None if the webhook took it (2xx), else why not."""
        if not self._wanted(alert):
            return None  # written by the store whatever the settings; this sender drops it
        body = json.dumps(
            {
                "id": alert.id,
                "kind": alert.kind,
                "job_id": alert.job_id,
                "tenant": alert.tenant,
                "task": alert.task,
                "created_at": alert.created_at.isoformat(),
                **alert.payload,
            }
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "Onbeat-Alert-Id": str(alert.id),
            "Onbeat-Signature": signature(self._secret, int(time.time()), body),
        }
        try:
            response = await self._http.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.is_success:
            return None
        return f"HTTP {response.status_code}"
