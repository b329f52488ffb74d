"""An HTTP receiver for external callbacks: an ASGI app (Starlette) to mount in your web
app, or to run on its own with ``awa callback serve``. Needs the ``http`` extra
(``pip install 'awa-py[http]'``); without it, importing this module raises
``awa.errors.MissingExtra`` saying so.

Endpoints (``POST``, JSON bodies, every field optional unless noted)::

    /callbacks/{id}/complete   {"payload": ..., "run_lease": n}
    /callbacks/{id}/fail       {"error": "text" (required), "run_lease": n}
    /callbacks/{id}/retry      {"run_lease": n}
    /callbacks/{id}/resume     {"payload": ..., "run_lease": n}
    /callbacks/{id}/resolve    {"payload": ..., "default_action": "ignore", "run_lease": n}
    /callbacks/{id}/heartbeat  {"timeout_seconds": 3600}

Responses are JSON: the job's id and state after the transition (``resolve`` adds its
``outcome``); 404 when no job holds the callback (or no route has the path), 400 for bad
input, 401 for a missing or bad signature, 405 for a method other than POST, 413 for a body
over ``MAX_BODY_BYTES`` (refused without reading it: a declared length over the limit
before the first byte, a chunked body as it passes the limit), 500 when a follow-up failed
(the resolution was rolled back: send again). Errors are ``{"error": "what is wrong"}``.

Requests are signed with a shared secret: HMAC-SHA256 over
``timestamp + "." + METHOD + " " + path + "." + body``, sent as ``X-Awa-Timestamp`` (Unix
seconds) and ``X-Awa-Signature: sha256=<hex>``; timestamps more than five minutes off are
refused. ``sign_request`` builds the headers. Resolutions go through the given
``AsyncClient``: its lifecycle hooks and follow-ups fire as for a call in your code.

With ``contract_secret`` (32 bytes) the app also serves the reference package's contract
(``awa.callbacks.contract``), for its HTTP workers and the functions written for them::

    /api/callbacks/{id}/complete   {"payload": ...}
    /api/callbacks/{id}/fail       {"error": "text" (required)}
    /api/callbacks/{id}/heartbeat  {"timeout_seconds": 3600}

signed with ``X-Awa-Signature: <hex keyed BLAKE3 of the id>`` (always required there) and
answered as the reference answers: ``{"id": job id, "state": "Completed"}``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from awa.callbacks import ResolveResult, callback_uuid
from awa.callbacks import contract as callback_contract
from awa.callbacks.resolution import CallbackResolution
from awa.core.extras import missing_extra
from awa.errors import CallbackNotFound, DatabaseError, ValidationError
from awa.lifecycle.followups import FollowUpError
from awa.model import JobRow

try:
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
except ImportError as error:
    raise missing_extra("http", "awa.callbacks.http") from error

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_SKEW_SECONDS",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "SignatureError",
    "create_app",
    "sign_request",
    "verify_signature",
]

SIGNATURE_HEADER = "X-Awa-Signature"
TIMESTAMP_HEADER = "X-Awa-Timestamp"
MAX_SKEW_SECONDS = 300
"""Signed requests whose timestamp is further than this from the server's clock are refused."""
MAX_BODY_BYTES = 1024 * 1024
"""Largest request body, in bytes: a larger one is refused (413) without being read."""
MAX_BIGINT = 2**63 - 1
MAX_BODY_DEPTH = 64
"""Deepest nesting of arrays and objects a request body may have (payloads are stored as
jsonb and may go through CEL; nothing legitimate nests this deep)."""

Secret = str | bytes


class SignatureError(Exception):
    """The request's signature is missing, malformed, stale or wrong."""


def _key(secret: Secret) -> bytes:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("the callback secret must not be empty")
    return key


def _signed_bytes(timestamp: str, method: str, path: str, body: bytes) -> bytes:
    # surrogatepass: a path holding a lone surrogate gets bytes (that no sender signed)
    # instead of an encoding error.
    return f"{timestamp}.{method.upper()} {path}.".encode("utf-8", "surrogatepass") + body


def _digest(secret: Secret, timestamp: str, method: str, path: str, body: bytes) -> str:
    message = _signed_bytes(timestamp, method, path, body)
    return hmac.new(_key(secret), message, hashlib.sha256).hexdigest()


