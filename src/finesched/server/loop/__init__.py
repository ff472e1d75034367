"""The scheduling loop: the only caller of the Scheduler, and what it drives.

Owns the loop (`loop.py`), the leader's lease (`lease.py`), the change feed (`feed.py`), upkeep
(`upkeep.py`: heartbeats, waiting reasons, event retention), objects set aside (`setaside.py`),
placing a group at once under the loop's lock (`placement.py`), what follows a process's end or an
agent's refusal (`lifecycle.py`: functions the loop and the agents' routes call with what they
need), and giving freed memory back (`memory.py`).

May import `server.store` and `server.metrics` (and `model/`, `state/`, `sched/`, `plugins/`);
never the HTTP API (`server.api`, `server.console`) nor the features that serve HTTP
(`server.offers`, `jobs`, `logs`, `what_if`).
"""
