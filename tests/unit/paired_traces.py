"""Paired-comparison decision traces written by the tests of the scripts that read them
(``replay_paired_prices.py``, ``resim_paired.py``, ``resim_compare.py``): a header, then a
decision and its result per step, step times from a known roofline."""

from __future__ import annotations

import json
import pathlib

from vllm_hust_vspec.adaptive.trace import TRACE_NAME

# accepted per request at K = 0, 1, 2: every draft at position 1, half at position 2
TOKENS = {0: 0.0, 1: 1.0, 2: 1.5}


def roofline_ms(batch: int, k: int) -> float:
    """A step's ms at ``batch`` drafting K: 10 + 5 a verified token + 0.5 a drafted one."""
    return 10.0 + 5.0 * batch * (1 + k) + 0.5 * k * batch


def header() -> dict:
    return {"trace": TRACE_NAME, "host": {"method": "draft_model"}, "settings": {}}


def step(n: int, k: int, batch: int, policy: str, accepted: dict[int, float] = TOKENS) -> list[dict]:
    """Step ``n``'s decision and result records: ``accepted[k]`` tokens a request."""
    return [{"step": n, "k": k, "batch": batch, "policy": policy},
            {"step": n, "drafted": k * batch, "accepted": int(accepted[k] * batch),
             "ms": roofline_ms(batch, k)}]


def rotation_trace(path: pathlib.Path, policies=("fixed:0", "fixed:1", "fixed:2", "online"),
                   batch: int = 4, server_round: int = 1) -> list[dict]:
    """A server's trace of 40 rotation rounds at ``batch``, a window of 6 steps a policy
    (online's at K = 1), written to ``path``; returns its windows as ``results.json`` lists
    them (the first half of the rounds ``code``'s, the second ``mixed``'s)."""
    recs = [header()]
    n = window = 0
    windows = []
    for rnd in range(40):
        for policy in policies:
            for _ in range(6):
                k = int(policy.split(":")[1]) if policy != "online" else 1
                recs += step(n, k, batch, policy)
                n += 1
            window += 1
            recs.append({"window": window, "round": rnd, "policy": policy, "steps": 6,
                         "tokens": 0, "ms": 0.0, "batch": batch})
            windows.append({"server_round": server_round, "window": window,
                            "concurrency": batch, "policy": policy,
                            "workload": "code" if rnd < 20 else "mixed"})
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return windows
