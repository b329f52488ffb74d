"""``settings.AWA``: where the jobs live and what ``manage.py awa_worker`` runs.

Keys (all optional)::

    AWA = {
        "DATABASE": "default",       # the Django database alias the jobs live in, or
        "URL": "postgresql://...",   # a database of their own (not both)
        "QUEUES": {"default": 8},    # what the worker runs, as AsyncClient.start() takes it
        "RUNTIME": {"heartbeat_interval": 10},  # start()'s keyword options
        "SHUTDOWN_TIMEOUT": 30,      # seconds running tasks get after SIGTERM
        "TASK_MODULES": ["myapp.jobs"],  # modules registering awa tasks on get_client()
        "MIGRATE": True,             # manage.py migrate also applies awa's schema
    }

With ``DATABASE`` (the default) tasks are enqueued on Django's connection, inside its
transaction, and the worker connects with that alias's settings (HOST, PORT, NAME, USER,
PASSWORD and the libpq keys of OPTIONS), and ``manage.py migrate`` on that database applies
awa's migrations too (unless ``MIGRATE`` is False), so test databases get the schema. With
``URL`` the jobs live elsewhere and an enqueue commits on its own. Every mistake raises
``ImproperlyConfigured`` naming the key.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from typing import Any

import psycopg
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from awa.errors import ValidationError
from awa.model import MAX_DURATION
from awa.storage.db import check_database_url
from awa.worker.config import RuntimeConfig, parse_queues

KEYS = ("DATABASE", "URL", "QUEUES", "RUNTIME", "SHUTDOWN_TIMEOUT", "TASK_MODULES", "MIGRATE")

# OPTIONS keys that Django's PostgreSQL backend consumes itself: not libpq parameters.
_DJANGO_ONLY_OPTIONS = frozenset(
    {
        "assume_role",
        "context",
        "cursor_factory",
        "isolation_level",
        "pool",
        "prepare_threshold",
        "server_side_binding",
    }
)


@dataclasses.dataclass(frozen=True)
class AwaSettings:
    """``settings.AWA``, checked. ``database`` is the Django alias that enqueues and reads
    results (None: the jobs live at ``url``, reached through awa's own connections);
    ``url`` is the libpq connection string the worker and ``awa_migrate`` use."""

    database: str | None
    url: str
    queues: Any
    runtime: dict[str, Any]
    shutdown_timeout: float
    task_modules: tuple[str, ...]
    migrate: bool


def load() -> AwaSettings:
    """Read and check ``settings.AWA``; ImproperlyConfigured names the key that is wrong."""
    raw = getattr(settings, "AWA", None)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"settings.AWA must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ImproperlyConfigured(
            f"settings.AWA has unknown key(s) {unknown}; valid keys: {', '.join(KEYS)}"
        )
    if "DATABASE" in raw and "URL" in raw:
        raise ImproperlyConfigured(
            "settings.AWA: give DATABASE (a Django database alias) or URL (a database of "
            "the jobs' own), not both"
        )
    if "URL" in raw:
        database, url = None, _url(raw["URL"])
    else:
        database = _alias(raw.get("DATABASE", "default"))
        url = conninfo(database)
    runtime = _runtime(raw.get("RUNTIME", {}))
    return AwaSettings(
        database=database,
        url=url,
        queues=_queues(raw.get("QUEUES"), runtime),
        runtime=runtime,
        shutdown_timeout=_shutdown_timeout(raw.get("SHUTDOWN_TIMEOUT", 30.0)),
        task_modules=_task_modules(raw.get("TASK_MODULES", ())),
        migrate=_flag("MIGRATE", raw.get("MIGRATE", True)),
    )


def _url(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ImproperlyConfigured("settings.AWA['URL'] must be a non-empty connection string")
    try:
        return check_database_url(value)
    except ValidationError as error:
        raise ImproperlyConfigured(f"settings.AWA['URL']: {error}") from None


def _alias(value: object) -> str:
    if not isinstance(value, str):
        raise ImproperlyConfigured(
            f"settings.AWA['DATABASE'] must be a database alias (a str), not {type(value).__name__}"
        )
    if value not in settings.DATABASES:
        raise ImproperlyConfigured(
            f"settings.AWA['DATABASE'] is {value!r}, which settings.DATABASES does not "
            f"define (it has {', '.join(map(repr, settings.DATABASES))})"
        )
    from django.db import connections

    vendor = connections[value].vendor
    if vendor != "postgresql":
        raise ImproperlyConfigured(
            f"settings.AWA['DATABASE']: database {value!r} is {vendor}; awa needs PostgreSQL "
            "(or give settings.AWA['URL'] for a PostgreSQL database of the jobs' own)"
        )
    return value


def conninfo(alias: str) -> str:
    """A libpq connection string for the Django database ``alias``: HOST, PORT, NAME, USER,
    PASSWORD, and OPTIONS except those that only Django's backend reads (as the connection
    has them: a test run's database name included)."""
    from django.db import connections

    where = f"settings.DATABASES[{alias!r}]"
    entry = connections[alias].settings_dict
    options = entry.get("OPTIONS") or {}
    params: dict[str, Any] = {
        key: value for key, value in options.items() if key not in _DJANGO_ONLY_OPTIONS
    }
    name = entry.get("NAME")
    if name is None:
        params["dbname"] = "postgres"  # what Django connects to for NAME None
    elif name:
        params["dbname"] = name
    elif not params.get("service"):
        raise ImproperlyConfigured(f"{where} needs NAME (or OPTIONS['service'])")
    for key, param in (("USER", "user"), ("PASSWORD", "password"), ("HOST", "host")):
        if entry.get(key):
            params[param] = entry[key]
    if entry.get("PORT"):
        params["port"] = entry["PORT"]
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ImproperlyConfigured(
                f"{where}['OPTIONS'][{key!r}] is a {type(value).__name__}; awa's connections "
                "take libpq parameters (strings or numbers)"
            )
    try:
        return psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in params.items()})
    except psycopg.ProgrammingError as error:
        raise ImproperlyConfigured(f"{where}: not a valid libpq connection: {error}") from None


