"""The HTTP API: what answers a request.

Owns one routes module per resource (`routes_*.py`, mounted by the app factory, `server/app.py`),
the OpenAPI document (`openapi.py`), authentication and its limiter (`auth.py`, `auth_limit.py`),
authorization (`authz.py`), the request context (`context.py`), what a caller may see
(`visibility.py`), paging, per-tenant object quotas (`quota.py`), agent reports' checks and what a
tenant may read of them (`reports.py`), per-device use (`device_usage.py`), the SSE watch hub
(`watch_hub.py`) and the HTTP server under it (`http_server.py`).

May import `server.store`, `server.loop`, `server.what_if` (``POST /v1/plan``'s dry run) and
`server.metrics`; never the console, the features that import the API (`server.offers`, `jobs`,
`logs`) or the app factory. Nothing below the API imports it.
"""
