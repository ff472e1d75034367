"""The control plane: a durable store, the scheduling loop and the HTTP API (a driver above `sched/`).

Its rooms, bottom up; each imports only the rooms below it (the import-linter contracts check it):

* `store/`: the database (engine, schema, migrations), the store facade and the stores of jobs
  and priority classes, rows turned into the scheduler's objects and into API answers, the lock order.
* `loop/`: the scheduling loop, the only caller of the Scheduler, and what it drives: the
  lease, the change feed, upkeep, set-aside, placement of groups, lifecycle after a process ends.
* `api/`: the HTTP API: one routes module per resource, OpenAPI, authentication and
  authorization, request context, visibility, paging, object quotas, the SSE watch hub.
* `console/`: the web console at /ui, above the API (it answers through the API's routes).

The features that cross the rooms stay here, one module each, where a reader looks first:
`offers.py` (offers and holds: API routes over the loop's placement), `jobs.py` (dataflow jobs:
routes, compile, place, store), `logs.py` (a workload's output, fetched from its node agent),
`what_if.py` (dry runs on a copy of the loop's state, behind ``POST /v1/plan``), `metrics.py`
(Prometheus metrics the loop and the API update). Of them, the loop imports only `metrics`, the
API only `what_if` and `metrics`, and the store none.

`app.py`, the app factory, is the one module that wires every room and feature together (the store,
the loop, the API's routers, the features' routers, the console), so it stands above them all and
nothing in server/ imports it. Bottom up: store, metrics, loop, what_if, api, then console, offers,
jobs and logs side by side, then app.
"""
