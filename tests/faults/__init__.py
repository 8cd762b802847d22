"""The fault-injection suite (issue 8, RELIABILITY.md): a supervised fleet of real processes, a
seeded nemesis, a load generator with an ack log, a ledger the task writes itself, an oracle that
shares no code with onbeat's cron engine, and a checker of RELIABILITY.md's metrics.

Run a scenario by hand: ``.venv/bin/python -m tests.faults --scenario S1 --seed 7``.
"""