def sign_request(
    secret: Secret,
    method: str,
    path: str,
    body: bytes | str,
    timestamp: int | float | None = None,
) -> dict[str, str]:
    """The signature headers for a request: ``path`` as the server receives it (e.g.
    ``/callbacks/<id>/complete``, without scheme, host or query) and ``body`` exactly as
    sent."""
    raw = body.encode() if isinstance(body, str) else bytes(body)
    stamp = str(int(time.time() if timestamp is None else timestamp))
    return {
        TIMESTAMP_HEADER: stamp,
        SIGNATURE_HEADER: "sha256=" + _digest(secret, stamp, method, path, raw),
    }


def verify_signature(
    secret: Secret,
    method: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float | None = None,
) -> None:
    """Raise SignatureError unless ``headers`` carry a valid, fresh signature."""
    stamp, hex_digest = _signature_headers(headers, now)
    expected = _digest(secret, stamp, method, path, body)
    if not hmac.compare_digest(expected, hex_digest.strip().lower()):
        raise SignatureError("signature does not match")


def _signature_headers(headers: Mapping[str, str], now: float | None = None) -> tuple[str, str]:
    """The timestamp and the hex digest of a request's signature headers, checked for
    presence, form and freshness (what can be checked before the body is read)."""
    stamp = headers.get(TIMESTAMP_HEADER) or headers.get(TIMESTAMP_HEADER.lower())
    signature = headers.get(SIGNATURE_HEADER) or headers.get(SIGNATURE_HEADER.lower())
    if not stamp or not signature:
        raise SignatureError(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        raise SignatureError(f"{TIMESTAMP_HEADER} must be Unix seconds")
    current = time.time() if now is None else now
    if abs(current - int(stamp)) > MAX_SKEW_SECONDS:
        raise SignatureError(
            f"{TIMESTAMP_HEADER} is more than {MAX_SKEW_SECONDS} seconds from the server's clock"
        )
    scheme, _, hex_digest = signature.partition("=")
    if scheme != "sha256" or not hex_digest:
        raise SignatureError(f"{SIGNATURE_HEADER} must be sha256=<hex digest>")
    return stamp, hex_digest


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _job_json(job: JobRow) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "kind": job.kind,
        "queue": job.queue,
        "state": job.state.value,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "run_lease": job.run_lease,
        "callback_timeout_at": (
            job.callback_timeout_at.isoformat() if job.callback_timeout_at is not None else None
        ),
    }


# What each action accepts in its body, and how it resolves the callback.
_FIELDS: dict[str, frozenset[str]] = {
    "complete": frozenset({"payload", "run_lease"}),
    "fail": frozenset({"error", "run_lease"}),
    "retry": frozenset({"run_lease"}),
    "resume": frozenset({"payload", "run_lease"}),
    "resolve": frozenset({"payload", "default_action", "run_lease"}),
    "heartbeat": frozenset({"timeout_seconds"}),
}

Action = Callable[[CallbackResolution, str, dict[str, Any]], Awaitable[dict[str, Any]]]


async def _complete(client: CallbackResolution, cb: str, body: dict[str, Any]) -> dict[str, Any]:
    return _job_json(await client.complete_external(cb, body.get("payload"), body.get("run_lease")))


async def _fail(client: CallbackResolution, cb: str, body: dict[str, Any]) -> dict[str, Any]:
    error = body.get("error")
    if not isinstance(error, str) or not error:
        raise ValidationError('fail needs "error": a non-empty string')
    return _job_json(await client.fail_external(cb, error, body.get("run_lease")))


async def _retry(client: CallbackResolution, cb: str, body: dict[str, Any]) -> dict[str, Any]:
    return _job_json(await client.retry_external(cb, body.get("run_lease")))


async def _resume(client: CallbackResolution, cb: str, body: dict[str, Any]) -> dict[str, Any]:
    return _job_json(await client.resume_external(cb, body.get("payload"), body.get("run_lease")))


