"""The PostgreSQL store's rows (``postgres_session.Row``): read by column name or position, like
``sqlite3.Row``, with the index of each shape of result made once and kept (``row_factory``)."""

from __future__ import annotations

import psycopg
import pytest

from onbeat.store.postgres_session import row_factory
from onbeat.testing.postgres import TEST_SERVER

pytestmark = pytest.mark.external_service


def test_rows__each_shape_of_result_reads_its_own_columns_by_name_and_position() -> None:
    with psycopg.connect(TEST_SERVER, row_factory=row_factory) as conn:
        for _ in range(2):  # the second time from the kept indexes
            wide = conn.execute("SELECT 1 AS id, 'a' AS job_id, 3 AS attempt").fetchone()
            narrow = conn.execute("SELECT 'b' AS job_id, 7 AS id").fetchone()
            unnamed = conn.execute("SELECT 5, 'ü' AS zoné").fetchone()
            assert wide is not None and narrow is not None and unnamed is not None
            assert (wide["id"], wide["job_id"], wide["attempt"]) == (1, "a", 3)
            assert (wide[0], wide[2]) == (1, 3)
            assert (narrow["id"], narrow["job_id"], narrow[0]) == (7, "b", "b")
            assert (unnamed["?column?"], unnamed["zoné"]) == (5, "ü")
            assert list(wide) == [1, "a", 3] and wide.keys() == ["id", "job_id", "attempt"]
            with pytest.raises(KeyError):
                narrow["attempt"]
