"""Runtime settings: one object, from command-line flags, code, or ``ONBEAT_*`` environment variables.

Precedence, highest first: a flag (``onbeat worker --concurrency 8``), an argument given in code
(``App(concurrency=8)``), the environment (``ONBEAT_CONCURRENCY=8``), the default. Each field says
which commands take it as a flag (``flag_on``): the CLI builds its options from that, and
``docs/settings.md`` is generated from the fields (``scripts/settings-doc``), so neither can drift
from this class.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SHARDS = 1024
"""Logical shards of a new store; a store keeps the count it was made with."""

ENV_PREFIX = "ONBEAT_"
PROCESS_COMMANDS = ("up", "scheduler", "worker", "api")
"""The commands that run a long-lived process (``migrate`` applies the schema and exits)."""
QUEUE_COMMANDS = ("up", "scheduler", "worker", "api")
"""The processes that use the delay queue (the API hands it the runs due at submission)."""
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def _flag(*commands: str) -> dict[str, Any]:
    """Field metadata: the commands that take this setting as a ``--flag`` too."""
    return {"flag_on": list(commands)}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    # --- where things are -----------------------------------------------------------------
    database_url: str = Field(
        default="sqlite:///onbeat.db",
        description="The store, the source of truth: `sqlite:///PATH` (one file; every process "
        "using it must be on one machine) or `postgresql://USER:PASSWORD@HOST/DB`.",
        json_schema_extra=_flag(*PROCESS_COMMANDS, "migrate"),
    )
    queue_url: str = Field(
        default="memory://",
        description="The delay queue. `memory://` lives inside one process: right for `onbeat up`, "
        "but separate scheduler and worker processes need a queue they share.",
        json_schema_extra=_flag(*QUEUE_COMMANDS),
    )
    queue_failover: bool = Field(
        default=True,
        description="With a `redis://` queue and a `postgresql://` store: while Redis is down, "
        "enqueue to and claim from a table in the store's database instead, so runs keep "
        "starting (`false`: wait for Redis; the sweep re-enqueues what it lost).",
        json_schema_extra=_flag(*QUEUE_COMMANDS),
    )
    migrate: bool = Field(
        default=True,
        description="Apply pending schema migrations on start. With `false` (`--no-migrate`) a "
        "process refuses to start while any is pending: run `onbeat migrate` once per deploy.",
        json_schema_extra=_flag(*PROCESS_COMMANDS),
    )
    app: str | None = Field(
        default=None,
        description="`MODULE:ATTR` of the `onbeat.App` holding your tasks (`onbeat up`, "
        "`onbeat worker`); imported from the current directory too.",
        json_schema_extra=_flag("up", "worker"),
    )
    log_level: LogLevel = Field(
        default="INFO",
        description="Least severe log level written to stderr (JSON lines unless it is a terminal).",
        json_schema_extra=_flag(*PROCESS_COMMANDS, "migrate"),
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description="The event loop of `onbeat up`, `scheduler`, `worker` and `api`: uvloop "
        "(libuv; a burst of 10,000 started with 15 % less worker CPU and a 20 % lower p99, "
        "docs/performance.md) or the standard library's. Where uvloop is not installed "
        "(Windows), the standard library's.",
    )

    gc_threshold: int = Field(
        default=50_000,
        ge=0,
        description="Objects allocated (less those freed) between the garbage collector's "
        "passes over new objects in `onbeat up`, `scheduler`, `worker` and `api`; 0: Python's "
        "default (700). At 700 a busy worker spent 4-7 % of its CPU in those passes, and the "
        "bulk create ran 15-25 % slower (docs/performance.md). What the process made while "
        "starting is frozen out of every pass either way.",
    )

    # --- the REST API ----------------------------------------------------------------------
    host: str = Field(
        default="127.0.0.1",
        description="Address the REST API and dashboard listen on.",
        json_schema_extra=_flag("up", "api"),
    )
    port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="Port the REST API and dashboard listen on.",
        json_schema_extra=_flag("up", "api"),
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port a scheduler or worker process serves Prometheus `/metrics` on (at "
        "`host`). `onbeat up` and `onbeat api` serve it with the API on `port`.",
        json_schema_extra=_flag("scheduler", "worker"),
    )
    insecure: bool = Field(
        default=False,
        description="Serve a non-loopback `host` although no API key exists (anyone reaching it "
        "is admin). Without it such a process refuses to start, and refuses requests without a "
        "key even after its last key is revoked.",
        json_schema_extra=_flag("up", "api"),
    )
    task_ttl: float = Field(
        default=86400.0,
        gt=0,
        description="Seconds a task stays valid for new jobs after the last worker that registers "
        "it was seen: a process without your code (`onbeat api`) accepts only tasks some worker "
        "published within this time.",
    )

    # --- workers ---------------------------------------------------------------------------
    concurrency: int = Field(
        default=64,
        ge=1,
        description="Runs one worker process executes at once.",
        json_schema_extra=_flag("up", "worker"),
    )
    pool: Literal["threads", "processes"] = Field(
        default="threads",
        description="Where sync tasks run: daemon threads, or child processes (hard timeouts, "
        "crash isolation). See docs/executors.md.",
        json_schema_extra=_flag("up", "worker"),
    )
    process_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Niceness each task process (`pool` processes) adds to its own: a CPU-bound "
        "task then yields the CPU to its worker's heartbeats, claims and starts (and to anything "
        "else on the machine) when they compete, and has it all when they do not. 0: equal.",
    )
    lease_ttl: float = Field(
        default=60.0, gt=0, description="Seconds a worker's lease on a run lasts."
    )
    heartbeat_interval: float = Field(
        default=10.0, gt=0, description="Seconds between lease renewals."
    )
    claim_batch: int = Field(
        default=256, ge=1, description="Most runs a worker claims per store call."
    )
    claim_prefetch: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Seconds of this worker's recent pace it claims beyond its free slots: "
        "runs that ended N times in the last that long let a claim take up to N more runs "
        "than slots are free (at most `claim_batch`), which wait in the worker, started, "
        "for a slot. A claim costs about the same however few runs it carries, so claims "
        "of short runs then carry more: W1 drained 10,000-11,100 no-op runs/s at "
        "concurrency 64, 164-187 runs a claim, against 8,000-8,900 and 64 without "
        "(docs/performance.md). Off by default until a stale start seen once with it is "
        "explained: a fault run's worker, its loop blocked 4.9 s, started a run whose lease had "
        "lapsed meanwhile (its outcome was fenced). 0.05 is the measured value. Such a run waits about this long at "
        "most while the pace holds, and is released if the worker stops; a worker whose runs "
        "end rarely claims few beyond its slots, and one under a fleet limit (set in its "
        "settings, or holding runs back at its last claim) none. 0: claims take only the "
        "free slots.",
    )
    claim_ahead: float = Field(
        default=20.0,
        ge=0,
        le=60,
        description="Seconds before their due time that an idle worker claims runs, to start "
        "them by its own timer at the instant after one confirming write: a burst then starts "
        "at the pace of that write, not of claims. Only runs nothing can change by then are "
        "taken (no limit, nothing of their job running before them); a cancel, pause or edit "
        "before the instant still wins. 20 let two workers hold all of a 100,000-run cron "
        "boundary before it (the last start 5-7 s after it, against 17-21 s with 5; "
        "docs/performance.md); 0: off. Runs reach the queue `window` ahead, so a value above "
        "`window` works as `window`. A run held ahead reads as queued, its `lease_owner` the "
        "worker holding it; if that worker dies, it starts elsewhere about 2 s after its time.",
    )
    claim_ahead_max: int = Field(
        default=50_000,
        ge=0,
        description="Most runs one worker holds claimed ahead of their due time (about 2.3 KiB "
        "of memory each). A burst larger than the workers hold starts its rest at the pace of "
        "claims: 50,000 let two workers start 100,000 runs due at one instant within 2-3 s, "
        "against 11 s with 10,000 (docs/performance.md).",
    )
    shutdown_grace: float = Field(
        default=10.0, ge=0, description="Seconds in-flight runs get to finish."
    )
    loop_stall_warning: float = Field(
        default=1.0,
        gt=0,
        description="Seconds the event loop may go unanswered before the watchdog logs what holds it.",
    )
    task_publish_interval: float = Field(
        default=60.0,
        gt=0,
        description="Seconds between a worker's publications of its tasks to the store (it also "
        "publishes them on start); keep it well below `task_ttl`.",
    )

    # --- fleet limits (enforced at claim, in the store, across every worker) ---------------
    max_in_flight: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000_000,
        description="Most runs running at once across the whole fleet; none by default. Give "
        "every worker the same value: each claim enforces the value of the worker making it.",
    )
    tenant_max_in_flight: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000_000,
        description="Most runs of one tenant running at once across the fleet, for every tenant "
        "without its own (`PUT /api/v1/tenants/{tenant}/limits`); none by default.",
    )
    tenant_max_starts_per_second: float | None = Field(
        default=None,
        ge=1e-6,
        le=1e6,
        description="Most runs of one tenant started per second across the fleet, evenly spaced "
        "(a run beyond it gets the next free slot and starts then), for every tenant without its "
        "own; none by default.",
    )

    # --- schedulers ------------------------------------------------------------------------
    shards: int = Field(
        default=DEFAULT_SHARDS,
        ge=1,
        le=65536,
        description="Logical shard count, fixed when the store is created (later values are "
        "ignored). Schedulers lease shards, so many shards cost only lease rows; 1,024 spreads "
        "load within ~10 % across Redis Cluster nodes or database groups, 16 by 1.5-2x.",
    )
    shard_lease_ttl: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a scheduler's lease on a shard lasts: a dead scheduler's shards are "
        "taken over within this plus `shard_renew_interval`.",
    )
    shard_renew_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between a scheduler's lease renewals (and its look for free shards).",
    )
    poll_interval: float = Field(
        default=0.2,
        gt=0,
        description="Seconds between reads for newly due work: how soon new work is noticed.",
    )
    window: float = Field(
        default=30.0,
        ge=0,
        description="Seconds ahead of due time that runs are handed to the delay queue (a cron "
        "job's next run is planned then). 30 let the dispatch of 100,000 every-minute cron "
        "jobs end before their boundary's runs start, not during them (docs/performance.md).",
    )
    dispatch_batch: int = Field(
        default=5000,
        ge=1,
        description="Most runs one dispatch transaction hands to the delay queue.",
    )
    misfire_grace: float = Field(
        default=60.0,
        ge=0,
        description="A fire time later than this when first dispatched counts as missed.",
    )
    sweep_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between sweeps for queued runs the delay queue lost.",
    )
    sweep_overdue: float = Field(
        default=15.0, ge=0, description="A queued run this overdue and not started is re-enqueued."
    )
    sweep_batch: int = Field(
        default=5000,
        ge=1,
        description="Most queued runs one sweep pass reads; the next pass goes on from there.",
    )
    reap_interval: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between looks for runs whose worker's lease expired (they run again).",
    )
    reconcile_interval: float = Field(
        default=60.0,
        gt=0,
        description="Seconds between checks that every cron job has its next run.",
    )
    execution_retention_days: int = Field(
        default=30,
        ge=0,
        description="Days of final runs (and their attempts) kept, counted by fire time in whole "
        "UTC days; older ones are dropped (PostgreSQL: their day partitions), except a day that "
        "holds an unresolved dead letter, a run not final yet or one that ended within the "
        "retention. 0 keeps them forever.",
    )
    partitions_ahead_days: int = Field(
        default=7,
        ge=0,
        description="PostgreSQL: days of history partitions created ahead of today (a run whose "
        "day has none lands in the DEFAULT partition and moves when the day's is created).",
    )
    history_maintain_interval: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds between a scheduler's passes of history upkeep (partitions ahead, "
        "retention); it also runs one on start.",
    )

    # --- alerts ----------------------------------------------------------------------------
    alert_webhook_url: str | None = Field(
        default=None,
        description="URL that schedulers POST alerts to (a dead letter; with `alert_skipped`, "
        "skipped fire times too), as signed JSON: see docs/alerts.md. None: no alerts are sent.",
    )
    alert_webhook_secret: SecretStr | None = Field(
        default=None,
        description="Shared secret that signs every alert (HMAC-SHA256, header "
        "`Onbeat-Signature`); required with `alert_webhook_url`. Never logged.",
    )
    alert_skipped: bool = Field(
        default=False,
        description="Also alert on skipped fire times (misfire and overlap skips, one alert per "
        "job and batch).",
    )
    alert_max_attempts: int = Field(
        default=15,
        ge=1,
        description="Deliveries tried per alert, with exponential backoff (5 s doubling, at most "
        "1 h apart; about 9 h in all) before it is given up and logged as an error.",
    )
    alert_interval: float = Field(
        default=1.0, gt=0, description="Seconds between a scheduler's looks for alerts to send."
    )

    @model_validator(mode="after")
    def _alert_secret(self) -> Settings:
        if self.alert_webhook_url is not None and self.alert_webhook_secret is None:
            raise ValueError(
                "alert_webhook_url is set but alert_webhook_secret is not: alerts are signed"
            )
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    def with_overrides(self, overrides: dict[str, Any]) -> Settings:
        """These settings with ``overrides`` applied and validated (the environment is not read
        again). Raises pydantic's ValidationError naming the field of a bad value."""
        return type(self).model_validate(self.model_dump() | overrides)


