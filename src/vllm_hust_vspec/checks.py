"""The field checks every loader uses (settings, cost tables, profiles, calibration grids,
traces, manifests).

Each check takes the value, where it came from (``source``: a file, flag or env var) and
its ``field`` (a key, ``a.b`` or ``a[3]``), and raises ``error(source, field, message)``
-- by default :class:`~vllm_hust_vspec.errors.VspecError`; loaders pass their own subclass,
which renders the line in its format.  The ``is_*`` predicates raise nothing.

Imports only :mod:`.errors` of ours.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Collection, Mapping
from typing import Any

from vllm_hust_vspec.errors import VspecError

ErrorType = type[VspecError]


def is_int(x: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """A finite int or float that is not a bool (an int too large for a float is not)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float range (JSON allows any number of digits)
        return False


def decimal_key(key: Any) -> int | None:
    """A key (or text) spelling a non-negative integer in decimal digits, as an int; None
    for anything else -- ``str.isdigit()`` also passes superscripts such as ``'²'`` that
    ``int()`` refuses, and a key past the interpreter's digit limit cannot be converted."""
    if not isinstance(key, str) or not key.isdecimal():
        return None
    try:
        return int(key)
    except ValueError:  # more digits than int() converts
        return None


# What the standard JSON and TOML parsers raise, besides their own decode errors
# (json.JSONDecodeError, tomllib.TOMLDecodeError: catch those first), on text they cannot
# hold: nesting deeper than the recursion limit, an integer literal longer than the
# interpreter's digit limit (a plain ValueError).  Loaders catch these after the decode error.
PARSER_LIMITS = (RecursionError, ValueError)


def parser_limit(exc: BaseException) -> str:
    """One line for a :data:`PARSER_LIMITS` error of ``json.loads`` / ``tomllib.loads``."""
    if isinstance(exc, RecursionError):
        return "nested too deeply to parse"
    if "integer string conversion" in str(exc):
        return f"an integer literal has more than {sys.get_int_max_str_digits()} digits"
    return f"cannot parse: {exc}"


def not_utf8(exc: UnicodeDecodeError, offset: bool = True) -> str:
    """One line for a file that is not UTF-8 text (``offset``: the error's position is the
    file's, i.e. the whole file was decoded at once)."""
    where = f" at offset {exc.start}" if offset else ""
    return f"not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r}{where})"


def integer(
    value: Any,
    source: str | None,
    field: str | None,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: ErrorType = VspecError,
    hint: str = "",
) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (either bound optional); ``hint`` is
    appended to a range refusal."""
    if not is_int(value):
        raise error(source, field, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise error(source, field, f"must be >= {minimum}, got {value}{hint}")
    if maximum is not None and value > maximum:
        raise error(source, field, f"must be <= {maximum}, got {value}{hint}")
    return value


def number(
    value: Any,
    source: str | None,
    field: str | None,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    error: ErrorType = VspecError,
) -> float:
    """``value`` as a finite float, ``>= minimum``, ``> above``, ``<= maximum`` (each
    optional)."""
    if not is_number(value):
        raise error(source, field, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise error(source, field, f"must be >= {minimum:g}, got {value!r}")
    if above is not None and value <= above:
        raise error(source, field, f"must be > {above:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise error(source, field, f"must be <= {maximum:g}, got {value!r}")
    return float(value)


def int_list(
    values: Any,
    source: str | None,
    field: str,
    *,
    minimum: int = 1,
    nonempty: bool = True,
    increasing: bool = True,
    error: ErrorType = VspecError,
    hint: str = "",
) -> list[int]:
    """A JSON list of integers ``>= minimum``, strictly increasing when ``increasing``;
    element errors name ``field[i]``."""
    if not isinstance(values, list) or (nonempty and not values):
        what = "a non-empty list" if nonempty else "a list"
        raise error(source, field, f"must be {what} of integers >= {minimum}, got {values!r}")
    for i, v in enumerate(values):
        integer(v, source, f"{field}[{i}]", minimum=minimum, error=error, hint=hint)
        if increasing and i and v <= values[i - 1]:
            raise error(source, f"{field}[{i}]",
                        f"{v} after {values[i - 1]}: the list must be strictly increasing")
    return list(values)


def mapping(
    value: Any,
    source: str | None,
    field: str | None,
    *,
    nonempty: bool = False,
    what: str = "an object",
    error: ErrorType = VspecError,
) -> dict[Any, Any]:
    """``value`` as a dict (a JSON object / TOML table)."""
    if not isinstance(value, dict) or (nonempty and not value):
        raise error(source, field, f"must be {what}, got {value!r}")
    return value


def one_of(
    value: Any,
    choices: Collection[Any],
    source: str | None,
    field: str | None,
    *,
    error: ErrorType = VspecError,
) -> Any:
    if value not in choices:
        raise error(source, field, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def known_keys(
    obj: Mapping[str, Any],
    known: Collection[str],
    source: str | None,
    *,
    prefix: str = "",
    error: ErrorType = VspecError,
) -> None:
    """Refuse the first key of ``obj`` not in ``known`` (in ``obj``'s order); the field is
    ``prefix + key``."""
    for key in obj:
        if key not in known:
            raise error(source, f"{prefix}{key}",
                        f"unknown key (known: {', '.join(sorted(map(str, known)))})")


def required_keys(
    obj: Mapping[str, Any],
    required: Collection[str],
    source: str | None,
    *,
    prefix: str = "",
    error: ErrorType = VspecError,
) -> None:
    """Refuse the first key of ``required`` missing from ``obj``."""
    for key in required:
        if key not in obj:
            raise error(source, f"{prefix}{key}", "missing")
