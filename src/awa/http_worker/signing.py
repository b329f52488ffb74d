"""Signed function requests: how a function knows that a POST comes from your workers.

With a shared ``secret``, every request an HTTP handler sends carries::

    X-Awa-Timestamp: <Unix seconds>
    X-Awa-Request-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>

over the body byte for byte. The path and host are left out on purpose: gateways in front
of serverless functions rewrite them. A function checks the headers with ``verify_request``
(or the three lines of HMAC it takes in any language) and refuses timestamps more than
``MAX_SKEW_SECONDS`` from its clock, which bounds replays.

This is not the callback contract's ``X-Awa-Signature`` (``awa.callbacks.contract``): that
one signs a callback id, and an async-mode function forwards it unchanged when it answers.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

__all__ = [
    "MAX_SKEW_SECONDS",
    "REQUEST_SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "RequestSignatureError",
    "sign_request",
    "verify_request",
]

TIMESTAMP_HEADER = "X-Awa-Timestamp"
REQUEST_SIGNATURE_HEADER = "X-Awa-Request-Signature"
MAX_SKEW_SECONDS = 300
"""Requests whose timestamp is further than this from the function's clock are refused."""
_PREFIX = "sha256="


class RequestSignatureError(Exception):
    """A function request's signature is missing, malformed, stale or wrong."""


def _mac(secret: str | bytes, timestamp: str, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("the request signing secret must not be empty")
    return hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def sign_request(
    secret: str | bytes, body: bytes, timestamp: float | None = None
) -> dict[str, str]:
    """The two signature headers for a request carrying ``body``."""
    stamp = str(int(time.time() if timestamp is None else timestamp))
    return {TIMESTAMP_HEADER: stamp, REQUEST_SIGNATURE_HEADER: _PREFIX + _mac(secret, stamp, body)}


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    if value is None:
        raise RequestSignatureError(f"missing {name} header")
    return value


def verify_request(
    secret: str | bytes,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float | None = None,
    max_skew: float = MAX_SKEW_SECONDS,
) -> None:
    """Raise RequestSignatureError unless ``headers`` (any mapping; names matched as given
    or in lower case) sign ``body`` with ``secret`` at a time within ``max_skew`` seconds
    of ``now``. The digest is compared in constant time."""
    stamp = _header(headers, TIMESTAMP_HEADER).strip()
    signature = _header(headers, REQUEST_SIGNATURE_HEADER).strip()
    if not stamp.isascii() or not stamp.isdigit():
        raise RequestSignatureError(f"{TIMESTAMP_HEADER} must be Unix seconds, not {stamp!r}")
    if abs((time.time() if now is None else now) - int(stamp)) > max_skew:
        raise RequestSignatureError(
            f"{TIMESTAMP_HEADER} is more than {max_skew:g} seconds from this clock"
        )
    if not signature.startswith(_PREFIX) or not signature.isascii():
        raise RequestSignatureError(f"{REQUEST_SIGNATURE_HEADER} must be sha256=<hex digest>")
    given = signature[len(_PREFIX) :].lower()
    if not hmac.compare_digest(_mac(secret, stamp, body), given):
        raise RequestSignatureError(f"{REQUEST_SIGNATURE_HEADER} does not match the body")
