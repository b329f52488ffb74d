"""The HTTP callback contract of the reference package (awa-pg), for interoperating with its
HTTP workers and callback receivers.

A reference HTTP worker registers a callback, then POSTs the job to a function endpoint with
the callback's URL (``{base}{prefix}/{callback_id}/complete``) and the header
``X-Awa-Signature``: the keyed BLAKE3 hash of the callback id under a shared 32-byte secret,
as lowercase hex. The function answers by POSTing to ``.../complete`` (``{"payload": ...}``),
``.../fail`` (``{"error": "..."}``) or ``.../heartbeat`` (``{"timeout_seconds": n}``) with the
same header. The signature covers the callback id only (not the body, not a timestamp).

``awa.callbacks.http.create_app(client, contract_secret=...)`` (``awa callback serve
--callback-hmac-secret``) receives such requests; this module signs, verifies and builds
URLs exactly as the reference does, so either side may be ours or theirs.
"""

from __future__ import annotations

import hmac
import re
import uuid
from collections.abc import Mapping
from typing import Any

import blake3

__all__ = [
    "ACTIONS",
    "DEFAULT_HEARTBEAT_TIMEOUT_SECS",
    "DEFAULT_PATH_PREFIX",
    "PATH_PREFIX_ENV_VAR",
    "SECRET_ENV_VAR",
    "SECRET_LENGTH",
    "SIGNATURE_HEADER",
    "build_callback_url",
    "function_request",
    "normalize_prefix",
    "parse_secret",
    "sign",
    "signature_headers",
    "signed_callback",
    "verify",
]

SIGNATURE_HEADER = "X-Awa-Signature"
"""The header carrying ``sign(secret, callback_id)``."""
DEFAULT_PATH_PREFIX = "/api/callbacks"
"""Where the reference's receivers mount ``{callback_id}/complete|fail|heartbeat``."""
DEFAULT_HEARTBEAT_TIMEOUT_SECS = 3600.0
"""The timeout a heartbeat without ``timeout_seconds`` sets, in seconds."""
SECRET_LENGTH = 32
"""Bytes in a signing secret (a BLAKE3 key)."""
SECRET_ENV_VAR = "AWA_CALLBACK_HMAC_SECRET"
"""The reference's variable for the secret, as 64 hex characters (the algorithm is keyed
BLAKE3 despite the name)."""
PATH_PREFIX_ENV_VAR = "AWA_CALLBACK_PATH_PREFIX"
"""The reference's variable for the receiver's path prefix."""
ACTIONS = ("complete", "fail", "heartbeat")
"""The actions the contract defines, in URL order."""

CallbackId = str | uuid.UUID
Secret = bytes | bytearray | memoryview

# Exactly what blake3::Hash::from_hex accepts: 64 ASCII hex digits of either case.
_SIGNATURE = re.compile(r"[0-9a-fA-F]{64}")
_HEX = re.compile(r"[0-9a-fA-F]*")
# Rust's str::trim strips the Unicode White_Space property, which differs from str.isspace
# (the latter also strips U+001C..U+001F): list the set to normalise prefixes identically.
_RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _key(secret: Secret) -> bytes:
    if isinstance(secret, str):
        raise TypeError("callback secret must be bytes (parse_secret() reads the hex form)")
    key = bytes(secret)
    if len(key) != SECRET_LENGTH:
        raise ValueError(f"callback secret must be exactly {SECRET_LENGTH} bytes (got {len(key)})")
    return key


def _digest(secret: Secret, callback_id: CallbackId) -> bytes:
    return blake3.blake3(str(callback_id).encode(), key=_key(secret)).digest()


def sign(secret: Secret, callback_id: CallbackId) -> str:
    """The signature of ``callback_id``: the lowercase hex of its keyed BLAKE3 hash (64
    characters). ``secret`` must be exactly 32 bytes, else ValueError."""
    return _digest(secret, callback_id).hex()


def verify(secret: Secret, callback_id: CallbackId, signature: str) -> bool:
    """Whether ``signature`` signs ``callback_id`` under ``secret``: 64 hex digits (either
    case) equal to the keyed hash, compared in constant time. Malformed hex, and an id
    that has no UTF-8 form, are False."""
    try:
        expected = _digest(secret, callback_id)
    except UnicodeEncodeError:
        return False  # a lone surrogate: no UTF-8 form, so nothing can have signed it
    if not isinstance(signature, str) or _SIGNATURE.fullmatch(signature) is None:
        return False
    return hmac.compare_digest(expected, bytes.fromhex(signature))


def normalize_prefix(prefix: str) -> str:
    """``prefix`` as the reference mounts it: surrounding whitespace and trailing slashes
    removed, one leading slash added when missing; empty (or blank) stays empty."""
    trimmed = prefix.strip(_RUST_WHITESPACE).rstrip("/")
    if not trimmed or trimmed.startswith("/"):
        return trimmed
    return "/" + trimmed


def build_callback_url(base: str, prefix: str, callback_id: CallbackId, action: str) -> str:
    """``{base}{prefix}/{callback_id}/{action}`` with the reference's slash rules: trailing
    slashes of ``base`` dropped, ``prefix`` normalised (``normalize_prefix``), ``action``
    (``"complete"``, ``"fail"`` or ``"heartbeat"``) appended as given."""
    return f"{base.rstrip('/')}{normalize_prefix(prefix)}/{callback_id}/{action}"


def parse_secret(text: str) -> bytes:
    """The 32-byte secret from its hex form (``AWA_CALLBACK_HMAC_SECRET``: 64 hex
    characters; surrounding whitespace is ignored). ValueError says what is wrong."""
    cleaned = text.strip()
    if _HEX.fullmatch(cleaned) is None or len(cleaned) % 2:
        raise ValueError("callback secret must be valid hex")
    if len(cleaned) != 2 * SECRET_LENGTH:
        raise ValueError(
            f"callback secret must be exactly {SECRET_LENGTH} bytes "
            f"({2 * SECRET_LENGTH} hex characters), got {len(cleaned)} characters"
        )
    return bytes.fromhex(cleaned)


def signature_headers(secret: Secret, callback_id: CallbackId) -> dict[str, str]:
    """``{"X-Awa-Signature": sign(secret, callback_id)}``: the header of every request
    about this callback, whether to the function or back to the receiver."""
    return {SIGNATURE_HEADER: sign(secret, callback_id)}


def signed_callback(
    secret: Secret,
    base: str,
    callback_id: CallbackId,
    *,
    prefix: str = DEFAULT_PATH_PREFIX,
    action: str = "complete",
) -> tuple[str, dict[str, str]]:
    """What a reference HTTP worker hands its function for a callback: the receiver's URL
    for ``action`` and the signature header to send with it."""
    url = build_callback_url(base, prefix, callback_id, action)
    return url, signature_headers(secret, callback_id)


def function_request(
    *,
    job_id: int,
    kind: str,
    args: Any,
    attempt: int,
    max_attempts: int,
    callback_id: CallbackId | None = None,
    callback_url: str | None = None,
) -> dict[str, Any]:
    """The JSON body a reference HTTP worker POSTs to its function endpoint, so that a
    function written for awa-pg can be driven from an awa handler. ``callback_id`` and
    ``callback_url`` are left out when None (the worker's synchronous mode)."""
    body: dict[str, Any] = {
        "job_id": job_id,
        "kind": kind,
        "args": dict(args) if isinstance(args, Mapping) else args,
        "attempt": attempt,
        "max_attempts": max_attempts,
    }
    if callback_id is not None:
        body["callback_id"] = str(callback_id)
    if callback_url is not None:
        body["callback_url"] = callback_url
    return body
