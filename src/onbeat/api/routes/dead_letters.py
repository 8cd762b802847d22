"""``/dead-letters``: executions that exhausted their attempts, for a human to replay or drop."""

from __future__ import annotations

from fastapi import APIRouter, Response

from onbeat.api.auth import CallerDep
from onbeat.api.cursors import decode_cursor, page_of
from onbeat.api.deps import DEFAULT_LIMIT, Cursor, Limit, OnbeatApp
from onbeat.api.problems import problem_responses
from onbeat.api.schemas import DeadLetterPage, ExecutionOut, dead_letter_out, execution_out

router = APIRouter(prefix="/dead-letters", tags=["dead letters"])
_WRITE = problem_responses(400, 404, 413, 422, 503, 504)


@router.get(
    "",
    response_model=DeadLetterPage,
    responses=problem_responses(400, 413, 422),
    summary="List dead letters",
)
def list_dead_letters(
    onbeat: OnbeatApp, caller: CallerDep, cursor: Cursor = None, limit: Limit = DEFAULT_LIMIT
) -> DeadLetterPage:
    """The caller's tenant's dead letters in id order, ``limit`` per page, each with its job's
    task, params and last error."""
    after_id = decode_cursor("dead-letters", cursor)
    fetched = onbeat.list_dead_letters(limit + 1, tenant=caller.tenant, after_id=after_id)
    dead, next_cursor = page_of("dead-letters", fetched, limit, lambda d: d.execution_id)
    return DeadLetterPage(items=[dead_letter_out(d) for d in dead], next_cursor=next_cursor)


@router.post(
    "/{dead_letter_id}/replay",
    response_model=ExecutionOut,
    responses=_WRITE,
    summary="Replay a dead letter",
)
def replay_dead_letter(dead_letter_id: str, onbeat: OnbeatApp, caller: CallerDep) -> ExecutionOut:
    """Put the execution back to run now with a fresh set of attempts (its attempt history is
    kept); the dead letter is removed."""
    return execution_out(onbeat.replay_dead_letter(dead_letter_id, tenant=caller.tenant))


@router.delete(
    "/{dead_letter_id}",
    status_code=204,
    response_class=Response,
    responses=_WRITE,
    summary="Drop a dead letter",
)
def drop_dead_letter(dead_letter_id: str, onbeat: OnbeatApp, caller: CallerDep) -> Response:
    """Remove the dead letter; the failed execution stays on record."""
    onbeat.drop_dead_letter(dead_letter_id, tenant=caller.tenant)
    return Response(status_code=204)
