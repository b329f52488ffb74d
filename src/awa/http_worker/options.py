"""The settings of one HTTP handler, validated when it is built (at registration), so that a
bad URL or limit is refused with a message naming it, not discovered by the first job."""

from __future__ import annotations

import dataclasses
import math
import re
import urllib.parse
from collections.abc import Mapping
from typing import Literal

from awa.callbacks import contract as callback_contract
from awa.errors import ValidationError
from awa.lifecycle.staging import MAX_OUTPUT_BYTES

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "MODES",
    "Mode",
    "Options",
    "check_url",
]

Mode = Literal["sync", "async"]
MODES: tuple[Mode, ...] = ("sync", "async")
DEFAULT_TIMEOUT = 30.0
"""Seconds a request may take, from connecting to the last byte of the response."""
DEFAULT_MAX_CONNECTIONS = 10
"""Requests one handler (one kind) has in flight at once, per worker process."""
DEFAULT_MAX_RETRY_AFTER = 24 * 3600.0
"""The longest ``Retry-After`` honoured, in seconds; a longer one is cut to this."""
RESERVED_PREFIX = "x-awa-"
"""Header names awa sets itself (signatures, timestamps): refused in ``headers``."""
RESERVED_HEADERS = frozenset(
    {"accept-encoding", "content-length", "content-type", "host", "traceparent"}
)
"""Other headers awa sets (or the HTTP client does), refused in ``headers`` too."""

# RFC 9110 token characters: what a header name may be made of.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_UNSAFE_VALUE = re.compile(r"[\x00\r\n]")


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """One HTTP handler's settings (see ``awa.http_worker.HttpHandler`` for each)."""

    url: str
    mode: Mode
    timeout: float
    max_connections: int
    secret: bytes | None
    headers: tuple[tuple[str, str], ...]
    max_response_bytes: int
    max_retry_after: float
    callback_base_url: str | None
    callback_prefix: str
    callback_timeout: float
    contract_secret: bytes | None

    @property
    def shown_url(self) -> str:
        """The URL without credentials, query or fragment: what error messages name (a
        token in a query string must not end up in a job's stored errors)."""
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port is not None else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"


def check_url(field: str, value: object) -> str:
    """``value`` if it is an absolute http(s) URL with a host, else ValidationError naming
    ``field`` and the value."""
    if not isinstance(value, str):
        raise ValidationError(f"{field} must be a string URL, not {type(value).__name__}")
    if not value or value != value.strip() or any(ord(c) < 0x21 or c == "\x7f" for c in value):
        raise ValidationError(
            f"{field} {value!r} is not a URL (empty, or holds spaces or control characters)"
        )
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError as error:
        raise ValidationError(f"{field} {value!r} is not a valid URL: {error}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValidationError(f"{field} {value!r} must use http or https, not {parts.scheme!r}")
    if not parts.hostname:
        raise ValidationError(f"{field} {value!r} has no host")
    return value


def _positive(field: str, value: object, *, integer: bool = False) -> float:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        wanted = "a whole number" if integer else "a number of seconds"
        raise ValidationError(f"{field} must be {wanted}, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValidationError(f"{field} must be positive and finite, not {value!r}")
    return value


def _secret(field: str, value: str | bytes | None) -> bytes | None:
    if value is None:
        return None
    key = value.encode() if isinstance(value, str) else value
    if not isinstance(key, bytes | bytearray) or not key:
        raise ValidationError(f"{field} must be a non-empty str or bytes")
    return bytes(key)


def _contract_secret(value: str | bytes | None) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str | bytes | bytearray):
        raise ValidationError(
            f"contract_secret must be 32 bytes or 64 hex characters, not {value!r}"
        )
    try:
        key = callback_contract.parse_secret(value) if isinstance(value, str) else bytes(value)
        callback_contract.sign(key, "")  # ValueError unless the key is 32 bytes
    except ValueError as error:
        raise ValidationError(f"contract_secret: {error}") from None
    return key


def _headers(value: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ValidationError("headers must be a mapping of header names to values")
    checked = []
    for name, text in value.items():
        if not isinstance(name, str) or _TOKEN.fullmatch(name) is None:
            raise ValidationError(f"header name {name!r} is not a valid HTTP token")
        lowered = name.lower()
        if lowered.startswith(RESERVED_PREFIX) or lowered in RESERVED_HEADERS:
            raise ValidationError(f"header {name!r} is set by awa and cannot be given")
        if not isinstance(text, str) or _UNSAFE_VALUE.search(text) or not text.isascii():
            raise ValidationError(
                f"header {name!r} must be ASCII text without CR, LF or NUL, not {text!r}"
            )
        checked.append((name, text))
    return tuple(checked)


def build(
    url: str,
    *,
    mode: Mode,
    timeout: float,
    max_connections: int,
    secret: str | bytes | None,
    headers: Mapping[str, str] | None,
    max_response_bytes: int,
    max_retry_after: float,
    callback_base_url: str | None,
    callback_prefix: str,
    callback_timeout: float,
    contract_secret: str | bytes | None,
) -> Options:
    """Validated ``Options``; ValidationError names the first bad argument and its value."""
    if mode not in MODES:
        raise ValidationError(f"mode must be 'sync' or 'async', not {mode!r}")
    if mode == "async" and callback_base_url is None:
        raise ValidationError(
            "mode='async' needs callback_base_url: where the function reaches the receiver"
        )
    limit = int(_positive("max_response_bytes", max_response_bytes, integer=True))
    if limit > MAX_OUTPUT_BYTES:
        raise ValidationError(
            f"max_response_bytes must be at most {MAX_OUTPUT_BYTES} (awa.MAX_OUTPUT_BYTES, "
            f"the largest output a job stores), not {limit}"
        )
    if not isinstance(callback_prefix, str):
        raise ValidationError(f"callback_prefix must be a string, not {callback_prefix!r}")
    return Options(
        url=check_url("url", url),
        mode=mode,
        timeout=float(_positive("timeout", timeout)),
        max_connections=int(_positive("max_connections", max_connections, integer=True)),
        secret=_secret("secret", secret),
        headers=_headers(headers),
        max_response_bytes=limit,
        max_retry_after=float(_positive("max_retry_after", max_retry_after)),
        callback_base_url=(
            None if callback_base_url is None else check_url("callback_base_url", callback_base_url)
        ),
        callback_prefix=callback_contract.normalize_prefix(callback_prefix),
        callback_timeout=float(_positive("callback_timeout", callback_timeout)),
        contract_secret=_contract_secret(contract_secret),
    )
