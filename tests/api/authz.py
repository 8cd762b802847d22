"""The auth matrix's parts, shared by tests/api/test_auth.py (in process) and the fault suite's
S9 (against a live ``onbeat api``): every route of the API with a request that works for a
writer, two tenants' rows, and Authorization headers that must all be refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onbeat import App
from onbeat.auth import Role
from onbeat.clock import Clock
from tests.api.conftest import make_dead_letter

UNKNOWN = "0123456789abcdef0123456789abcdef"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    """Relative to /api/v1, with the spec's path parameters."""
    body: dict[str, Any] | None = None
    query: dict[str, str] = field(default_factory=dict)
    admin: bool = False
    """Needs an admin key (a writer's is a 403)."""

    @property
    def writes(self) -> bool:
        return self.method != "GET"

    @property
    def takes_id(self) -> bool:
        return "{" in self.path

    def url(self, ids: dict[str, str]) -> str:
        return self.path.format(**ids)

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


ROUTES = [
    Route("GET", "/jobs"),
    Route("POST", "/jobs", body={"task": "echo"}),
    Route("POST", "/jobs/batch", body={"jobs": [{"task": "echo"}]}),
    Route("GET", "/jobs/{job_id}"),
    Route("PATCH", "/jobs/{job_id}", body={"priority": 3}),
    Route("DELETE", "/jobs/{job_id}"),
    Route("POST", "/jobs/{job_id}/pause"),
    Route("POST", "/jobs/{job_id}/resume"),
    Route("POST", "/jobs/{job_id}/run"),
    Route("GET", "/jobs/{job_id}/executions"),
    Route("GET", "/jobs/{job_id}/audit"),
    Route("GET", "/executions/{execution_id}"),
    Route("GET", "/dead-letters"),
    Route("POST", "/dead-letters/{dead_letter_id}/replay"),
    Route("DELETE", "/dead-letters/{dead_letter_id}"),
    Route("GET", "/tasks"),
    Route("GET", "/schedules/preview", query={"expression": "@daily"}),
    Route("GET", "/tenants/{tenant}/limits"),
    Route("PUT", "/tenants/{tenant}/limits", body={"max_in_flight": 5}, admin=True),
]
PUBLIC = ["/api/v1/healthz", "/api/v1/readyz", "/openapi.json", "/docs"]
WITH_ID = [r for r in ROUTES if r.takes_id]
NUL_IDS = {
    "job_id": "ab%00c",
    "execution_id": "ab%00c",
    "dead_letter_id": "ab%00c",
    "tenant": "a%00",
}
"""Path parameters carrying NUL (percent-encoded): they name nothing, on any store."""


@dataclass
class Tenant:
    ids: dict[str, str]
    job_ids: list[str]
    keys: dict[Role, str] = field(default_factory=dict)


@dataclass
class World:
    acme: Tenant
    rival: Tenant


async def tenant_rows(app: App, clock: Clock, tenant: str) -> Tenant:
    job = app.schedule("echo", cron="0 * * * *", tenant=tenant)
    execution = app.run_now(job.id)
    dead = await make_dead_letter(app, clock, tenant)
    ids = {"job_id": job.id, "execution_id": execution.id, "dead_letter_id": dead, "tenant": tenant}
    return Tenant(ids=ids, job_ids=sorted([job.id, app.get_execution(dead).job_id]))


def bad_authorizations(app: App) -> list[str]:
    key = app.create_api_key("acme", Role.ADMIN)
    app.revoke_api_key(key[0].id)
    return [
        "Bearer onb_000000000000_" + "x" * 43,  # well-formed, unknown
        f"Bearer {key[1]}",  # revoked
        f"Bearer {key[1]}x",
        "Basic YWNtZTpzZWNyZXQ=",
        "Bearer",
        "Bearer ",
        "Bearer a b",
        "Bearer " + "k" * 600,
        "onb_000000000000_xxxx",
    ]