async def _resolve(client: CallbackResolution, cb: str, body: dict[str, Any]) -> dict[str, Any]:
    result: ResolveResult = await client.resolve_callback(
        cb, body.get("payload"), body.get("default_action", "ignore"), body.get("run_lease")
    )
    answer: dict[str, Any] = {"outcome": result.outcome, "reason": result.reason}
    if result.is_completed():
        answer["payload"] = result.payload
    if result.job is not None:
        answer.update(_job_json(result.job))
    return answer


async def _heartbeat(client: CallbackResolution, cb: str, body: dict[str, Any]) -> dict[str, Any]:
    timeout = body.get("timeout_seconds", 3600.0)
    return _job_json(await client.heartbeat_callback(cb, timeout))


_ACTIONS: dict[str, Action] = {
    "complete": _complete,
    "fail": _fail,
    "retry": _retry,
    "resume": _resume,
    "resolve": _resolve,
    "heartbeat": _heartbeat,
}


def _nesting_depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests arrays and objects, counted up to ``limit + 1`` (walked
    without recursion, so a hostile body cannot exhaust the stack)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children)
    return deepest


def _load_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        # orjson refuses nesting deeper than 1024 levels (the standard library would recurse
        # until RecursionError, a 500).
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        hint = ""
        if b"NaN" in raw or b"Infinity" in raw or "infinity" in str(error):
            hint = " (NaN and infinities are not JSON numbers)"
        raise ValidationError(f"the body is not valid JSON{hint}: {error}") from None
    if _nesting_depth(body, MAX_BODY_DEPTH) > MAX_BODY_DEPTH:
        raise ValidationError(f"the body nests arrays and objects deeper than {MAX_BODY_DEPTH}")
    if not isinstance(body, dict):
        raise ValidationError("the body must be a JSON object")
    return body


def _parse_body(raw: bytes, action: str) -> dict[str, Any]:
    body = _load_body(raw)
    unknown = sorted(set(body) - _FIELDS[action])
    if unknown:
        allowed = ", ".join(sorted(_FIELDS[action])) or "nothing"
        shown = ", ".join(_shown(name) for name in unknown[:5])
        raise ValidationError(f"{action} does not take {shown} (it takes {allowed})")
    _check_run_lease(body.get("run_lease"))
    return body


def _check_run_lease(run_lease: object) -> None:
    """A run_lease is a bigint counter of claims: a whole number from 0 up."""
    if run_lease is None:
        return
    if isinstance(run_lease, bool) or not isinstance(run_lease, int):
        raise ValidationError(
            f"run_lease must be a whole number, not {type(run_lease).__name__} "
            f"({_shown(run_lease)})"
        )
    if not 0 <= run_lease <= MAX_BIGINT:
        raise ValidationError(
            f"run_lease must be between 0 and {MAX_BIGINT}, got {_shown(run_lease)}"
        )


