"""Worker processes for the crash tests: start a script that prints ``ready`` once its
runtime runs, and kill it with SIGKILL."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path


def start_worker(script: Path, database_url: str) -> subprocess.Popen[str]:
    """Start the worker script and wait (with a deadline) until it says it is ready."""
    process = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        readable, _, _ = select.select([process.stdout], [], [], 0.1)
        if readable:
            line = process.stdout.readline()
            if line.strip() == "ready":
                return process
            if not line:
                break
    process.kill()
    process.wait(10)
    raise AssertionError(f"the worker did not start (exit code {process.returncode})")


def kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    assert process.stdout is not None
    process.stdout.close()
