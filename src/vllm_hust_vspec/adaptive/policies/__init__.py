"""Controller policies behind one interface (:class:`.base.Policy`), selectable by name
through :func:`.registry.make_policy`."""

from .base import Policy, PolicyContext
from .registry import make_policy, policy_names, register_policy

__all__ = [
    "Policy",
    "PolicyContext",
    "make_policy",
    "policy_names",
    "register_policy",
]