def _shown(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (with the full length) so that a hostile
    input does not fill the answer."""
    text = repr(value)
    if len(text) <= limit:
        return text
    length = f", {len(value)} characters" if isinstance(value, str) else ""
    return f"{text[:limit]}... (cut{length})"


def _callback_id(text: str) -> str:
    """The callback id of a path, checked before anything reaches the database."""
    if len(text) > 64:
        raise ValidationError(
            f"callback id is not a UUID: it is {len(text)} characters long (a UUID has 36)"
        )
    return callback_uuid(text)


# The reference's contract -------------------------------------------------------------------
# Its bodies, read as its receiver reads them: unknown fields are ignored, "error" is a
# required string, "timeout_seconds" a number defaulting to an hour. No run_lease.


def _contract_state(job: JobRow) -> str:
    # The reference answers with its state's Rust name: "WaitingExternal", "Completed".
    return "".join(part.capitalize() for part in job.state.value.split("_"))


async def _contract_complete(client: CallbackResolution, cb: str, body: dict[str, Any]) -> JobRow:
    return await client.complete_external(cb, body.get("payload"))


async def _contract_fail(client: CallbackResolution, cb: str, body: dict[str, Any]) -> JobRow:
    error = body.get("error")
    if not isinstance(error, str):
        raise ValidationError('fail needs "error": a string')
    return await client.fail_external(cb, error)


async def _contract_heartbeat(client: CallbackResolution, cb: str, body: dict[str, Any]) -> JobRow:
    timeout = body.get("timeout_seconds", callback_contract.DEFAULT_HEARTBEAT_TIMEOUT_SECS)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ValidationError("timeout_seconds must be a finite, non-negative number")
    return await client.heartbeat_callback(cb, timeout)


ContractAction = Callable[[CallbackResolution, str, dict[str, Any]], Awaitable[JobRow]]

_CONTRACT_ACTIONS: dict[str, ContractAction] = {
    "complete": _contract_complete,
    "fail": _contract_fail,
    "heartbeat": _contract_heartbeat,
}


async def _answer(action: str, run: Callable[[], Awaitable[JSONResponse]]) -> JSONResponse:
    """``run()``'s response, or the error's status: 404 no such callback, 400 bad input,
    500 a follow-up failed (rolled back), 503 the database is unreachable."""
    try:
        return await run()
    except CallbackNotFound as error:
        return _error(404, str(error))
    except ValidationError as error:
        return _error(400, str(error))
    except FollowUpError as error:
        return _error(
            500, f"a follow-up failed, so the {action} was rolled back (send it again): {error}"
        )
    except DatabaseError as error:
        return _error(503, str(error))


def _too_large(message: str) -> JSONResponse:
    # Connection: close makes the server drop the connection instead of reading (and
    # discarding) the rest of the body.
    return JSONResponse(
        {"error": message},
        status_code=413,
        headers={"Connection": "close"},
    )


def _refuse_declared_length(request: Request) -> JSONResponse | None:
    """The answer refusing the request's Content-Length, if it must be: 400 when it is not
    a whole number of bytes, 413 when it is over the limit."""
    values = request.headers.getlist("content-length")
    if not values:
        return None
    text = values[0].strip()
    if any(other.strip() != text for other in values[1:]):
        return _error(400, "the request has conflicting Content-Length headers")
    if not (text.isascii() and text.isdigit()):
        return _error(400, f"Content-Length must be a whole number of bytes, not {_shown(text)}")
    if len(text) > len(str(MAX_BODY_BYTES)) or int(text) > MAX_BODY_BYTES:
        shown = text if len(text) <= 30 else f"a {len(text)}-digit number of"
        return _too_large(
            f"the body is declared as {shown} bytes; the limit is {MAX_BODY_BYTES} bytes"
        )
    return None


async def _read_body(request: Request) -> bytes | JSONResponse:
    """The request's body, read as it arrives and never beyond ``MAX_BODY_BYTES``: a
    declared length over the limit is refused before reading, an undeclared (chunked) body
    as soon as it passes the limit."""
    refused = _refuse_declared_length(request)
    if refused is not None:
        return refused
    received = bytearray()
    try:
        async for chunk in request.stream():
            received += chunk
            if len(received) > MAX_BODY_BYTES:
                return _too_large(f"the body is larger than the limit of {MAX_BODY_BYTES} bytes")
    except ClientDisconnect:
        return _error(400, "the client disconnected before the end of the body")
    return bytes(received)


def _contract_route(client: CallbackResolution, secret: bytes, prefix: str) -> Route:
    async def receive(request: Request) -> JSONResponse:
        callback_id = request.path_params["callback_id"]
        action = request.path_params["action"]
        if action not in _CONTRACT_ACTIONS:
            return _error(
                404, f"unknown action {_shown(action)}: use one of complete, fail, heartbeat"
            )
        # The signature first: an unsigned sender learns nothing, not even a bad body. It
        # covers the id only, so it is checked before the body is read.
        signature = request.headers.get(callback_contract.SIGNATURE_HEADER)
        if signature is None:
            return _error(401, f"missing {callback_contract.SIGNATURE_HEADER} header")
        if not callback_contract.verify(secret, callback_id, signature):
            return _error(401, "invalid callback signature")
        raw = await _read_body(request)
        if isinstance(raw, JSONResponse):
            return raw

        async def run() -> JSONResponse:
            body = _load_body(raw)
            job = await _CONTRACT_ACTIONS[action](client, _callback_id(callback_id), body)
            return JSONResponse({"id": job.id, "state": _contract_state(job)})

        return await _answer(action, run)

    return Route(prefix + "/{callback_id}/{action}", receive, methods=["POST"])


def create_app(
    client: CallbackResolution,
    *,
    secret: Secret | None = None,
    allow_unsigned: bool = False,
    prefix: str = "/callbacks",
    contract_secret: bytes | None = None,
    contract_prefix: str = callback_contract.DEFAULT_PATH_PREFIX,
) -> Starlette:
    """The callback receiver as an ASGI app. Mount it in your own app (Starlette's
    ``Mount``, FastAPI's ``app.mount``) or serve it with uvicorn.

    ``secret`` is the shared signing key; without one, ``allow_unsigned=True`` must say
    that unsigned requests are fine (a private network, a proxy that authenticates). With
    both, unsigned requests pass and signed ones must be valid. The client is not closed
    by the app: close it when your app shuts down.

    ``contract_secret`` (32 bytes, ``awa.callbacks.contract.parse_secret`` reads the hex
    form) adds the reference's routes under ``contract_prefix``, every request signed with
    it; given alone, without ``secret`` or ``allow_unsigned``, the app serves those routes
    only. The two prefixes must differ.
    """
    contract = contract_secret is not None
    native = secret is not None or allow_unsigned
    if not native and not contract:
        raise ValueError(
            "give the callback secret, or allow_unsigned=True to accept any request "
            "(or contract_secret= to serve only the reference's signed routes)"
        )
    if secret is not None:
        _key(secret)
    routes: list[Route] = []
    if native:
        prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        routes.append(
            Route(
                prefix + "/{callback_id}/{action}",
                _receiver(client, secret, allow_unsigned),
                methods=["POST"],
            )
        )
    if contract_secret is not None:
        callback_contract.sign(contract_secret, "")  # a key of the wrong size fails now
        key = bytes(contract_secret)
        contract_prefix = callback_contract.normalize_prefix(contract_prefix)
        if native and contract_prefix == prefix:
            raise ValueError(
                f"prefix and contract_prefix are both {prefix or '/'!r}: give them different paths"
            )
        routes.append(_contract_route(client, key, contract_prefix))
    return Starlette(routes=routes, exception_handlers=_http_errors(routes))


def _http_errors(routes: list[Route]) -> dict[Any, Any]:
    """JSON answers, naming what is wrong, for a path no route serves (404) and a method
    other than POST (405)."""
    served = " and ".join(f"POST {route.path}" for route in routes)

    async def not_found(request: Request, error: Exception) -> JSONResponse:
        path = _shown(request.url.path, limit=200)
        return _error(404, f"no callback endpoint at {path}: use {served}")

    async def not_allowed(request: Request, error: Exception) -> JSONResponse:
        return JSONResponse(
            {"error": f"method {_shown(request.method)} is not allowed: callbacks are POSTed"},
            status_code=405,
            headers={"Allow": "POST"},
        )

    return {404: not_found, 405: not_allowed}


def _receiver(
    client: CallbackResolution, secret: Secret | None, allow_unsigned: bool
) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def receive(request: Request) -> JSONResponse:
        callback_id = request.path_params["callback_id"]
        action = request.path_params["action"]
        if action not in _ACTIONS:
            return _error(404, f"unknown action {_shown(action)}: use one of {', '.join(_ACTIONS)}")
        signed = SIGNATURE_HEADER in request.headers or TIMESTAMP_HEADER in request.headers
        key = secret if signed or not allow_unsigned else None
        if key is not None:
            # What can be checked without the body (presence, form, freshness) is, so that
            # an unsigned sender never makes the receiver read a body.
            try:
                _signature_headers(request.headers)
            except SignatureError as error:
                return _error(401, str(error))
        raw = await _read_body(request)
        if isinstance(raw, JSONResponse):
            return raw
        if key is not None:
            try:
                verify_signature(key, request.method, request.url.path, raw, request.headers)
            except SignatureError as error:
                return _error(401, str(error))

        async def run() -> JSONResponse:
            cb = _callback_id(callback_id)
            answer = await _ACTIONS[action](client, cb, _parse_body(raw, action))
            return JSONResponse({"callback_id": callback_id, "action": action, **answer})

        return await _answer(action, run)

    return receive
