"""What the operator UI accepts from a request: query parameters, path parameters and form
fields, each checked before it reaches the database. A wrong one is a ``BadRequest`` (the
page answers 400) whose message names it and the rule it broke."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from awa.errors import ValidationError
from awa.model import JobState, check_encodable
from awa.ui import reads

BIGINT_MAX = 2**63 - 1
"""The largest job id (ids are ``bigint``): a larger number never reaches the database."""
MAX_TEXT = 1000
"""The longest filter a query string may carry."""


class BadRequest(ValidationError):
    """A parameter or form field the UI cannot use; the page says which and why."""


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut short, for a message about a value the request carried."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clean(name: str, value: object, limit: int | None) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be text, not {type(value).__name__}")
    if "\x00" in value:
        raise BadRequest(f"{name}: NUL bytes are not allowed")
    if limit is not None and len(value) > limit:
        raise BadRequest(f"{name}: at most {limit} characters")
    try:
        check_encodable(name, value)
    except ValidationError as error:
        raise BadRequest(str(error)) from None
    return value


def text(params: Mapping[str, Any], name: str, *, strip: bool = True) -> str | None:
    """An optional text parameter (None when absent or empty). Names (kind, queue, tag) are
    matched exactly, so they keep their spaces (``strip=False``)."""
    value = _clean(name, params.get(name, ""), MAX_TEXT)
    value = value.strip() if strip else value
    return value or None


def required(params: Mapping[str, Any], name: str) -> str:
    """A form field that must be present: a stored name (queue, schedule), sent back as the
    page received it. Its length is left to ``awa.admin``, which says the limit."""
    value = params.get(name)
    if value is None or value == "":
        raise BadRequest(f"{name}: the form does not say which (reload the page)")
    return _clean(name, value, None)


def number(name: str, value: str) -> int:
    """A whole number from 0 to ``BIGINT_MAX`` written in ASCII digits (no sign, no
    exponent, no underscore)."""
    digits = value.lstrip("0") or "0"
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
        raise BadRequest(
            f"{name} must be a whole number from 0 to {BIGINT_MAX}, not {shown(value)}"
        )
    found = int(digits)
    if found > BIGINT_MAX:
        raise BadRequest(
            f"{name} must be a whole number from 0 to {BIGINT_MAX}, not {shown(value)}"
        )
    return found


def whole_number(params: Mapping[str, Any], name: str) -> int | None:
    value = text(params, name)
    return None if value is None else number(name, value)


def job_id(value: str) -> int:
    """A job id from the path (``/jobs/<id>``)."""
    return number("job id", _clean("job id", value, None))


def job_ids(values: list[Any]) -> list[int]:
    """The ``ids`` fields of a bulk form."""
    return [number("ids", _clean("ids", value, MAX_TEXT)) for value in values]


def job_filter(params: Mapping[str, Any]) -> reads.JobFilter:
    """The jobs page's filters from its query string (or a bulk form's fields)."""
    state_text = text(params, "state")
    state = None
    if state_text is not None:
        try:
            state = JobState(state_text)
        except ValueError:
            names = ", ".join(member.value for member in JobState)
            raise BadRequest(f"state must be one of {names}, not {shown(state_text)}") from None
    sort = text(params, "sort") or "id"
    if sort not in ("id", "run_at"):
        raise BadRequest(f"sort must be id or run_at, not {shown(sort)}")
    after_id = whole_number(params, "after")
    after_run_at = None
    if sort == "run_at" and after_id is not None:
        stamp = text(params, "after_run_at")
        try:
            after_run_at = dt.datetime.fromisoformat(stamp or "")
        except ValueError:
            raise BadRequest("after_run_at must be an ISO timestamp with the after id") from None
    return reads.JobFilter(
        state=state,
        kind=text(params, "kind", strip=False),
        queue=text(params, "queue", strip=False),
        tag=text(params, "tag", strip=False),
        text=text(params, "q"),
        sort=sort,
        after_id=after_id,
        after_run_at=after_run_at,
    )
