"""``App``: the public Python API. Register tasks, submit and manage jobs, read executions.

Every method is usable from a plain script; the ``a``-prefixed twins are for async code (they run
the store call in a thread so the event loop keeps serving).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypedDict, TypeVar, Unpack

from onbeat import validation
from onbeat.audit import AuditReport, audit
from onbeat.auth import DEFAULT_TENANT, ApiKey, KeyCache, Role, hash_key, is_loopback, new_key
from onbeat.clock import Clock, StoreClock
from onbeat.errors import NotFoundError, OnbeatError, TaskNotFoundError, ValidationError
from onbeat.group_commit import GroupCommit
from onbeat.limits import (
    MAX_IN_FLIGHT,
    MAX_STARTS_PER_SECOND,
    MIN_STARTS_PER_SECOND,
    TenantLimits,
    Usage,
)
from onbeat.model import (
    DeadLetter,
    Execution,
    ExecutionStatus,
    Job,
    MisfirePolicy,
    OverlapPolicy,
)
from onbeat.queue import open_node_queue
from onbeat.queue.feeder import QueueFeeder
from onbeat.schedule import ScheduleKind
from onbeat.settings import Settings
from onbeat.store import Store, open_store
from onbeat.store.base import CreatedJob, JobChanges, NewJob, PublishedTask
from onbeat.task import Pool, Task, TaskFunction, TaskRegistry

F = TypeVar("F", bound=TaskFunction)
log = logging.getLogger("onbeat.app")

PUBLISHED_TASK_TTL = 5.0
"""Seconds this process keeps a task it read from the store's catalog (read for every job
submitted through a process without the task's code): how late it sees a worker publish the task
with other defaults, or its ``task_ttl`` run out."""


class JobOptions(TypedDict, total=False):
    """The policies of a job submitted with :meth:`App.schedule`; every one is optional."""

    max_attempts: int | None
    """Attempts before the run is dead-lettered; default: the task's."""
    timeout: float | None
    """Seconds a run may take; default: the task's."""
    backoff: float | None
    """Seconds: the retry backoff base; default: the task's."""
    backoff_max: float | None
    """Seconds: the retry backoff cap; default: the task's."""
    overlap: OverlapPolicy | str
    """When a run is due while the previous one still runs; default ``skip``."""
    misfire: MisfirePolicy | str
    """What to do with fire times missed while no scheduler ran; default ``run_once``."""
    catchup_window: float
    """Seconds back ``run_all`` replays missed fire times; default 3600."""
    priority: int
    """-100 to 100, higher first; default 0."""
    jitter: float
    """Seconds: each run starts up to this much after its fire time; default 0."""
    tenant: str
    """Whose job it is; default ``"default"``."""
    idempotency_key: str | None
    """A retried submission with the same key (within a day, same tenant) returns the first job."""


