"""The same workloads as ``bench/fleet.py`` (W1 throughput, W2 burst, W3 cron fan-out) against
other Python job systems, each installed in a venv of its own (``bench/peers/.venvs/<peer>``)
from ``bench/peers/<peer>/requirements.txt``, and against onbeat itself (``onbeat_peer/``: the
fleet and the embedded node, in the repo's ``.venv``). ``run.py`` is the driver; each
``<peer>/`` package holds that peer's app (the no-op ledger task, how to submit) and its
``SPEC`` (how its processes are started). Modules imported by the peers' processes use the
standard library only."""
