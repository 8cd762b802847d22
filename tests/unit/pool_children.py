"""What a test sees of the process pools' children from outside: their processes in /proc."""

from __future__ import annotations

import os
from pathlib import Path


def pool_processes() -> set[int]:
    """Processes, zombies included, that multiprocessing's fork server forked for this test run."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    servers = [
        pid
        for pid in parents.get(os.getpid(), [])
        if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    return {pid for server in servers for pid in parents.get(server, [])}
