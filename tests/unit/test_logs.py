"""The log formats: JSON lines off a terminal, text with key=value fields on one."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Iterator

import pytest

from onbeat.logs import configure_logging
from onbeat.scheduler import shard_ranges
from onbeat.store.postgres_session import QuietPoolReconnects


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


RUN = {"execution_id": "ex_1", "job_id": "job_1", "attempt": 2, "fencing_token": 7}


def test_not_a_terminal__one_json_object_a_line_with_the_run_fields() -> None:
    out = io.StringIO()
    configure_logging("info", out)
    log = logging.getLogger("onbeat.test")
    log.info("execution %s", "succeeded", extra=RUN)
    log.debug("not at this level")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())  # tracebacks too
    assert first == {
        "time": first["time"],
        "level": "info",
        "logger": "onbeat.test",
        "message": "execution succeeded",
        **RUN,
    }
    assert first["time"].endswith("+00:00")
    assert second["level"] == "error"
    assert "ValueError: boom" in second["traceback"]
    assert "execution_id" not in second


def test_terminal__readable_text_with_the_fields_appended() -> None:
    out = Terminal()
    configure_logging("DEBUG", out)
    logging.getLogger("onbeat.test").warning("lease lost", extra=RUN)
    [line] = out.getvalue().splitlines()
    assert " WARNING onbeat.test: lease lost  execution_id=ex_1 job_id=job_1 attempt=2" in line
    assert line.endswith("fencing_token=7")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_pool_reconnect_warnings__first_then_one_per_interval_with_the_count() -> None:
    now = [0.0]
    quiet = QuietPoolReconnects(lambda: now[0])

    def failure(pool: str) -> logging.LogRecord:
        record = logging.LogRecord(
            "psycopg.pool", logging.WARNING, __file__, 1,
            QuietPoolReconnects.CONNECT_FAILED, (pool, "connection refused"), None,
        )  # fmt: skip
        return record

    passed = []
    for second in range(65):  # one attempt a second per pool, for 65 s
        now[0] = float(second)
        passed += [r.getMessage() for r in (failure("onbeat"), failure("queue")) if quiet.filter(r)]
    assert passed == [
        "error connecting in 'onbeat': connection refused",
        "error connecting in 'queue': connection refused",
        "error connecting in 'onbeat': connection refused (29 more failures of this pool held back)",
        "error connecting in 'queue': connection refused (29 more failures of this pool held back)",
        "error connecting in 'onbeat': connection refused (29 more failures of this pool held back)",
        "error connecting in 'queue': connection refused (29 more failures of this pool held back)",
    ]
    gave_up = logging.LogRecord(
        "psycopg.pool",
        logging.WARNING,
        __file__,
        1,
        QuietPoolReconnects.GAVE_UP,
        ("onbeat", 2.0),
        None,
    )
    assert not quiet.filter(gave_up)
    other = logging.LogRecord(
        "psycopg.pool", logging.WARNING, __file__, 1, "discarding %s", ("x",), None
    )
    assert quiet.filter(other)


@pytest.mark.parametrize(
    ("shards", "shown"),
    [
        (range(1024), "0-1023"),
        ({700, 3, 702, 703, 4, 5}, "3-5, 700, 702-703"),
        ({9}, "9"),
        (set(), ""),
    ],
)
def test_shard_ranges__a_scheduler_log_line_shows_runs_of_shards_as_ranges(
    shards: Iterable[int], shown: str
) -> None:
    assert shard_ranges(shards) == shown
