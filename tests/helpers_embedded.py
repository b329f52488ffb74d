"""A throwaway data directory for tests that start the embedded server."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from awa.storage.embedded import stop_embedded_server


def env_without_database() -> dict[str, str]:
    """The environment minus DATABASE_URL and the PG* variables (awa then goes embedded)."""
    return {
        name: value
        for name, value in os.environ.items()
        if name != "DATABASE_URL" and not name.startswith("PG")
    }


@contextlib.contextmanager
def throwaway_data_dir() -> Iterator[Path]:
    """``<tmp>/awa-embedded-test-<hex>/postgres``, neither of them created yet: awa creates
    them (as root, for the unprivileged server user, under a directory it may traverse,
    unlike pytest's private tmp_path). Afterwards the server is stopped and both removed."""
    base = Path(tempfile.gettempdir()) / f"awa-embedded-test-{uuid.uuid4().hex[:10]}"
    data_dir = base / "postgres"
    try:
        yield data_dir
    finally:
        stop_embedded_server(data_dir)
        shutil.rmtree(base, ignore_errors=True)
