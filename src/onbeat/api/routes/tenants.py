"""``/tenants/{tenant}/limits``: a tenant's own fleet limits (runs in flight, starts per second),
enforced by every worker at claim; None leaves the fleet's default (``Settings``) in force.

A caller sees only its own tenant (another is a 404, as for every resource); changing limits needs
an admin key. A tenant's admin may so change its own tenant's limits: onbeat has no role above a
tenant's admin yet (an operator without keys, on a loopback-only node, is admin of every tenant).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from onbeat.api.auth import Caller, CallerDep
from onbeat.api.deps import OnbeatApp
from onbeat.api.problems import FieldError, ProblemError, problem_responses
from onbeat.auth import Role
from onbeat.errors import NotFoundError
from onbeat.limits import (
    MAX_IN_FLIGHT,
    MAX_STARTS_PER_SECOND,
    MIN_STARTS_PER_SECOND,
    TenantLimits,
    Usage,
)
from onbeat.validation import MAX_TENANT

router = APIRouter(prefix="/tenants", tags=["tenants"])
TenantName = Annotated[str, Path(min_length=1, max_length=MAX_TENANT)]


class TenantLimitsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_in_flight: int | None = Field(
        default=None,
        ge=0,
        le=MAX_IN_FLIGHT,
        strict=True,
        description="Most runs of the tenant running at once; null: default.",
    )
    max_starts_per_second: float | None = Field(
        default=None,
        ge=MIN_STARTS_PER_SECOND,
        le=MAX_STARTS_PER_SECOND,
        strict=True,
        description="Most runs of the tenant started per second, evenly spaced; null: default.",
    )


class TenantLimitsOut(BaseModel):
    tenant: str
    max_in_flight: int | None = Field(description="The tenant's own; null: the fleet's default.")
    max_starts_per_second: float | None = Field(
        description="The tenant's own; null: the fleet's default."
    )
    running: int = Field(description="Runs of the tenant running now, across the fleet.")


def _out(tenant: str, limits: TenantLimits, usage: Usage) -> TenantLimitsOut:
    return TenantLimitsOut(
        tenant=tenant,
        max_in_flight=limits.max_in_flight,
        max_starts_per_second=limits.max_starts_per_second,
        running=usage.running,
    )


def _visible(caller: Caller, tenant: str) -> None:
    """Another tenant's limits are answered exactly like an unknown tenant's: 404."""
    if caller.tenant is not None and caller.tenant != tenant:
        raise NotFoundError(f"tenant {tenant!r} not found")


@router.get(
    "/{tenant}/limits",
    response_model=TenantLimitsOut,
    responses=problem_responses(400, 404, 413, 422),
    summary="Get a tenant's limits",
)
def get_tenant_limits(tenant: TenantName, onbeat: OnbeatApp, caller: CallerDep) -> TenantLimitsOut:
    """The tenant's own limits (null: the fleet's default applies) and its runs in flight."""
    _visible(caller, tenant)
    return _out(tenant, *onbeat.get_tenant_limits(tenant))


@router.put(
    "/{tenant}/limits",
    response_model=TenantLimitsOut,
    responses=problem_responses(400, 404, 413, 422, 503, 504),
    summary="Set a tenant's limits",
)
def put_tenant_limits(
    tenant: TenantName, body: TenantLimitsIn, onbeat: OnbeatApp, caller: CallerDep
) -> TenantLimitsOut:
    """Replace the tenant's own limits (a null or missing field: the fleet's default); every
    worker's next claim obeys them. Needs an admin key."""
    _visible(caller, tenant)
    if not caller.role.allows(Role.ADMIN):
        message = f"is a {caller.role.value} key; changing limits needs an admin key"
        raise ProblemError(
            403,
            "forbidden",
            f"Authorization {message}",
            [FieldError(field="Authorization", message=message)],
        )
    onbeat.set_tenant_limits(
        tenant,
        max_in_flight=body.max_in_flight,
        max_starts_per_second=body.max_starts_per_second,
    )
    return _out(tenant, *onbeat.get_tenant_limits(tenant))
