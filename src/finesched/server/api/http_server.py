"""The HTTP server under the API: uvicorn, with read timeouts it does not have of its own.

uvicorn closes a keep-alive connection that stays idle between requests (`timeout_keep_alive`),
but it waits for ever for a request that never finishes: a client that opens a connection and
sends nothing, half a request line or headers a byte a minute (slowloris), or a body that
stalls, holds a connection and a file descriptor for as long as it likes; 4,000 such connections
starve the server. `TimedHttpToolsProtocol` is uvicorn's own httptools protocol with two timers,
as Go's `http.Server` has `ReadHeaderTimeout` and `ReadTimeout`:

* from the moment a connection is made (or a keep-alive connection's next request begins) until
  its request headers are complete: `header_timeout_s`; past it the client is answered 408 and
  the connection closed;
* from the end of the headers until the end of the body: `body_timeout_s`; past it the
  connection is closed (the request in progress sees a disconnect).

Idle keep-alive connections are closed after `keep_alive_s` (uvicorn's own timer), and at most
`max_connections` connections and requests are served at once: past that uvicorn answers 503
(`limit_concurrency`), so a flood of connections costs the server a refusal each, not its memory.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("finesched.server")


@dataclass(frozen=True)
class Timeouts:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    #: Connections and requests in progress at once (uvicorn's limit_concurrency: 503 past it).
    max_connections: int = 4096


_TIMEOUT_BODY = b"the request was not sent in time\n"
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY
)


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header and a body read timeout (see the module docstring)."""

    timeouts = Timeouts()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _expired(self, what: str) -> None:
        self._read_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        client = "%s:%s" % self.client if self.client else "a client"  # noqa: UP031
        log.info("closing the connection of %s: its request %s did not arrive in time", client, what)
        if what == "headers":
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.timeouts.header_timeout_s, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_timer is None:  # the next request of a keep-alive connection
            self._arm(self.timeouts.header_timeout_s, "headers")

    def on_headers_complete(self) -> None:
        self._arm(self.timeouts.body_timeout_s, "body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()


def protocol_with(timeouts: Timeouts) -> type[TimedHttpToolsProtocol]:
    """The protocol class with these timeouts (uvicorn makes one instance per connection)."""
    return type("TimedHttpToolsProtocol", (TimedHttpToolsProtocol,), {"timeouts": timeouts})


def server_config(app: Any, host: str, port: int, timeouts: Timeouts | None = None, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for the API: the timed protocol, keep-alive and connection limits."""
    timeouts = timeouts or Timeouts()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_with(timeouts),
        timeout_keep_alive=max(1, round(timeouts.keep_alive_s)),
        limit_concurrency=timeouts.max_connections,
        # a client's X-Forwarded-For is not its address: the failed-authentication limit counts by the
        # peer's address (server/api/auth_limit.py)
        proxy_headers=False,
        **options,
    )


def run(app: Any, host: str, port: int, timeouts: Timeouts | None = None, **options: Any) -> None:
    """Serve `app` until the process is asked to stop (what `finesched serve` runs)."""
    uvicorn.Server(server_config(app, host, port, timeouts, **options)).run()
