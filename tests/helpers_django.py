"""Running the Django test project (tests/django_project) in subprocesses: Django settings
can be configured once per process, so every Django scenario runs in one of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).parent
SCENARIO = TESTS / "procs" / "django_scenario.py"
TIMEOUT = 90.0


def django_env(database_url: str, **overrides: Any) -> dict[str, str]:
    """The environment of a Django subprocess on the test database; ``overrides`` replace
    whole settings of tests/django_project/settings.py."""
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)  # the integration must use Django's settings, not this
    path = [str(TESTS), *filter(None, [env.get("PYTHONPATH")])]
    env.update(
        AWA_TEST_DB=database_url,
        DJANGO_SETTINGS_MODULE="django_project.settings",
        PYTHONPATH=os.pathsep.join(path),
        PYTHONUNBUFFERED="1",
        AWA_TEST_OVERRIDES=json.dumps(overrides),
    )
    return env


def scenario(name: str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    """Run one scenario of procs/django_scenario.py (``extra``: its further arguments) and
    return what it printed."""
    done = subprocess.run(
        [sys.executable, str(SCENARIO), name, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"scenario {name} failed:\n{done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
