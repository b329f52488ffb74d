"""The settings of ``awa worker``: flags, ``AWA_*`` environment variables and a TOML file.

One scheme for everything ``start()`` takes:

- Every runtime setting of ``start()`` (``awa.RuntimeConfig``) is a flag named after it
  (``--heartbeat-interval 10``), an environment variable (``AWA_HEARTBEAT_INTERVAL=10``) and
  a key of the file's ``[worker]`` table (``heartbeat_interval = 10``). Durations are
  seconds; ``none`` turns off an optional one (``--cancel-grace none``); switches take
  ``true`` or ``false`` (``--dlq-enabled true``).
- Queues: ``--queue email=4`` (repeatable; ``AWA_QUEUES="email=4 billing=2"``) and per-queue
  settings ``--queue-option email.deadline_duration=60`` (``AWA_QUEUE_OPTIONS``), or a
  ``[queues.email]`` table in the file (``max_workers = 4``, ``deadline_duration = 60``,
  ``retry = { base = 3, max_delay = 3600 }``). Queues named by flags or the environment
  replace the file's list (keeping the file's settings for the queues they name).
- The file is ``--config PATH`` (or ``AWA_CONFIG``); its ``[worker]`` table may also name the
  client (``client = "myapp.jobs:client"``) and the command's own settings
  (``shutdown_timeout``, ``log_level``, ``log_format``).

A flag or environment variable wins over the file, which wins over the defaults.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from awa.errors import ValidationError
from awa.observability.log_format import LogFormat
from awa.worker.config import QueueConfig, RetryPolicy, RuntimeConfig

RUNTIME_HELP: dict[str, str] = {
    "heartbeat_interval": "Seconds between heartbeats of running jobs.",
    "heartbeat_staleness": "Seconds without a heartbeat before a running job is rescued.",
    "promote_interval": "Seconds between promotions of due scheduled and retryable jobs.",
    "promote_batch_size": "Jobs promoted per statement.",
    "leader_election_interval": "Seconds between attempts to become the maintenance leader.",
    "leader_check_interval": "Seconds between checks that the leader still holds its lock.",
    "completion_batch_size": "Completions committed per statement at most.",
    "completion_linger": "Seconds a completion waits for others to share its statement.",
    "sync_handler_threads": "Threads for plain def handlers ('none': one per slot of the "
    "queues run).",
    "heartbeat_rescue_interval": "Seconds between sweeps for jobs whose heartbeat went stale.",
    "deadline_rescue_interval": "Seconds between sweeps for attempts past their deadline.",
    "callback_rescue_interval": "Seconds between sweeps for expired callbacks.",
    "rescue_batch_size": "Jobs rescued per sweep at most.",
    "completed_retention": "Seconds completed (and cancelled) jobs are kept (default 1 day).",
    "failed_retention": "Seconds failed jobs are kept (default 7 days).",
    "cleanup_interval": "Seconds between retention sweeps.",
    "cleanup_batch_size": "Jobs deleted per retention statement.",
    "vacuum_interval": "Seconds between dead-row checks of the job tables (0: never vacuum).",
    "vacuum_threshold": "Dead rows in a job table that make the leader vacuum it.",
    "ring_rotation_interval": "Seconds between the leader's checks whether to rotate the "
    "active jobs' storage ring.",
    "cron_interval": "Seconds between the leader's evaluations of periodic-job schedules.",
    "cancel_grace": "Seconds a cancelled or rescued async handler has before it is "
    "interrupted ('none': never interrupt).",
    "global_max_workers": "Handler slots shared by weight among the queues given min_workers "
    "('none': every queue keeps its max_workers).",
    "priority_aging_interval": "Seconds an available job waits before the leader raises its "
    "priority one level (0: no aging).",
    "queue_sample_interval": "Seconds between the leader's counts of each queue's jobs for the "
    "queue gauges (stretched on a large backlog).",
    "override_refresh_interval": "Seconds between each worker's reads of the live queue "
    "overrides (a notification applies a change sooner).",
    "dlq_enabled": "Move jobs that fail for good to the dead-letter queue (true/false), in the "
    "queues that do not set dlq_enabled themselves.",
    "dlq_retention": "Seconds a dead-letter queue entry is kept (default 30 days).",
    "descriptor_retention": "Seconds a queue's or kind's descriptor is kept after a worker last "
    "ran or declared it (0: for ever; default 30 days).",
    "override_log_retention": "Seconds an entry of the queue override change log is kept "
    "(0: for ever; default 365 days).",
}

QUEUE_KEYS = frozenset(
    field.name for field in dataclasses.fields(QueueConfig) if field.name not in ("name", "retry")
)
RETRY_KEYS = frozenset(field.name for field in dataclasses.fields(RetryPolicy))
COMMAND_KEYS = frozenset(
    {"client", "shutdown_timeout", "log_level", "log_format", "metrics_port", "metrics_host"}
)
RUNTIME_KEYS = frozenset(field.name for field in dataclasses.fields(RuntimeConfig))

_TYPES: dict[str, str] = {
    **{field.name: str(field.type) for field in dataclasses.fields(RuntimeConfig)},
    **{field.name: str(field.type) for field in dataclasses.fields(QueueConfig)},
    **{f"retry.{field.name}": str(field.type) for field in dataclasses.fields(RetryPolicy)},
}


def runtime_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def runtime_envvar(name: str) -> str:
    return "AWA_" + name.upper()


def parse_value(name: str, text: str) -> Any:
    """A setting given as text (a flag or an environment variable), as its type."""
    kind = _TYPES[name]
    optional = kind.endswith("| None")
    if kind.startswith("bool"):
        return _parse_bool(name, text, optional)
    if optional and text.strip().lower() in ("none", "off", ""):
        return None
    if name == "rate_limit":
        # "50" (per second, burst 50) or "50/10" (burst 10).
        rate, _, burst = text.partition("/")
        try:
            return (float(rate), int(burst) if burst.strip() else 0)
        except ValueError:
            raise ValidationError(
                f"rate_limit must be 'RATE' or 'RATE/BURST' (jobs per second, burst), got {text!r}"
            ) from None
    try:
        if kind.startswith("int"):
            return int(text)
        value = float(text)
    except ValueError:
        expected = "an integer" if kind.startswith("int") else "a number of seconds"
        raise ValidationError(f"{name} must be {expected}, got {text!r}") from None
    if not math.isfinite(value):
        raise ValidationError(f"{name} must be a finite number, got {text!r}")
    return value


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _parse_bool(name: str, text: str, optional: bool) -> bool | None:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    if optional and word in ("none", ""):
        return None
    raise ValidationError(f"{name} must be true or false, got {text!r}")


@dataclasses.dataclass
class WorkerSettings:
    """What ``awa worker`` runs: the client, ``start()``'s queues and runtime options, and
    the command's own settings. ``queues`` is the set of queues to run with their settings
    (None: every queue the tasks declare); ``queue_options`` refine queues by name."""

    client: str | None = None
    queues: dict[str, dict[str, Any]] | None = None
    queue_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    runtime: dict[str, Any] = dataclasses.field(default_factory=dict)
    shutdown_timeout: float = 30.0
    log_level: str = "INFO"
    log_format: LogFormat = "text"
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"

    def check(self) -> None:
        """Build the configs now, so that a bad value fails before anything starts."""
        RuntimeConfig.from_options(self.runtime)
        for name in set(self.queues or {}) | set(self.queue_options):
            QueueConfig(name, **_queue_kwargs(self._options(name)))

    def _options(self, name: str) -> dict[str, Any]:
        base = dict((self.queues or {}).get(name, {}))
        extra = self.queue_options.get(name, {})
        retry = {**base.get("retry", {}), **extra.get("retry", {})}
        base.update(extra)
        if retry:
            base["retry"] = retry
        return base

    def start_queues(self, declared: Iterable[str]) -> dict[str, dict[str, Any]] | None:
        """``start()``'s queues argument; None: every queue the tasks declare, as they are.
        With ``global_max_workers`` the declared queues are named (weighted mode takes a
        dict: each queue then shares the slots with the default minimum and weight)."""
        weighted = self.runtime.get("global_max_workers") is not None
        if self.queues is None and not self.queue_options and not weighted:
            return None
        names = list(self.queues) if self.queues is not None else list(dict.fromkeys(declared))
        stray = sorted(set(self.queue_options) - set(names))
        if stray:
            raise ValidationError(
                f"queue settings given for {stray}, which this worker does not run "
                f"(it runs {', '.join(names)})"
            )
        return {name: _queue_kwargs(self._options(name)) for name in names}


def _queue_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = {key: value for key, value in options.items() if key != "retry"}
    retry = options.get("retry")
    if retry:
        kwargs["retry"] = RetryPolicy(**retry)
    return kwargs


def load_file(path: Path) -> dict[str, Any]:
    """Read and check a settings file; ValidationError names what is wrong."""
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as error:
        raise ValidationError(f"cannot read the settings file {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ValidationError(f"the settings file {path} is not valid TOML: {error}") from None
    unknown = sorted(set(data) - {"worker", "queues"})
    if unknown:
        raise ValidationError(f"{path}: unknown table(s) {unknown}; expected [worker], [queues]")
    worker = _table(data.get("worker", {}), f"{path}: [worker]")
    allowed = RUNTIME_KEYS | COMMAND_KEYS
    unknown = sorted(set(worker) - allowed)
    if unknown:
        raise ValidationError(
            f"{path}: unknown key(s) {unknown} in [worker]; "
            f"valid keys: {', '.join(sorted(allowed))}"
        )
    queues = _table(data.get("queues", {}), f"{path}: [queues]")
    for name, options in queues.items():
        where = f"{path}: [queues.{name}]"
        options = _table(options, where)
        unknown = sorted(set(options) - QUEUE_KEYS - {"retry"})
        if unknown:
            raise ValidationError(
                f"{where}: unknown key(s) {unknown}; valid keys: "
                f"{', '.join(sorted(QUEUE_KEYS | {'retry'}))}"
            )
        retry = _table(options.get("retry", {}), f"{where} retry")
        unknown = sorted(set(retry) - RETRY_KEYS)
        if unknown:
            raise ValidationError(
                f"{where}: unknown retry key(s) {unknown}; valid: {', '.join(sorted(RETRY_KEYS))}"
            )
    return data


def _table(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(f"{where} must be a table")
    return value


def parse_queue(text: str) -> tuple[str, int | None]:
    """``NAME`` or ``NAME=MAX_WORKERS``."""
    name, sep, workers = text.partition("=")
    name = name.strip()
    if not name:
        raise ValidationError(f"--queue takes NAME or NAME=MAX_WORKERS, got {text!r}")
    if not sep:
        return name, None
    try:
        count = int(workers)
    except ValueError:
        raise ValidationError(
            f"--queue {text!r}: MAX_WORKERS must be a positive integer, got {workers!r}"
        ) from None
    if count < 1:
        raise ValidationError(f"--queue {text!r}: MAX_WORKERS must be at least 1")
    return name, count


def parse_queue_option(text: str) -> tuple[str, str, Any]:
    """``QUEUE.KEY=VALUE`` (``KEY`` may be ``retry.base`` and the like)."""
    target, sep, value = text.partition("=")
    queue, dot, key = target.rpartition(".") if "retry." not in target else _split_retry(target)
    if not (sep and dot and queue and key):
        raise ValidationError(f"--queue-option takes QUEUE.KEY=VALUE, got {text!r}")
    valid = sorted(QUEUE_KEYS | {f"retry.{name}" for name in RETRY_KEYS})
    if key not in valid:
        raise ValidationError(
            f"--queue-option {text!r}: unknown queue setting {key!r}; valid: {', '.join(valid)}"
        )
    return queue, key, parse_value(key, value)


def _split_retry(target: str) -> tuple[str, str, str]:
    queue, _, rest = target.partition(".retry.")
    return queue, ".", f"retry.{rest}"


def resolve(
    *,
    config: Path | None,
    client: str | None,
    queues: Iterable[str],
    queue_options: Iterable[str],
    runtime: Mapping[str, str | None],
    shutdown_timeout: float | None,
    log_level: str | None,
    log_format: str | None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
) -> WorkerSettings:
    """Settings from the file (if any) overlaid with what flags and the environment gave
    (``runtime``: setting name -> its text, None when not given)."""
    data = load_file(config) if config is not None else {}
    worker: dict[str, Any] = dict(data.get("worker", {}))
    settings = WorkerSettings(
        client=client or worker.get("client"),
        shutdown_timeout=_first(shutdown_timeout, worker.get("shutdown_timeout"), 30.0),
        log_level=str(_first(log_level, worker.get("log_level"), "INFO")),
    )
    chosen_format = _first(log_format, worker.get("log_format"), "text")
    if chosen_format not in ("text", "json"):
        raise ValidationError(f"log_format must be 'text' or 'json', got {chosen_format!r}")
    settings.log_format = chosen_format
    port = _first(metrics_port, worker.get("metrics_port"), -1)
    if isinstance(port, bool) or not isinstance(port, int) or not -1 <= port <= 65535:
        raise ValidationError(f"metrics_port must be a port number (0-65535), got {port!r}")
    settings.metrics_port = None if port == -1 else port
    settings.metrics_host = str(_first(metrics_host, worker.get("metrics_host"), "0.0.0.0"))
    settings.runtime = {key: value for key, value in worker.items() if key in RUNTIME_KEYS}
    for name, text in runtime.items():
        if text is not None:
            settings.runtime[name] = parse_value(name, text)

    file_queues: dict[str, dict[str, Any]] = {
        name: dict(options) for name, options in data.get("queues", {}).items()
    }
    named = [parse_queue(text) for text in queues]
    if named:
        # Queues named by flags or the environment replace the file's list, keeping the
        # file's settings for the queues they name.
        settings.queues = {}
        for name, workers in named:
            options = dict(file_queues.get(name, {}))
            if workers is not None:
                options["max_workers"] = workers
            settings.queues[name] = options
    elif file_queues:
        settings.queues = file_queues
    for text in queue_options:
        name, key, value = parse_queue_option(text)
        options = settings.queue_options.setdefault(name, {})
        if key.startswith("retry."):
            options.setdefault("retry", {})[key.removeprefix("retry.")] = value
        else:
            options[key] = value
    if not math.isfinite(settings.shutdown_timeout) or settings.shutdown_timeout < 0:
        raise ValidationError(
            f"shutdown_timeout must be a number of seconds >= 0, got {settings.shutdown_timeout}"
        )
    return settings


def _first(*values: Any) -> Any:
    return next(value for value in values if value is not None)
