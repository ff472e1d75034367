"""The web console, served by `finesched serve` at /ui (see `routes.py`): its own room in the API layer.

Templates and static assets are package data (no Node build step, nothing fetched at run time);
`routes.router` is mounted by `server/app.py` beside the /v1 routers.

May import `server.api` (it answers through the API's own route functions, so it shows what the
API would) and `server.store`; never the loop directly, nothing below imports it.
"""

from finesched.server.console.routes import router

__all__ = ["router"]
