"""The idempotency fingerprint: keys stored earlier must keep matching their submissions."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from hypothesis import given
from hypothesis import strategies as st

from onbeat.model import RetryPolicy
from onbeat.schedule import Schedule, ScheduleKind
from onbeat.store.records import NewJob
from onbeat.store.rows import fingerprint
from onbeat.testing import strategies


def _as_stored_before(new: NewJob) -> str:
    """How fingerprints were computed until 2026-12-02 (``dataclasses.asdict``)."""
    described = dataclasses.asdict(dataclasses.replace(new, idempotency_key=None))
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


submissions = strategies.submissions(idempotency_key=st.none() | st.text(min_size=1, max_size=8))


@given(submissions)
def test_fingerprint__is_the_one_keys_were_stored_with(new: NewJob) -> None:
    assert fingerprint(new) == _as_stored_before(new)


def test_fingerprint__tells_submissions_apart_and_ignores_the_key() -> None:
    new = NewJob("report.send", {"to": "a"}, Schedule(ScheduleKind.NOW), idempotency_key="k1")
    assert fingerprint(new) == fingerprint(dataclasses.replace(new, idempotency_key="k2"))
    assert fingerprint(new) != fingerprint(dataclasses.replace(new, params={"to": "b"}))
    assert fingerprint(new) != fingerprint(dataclasses.replace(new, retry=RetryPolicy(4)))
