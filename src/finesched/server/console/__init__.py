"""The web console, served by `finesched serve` at /ui (see `routes.py`): its own room in the API layer.

Templates and static assets are package data (no Node build step, nothing fetched at run time);
`routes.router` is mounted by `server/app.py` beside the /v1 routers.
"""

from finesched.server.console.routes import router

__all__ = ["router"]
