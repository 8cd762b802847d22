"""SQLStore: the Store's transactions, shared by every SQL backend, one module per role.

Each method is one transaction that reads rows, hands them to the pure decisions of ``plan``
(dispatch, claim, misfire, overlap) and writes the outcome in batched statements. A backend
supplies its connection handling, its clock and its named statements (``sql/<backend>/queries.sql``,
the same names with the same parameters in every backend); the policy lives here once.

Isolation: a backend must make each method's read-decide-write atomic against every other
process. SQLite does it by serialising writers (``BEGIN IMMEDIATE``); PostgreSQL, under READ
COMMITTED, by row locks its statements take (``FOR UPDATE`` in the reads a decision rests on,
locks on the jobs of a claim in ``_lock_jobs``, the shard rows in ``_fenced_shards``), and by
conditions re-checked in every UPDATE (status, fencing token, lease expiry). ``store/base.py``
says what each method guarantees.
"""

from onbeat.store.sql_store.alerts import AlertTransactions
from onbeat.store.sql_store.base import Connection, Cursor, Row, SQLBase, Witness, retried
from onbeat.store.sql_store.dashboard import DashboardReads
from onbeat.store.sql_store.history import HistoryTransactions
from onbeat.store.sql_store.jobs import JobTransactions
from onbeat.store.sql_store.registry import RegistryTransactions
from onbeat.store.sql_store.runs import RunTransactions
from onbeat.store.sql_store.scheduling import SchedulingTransactions

__all__ = ["Connection", "Cursor", "Row", "SQLBase", "SQLStore", "Witness", "retried"]


class SQLStore(
    JobTransactions,
    SchedulingTransactions,
    RunTransactions,
    DashboardReads,
    RegistryTransactions,
    AlertTransactions,
    HistoryTransactions,
):
    """The transactions of ``Store`` over a backend's named statements (``_q``)."""

    def ping(self) -> None:
        with self._read() as c:
            c.execute("SELECT 1")
