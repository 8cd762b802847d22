"""Webhook alerts end to end on the in-process node: a dead letter reaches a real HTTP receiver,
signed, through failures and a sender that dies mid-delivery; nothing is lost or sent unsigned."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import SecretStr

from onbeat.alerts import AlertSender, signature, verify_signature
from onbeat.metrics import Metrics
from onbeat.settings import Settings
from tests.integration.conftest import Node

SECRET = "s3cret"


@dataclass
class Receiver:
    """A webhook receiver that answers ``failures`` 503s before it takes alerts."""

    url: str = ""
    failures: int = 0
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    answered: int = 0


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.answered += 1
            if state.failures > 0:
                state.failures -= 1
                self.send_response(503)
            else:
                state.received.append((dict(self.headers), body))
                self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/onbeat"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def _sender(node: Node, receiver: Receiver, metrics: Metrics, **overrides: Any) -> AlertSender:
    settings = Settings(alert_webhook_url=receiver.url, alert_webhook_secret=SECRET, **overrides)  # type: ignore[arg-type]
    return AlertSender(node.app.store, settings, node.clock, metrics)


async def _dead_letter(node: Node) -> str:
    job = node.app.schedule("fail", max_attempts=1)
    await node.step()
    execution = node.execution(job.id)
    assert execution.status.value == "failed"
    return execution.id


async def test_alert__dead_letter_delivered_signed_after_failures(
    node: Node, receiver: Receiver
) -> None:
    execution_id = await _dead_letter(node)
    receiver.failures = 2
    metrics = Metrics()
    sender = _sender(node, receiver, metrics)
    assert await sender.deliver_due() == 0  # 503: retried later, not now
    assert await sender.deliver_due() == 0 and receiver.answered == 1
    node.clock.advance(5)  # attempt 1's backoff is at most 5 s
    assert await sender.deliver_due() == 0 and receiver.answered == 2
    node.clock.advance(10)
    assert await sender.deliver_due() == 1
    await sender.close()
    [(headers, body)] = receiver.received
    assert verify_signature(SECRET, headers["Onbeat-Signature"], body)
    assert not verify_signature("other", headers["Onbeat-Signature"], body)
    alert = json.loads(body)
    assert alert["kind"] == "dead_letter"
    assert alert["execution_id"] == execution_id
    assert alert["task"] == "fail"
    assert alert["error"].startswith("RuntimeError: boom 1")
    assert headers["Onbeat-Alert-Id"] == str(alert["id"])
    assert metrics.alerts.labels("dead_letter", "retried")._value.get() == 2
    assert metrics.alerts.labels("dead_letter", "delivered")._value.get() == 1
    node.clock.advance(3600)
    assert node.app.store.alert_claim(10, 60) == []  # delivered alerts are forgotten


async def test_alert__a_sender_that_dies_mid_delivery_loses_nothing(
    node: Node, receiver: Receiver
) -> None:
    await _dead_letter(node)
    node.app.store.alert_claim(10, 60)  # a sender claimed it, then died before sending
    sender = _sender(node, receiver, Metrics())
    assert await sender.deliver_due() == 0  # held by the dead sender
    node.clock.advance(60)
    assert await sender.deliver_due() == 1
    await sender.close()
    assert len(receiver.received) == 1


async def test_alert__given_up_after_max_attempts(node: Node, receiver: Receiver) -> None:
    await _dead_letter(node)
    receiver.failures = 100
    metrics = Metrics()
    sender = _sender(node, receiver, metrics, alert_max_attempts=2)
    await sender.deliver_due()
    node.clock.advance(5)
    await sender.deliver_due()
    node.clock.advance(3600)
    await sender.deliver_due()
    await sender.close()
    assert receiver.answered == 2
    assert metrics.alerts.labels("dead_letter", "given_up")._value.get() == 1
    assert node.app.store.alert_claim(10, 60) == []


async def test_alert__skips_are_sent_only_when_asked(node: Node, receiver: Receiver) -> None:
    job = node.app.schedule("record", cron="* * * * *", misfire="skip")
    node.clock.advance(3 * 3600)  # the node was down: its fire times are missed
    await node.step()
    quiet = _sender(node, receiver, Metrics())
    await quiet.deliver_due()  # the default sends dead letters only: skips are dropped
    await quiet.close()
    assert receiver.received == []
    job2 = node.app.schedule("record", cron="* * * * *", misfire="skip")
    node.clock.advance(3 * 3600)
    await node.step()
    loud = _sender(node, receiver, Metrics(), alert_skipped=True)
    await loud.deliver_due()
    await loud.close()
    alerts = [json.loads(body) for _, body in receiver.received]
    assert {a["job_id"] for a in alerts} == {job.id, job2.id}
    assert all(a["kind"] == "skipped" and a["count"] > 0 for a in alerts)


def test_verify_signature__refuses_tampering_and_old_signatures() -> None:
    body = b'{"kind": "dead_letter"}'
    header = signature(SECRET, 1_000_000, body)
    assert verify_signature(SECRET, header, body, now=1_000_100)
    assert not verify_signature(SECRET, header, body + b" ", now=1_000_100)
    assert not verify_signature(SECRET, header, body, now=1_000_000 + 301)
    assert not verify_signature(SECRET, "garbage", body, now=1_000_000)


def test_settings__a_webhook_without_a_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="alert_webhook_secret"):
        Settings(alert_webhook_url="http://example.invalid/hook")
    settings = Settings(alert_webhook_url="http://x/", alert_webhook_secret=SecretStr(SECRET))
    assert SECRET not in repr(settings)
