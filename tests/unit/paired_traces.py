"""Paired-comparison decision traces written by the tests of the scripts that read them
(``replay_paired_prices.py``, ``resim_paired.py``): a header, then a decision and its
result per step, step times from a known roofline."""

from __future__ import annotations

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
