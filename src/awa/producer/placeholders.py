"""Statements written with Postgres' ``$1, $2`` placeholders (the reference package's
``Transaction.execute``), run through psycopg, which takes ``%s`` / ``%(name)s``.

The statement is scanned as Postgres reads it: placeholders inside string literals
(``'...'``, ``E'...'``, ``$tag$...$tag$``), quoted identifiers (``"..."``) and comments
(``--``, nested ``/* */``) are text, not placeholders. A statement using both styles is
refused, since its meaning would depend on which one we guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from awa.errors import ValidationError

_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_NUMBERED = re.compile(r"\$(\d+)")
_PSYCOPG = re.compile(r"%(\([^)]*\))?[sbt]")


def _word_char(char: str) -> bool:
    """A character of an identifier: a ``$`` after one is part of the name, not a quote."""
    return char.isalnum() or char == "_"


def _skip_quoted(sql: str, start: int, quote: str, backslashes: bool) -> int:
    """The index after the literal or identifier opened at ``start``."""
    index = start + 1
    while index < len(sql):
        char = sql[index]
        if backslashes and char == "\\":
            index += 2
            continue
        if char == quote:
            if index + 1 < len(sql) and sql[index + 1] == quote:  # '' or "" escape
                index += 2
                continue
            return index + 1
        index += 1
    raise ValidationError(f"unterminated {quote} quote in the statement")


def _skip_block_comment(sql: str, start: int) -> int:
    depth, index = 0, start
    while index < len(sql):
        if sql.startswith("/*", index):
            depth += 1
            index += 2
        elif sql.startswith("*/", index):
            depth -= 1
            index += 2
            if depth == 0:
                return index
        else:
            index += 1
    raise ValidationError("unterminated /* comment in the statement")


def _code_spans(sql: str) -> list[tuple[int, int, bool]]:
    """The statement cut into (start, end, is_code) pieces: code, or text (literals,
    quoted identifiers, comments)."""
    spans: list[tuple[int, int, bool]] = []
    code_start = index = 0
    while index < len(sql):
        char = sql[index]
        end = None
        if char == "'":
            backslashes = (
                index > 0
                and sql[index - 1] in "eE"
                and (index == 1 or not (sql[index - 2].isalnum() or sql[index - 2] == "_"))
            )
            end = _skip_quoted(sql, index, "'", backslashes)
        elif char == '"':
            end = _skip_quoted(sql, index, '"', False)
        elif sql.startswith("--", index):
            newline = sql.find("\n", index)
            end = len(sql) if newline == -1 else newline
        elif sql.startswith("/*", index):
            end = _skip_block_comment(sql, index)
        elif char == "$" and not (
            index > 0 and (sql[index - 1].isalnum() or sql[index - 1] == "_")
        ):
            tag = _DOLLAR_TAG.match(sql, index)
            if tag is not None:
                closing = sql.find(tag.group(0), tag.end())
                if closing == -1:
                    raise ValidationError(f"unterminated {tag.group(0)} quote in the statement")
                end = closing + len(tag.group(0))
        if end is None:
            index += 1
            continue
        if index > code_start:
            spans.append((code_start, index, True))
        spans.append((index, end, False))
        code_start = index = end
    if code_start < len(sql):
        spans.append((code_start, len(sql), True))
    return spans


def translate(sql: str, params: Sequence[Any]) -> tuple[str, Sequence[Any] | Mapping[str, Any]]:
    """``sql`` and ``params`` as psycopg takes them: ``$n`` placeholders become named ones
    (so one may appear several times, in any order); psycopg-style statements pass as they
    are. ValidationError for a statement mixing both styles, or a ``$n`` without its
    parameter."""
    spans = _code_spans(sql)
    code = [sql[start:end] for start, end, is_code in spans if is_code]
    numbered = any(_NUMBERED.search(piece) for piece in code)
    if not numbered:
        return sql, params
    if any(_PSYCOPG.search(piece) for piece in code):
        raise ValidationError(
            "the statement mixes $1-style and %s-style placeholders; use one style"
        )
    used: set[int] = set()

    def named(match: re.Match[str]) -> str:
        number = int(match.group(1))
        if number < 1 or number > len(params):
            raise ValidationError(
                f"the statement uses ${number} but {len(params)} parameter(s) were given"
            )
        used.add(number)
        return f"%(p{number})s"

    pieces = []
    for start, end, is_code in spans:
        piece = sql[start:end].replace("%", "%%")  # psycopg reads % everywhere
        pieces.append(_NUMBERED.sub(named, piece) if is_code else piece)
    return "".join(pieces), {f"p{number}": params[number - 1] for number in used}
