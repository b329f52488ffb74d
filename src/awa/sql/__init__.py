"""The SQL of awa: numbered migrations and named queries, loaded from the files beside this one.

This package is the only place SQL text lives. A query file holds several statements, each
introduced by a ``-- name: <query_name>`` line; comments above a statement explain its hazards.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import LiteralString, cast

_NAME_LINE = re.compile(r"^-- name: ([a-z0-9_]+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: LiteralString


@functools.cache
def _queries() -> dict[str, LiteralString]:
    found: dict[str, LiteralString] = {}
    folder = resources.files(__package__).joinpath("queries")
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        parts = _NAME_LINE.split(text)
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise RuntimeError(f"query {name!r} is defined twice ({entry.name})")
            found[name] = cast(LiteralString, body.strip())
    return found


def query(name: str) -> LiteralString:
    """The SQL text of the named query."""
    try:
        return _queries()[name]
    except KeyError:
        raise KeyError(f"no SQL query named {name!r} in awa/sql/queries") from None


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this version, in order."""
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append(
                Migration(
                    version=int(match.group(1)),
                    name=match.group(2),
                    sql=entry.read_text(encoding="utf-8"),
                )
            )
    found.sort(key=lambda migration: migration.version)
    versions = [migration.version for migration in found]
    # Distinct numbers from 1; a number may be missing while the branch that takes it is
    # merged (each migration is applied by its number, whatever the order they arrive in).
    if len(set(versions)) != len(versions) or (versions and versions[0] != 1):
        raise RuntimeError(f"migrations must have distinct numbers from 1, found {versions}")
    return tuple(found)


def current_version() -> int:
    return migrations()[-1].version