def flag_commands(name: str) -> list[str]:
    """The commands that take the setting ``name`` as a flag."""
    extra = Settings.model_fields[name].json_schema_extra
    commands = extra.get("flag_on", []) if isinstance(extra, dict) else []
    return [str(c) for c in commands] if isinstance(commands, list) else []


def flag_name(name: str) -> str:
    """The flag of a setting, as ``--help`` shows it."""
    field = Settings.model_fields[name]
    dashed = name.replace("_", "-")
    if field.annotation is bool:
        return f"--no-{dashed}" if field.default else f"--{dashed}"
    return f"--{dashed}"


def env_name(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, fit for logs and error messages."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        return " \\| ".join(f"`{choice}`" for choice in typing.get_args(annotation))
    if isinstance(annotation, types.UnionType):
        return " or ".join(
            _type_name(a) for a in typing.get_args(annotation) if a is not type(None)
        )
    # every float setting is a duration in seconds
    names = {bool: "boolean", int: "integer", float: "seconds", str: "text", SecretStr: "secret"}
    return names.get(annotation, str(annotation))


def settings_table() -> str:
    """The Markdown table of every setting (``docs/settings.md`` embeds it)."""
    rows = [
        "| environment variable | flag (commands) | type | default | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, field in Settings.model_fields.items():
        commands = flag_commands(name)
        flag = f"`{flag_name(name)}` ({', '.join(commands)})" if commands else "-"
        kind = _type_name(field.annotation)
        default = "none" if field.default is None else f"`{_default_text(field.default)}`"
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{env_name(name)}` | {flag} | {kind} | {default} | {description} |")
    return "\n".join(rows) + "\n"


def _default_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


TABLE_START = "<!-- settings table: generated by scripts/settings-doc from onbeat.settings -->"
TABLE_END = "<!-- end of settings table -->"


def settings_doc(text: str) -> str:
    """``text`` (docs/settings.md) with the table between its markers replaced by the current one."""
    head, start, rest = text.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"the settings document lacks the markers {TABLE_START!r} / {TABLE_END!r}")
    return f"{head}{TABLE_START}\n{settings_table()}{TABLE_END}{tail}"
