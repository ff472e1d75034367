"""The store: everything durable, and the shapes of what is stored.

Owns the engine (`db.py`), the tables (`schema.py`), the Alembic migrations (`migrate.py`,
`migrations/`), the store facade (`store.py`: transactions, events, optimistic versions), the job
and priority-class stores, the event correlator, rows turned into the scheduler's objects
(`cluster_view.py`) and into API answers (`views.py`, `job_status.py`), and the one lock order
between the loop's lock and the store's writer (`locking.py`: the store marks its write
transactions, the loop's lock refuses to be taken inside one).

May import `model/`, `state/`, `plugins/` and the package's shared modules; never `server.loop`,
`server.api`, `server.console` or the features beside them (`server.offers`, `jobs`, `logs`,
`what_if`, `metrics`).
"""
