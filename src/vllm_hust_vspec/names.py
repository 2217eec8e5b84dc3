"""The names every layer shares, declared once: controller policies, per-request stop
modes, and the k of the drafters' top-k entropies.

A leaf: it imports nothing of ours (the option schema in :mod:`.settings`, the policy
registry, the stop rule and the patches all read these)."""

from __future__ import annotations

import math

# Controller policies the option schema offers (``adaptive_policy``); the registry in
# ``adaptive/policies`` builds each of them.
POLICIES: tuple[str, ...] = ("fixed", "schedule", "online", "profile", "budget", "sweep")
# What the simulator runs when no --policy is given (fixed K 0..kmax is always computed).
STANDARD_POLICIES: tuple[str, ...] = ("online", "budget")
# Per-request stop modes (``adaptive_stop``; adaptive/policies/stop.py).
STOP_MODES: tuple[str, ...] = ("off", "survival", "confidence", "entropy")
# k of the top-k entropies in ``BatchView.entropies`` (what the drafters compute).
ENTROPY_TOPK = 8
# The largest top-k entropy (nats): a uniform distribution over the top ENTROPY_TOPK tokens.
MAX_ENTROPY = math.log(ENTROPY_TOPK)
