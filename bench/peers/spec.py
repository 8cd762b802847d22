"""How the driver starts a peer (standard library only: each ``<peer>/__init__.py`` defines a
``SPEC``, and the peers' venvs import those packages too)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Argv = tuple[str, ...]


@dataclass(frozen=True)
class PeerSpec:
    name: str
    services: tuple[str, ...]
    """``postgres`` (a fresh database of its own) and/or ``redis`` (a private redis-server)."""
    workers: tuple[Argv, ...]
    """One command per process the driver starts; ``argv[0]`` is a script of the peer's venv
    (``python`` is its interpreter)."""
    config: str
    """What was chosen for 2 cores, and why (with the docs it follows)."""
    setup: tuple[Argv, ...] = ()
    """Run once before anything else (schema installation)."""
    cron: str = "workers"
    """W3: ``workers`` (the processes above fire the cron jobs), ``scheduler`` (``scheduler``
    below fires them), or ``n/a: <why>``."""
    scheduler: Argv | None = None
    names: tuple[str, ...] = ()
    """What each of ``workers`` is called in logs and CPU figures (default ``worker-<i>``)."""
    environment: Mapping[str, str] = field(default_factory=dict)
    """Variables every process of the peer gets (setup and submissions too); ``{database_url}``,
    ``{redis_url}`` and ``{workdir}`` (the run's scratch directory) are filled in."""
    app: str = ""
    """The module holding the peer's app (``submit``); default ``bench.peers.<name>.app``."""
    repo_venv: bool = False
    """Run in the repo's own ``.venv`` (onbeat, installed there editable) rather than in a venv
    made from ``<name>/requirements.txt``."""

    @property
    def app_module(self) -> str:
        return self.app or f"bench.peers.{self.name}.app"
