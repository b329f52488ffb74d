"""Job kinds and the conversion of job args to and from JSON.

Args may be a dataclass instance, a pydantic model or a dict. Dataclasses and other annotated
types go through pydantic's TypeAdapter, so nested dataclasses, datetimes, UUIDs and enums
round-trip instead of coming back as strings.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import orjson
import pydantic
import pydantic_core

from awa.errors import ValidationError

T = TypeVar("T")

_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


@functools.lru_cache(maxsize=4096)
def derive_kind(name: str) -> str:
    """The kind of an args class from its name: ``SMTPEmail`` -> ``smtp_email``.

    An underscore goes before an uppercase letter that follows a lowercase letter or digit,
    and before an uppercase letter that follows another and precedes a lowercase one.
    """
    return _BOUNDARY.sub("_", name).lower()


def kind_for(args: object, kind: str | None) -> str:
    """The kind to insert ``args`` under: the explicit one, else derived from its class."""
    if kind is not None:
        return kind
    if isinstance(args, Mapping):
        raise ValidationError(
            "kind is required when args is a plain dict: pass kind='...' "
            "(a class's kind is derived from its name)"
        )
    return derive_kind(type(args).__name__)


@functools.cache
def _adapter(args_type: type[Any]) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(args_type)


def args_to_json_value(args: object) -> dict[str, Any]:
    """Convert job args to a JSON object (a dict of JSON values)."""
    return encode_args(args_encoder(type(args)), args)


Encoder = Callable[[Any], dict[str, Any]]


def args_encoder(args_type: type[Any]) -> Encoder:
    """The encoder for args of this type (see ``encoder_for``), or a ValidationError."""
    try:
        return encoder_for(cast(Any, args_type))
    except pydantic.PydanticSchemaGenerationError as error:
        raise ValidationError(f"job args cannot be converted to JSON: {error}") from None


def encode_args(encoder: Encoder, args: object) -> dict[str, Any]:
    """Run an encoder from ``args_encoder``; a value it cannot serialize is a ValidationError."""
    try:
        return encoder(args)
    except (
        pydantic_core.PydanticSerializationError,
        pydantic.PydanticSchemaGenerationError,
    ) as error:
        raise ValidationError(f"job args cannot be converted to JSON: {error}") from None


@functools.cache
def encoder_for(args_type: type[Any]) -> Encoder:
    """The function that turns args of this type into JSON values (looked up once per
    type: bulk inserts encode tens of thousands of args a second)."""
    if issubclass(args_type, pydantic.BaseModel):
        return lambda args: cast(dict[str, Any], args.model_dump(mode="json"))
    if dataclasses.is_dataclass(args_type):
        adapter = _adapter(args_type)
        serializer = adapter.serializer
        if isinstance(serializer, pydantic_core.SchemaSerializer):
            # The core serializer directly: the adapter's wrapper doubles the cost of a
            # small job's encoding.
            return lambda args: cast(dict[str, Any], serializer.to_python(args, mode="json"))
        return lambda args: cast(dict[str, Any], adapter.dump_python(args, mode="json"))
    if issubclass(args_type, Mapping):
        return _identity
    return _reject


def _reject(args: Any) -> dict[str, Any]:
    raise ValidationError(
        "job args must be a dataclass instance, a pydantic model or a dict, "
        f"not {type(args).__name__}"
    )


def decode_args(args_type: type[T] | None, value: Any) -> T:
    """Build ``args_type`` from the stored JSON args (``dict``/None returns the JSON)."""
    return cast(T, decoder_for(cast(Any, args_type))(value))


def _identity(value: Any) -> Any:
    return value


@functools.cache
def decoder_for(args_type: Any) -> Callable[[Any], Any]:
    """The function that decodes stored JSON args into ``args_type`` (looked up once per
    type: the claim path decodes thousands of jobs a second)."""
    if args_type is None or args_type is dict or args_type is Any:
        return _identity
    if isinstance(args_type, type) and issubclass(args_type, pydantic.BaseModel):
        return args_type.model_validate
    adapter = _adapter(args_type)
    validator = adapter.validator
    if isinstance(validator, pydantic_core.SchemaValidator):
        return validator.validate_python  # without the adapter's wrapper, as in encoder_for
    return adapter.validate_python


def dump_json(value: object, field: str, *, sort_keys: bool = False) -> str:
    """Serialize to compact JSON, refusing NaN/Infinity and NUL bytes with a clear error.

    With ``sort_keys`` the output is canonical (sorted keys, compact, raw UTF-8), the form
    unique keys are hashed over.
    """
    try:
        raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except TypeError as error:
        raise ValidationError(f"{field} cannot be converted to JSON: {error}") from None
    # orjson writes NaN and infinities as null: only output with a null can hide one, and
    # most args have none, so the walk over the value is skipped for them.
    if b"null" in raw:
        bad_float = _find_non_finite(value, field)
        if bad_float is not None:
            raise ValidationError(f"{bad_float} is NaN or infinite, which JSON cannot represent")
    text = raw.decode()
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        path = _find_nul(value, field) or field
        raise ValidationError(f"{path} contains a NUL byte, which Postgres cannot store")
    return text


def _find_non_finite(value: object, path: str) -> str | None:
    """The path of the first NaN or infinite float (orjson would silently write null).

    Subclasses count: orjson serializes dict and list subclasses (OrderedDict, defaultdict)
    like their bases, so a NaN inside one would otherwise be stored as null.
    """
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, _CONTAINERS_AND_FLOATS):
                found = _find_non_finite(item, f"{path}[{key!r}]")
                if found:
                    return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(cast(list[Any], value)):
            if isinstance(item, _CONTAINERS_AND_FLOATS):
                found = _find_non_finite(item, f"{path}[{index}]")
                if found:
                    return found
    return None


_CONTAINERS_AND_FLOATS = (float, dict, list, tuple)


# A JSON escape \u0000 preceded by an even number of backslashes (an odd number would make
# it an escaped backslash followed by the literal text "u0000").
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _find_nul(value: object, path: str) -> str | None:
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                return f"{path} key {key!r}"
            found = _find_nul(item, f"{path}[{key!r}]")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _find_nul(item, f"{path}[{index}]")
            if found:
                return found
    return None
