"""Apply declared patches: check every requirement first, then all or nothing.

A :class:`Patch` couples a :class:`~vllm_hust_vspec.patchspec.PatchSpec` (what it
replaces, what it needs, why) with ``make(original) -> replacement``.  :func:`apply`

1. resolves every symbol every patch requires (module import, attribute chain, instance
   attributes set in ``__init__``, declared parameters) and raises ONE :class:`PatchError`
   naming each missing symbol before anything is touched;
2. builds every replacement, refusing a target that already carries a replacement (ours or
   another plugin's marked one) or that two patches claim;
3. sets them all, rolling back on failure, and logs each replaced attribute.

Applying the same patches again is a no-op (idempotent); an attribute is never overwritten
twice.  :func:`revert_all` restores the originals (tests use it).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.patchspec import PatchSpec, Symbol

logger = logging.getLogger("vllm_hust_vspec")

# Attribute set on every replacement we install: the patch's name.
MARK = "__vspec_patch__"
_MISSING = object()


class PatchError(VspecError, RuntimeError):
    """The host does not have what a patch needs, or a target is already patched."""


@dataclasses.dataclass(frozen=True)
class Patch:
    spec: PatchSpec
    make: Callable[[Any], Any]  # original attribute value -> replacement


@dataclasses.dataclass
class _Applied:
    patch: Patch
    owner: Any
    attr: str
    original: Any  # value in owner.__dict__ before, or _MISSING when it was inherited
    replacement: Any


_STATE: dict[str, _Applied] = {}
_LOCK = threading.Lock()


# --------------------------------------------------------------------------- resolution


class SymbolMissing(VspecError, LookupError):
    pass


def _declares_instance_attr(cls: type, name: str) -> bool:
    """True when instances of ``cls`` get ``name``: a dataclass field, a class annotation,
    or an attribute assigned in some ``__init__`` of the MRO (read from the code object's
    names, never from source text)."""
    for klass in cls.__mro__:
        fields = getattr(klass, "__dataclass_fields__", None)
        if fields and name in fields:
            return True
        if name in klass.__dict__.get("__annotations__", {}):
            return True
        init = klass.__dict__.get("__init__")
        if init is not None:
            init = inspect.unwrap(init)  # look through our own (functools.wraps) wrapper
        code = getattr(init, "__code__", None)
        if code is not None and name in code.co_names:
            return True
    return False


def resolve(symbol: Symbol) -> tuple[Any, str, Any]:
    """``(owner, attribute name, current value)`` of ``symbol`` in the running host.

    For an instance attribute (``Scheduler.dynamic_sd_lookup``) the value is ``None``.
    Raises :class:`SymbolMissing` with the reason."""
    try:
        obj: Any = importlib.import_module(symbol.module)
    except ImportError as exc:
        raise SymbolMissing(f"module {symbol.module} cannot be imported ({exc})") from None
    parts = symbol.qualname.split(".")
    owner: Any = obj
    for i, part in enumerate(parts):
        owner = obj
        if part in getattr(obj, "__dict__", {}) or hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if i == len(parts) - 1 and isinstance(obj, type) and _declares_instance_attr(obj, part):
            return owner, part, None
        where = ".".join([symbol.module] + parts[:i])
        raise SymbolMissing(f"{where} has no attribute {part!r}")
    if symbol.params:
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            raise SymbolMissing("not a callable with a signature") from None
        lacking = [p for p in symbol.params if p not in params]
        if lacking:
            raise SymbolMissing(f"signature lacks parameter(s) {', '.join(lacking)}")
    return owner, parts[-1], obj


def check(patches: Iterable[Patch]) -> list[str]:
    """Every unmet requirement as ``'<symbol> (patch <name>): <reason>'``."""
    problems: list[str] = []
    for patch in patches:
        for symbol in patch.spec.all_symbols:
            try:
                resolve(symbol)
            except SymbolMissing as exc:
                problems.append(f"{symbol} (patch {patch.spec.name}): {exc}")
    return problems


# --------------------------------------------------------------------------- apply


def apply(patches: Iterable[Patch]) -> list[str]:
    """Apply ``patches`` (those with ``spec.applies``) all or nothing.

    Returns the names of the patches in effect afterwards, in order.  Raises
    :class:`PatchError` naming every missing symbol, or the target that cannot be
    replaced; in that case nothing was changed."""
    todo = [p for p in patches if p.spec.applies]
    with _LOCK:
        problems = check(todo)
        if problems:
            raise PatchError(
                "vllm-hust-vspec cannot patch this host; missing host symbol(s):\n  "
                + "\n  ".join(problems)
                + "\n(nothing was patched; run vllm-hust-vspec-doctor for the full report)"
            )
        plan = _plan(todo)
        _install(plan)
        for item in plan:
            _STATE[item.patch.spec.name] = item
            logger.info(
                "vllm-hust-vspec: patch %s replaced %s (process %s)",
                item.patch.spec.name,
                item.patch.spec.target,
                item.patch.spec.process,
            )
        return [p.spec.name for p in todo]


def _plan(todo: list[Patch]) -> list[_Applied]:
    """The replacements to install, built before anything is set (patches already in
    effect are skipped; a target claimed twice or already replaced is refused)."""
    plan: list[_Applied] = []
    claimed: dict[tuple[int, str], str] = {}
    for patch in todo:
        done = _STATE.get(patch.spec.name)
        if done is not None:
            if done.owner.__dict__.get(done.attr) is not done.replacement:
                raise PatchError(
                    f"patch {patch.spec.name}: {patch.spec.target} was replaced by "
                    "someone else after vllm-hust-vspec patched it"
                )
            continue
        owner, attr, current = resolve(patch.spec.target)
        key = (id(owner), attr)
        if key in claimed:
            raise PatchError(
                f"patches {claimed[key]} and {patch.spec.name} both replace "
                f"{patch.spec.target}"
            )
        claimed[key] = patch.spec.name
        marker = getattr(current, MARK, None)
        if marker is not None:
            raise PatchError(
                f"patch {patch.spec.name}: {patch.spec.target} is already replaced by "
                f"patch {marker!r}; refusing to overwrite it twice"
            )
        try:
            replacement = patch.make(current)
            setattr(replacement, MARK, patch.spec.name)
        except Exception as exc:
            raise PatchError(
                f"patch {patch.spec.name}: building the replacement of "
                f"{patch.spec.target} failed: {exc}"
            ) from exc
        original = owner.__dict__.get(attr, _MISSING)
        plan.append(_Applied(patch, owner, attr, original, replacement))
    return plan


def _install(plan: list[_Applied]) -> None:
    """Set every replacement of ``plan``; on a failure, restore those set and raise."""
    installed: list[_Applied] = []
    try:
        for item in plan:
            setattr(item.owner, item.attr, item.replacement)
            installed.append(item)
    except Exception as exc:
        for item in reversed(installed):
            _restore(item)
        raise PatchError(f"installing patches failed, rolled back: {exc}") from exc


def _restore(item: _Applied) -> None:
    if item.original is _MISSING:
        delattr(item.owner, item.attr)
    else:
        setattr(item.owner, item.attr, item.original)


def applied() -> list[str]:
    """Names of the patches currently installed."""
    return list(_STATE)


def revert_all() -> None:
    """Restore every original attribute (for tests; never called by the plugin)."""
    with _LOCK:
        for item in reversed(list(_STATE.values())):
            _restore(item)
        _STATE.clear()
