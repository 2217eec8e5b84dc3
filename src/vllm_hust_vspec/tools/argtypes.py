"""argparse value types shared by the bench tools (one clear message per bad value)."""

from __future__ import annotations

import argparse
import json


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A number > 0 (``inf`` allowed)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return v


def json_object(text: str) -> dict:
    """A JSON object (keyword arguments handed on to a constructor)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError("want a JSON object")
    return doc
