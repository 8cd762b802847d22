"""``onbeat up``'s log: JSON lines when stderr is not a terminal, a run's state changes carry its
identity, and no API key ever appears in it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from tests.cli.conftest import onbeat, running_node


def test_log__json_lines_with_run_fields_and_never_an_api_key(tmp_path: Path) -> None:
    with running_node(tmp_path, log_level="DEBUG") as node:
        created = onbeat(
            *("keys", "create", "--tenant", "acme", "--role", "writer"),
            *("--database-url", node.database_url),
        )
        assert created.returncode == 0, created.stderr
        key = created.stdout.splitlines()[-1]
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=node.url, timeout=10) as http:
            job = http.post("/api/v1/jobs", json={"task": "echo"}, headers=auth).json()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                page = http.get(f"/api/v1/jobs/{job['id']}/executions", headers=auth).json()
                if page["items"] and page["items"][0]["status"] == "succeeded":
                    break
                time.sleep(0.05)  # a real node in another process: nothing to wait on but time
            else:
                raise AssertionError(f"the run did not succeed: {page}")
            assert http.get("/metrics", headers=auth).status_code == 200
            assert (
                http.get("/metrics", headers={"Authorization": f"Bearer {key}x"}).status_code == 401
            )
    log_text = (tmp_path / "node.log").read_text()
    assert key not in log_text
    assert key.split("_", 2)[2] not in log_text  # nor its secret part (which may hold "_")
    lines = [json.loads(line) for line in log_text.splitlines()]  # every line is JSON
    [succeeded] = [line for line in lines if line["message"] == "execution succeeded"]
    execution_id = page["items"][0]["id"]
    assert succeeded["execution_id"] == execution_id
    assert succeeded["job_id"] == job["id"]
    assert succeeded["attempt"] == 1
    assert succeeded["fencing_token"] >= 1
    assert succeeded["level"] == "info"
