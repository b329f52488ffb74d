"""Settings of the test project: the test database, the awa task backend, a fast worker."""

from __future__ import annotations

import importlib.util
import json
import os

from psycopg.conninfo import conninfo_to_dict

_params = {key: str(value) for key, value in conninfo_to_dict(os.environ["AWA_TEST_DB"]).items()}

SECRET_KEY = "awa-tests"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["awa.contrib.django"]
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.append("django_tasks")  # the backport, on Django 5.2

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _params.get("dbname"),
        "USER": _params.get("user", ""),
        "PASSWORD": _params.get("password", ""),
        "HOST": _params.get("host", ""),
        "PORT": _params.get("port", ""),
    },
    # Not PostgreSQL: settings.AWA['DATABASE'] = "lite" must be refused.
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}

TASKS = {
    "default": {
        "BACKEND": "awa.contrib.django.AwaTaskBackend",
        "QUEUES": ["default", "reports"],
    },
    # Any queue, retries, a deadline of its own.
    "retrying": {
        "BACKEND": "awa.contrib.django.AwaTaskBackend",
        "QUEUES": [],
        "OPTIONS": {"MAX_ATTEMPTS": 3, "DEADLINE_DURATION": 60},
    },
}

# A fast worker for tests: quick polls, promotion, election and heartbeats.
_FAST_QUEUE = {"max_workers": 4, "poll_interval": 0.05}
AWA = {
    "QUEUES": {"default": _FAST_QUEUE, "reports": _FAST_QUEUE},
    "RUNTIME": {
        "promote_interval": 0.05,
        "leader_election_interval": 0.2,
        "heartbeat_interval": 0.2,
    },
    "SHUTDOWN_TIMEOUT": 10,
    "TASK_MODULES": ["django_project.awa_jobs"],
}

globals().update(json.loads(os.environ.get("AWA_TEST_OVERRIDES", "{}")))
