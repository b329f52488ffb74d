"""Helpers for the operator UI tests: an httpx client on the ASGI app, the CSRF token of its
session, and the visible text of a page."""

from __future__ import annotations

import contextlib
import html
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.types import ASGIApp


@contextlib.asynccontextmanager
async def browse(app: ASGIApp, base: str = "http://ui.test") -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=base) as http:
        yield http


async def csrf(http: httpx.AsyncClient, path: str = "/jobs") -> str:
    """The session's CSRF token, as a page's forms carry it (the cookie is kept by http)."""
    page = await http.get(path)
    assert page.status_code == 200, page.text
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match is not None, "the page has no form with a CSRF token"
    return match.group(1)


async def post(http: httpx.AsyncClient, path: str, token: str, **fields: Any) -> httpx.Response:
    data = {"csrf_token": token, **fields}
    return await http.post(path, data=data)


def text(page: httpx.Response | str) -> str:
    """The page's text without tags, whitespace folded."""
    body = page if isinstance(page, str) else page.text
    body = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", body, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body))).strip()


def flash(page: httpx.Response) -> str | None:
    match = re.search(r'class="flash"[^>]*>([^<]*)<', page.text)
    return html.unescape(match.group(1)) if match else None


def job_ids(page: httpx.Response) -> list[int]:
    """The ids of the jobs a jobs page lists, in order."""
    return [int(found) for found in re.findall(r'<tr data-job="(\d+)">', page.text)]
