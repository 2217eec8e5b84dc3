"""Qwen2 EAGLE-1 heads (issue 19 item 2) on the real CPU host, which has none of its own.

The fixture pair rewritten as Qwen2 (``qwen2_pair.py``: a Qwen2 target with zero q/k/v
biases, an EAGLE head whose checkpoint says ``Qwen2ForCausalLMEagle`` and has no biases at
all) loads through the plugin's registration, stays lossless against the Qwen2 target alone,
and drafts exactly what the Llama EAGLE head drafts for the Llama target (the same functions):
the same acceptance to the last token, so the missing biases were filled with zeros and the
head's layers are EAGLE-1's.
"""

from __future__ import annotations

import pytest
from plugin_helpers import close, greedy, load_prompts, make_llm, plugin_env
from qwen2_pair import qwen2_pair

pytestmark = [pytest.mark.host, pytest.mark.slow]

KMAX = 4


def _counters(llm) -> tuple[float, float]:
    got = {m.name: float(m.value) for m in llm.get_metrics() if hasattr(m, "value")}
    return (got["vllm:spec_decode_num_accepted_tokens"],
            got["vllm:spec_decode_num_draft_tokens"])


def _run(target, head, prompts, tokenizer):
    spec = None if head is None else {"method": "eagle", "model": str(head),
                                      "num_speculative_tokens": KMAX}
    with plugin_env(adaptive_policy="fixed"):
        llm = make_llm(str(target), spec, disable_log_stats=head is None, tokenizer=tokenizer)
        try:
            tokens = greedy(llm, prompts, max_tokens=32)
            counters = None if head is None else _counters(llm)
        finally:
            close(llm)
    return tokens, counters


def test_a_qwen2_eagle_head_loads_stays_lossless_and_drafts_like_its_llama_twin(
        fixtures_dir, tmp_path):
    from vllm import ModelRegistry

    from vllm_hust_vspec.models.registration import QWEN2_EAGLE, QWEN2_EAGLE_ARCHITECTURES

    target, head = qwen2_pair(fixtures_dir, tmp_path)
    prompts = load_prompts(fixtures_dir, "code")[:6]
    # one tokenizer for all: transformers picks Qwen2's own tokenizer class for a qwen2
    # config, which splits the fixture's byte-level BPE text differently
    tok = str(fixtures_dir / "target")
    alone, _ = _run(target, None, prompts, tok)
    qwen2, (q_acc, q_drafted) = _run(target, head, prompts, tok)
    llama, (l_acc, l_drafted) = _run(fixtures_dir / "target", fixtures_dir / "eagle", prompts, tok)
    print(f"Qwen2 EAGLE: {q_acc:.0f}/{q_drafted:.0f} accepted; Llama EAGLE: "
          f"{l_acc:.0f}/{l_drafted:.0f}")

    # the host had none: the plugin registered its head under every name vLLM may ask for
    for arch in QWEN2_EAGLE_ARCHITECTURES:
        assert ModelRegistry.models[arch].module_name + ":" + \
            ModelRegistry.models[arch].class_name == QWEN2_EAGLE
    assert qwen2 == alone  # lossless
    assert llama == alone  # the rewrite computes the Llama target's function
    assert q_drafted > 0 and q_acc / q_drafted > 0.3  # a trained head, not noise
    assert (q_acc, q_drafted) == (l_acc, l_drafted)
