"""``wrk`` as W5's load generator (``bench/api.py --load wrk``): one ``wrk`` per server URL, the
connections spread over them, for a fixed time.

The Python load generator (httpx on asyncio) spends about as much CPU per request as the server
it measures, on the same 2 cores, so it caps what it can show. wrk (C, Debian package ``wrk``)
spends a few per cent of that: the server's figure is then the server's. Each ``wrk`` reports,
from a Lua ``done()``, its requests, non-2xx answers, socket errors and latency percentiles.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Lua: one request shape, and a JSON summary line on stderr at the end. ``paths`` (a GET phase)
# picks a path at random per request; ``body`` (a POST phase) sends the same body each time.
_SCRIPT = """
local paths = {paths}
wrk.method = "{method}"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
math.randomseed(os.time())
request = function()
  if #paths > 0 then
    return wrk.format(nil, paths[math.random(#paths)])
  end
  return wrk.format(nil, "{path}")
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.stderr:write(string.format(
    'WRK_JSON {{"requests": %d, "duration_us": %d, "non_2xx": %d, "socket_errors": %d, '
    .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


@dataclass
class WrkResult:
    requests: int
    seconds: float
    non_2xx: int
    socket_errors: int
    percentiles_ms: dict[str, float]  # p50/p90/p99/max: the worst over the wrk processes
    client_cpu: float


def available() -> bool:
    return shutil.which("wrk") is not None


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Lua string literal here (ASCII)


def run_wrk(
    base_urls: Sequence[str],
    *,
    method: str,
    path: str,
    body: str | None = None,
    paths: Sequence[str] = (),
    connections: int,
    seconds: float,
) -> WrkResult:
    """``connections`` spread over ``base_urls`` (one single-threaded ``wrk`` each), for
    ``seconds``."""
    script = _SCRIPT.format(
        paths="{" + ",".join(_lua_string(p) for p in paths) + "}",
        method=method,
        body=_lua_string(body) if body is not None else "nil",
        path=path,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        shares = [connections // len(base_urls)] * len(base_urls)
        for i in range(connections % len(base_urls)):
            shares[i] += 1
        wrk = ["wrk", "-t", "1", "-d", f"{seconds:g}s", "--timeout", "30s", "-s", f.name]
        procs = [
            subprocess.Popen(
                [*wrk, "-c", str(n), url + path],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for url, n in zip(base_urls, shares, strict=True)
            if n
        ]
        reports = []
        for proc in procs:
            _, err = proc.communicate()
            line = next((x for x in err.splitlines() if x.startswith("WRK_JSON ")), None)
            if proc.returncode or line is None:
                raise RuntimeError(f"wrk failed ({proc.returncode}): {err[-500:]}")
            reports.append(json.loads(line.removeprefix("WRK_JSON ")))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        Path(f.name).unlink()
    return WrkResult(
        requests=sum(r["requests"] for r in reports),
        seconds=max(r["duration_us"] for r in reports) / 1e6,
        non_2xx=sum(r["non_2xx"] for r in reports),
        socket_errors=sum(r["socket_errors"] for r in reports),
        percentiles_ms={
            k: max(r[f"{k}_us"] for r in reports) / 1e3 for k in ("p50", "p90", "p99", "max")
        },
        client_cpu=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
    )
