"""The links and redirects of the operator UI: paths under its mount, never absolute URLs.

Stored names (queues, kinds, schedules, tags, workflow ids, metadata) may hold any
character, ``/`` and ``..`` included, so a name never becomes raw path text: each path
parameter is percent-encoded as one segment, names the UI acts on travel as form fields,
and filters as an encoded query string. Links start at the mount's path (``root_path``),
so the ``Host`` header a request carried plays no part in them.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

MAX_NEXT = 4000
"""The longest ``next`` target a form may carry."""


def root(request: Request) -> str:
    """The mount's path, percent-encoded ("" at the root)."""
    return urllib.parse.quote(request.scope.get("root_path") or "", safe="/")


def path_for(
    request: Request, name: str, /, *, query: Mapping[str, Any] | None = None, **params: Any
) -> str:
    """The path of the UI's route ``name`` under its mount, each parameter one encoded
    segment, then the query's non-empty values, url-encoded."""
    segments = {}
    for key, value in params.items():
        segment = str(value)
        if segment.strip(".") == "":
            # Browsers resolve "." and ".." segments, encoded or not: never one of those.
            raise ValueError(f"a link to {name} needs a {key} other than {segment!r}")
        segments[key] = urllib.parse.quote(segment, safe="")
    path = root(request) + str(request.app.router.url_path_for(name, **segments))
    values = {key: str(value) for key, value in (query or {}).items() if value not in (None, "")}
    return f"{path}?{urllib.parse.urlencode(values)}" if values else path


def back_to(request: Request, target: object, default: str) -> str:
    """``target`` when it is a path of this UI, else ``default``.

    A target is kept only when no browser could read it as another site or another path: a
    relative reference starting with the mount's path, in printable ASCII, without a
    backslash, ``//``, a scheme, a host, an encoded slash or a dot segment.
    """
    if not isinstance(target, str) or not target or len(target) > MAX_NEXT:
        return default
    if not target.isascii() or not target.isprintable() or any(c in target for c in " \\"):
        return default
    parts = urllib.parse.urlsplit(target)
    path = parts.path
    if parts.scheme or parts.netloc or parts.fragment or not path.startswith(root(request) + "/"):
        return default
    decoded = urllib.parse.unquote(path)
    if "//" in path or decoded.count("/") != path.count("/"):
        return default  # an encoded slash: one segment to us, two to a proxy
    if any(segment in (".", "..") for segment in decoded.split("/")):
        return default
    if not decoded.isprintable() or "\\" in decoded:
        return default
    return target
