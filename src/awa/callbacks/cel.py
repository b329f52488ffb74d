"""CEL expressions of a callback, and the decision ``resolve_callback`` makes with them.

A callback may carry four expressions over one variable, ``payload`` (the JSON the outside
system sent): ``filter`` (false: ignore the payload), ``on_fail`` (true: fail the job),
``on_complete`` (true: complete it) and ``transform`` (the payload handed back on
completion). They are compiled when the callback is registered, so a bad expression fails
in the handler, not when the answer arrives.

Evaluating them needs the ``cel`` extra (``pip install 'awa-py[cel]'``): cel-python is
imported the first time an expression is compiled or a callback that has one is resolved,
and without it that raises ``awa.errors.MissingExtra`` saying so. Callbacks without
expressions never need it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from awa.core.extras import require_extra
from awa.core.kinds import dump_json
from awa.errors import ValidationError

if TYPE_CHECKING:
    import celpy
    from lark import Tree

VARIABLE = "payload"
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_CONSTANTS = frozenset({"true", "false", "null"})

Action = Literal["complete", "fail", "ignore"]


@functools.cache
def _celpy() -> ModuleType:
    """cel-python, imported on first use (MissingExtra without the ``cel`` extra)."""
    require_extra("cel", "a callback with CEL expressions")
    import celpy
    import celpy.adapter
    import celpy.evaluation

    return celpy


@functools.cache
def _environment() -> celpy.Environment:
    environment: celpy.Environment = _celpy().Environment()
    return environment


@functools.lru_cache(maxsize=1024)
def _program(source: str) -> Any:
    environment = _environment()
    return environment.program(environment.compile(source))


def check_expression(name: str, source: str | None) -> str | None:
    """Compile ``source``; ValidationError naming the expression when it is not valid CEL or
    refers to anything but ``payload``."""
    if source is None:
        return None
    if not isinstance(source, str) or not source.strip():
        raise ValidationError(f"invalid CEL expression for {name}: it must be a non-empty string")
    environment = _environment()  # outside the try: a missing extra is not a bad expression
    try:
        tree = environment.compile(source)
    except Exception as error:
        message = " ".join(str(error).split())
        raise ValidationError(f"invalid CEL expression for {name}: {message}") from None
    unknown = sorted(_free_identifiers(tree) - {VARIABLE})
    if unknown:
        raise ValidationError(
            f"invalid CEL expression for {name}: it refers to {', '.join(unknown)}; "
            f"the only variable is {VARIABLE!r}"
        )
    return source


def _free_identifiers(tree: Tree[Any]) -> set[str]:
    from lark import Token

    bound: set[str] = set()
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and len(node.children) >= 3:
            method, arguments = node.children[1], node.children[2]
            if isinstance(method, Token) and str(method) in _MACROS:
                bound |= _first_argument_identifier(arguments)
    found = set()
    for node in tree.iter_subtrees():
        if node.data == "ident":
            found.add(str(node.children[0]))
    return found - bound - _CONSTANTS


def _first_argument_identifier(arguments: Any) -> set[str]:
    from lark import Tree

    if isinstance(arguments, Tree) and arguments.children:
        first = arguments.children[0]
        if isinstance(first, Tree):
            for node in first.iter_subtrees():
                if node.data == "ident":
                    return {str(node.children[0])}
    return set()


def evaluate(source: str, payload: Any) -> Any:
    """Evaluate with ``payload`` bound; the result as plain JSON-like Python values.
    Raises on any compile or runtime error."""
    celpy = _celpy()
    result = _program(source).evaluate({VARIABLE: celpy.adapter.json_to_cel(payload)})
    if isinstance(result, celpy.evaluation.CELEvalError):
        raise result
    return _to_python(result)


def _to_python(value: Any) -> Any:
    celpy = _celpy()
    if isinstance(value, celpy.celtypes.BoolType):
        return bool(value)
    if isinstance(value, celpy.celtypes.IntType | celpy.celtypes.UintType):
        return int(value)
    if isinstance(value, celpy.celtypes.DoubleType | float):
        # celpy returns plain floats (and strings) from some operators, e.g. 2.0 * x.
        if not math.isfinite(value):
            raise TypeError("a NaN or infinite CEL result has no JSON form")
        return float(value)
    if isinstance(value, celpy.celtypes.StringType | str):
        return str(value)
    if isinstance(value, celpy.celtypes.MapType):
        return {str(_to_python(key)): _to_python(item) for key, item in value.items()}
    if isinstance(value, celpy.celtypes.ListType):
        return [_to_python(item) for item in value]
    if value is None:
        return None
    raise TypeError(f"a CEL result of type {type(value).__name__} has no JSON form")


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a payload: complete (with ``payload``), fail (with ``error`` and the
    matching ``expression``) or ignore (with ``reason``)."""

    action: Action
    payload: Any = None
    error: str | None = None
    expression: str | None = None
    reason: str | None = None


IGNORE_FILTERED = "filter expression returned false"
IGNORE_DEFAULT = "no expressions configured, default is ignore"
FAIL_DEFAULT = "callback failed: default action"
FAIL_MATCHED = "callback failed: on_fail expression matched"


def _is_true(source: str | None, payload: Any) -> bool:
    """An expression that errors (or is not a boolean) counts as false."""
    if source is None:
        return False
    try:
        return evaluate(source, payload) is True
    except Exception:
        return False


def decide(
    payload: Any,
    default_action: Action,
    *,
    filter: str | None,
    on_complete: str | None,
    on_fail: str | None,
    transform: str | None,
) -> Decision:
    """The resolve_callback decision: filter (fails open), then on_fail, then on_complete
    (with transform, which falls back to the payload), else the default action."""
    if any(source is not None for source in (filter, on_complete, on_fail, transform)):
        _celpy()  # a missing extra is an error, not an expression that evaluates to false
    if filter is not None:
        try:
            passed = evaluate(filter, payload)
        except Exception:
            passed = True  # a broken filter must not swallow callbacks
        if passed is False:
            return Decision("ignore", reason=IGNORE_FILTERED)
    if _is_true(on_fail, payload):
        return Decision("fail", error=FAIL_MATCHED, expression=on_fail)
    if _is_true(on_complete, payload):
        result = payload
        if transform is not None:
            try:
                result = evaluate(transform, payload)
                dump_json(result, "transform")  # storable as the job's output (no NUL)
            except Exception:
                result = payload
        return Decision("complete", payload=result)
    if default_action == "complete":
        return Decision("complete", payload=payload)
    if default_action == "fail":
        return Decision("fail", error=FAIL_DEFAULT)
    return Decision("ignore", reason=IGNORE_DEFAULT)
