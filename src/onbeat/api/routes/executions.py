"""``/executions``: one planned run of a job, with its per-attempt history."""

from __future__ import annotations

from fastapi import APIRouter

from onbeat.api.auth import CallerDep
from onbeat.api.deps import OnbeatApp
from onbeat.api.problems import problem_responses
from onbeat.api.schemas import ExecutionOut, execution_out

router = APIRouter(prefix="/executions", tags=["executions"])


@router.get(
    "/{execution_id}",
    response_model=ExecutionOut,
    responses=problem_responses(400, 404, 413, 422),
    summary="Get an execution",
)
def get_execution(execution_id: str, onbeat: OnbeatApp, caller: CallerDep) -> ExecutionOut:
    return execution_out(onbeat.get_execution(execution_id, tenant=caller.tenant))