def _runtime(value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(
            f"settings.AWA['RUNTIME'] must be a dict of start() options, not {type(value).__name__}"
        )
    try:
        RuntimeConfig.from_options(value)
    except (ValidationError, TypeError, ValueError) as error:
        raise ImproperlyConfigured(f"settings.AWA['RUNTIME']: {error}") from None
    return dict(value)


def _queues(value: object, runtime: Mapping[str, Any]) -> Any:
    if value is None:
        if runtime.get("global_max_workers") is not None:
            raise ImproperlyConfigured(
                "settings.AWA['QUEUES']: weighted mode requires explicit queue configs "
                "(RUNTIME sets global_max_workers): give each queue's share, e.g. "
                "{'email': {'min_workers': 2, 'weight': 3}}"
            )
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Mapping | list | tuple):
        raise ImproperlyConfigured(
            "settings.AWA['QUEUES'] must be a dict ({'email': 4} or {'email': {'max_workers': "
            f"4, ...}}) or a list of (name, max_workers) pairs, not {type(value).__name__}"
        )
    try:
        parse_queues(value, [], global_max_workers=runtime.get("global_max_workers"))
    except (ValidationError, TypeError, ValueError) as error:
        raise ImproperlyConfigured(f"settings.AWA['QUEUES']: {error}") from None
    return value


def _shutdown_timeout(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_DURATION.total_seconds()  # NaN and infinities too
    ):
        raise ImproperlyConfigured(
            "settings.AWA['SHUTDOWN_TIMEOUT'] must be a number of seconds from 0 to "
            f"{MAX_DURATION.total_seconds():.0f}, not {value!r}"
        )
    return float(value)


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ImproperlyConfigured(f"settings.AWA[{key!r}] must be True or False, not {value!r}")
    return value


def _task_modules(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ImproperlyConfigured(
            "settings.AWA['TASK_MODULES'] must be a list of module names, not "
            f"{type(value).__name__}"
        )
    for name in value:
        # A dotted name of identifiers: no path ("a/b", "..x"), NUL or stray character.
        if (
            not isinstance(name, str)
            or not 0 < len(name) <= MAX_MODULE_NAME
            or not all(part.isidentifier() for part in name.split("."))
        ):
            shown = repr(name) if len(repr(name)) <= 80 else f"{repr(name)[:60]}..."
            raise ImproperlyConfigured(
                f"settings.AWA['TASK_MODULES'] holds {shown}, which is not a module name "
                "(a dotted name such as 'myapp.jobs')"
            )
    return tuple(value)


MAX_MODULE_NAME = 1000


def missing_task_modules(task_modules: tuple[str, ...]) -> list[str]:
    """Why each of ``TASK_MODULES`` that cannot be found would fail to import (one line per
    module; empty when all are there). Parent packages are imported to look inside them, the
    modules themselves are not."""
    problems = []
    for name in task_modules:
        try:
            found = importlib.util.find_spec(name)
        except ImportError as error:  # a parent package is missing
            problems.append(f"{name!r}: {error}")
            continue
        except Exception as error:  # a parent package failed to import
            problems.append(f"{name!r}: importing its package failed: {error!r}")
            continue
        if found is None:
            problems.append(f"{name!r}: no module named {name!r}")
    return problems
