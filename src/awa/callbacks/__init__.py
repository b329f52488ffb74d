"""External callbacks: a job parks (or its handler waits) until another system answers.

- ``wait``: the attempt's side: register a callback, park the job or wait for the answer.
- ``resolve``: the answers (complete, fail, retry, resume, resolve by CEL, heartbeat) as
  transitions on any connection, firing nothing (``awa.admin`` and the blocking client).
- ``resolution``: the same answers through an ``AsyncClient``, with follow-ups in the
  answer's transaction and hooks after it commits.
- ``cel``: the CEL expressions a callback may carry; ``http``: the HTTP receiver.

The names below are this package's public surface (``awa.callbacks.complete_external``...).
"""

from awa.callbacks.resolve import (
    DEFAULT_TIMEOUT,
    DefaultAction,
    ResolveResult,
    RetriedCallback,
    callback_uuid,
    check_timeout,
    complete_external,
    complete_flow,
    fail_external,
    fail_flow,
    heartbeat_callback,
    heartbeat_flow,
    resolve_callback,
    resolve_flow,
    resume_external,
    resume_flow,
    retry_external,
    retry_flow,
)
from awa.callbacks.wait import WAIT_POLL_SECONDS, new_token, register_statement, wait_for_callback

__all__ = [
    "DEFAULT_TIMEOUT",
    "WAIT_POLL_SECONDS",
    "DefaultAction",
    "ResolveResult",
    "RetriedCallback",
    "callback_uuid",
    "check_timeout",
    "complete_external",
    "complete_flow",
    "fail_external",
    "fail_flow",
    "heartbeat_callback",
    "heartbeat_flow",
    "new_token",
    "register_statement",
    "resolve_callback",
    "resolve_flow",
    "resume_external",
    "resume_flow",
    "retry_external",
    "retry_flow",
    "wait_for_callback",
]
