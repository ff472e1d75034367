"""List pages as Kubernetes serves them: `limit` and `continue`, and `metadata.continue` in the answer.

A list endpoint answers at most `limit` items (DEFAULT_PAGE when the client gives none, at most
MAX_PAGE), in a stable order (by id, oldest first, or by name). When more remain, the answer's
`metadata` carries `continue`, an opaque token, and `remainingItemCount`; the client asks again
with the same filters and `continue=TOKEN` and gets the next page. The pages are keyset pages: the
token holds the last key the client was given, so a page never repeats or skips an object that
existed through the whole listing, and no server state is kept between pages (any replica answers
the next page; nothing expires).

The token also holds a digest of the query's filters: a token used with other filters (or on
another list) is refused with 422 naming `continue`, as is one that is not a token at all.
Kubernetes answers 410 Gone for a token whose snapshot expired; ours have no snapshot to expire.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Query

from finesched.server.store.views import InputError

DEFAULT_PAGE = 500
MAX_PAGE = 5000
#: Longer than any token this module writes (a 253-character name, base64-encoded, plus the digest).
MAX_TOKEN = 1024

LimitQuery = Annotated[
    int | None,
    Query(ge=1, le=MAX_PAGE, description=f"At most this many items (default {DEFAULT_PAGE}, at most {MAX_PAGE})"),
]
ContinueQuery = Annotated[
    str | None,
    Query(
        alias="continue",
        max_length=MAX_TOKEN,
        pattern="^[A-Za-z0-9_-]+$",
        description="The `metadata.continue` of the previous page (with the same filters): the next page",
    ),
]


@dataclass(frozen=True)
class PageRequest:
    """What one page asks for: at most `limit` items after `after` (None: from the start)."""

    what: str
    filters: Mapping[str, Any]
    limit: int | None  # None: every item that follows
    after: int | str | None

    def answer(self, items: Sequence[Any], last: int | str | None, remaining: int) -> dict[str, Any]:
        """The list answer: `items` and `metadata` (`continue` and `remainingItemCount` when `remaining`
        items follow the last one given, keyed `last`)."""
        metadata: dict[str, Any] = {}
        if remaining > 0 and last is not None:
            metadata = {"continue": encode(self.what, self.filters, last), "remainingItemCount": remaining}
        return {"metadata": metadata, "items": list(items)}


def _digest(what: str, filters: Mapping[str, Any]) -> str:
    canonical = json.dumps([what, {k: v for k, v in sorted(filters.items()) if v is not None}], default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def encode(what: str, filters: Mapping[str, Any], last: int | str) -> str:
    """The opaque token for "the page after `last`" of this list with these filters."""
    raw = json.dumps({"k": last, "q": _digest(what, filters)}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _bad(token: str, why: str) -> InputError:
    shown = token if len(token) <= 80 else token[:77] + "..."
    return InputError([{"loc": ["query", "continue"], "msg": why, "input": shown}])


def decode(what: str, filters: Mapping[str, Any], token: str, key: type) -> int | str:
    """The last key a token names; 422 (InputError on `continue`) when it is malformed or was given
    for another query (other filters, another list)."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        doc = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise _bad(token, "is not a continue token (use metadata.continue of the previous page)") from None
    if not isinstance(doc, dict) or set(doc) != {"k", "q"}:
        raise _bad(token, "is not a continue token (use metadata.continue of the previous page)")
    last = doc["k"]
    if key is int and (isinstance(last, bool) or not isinstance(last, int) or not 0 <= last < 2**63):
        raise _bad(token, "is not a continue token of this list")
    if key is str and not isinstance(last, str):
        raise _bad(token, "is not a continue token of this list")
    if doc["q"] != _digest(what, filters):
        raise _bad(token, "was given for another query: ask again with the filters of the first page")
    return last  # type: ignore[no-any-return]


def request(
    what: str, filters: Mapping[str, Any], limit: int | None, token: str | None, key: type = int,
    default: int | None = DEFAULT_PAGE,
) -> PageRequest:  # fmt: skip
    """The page a list request asks for. `default` is the page size without `limit` (None: all of
    it, for lists whose old clients read everything in one answer)."""
    after = decode(what, filters, token, key) if token is not None else None
    return PageRequest(what, dict(filters), limit if limit is not None else default, after)
