"""Helpers for the operator UI tests: an httpx client on the ASGI app, the CSRF token of its
session, and the visible text of a page."""

from __future__ import annotations

import contextlib
import dataclasses
import html
import html.parser
import re
import urllib.parse
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


@dataclasses.dataclass
class Form:
    """A form of a page as a browser sees it: its address as written, its fields (hidden
    inputs) and the data-* attributes of the table row it sits in."""

    action: str
    method: str
    fields: dict[str, str]
    row: dict[str, str]
    buttons: list[str]


class _Forms(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self.references: list[str] = []
        self._row: dict[str, str] = {}
        self._form: Form | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        for name in ("href", "src", "action", "data-live-url"):
            if name in found:
                self.references.append(found[name])
        if tag == "tr":
            self._row = {name: value for name, value in found.items() if name.startswith("data-")}
        elif tag == "form":
            self._form = Form(
                found.get("action", ""), found.get("method", "get"), {}, self._row, []
            )
            self.forms.append(self._form)
        elif self._form is not None and tag == "input" and found.get("type") == "hidden":
            self._form.fields[found.get("name", "")] = found.get("value", "")
        elif self._form is not None and tag == "button" and "value" in found:
            self._form.buttons.append(found["value"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        elif tag == "tr":
            self._row = {}


def forms(page: httpx.Response) -> list[Form]:
    """The page's forms, in order."""
    parser = _Forms()
    parser.feed(page.text)
    return parser.forms


def references(page: httpx.Response) -> list[str]:
    """Every address the page holds: links, scripts, stylesheets, form actions, live URLs."""
    parser = _Forms()
    parser.feed(page.text)
    return parser.references


def resolve(page: httpx.Response, reference: str) -> httpx.URL:
    """The URL a browser goes to from ``reference`` on ``page`` (dot segments resolved,
    encoded ones too, as browsers do)."""
    parts = urllib.parse.urlsplit(reference)
    segments = [
        ".."
        if re.fullmatch(r"(?i)(\.|%2e){2}", segment)
        else "."
        if re.fullmatch(r"(?i)\.|%2e", segment)
        else segment
        for segment in parts.path.split("/")
    ]
    path = "/".join(segments)
    joined = urllib.parse.urljoin(str(page.url), urllib.parse.urlunsplit(parts._replace(path=path)))
    return httpx.URL(joined)


async def submit(
    http: httpx.AsyncClient, page: httpx.Response, form: Form, **extra: str
) -> httpx.Response:
    """Press the form's button as a browser would: post its fields to its resolved address,
    from the page's origin."""
    origin = f"{page.url.scheme}://{page.url.netloc.decode()}"
    target = resolve(page, form.action or str(page.url))
    return await http.post(target, data={**form.fields, **extra}, headers={"Origin": origin})
