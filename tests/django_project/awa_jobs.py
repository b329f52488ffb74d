"""Imported by the worker (settings.AWA TASK_MODULES): an awa task registered on the Django
integration's client, and receivers of the task signals that log them to the file
AWA_TEST_SIGNAL_LOG names."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

from django.db import connection

import awa
from awa.contrib.django import get_client

try:
    from django.tasks import signals
except ImportError:
    from django_tasks import signals


@dataclasses.dataclass
class Ping:
    text: str


@get_client().task(Ping, queue="default")
async def ping(job: awa.Job[Ping]) -> None:
    job.record_output({"pong": job.args.text})


def _recorder(name: str) -> Any:
    def receive(sender: type, task_result: Any, **kwargs: Any) -> None:
        path = os.environ.get("AWA_TEST_SIGNAL_LOG")
        if not path:
            return
        with connection.cursor() as cursor:  # receivers may use the ORM
            cursor.execute("SELECT 1")
        handling = sys.exc_info()[0]
        record = {
            "signal": name,
            "id": task_result.id,
            "status": str(task_result.status),
            "sender": sender.__name__,
            "handling": handling.__name__ if handling else None,
        }
        with open(path, "a") as log:
            log.write(json.dumps(record) + "\n")

    return receive


for _name in ("task_started", "task_finished"):
    getattr(signals, _name).connect(_recorder(_name), weak=False)