class App:
    def __init__(
        self,
        database_url: str | None = None,
        queue_url: str | None = None,
        *,
        clock: Clock | None = None,
        **settings: Any,
    ) -> None:
        if database_url is not None:
            settings["database_url"] = database_url
        if queue_url is not None:
            settings["queue_url"] = queue_url
        self.settings = Settings(**settings)
        self._injected_clock = clock
        self.clock: Clock = clock or StoreClock(lambda: self.store.now())
        """The injected clock, else the store's: a host whose wall clock is wrong must not fire
        a run early or expire a lease (docs/architecture.md, "Clock")."""
        self.registry = TaskRegistry()
        self._store: Store | None = None
        self._store_lock = threading.Lock()
        self._submit_listeners: list[Callable[[], None]] = []
        self._published: dict[str, tuple[PublishedTask, float]] = {}
        """Tasks read from the store's catalog, and until when (monotonic) they are kept."""
        self._keys = KeyCache(lambda: self.clock.monotonic())
        self._creates: GroupCommit[NewJob, CreatedJob] = GroupCommit(self._create)
        """Single submissions from threads at once share a transaction (``onbeat.group_commit``)."""
        self._feeder: QueueFeeder | None = None
        self._feeder_lock = threading.Lock()
        self._own_feeder_tried = False

    @property
    def store(self) -> Store:
        """The store, opened at first use. Under a lock: threads that reach it first at once
        (a server's thread pool) must share one store, not each open one and leak the others."""
        store = self._store
        if store is None:
            with self._store_lock:
                store = self._store
                if store is None:
                    store = self._store = open_store(
                        self.settings.database_url,
                        self._injected_clock,
                        self.settings.shards,
                        migrate=self.settings.migrate,
                    )
        return store

    def close(self) -> None:
        with self._feeder_lock:
            feeder, self._feeder = self._feeder, None
        if feeder is not None:
            feeder.close()
        if self._store is not None:
            self._store.close()
            self._store = None

    def feed_queue(self, feeder: QueueFeeder | None) -> QueueFeeder | None:
        """Hand the runs due at submission to ``feeder`` (a node's queue, while the node runs),
        or, with None, to a queue of this App's own again; returns the feeder it replaces."""
        with self._feeder_lock:
            replaced, self._feeder = self._feeder, feeder
            self._own_feeder_tried = feeder is not None
        return replaced

    def _queue_feeder(self) -> QueueFeeder | None:
        """Where the runs due at submission go: the node's queue while a node runs this App,
        else a queue of this App's own, opened at the first submission, if ``queue_url`` names
        one that other processes share. None (``memory://`` outside a node): the dispatch of a
        scheduler queues them, as every other run."""
        with self._feeder_lock:
            if self._feeder is None and not self._own_feeder_tried:
                self._own_feeder_tried = True
                url = self.settings.queue_url
                if not url.startswith("memory://"):
                    self._feeder = QueueFeeder.on_own_thread(
                        lambda: open_node_queue(
                            url,
                            self.settings.database_url,
                            self.clock,
                            failover=self.settings.queue_failover,
                        )
                    )
            return self._feeder

    def _create(self, news: Sequence[NewJob]) -> list[CreatedJob]:
        """Store the jobs; hand the runs created queued (due within the dispatch window) to the
        delay queue, a dispatch fewer for each (``onbeat.queue.feeder``); wake the schedulers
        for the others (once for a group commit's batch, not once a job)."""
        feeder = self._queue_feeder()
        window = None if feeder is None else self.settings.window
        created = self.store.job_create_many(news, queue_within=window)
        if feeder is not None:
            feeder.enqueue([c.queued for c in created if c.queued is not None])
        to_dispatch = [c for c in created if c.queued is None]  # the others are in the queue
        dues = [c.job.next_fire_at for c in to_dispatch if c.job.next_fire_at is not None]
        try:  # committed: nothing may fail the create now (a group commit would write it again)
            if to_dispatch:
                self._submitted(min(dues) if len(dues) == len(to_dispatch) else None)
        except Exception:
            log.exception("could not wake the schedulers: their next poll dispatches the jobs")
        return created

    def on_submit(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after work is submitted through this App (the embedded node's
        scheduler uses it to dispatch at once instead of at its next poll)."""
        self._submit_listeners.append(listener)

    def _submitted(self, due: datetime | None = None) -> None:
        """Work was submitted; ``due``: when its earliest run is due (None: not known). The
        listeners are told; so are the schedulers of other processes on PostgreSQL (a NOTIFY,
        see ``onbeat.dispatch_wake``) when that is within the dispatch window."""
        for listener in self._submit_listeners:
            listener()
        if not self.store.wakes_other_processes:
            return
        if due is not None and due > self.store.now() + timedelta(seconds=self.settings.window):
            return  # a scheduler's poll reaches it well before it is due
        try:
            self.store.notify_dispatch()
        except OnbeatError as exc:  # the poll dispatches it all the same, a little later
            log.warning("could not wake the schedulers of other processes: %s", exc)

    # --- tasks ------------------------------------------------------------------------------
    def task(
        self,
        *,
        name: str | None = None,
        max_attempts: int = 3,
        timeout: float | None = None,
        backoff: float = 1.0,
        backoff_max: float = 300.0,
        pool: Pool | None = None,
    ) -> Callable[[F], F]:
        """Register ``fn(ctx, **params)`` (sync or async) as a task; jobs name it by ``name``
        (default: the function's dotted path). ``backoff``/``backoff_max`` are seconds.
        ``pool`` runs a sync task in the worker's threads or child processes whatever the
        worker's ``--pool`` (docs/executors.md)."""

        def register(f: F) -> F:
            self.registry.register(
                f,
                name=name,
                max_attempts=max_attempts,
                timeout=timeout,
                backoff=backoff,
                backoff_max=backoff_max,
                pool=pool,
            )
            return f

        return register

    def get_task(self, name: str) -> Task | PublishedTask:
        """The task a job may name: registered in this process, or else published to the store
        by a worker within ``settings.task_ttl`` (so a process without the tasks' code, such as
        ``onbeat api``, knows them too); TaskNotFoundError otherwise."""
        task = self.get_tasks([name]).get(name)
        if task is None:
            raise TaskNotFoundError(name)
        return task

    def get_tasks(self, names: Iterable[str]) -> dict[str, Task | PublishedTask]:
        """The tasks among ``names`` that :meth:`get_task` knows, by name, with at most one store
        read for those this process does not register: a batch of jobs costs one read, not one
        per job, and a task found is kept ``PUBLISHED_TASK_TTL`` seconds (the API without the
        user's code needs one for every job submitted)."""
        wanted = set(names)
        found = {name: task for name in wanted if (task := self.known_task(name)) is not None}
        unread = sorted(wanted - found.keys())
        if unread:
            now = self.clock.monotonic()
            for task in self.store.task_catalog(self.settings.task_ttl, unread):
                found[task.name] = task
                self._published[task.name] = (task, now + PUBLISHED_TASK_TTL)
        return found

    def known_task(self, name: str) -> Task | PublishedTask | None:
        """The task if this process knows it without reading the store: registered here, or
        read from the catalog within ``PUBLISHED_TASK_TTL`` seconds."""
        if name in self.registry:
            return self.registry.get(name)
        kept = self._published.get(name)
        return kept[0] if kept is not None and self.clock.monotonic() < kept[1] else None

    def list_tasks(self) -> list[Task | PublishedTask]:
        """Every task :meth:`get_task` knows, by name (this process's own first, where a worker
        published the same name)."""
        tasks: dict[str, Task | PublishedTask] = {
            t.name: t for t in self.store.task_catalog(self.settings.task_ttl)
        }
        tasks.update((t.name, t) for t in self.registry)
        return [tasks[name] for name in sorted(tasks)]

    # --- jobs -------------------------------------------------------------------------------
    def schedule(
        self,
        task_name: str,
        params: dict[str, Any] | None = None,
        cron: str | None = None,
        at: datetime | str | None = None,
        timezone: str = "UTC",
        **options: Unpack[JobOptions],
    ) -> Job:
        """Submit a job: ``cron`` for a recurring one, ``at`` for one run at a time, neither to run
        now. Everything is validated first (``onbeat.validation``, as the REST API does); on a
        ValidationError nothing is stored. See :class:`JobOptions` for the policies and the
        idempotency key."""
        return self.submit(task_name, params, cron, at, timezone, **options).job

    def prepare(
        self,
        task_name: str,
        params: dict[str, Any] | None = None,
        cron: str | None = None,
        at: datetime | str | None = None,
        timezone: str = "UTC",
        *,
        tasks: Mapping[str, Task | PublishedTask] | None = None,
        **options: Unpack[JobOptions],
    ) -> NewJob:
        """Validate a submission as :meth:`schedule` does and return the job to store, without
        storing it (for :meth:`submit_many`); ValidationError names what is wrong. ``tasks``:
        tasks already looked up (:meth:`get_tasks`); others are looked up here."""
        unknown = options.keys() - JobOptions.__optional_keys__
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        key = validation.idempotency_key(options.get("idempotency_key"))
        name = validation.task_name(task_name)
        known = None if tasks is None else tasks.get(name)
        task = known if known is not None else self.get_task(name)
        max_attempts, timeout = options.get("max_attempts"), options.get("timeout")
        backoff, backoff_max = options.get("backoff"), options.get("backoff_max")
        return NewJob(
            task=task.name,
            params=validation.params(params),
            schedule=validation.schedule(cron, at, timezone),
            retry=validation.retry(
                task.retry.max_attempts if max_attempts is None else max_attempts,
                task.retry.backoff_base if backoff is None else backoff,
                task.retry.backoff_cap if backoff_max is None else backoff_max,
            ),
            timeout=validation.timeout(task.timeout if timeout is None else timeout),
            overlap=validation.overlap(options.get("overlap", OverlapPolicy.SKIP)),
            misfire=validation.misfire(options.get("misfire", MisfirePolicy.RUN_ONCE)),
            catchup_window=validation.catchup_window(options.get("catchup_window", 3600.0)),
            priority=validation.priority(options.get("priority", 0)),
            jitter=validation.jitter(options.get("jitter", 0.0)),
            tenant=validation.tenant(options.get("tenant", DEFAULT_TENANT)),
            idempotency_key=key,
        )

    def submit(
        self,
        task_name: str,
        params: dict[str, Any] | None = None,
        cron: str | None = None,
        at: datetime | str | None = None,
        timezone: str = "UTC",
        **options: Unpack[JobOptions],
    ) -> CreatedJob:
        """:meth:`schedule`, also saying whether the job was created by this call or is the one
        an earlier submission under the same ``idempotency_key`` created (``replayed``)."""
        return self.submit_many([self.prepare(task_name, params, cron, at, timezone, **options)])[0]

    def submit_many(self, jobs: Sequence[NewJob]) -> list[CreatedJob]:
        """Store jobs made by :meth:`prepare` in one transaction: all of them or, if the store
        refuses one (an idempotency key reused for another submission), none. One job submitted
        while other threads submit theirs may share their transaction, with what it would have
        had alone (``onbeat.group_commit``)."""
        return [self._creates.submit(jobs[0])] if len(jobs) == 1 else self._create(jobs)

    async def submit_async(self, job: NewJob) -> CreatedJob:
        """:meth:`submit_many` of one job, for a caller on an event loop: it shares a
        transaction with the jobs submitted at the same time, and holds no thread meanwhile."""
        return await self._creates.submit_async(job)

    def get_job(self, job_id: str, *, tenant: str | None = None) -> Job:
        """The job; with ``tenant``, only if it belongs to that tenant (else NotFoundError, as if
        it did not exist: another tenant's ids are not even confirmed)."""
        job = self.store.job_get(job_id) if validation.storable(job_id) else None
        if job is None or (tenant is not None and job.tenant != tenant):
            raise NotFoundError(f"job {job_id!r} not found")
        return job

    def list_jobs(self, **filters: Any) -> list[Job]:
        validation.filters(
            **{k: v for k, v in filters.items() if k in ("tenant", "task", "after_id")}
        )
        return self.store.job_list(**filters)

    def list_executions(
        self,
        job: str | Job,
        limit: int = 100,
        *,
        status: ExecutionStatus | None = None,
        before_id: str | None = None,
        tenant: str | None = None,
    ) -> list[Execution]:
        """The job's executions, newest fire time first, each with its attempts; ``before_id``
        continues a page after that execution. ``job``: its id, or the job already read."""
        if isinstance(job, Job):
            if tenant is not None and job.tenant != tenant:
                raise NotFoundError(f"job {job.id!r} not found")
            job_id = job.id
        else:
            job_id = self.get_job(job, tenant=tenant).id
        validation.filters(before_id=before_id)
        return self.store.execution_list(job_id, status=status, before_id=before_id, limit=limit)

    def get_execution(self, execution_id: str, *, tenant: str | None = None) -> Execution:
        execution = (
            self.store.execution_get(execution_id) if validation.storable(execution_id) else None
        )
        if execution is None:
            raise NotFoundError(f"execution {execution_id!r} not found")
        if tenant is not None:
            try:
                self.get_job(execution.job_id, tenant=tenant)
            except NotFoundError:
                raise NotFoundError(f"execution {execution_id!r} not found") from None
        return execution

    def pause(self, job_id: str, *, tenant: str | None = None) -> Job:
        self.get_job(job_id, tenant=tenant)
        return self.store.job_pause(job_id)

    def resume(self, job_id: str, *, tenant: str | None = None) -> Job:
        self.get_job(job_id, tenant=tenant)
        job = self.store.job_resume(job_id, self.settings.misfire_grace)
        self._submitted()
        return job

    def cancel(self, job_id: str, *, tenant: str | None = None) -> Job:
        self.get_job(job_id, tenant=tenant)
        return self.store.job_cancel(job_id)

    def run_now(self, job_id: str, *, tenant: str | None = None) -> Execution:
        self.get_job(job_id, tenant=tenant)
        execution = self.store.job_run_now(job_id)
        self._submitted(execution.due_at)
        return execution

    def audit(
        self,
        job_id: str,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        tenant: str | None = None,
    ) -> AuditReport:
        """Every fire time the schedule produced in [since, until] (default: since the job was
        created, or since its fire time if it is a once job submitted for a time already past;
        until now), accounting for edits and pauses, against the execution records."""
        job = self.get_job(job_id, tenant=tenant)
        now = self.store.now()
        if since is None:
            since = job.created_at
            at = job.schedule.at
            if job.schedule.kind is ScheduleKind.ONCE and at is not None and at < since:
                since = at  # its one fire time (it runs late) is what the audit is about
        until = min(until or now, now)
        for name, value in (("since", since), ("until", until)):
            if value.tzinfo is None:
                raise ValidationError(name, "must have a UTC offset")
        if since > until:
            raise ValidationError("since", "must not be after until")
        records = self.store.execution_fire_records(job_id, since, until)
        return audit(self.store.job_events(job_id), records, since, until)

    def update_job(
        self,
        job_id: str,
        *,
        tenant: str | None = None,
        params: dict[str, Any] | None = None,
        cron: str | None = None,
        at: datetime | str | None = None,
        timezone: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        backoff: float | None = None,
        backoff_max: float | None = None,
        overlap: OverlapPolicy | str | None = None,
        misfire: MisfirePolicy | str | None = None,
        priority: int | None = None,
        jitter: float | None = None,
    ) -> Job:
        """Edit a job. A new schedule (``cron``/``at``, or a new ``timezone``) replaces the
        not-yet-started scheduled runs; other edits apply to every run that starts afterwards."""
        job = self.get_job(job_id, tenant=tenant)
        schedule = None
        if cron is not None or at is not None or timezone is not None:
            if cron is None and at is None and job.schedule.kind is not ScheduleKind.CRON:
                validation.timezone_name(timezone)  # the value first, as the REST API checks it
                raise ValidationError(
                    "timezone",
                    "only a cron schedule has a time zone to change; give a cron expression or "
                    "an at time",
                )
            if cron is None and at is None:
                cron = job.schedule.expression
            schedule = validation.schedule(
                cron, at, job.schedule.timezone if timezone is None else timezone
            )
        retry = None
        if max_attempts is not None or backoff is not None or backoff_max is not None:
            retry = validation.retry(
                job.retry.max_attempts if max_attempts is None else max_attempts,
                job.retry.backoff_base if backoff is None else backoff,
                job.retry.backoff_cap if backoff_max is None else backoff_max,
            )
        changes = JobChanges(
            params=None if params is None else validation.params(params),
            schedule=schedule,
            retry=retry,
            timeout=validation.timeout(timeout),
            overlap=None if overlap is None else validation.overlap(overlap),
            misfire=None if misfire is None else validation.misfire(misfire),
            priority=None if priority is None else validation.priority(priority),
            jitter=None if jitter is None else validation.jitter(jitter),
        )
        updated = self.store.job_update(job_id, changes)
        self._submitted()
        return updated

    def list_dead_letters(
        self, limit: int = 100, *, tenant: str | None = None, after_id: str | None = None
    ) -> list[DeadLetter]:
        validation.filters(tenant=tenant, after_id=after_id)
        return self.store.dead_letter_list(tenant=tenant, after_id=after_id, limit=limit)

    def replay_dead_letter(self, execution_id: str, *, tenant: str | None = None) -> Execution:
        self._dead_letter_visible(execution_id, tenant)
        execution = self.store.dead_letter_replay(execution_id)
        self._submitted(execution.due_at)
        return execution

    def drop_dead_letter(self, execution_id: str, *, tenant: str | None = None) -> None:
        self._dead_letter_visible(execution_id, tenant)
        self.store.dead_letter_drop(execution_id)

    def _dead_letter_visible(self, execution_id: str, tenant: str | None) -> None:
        try:
            self.get_execution(execution_id, tenant=tenant)
        except NotFoundError:
            raise NotFoundError(f"dead letter {execution_id!r} not found") from None

    # --- fleet limits -----------------------------------------------------------------------
    def get_tenant_limits(self, tenant: str) -> tuple[TenantLimits, Usage]:
        """``tenant``'s own limits (None fields: the fleet's defaults, ``Settings``) and its
        counters (runs in flight now)."""
        name = validation.tenant(tenant)
        return self.store.tenant_limits_get(name), self.store.tenant_usage(name)

    def set_tenant_limits(
        self,
        tenant: str,
        *,
        max_in_flight: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> TenantLimits:
        """Set ``tenant``'s own limits, enforced by every worker's next claim (None: the fleet's
        default); ValidationError if a value is out of range."""
        name = validation.tenant(tenant)
        if max_in_flight is not None and (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or not 0 <= max_in_flight <= MAX_IN_FLIGHT
        ):
            raise ValidationError(
                "max_in_flight", f"must be an integer from 0 to {MAX_IN_FLIGHT}, or null"
            )
        if max_starts_per_second is not None and (
            isinstance(max_starts_per_second, bool)
            or not isinstance(max_starts_per_second, int | float)
            or not MIN_STARTS_PER_SECOND <= max_starts_per_second <= MAX_STARTS_PER_SECOND
        ):
            raise ValidationError(
                "max_starts_per_second",
                f"must be a number from {MIN_STARTS_PER_SECOND:g} to {MAX_STARTS_PER_SECOND:g}, "
                "or null",
            )
        limits = TenantLimits(
            max_in_flight,
            None if max_starts_per_second is None else float(max_starts_per_second),
        )
        self.store.tenant_limits_set(name, limits)
        return limits

    # --- API keys ---------------------------------------------------------------------------
    def create_api_key(self, tenant: str, role: Role | str) -> tuple[ApiKey, str]:
        """A new key for ``tenant`` with ``role``; returns it and the secret key, shown only once."""
        key_id, key = new_key()
        api_key = ApiKey(
            key_id,
            validation.tenant(tenant),
            validation.choice(Role, role, "role"),
            self.store.now(),
        )
        self.store.api_key_insert(api_key, hash_key(key))
        self._keys.forget()
        return api_key, key

    def authenticate(self, key: str) -> ApiKey | None:
        """The active key ``key`` is, or None. A key found is kept for ``KEYS_EXIST_TTL``: revoked
        through this App it stops working at once; through another process, within that."""
        digest = hash_key(key)
        known = self._keys.key(digest)
        if known is not None:
            return known
        generation = self._keys.generation
        found = self.store.api_key_by_hash(digest)
        if found is not None:
            self._keys.remember_key(digest, found, generation)
        return found

    def authenticate_known(self, key: str) -> ApiKey | None:
        """:meth:`authenticate` if it needs no store read (the key was found within
        ``KEYS_EXIST_TTL``), else None: for an event loop, which must not block on the store."""
        return self._keys.key(hash_key(key))

    def list_api_keys(self) -> list[ApiKey]:
        return self.store.api_key_list()

    def revoke_api_key(self, key_id: str) -> None:
        if not validation.storable(key_id) or not self.store.api_key_revoke(key_id):
            raise NotFoundError(f"active API key {key_id!r} not found")
        self._keys.forget()

    def auth_enabled(self) -> bool:
        """True if every request needs an API key: once an active key exists, and always on a
        node whose API serves a non-loopback address without ``insecure``, so that revoking its
        last key does not open it to anyone."""
        known = self.auth_enabled_known()
        return self.api_keys_exist() if known is None else known

    def auth_enabled_known(self) -> bool | None:
        """:meth:`auth_enabled` if it needs no store read, else None (see
        :meth:`authenticate_known`)."""
        if not is_loopback(self.settings.host) and not self.settings.insecure:
            return True
        return self._keys.exist()

    def api_keys_exist(self) -> bool:
        """Whether an active API key exists, read from the store at most once per
        ``KEYS_EXIST_TTL`` seconds: every request without a key asks. A key created or revoked
        through this App counts at once; through another process (``onbeat keys``), within
        ``KEYS_EXIST_TTL``."""
        known = self._keys.exist()
        if known is not None:
            return known
        generation = self._keys.generation
        exist = self.store.api_key_count_active() > 0
        self._keys.remember_exist(exist, generation)
        return exist

    # --- async twins ------------------------------------------------------------------------
    async def aschedule(self, task_name: str, **kwargs: Any) -> Job:
        return await asyncio.to_thread(lambda: self.schedule(task_name, **kwargs))

    async def aget_job(self, job_id: str) -> Job:
        return await asyncio.to_thread(self.get_job, job_id)

    async def alist_executions(self, job_id: str, limit: int = 100) -> list[Execution]:
        return await asyncio.to_thread(self.list_executions, job_id, limit)

    async def arun_now(self, job_id: str) -> Execution:
        return await asyncio.to_thread(self.run_now, job_id)
