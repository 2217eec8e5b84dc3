"""The drafter's cheaper LM heads (issue 19 items 4 and 5), on the real CPU host: an active
vocabulary and a weight-only int8 head.

``vllm-hust-vspec-vocab`` (a real subprocess) ranks the fixture tokenizer's ids by the
counts of a corpus of the fixtures' own kind (Python standard-library sources, which the
fixture models were trained on; the prompts come from held-out files).  Then, in-process
engines at a fixed K = 4, greedy:

* the draft model with its whole LM head, with the first 1024 ranked ids, with the 1024 ids
  the corpus used least (never, most of them), and with its whole head as int8 (w8a16);
  EAGLE with the first 1024 ids as int8 (both at once);
* every run's tokens are the same (the target verifies every draft: lossless);
* the draft model keeps most of its acceptance on the ranked ids and as int8, and accepts
  almost nothing on the rarest ids (the restriction is in effect: its drafts can only be
  active ids);
* a file for another tokenizer (an id past the vocabulary) fails the engine's start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from plugin_helpers import capture_log, close, engine_spec, greedy, load_prompts, make_llm, plugin_env

pytestmark = [pytest.mark.host, pytest.mark.slow]

KMAX = 4
SIZE = 1024


def _counters(llm) -> tuple[float, float]:
    got = {m.name: float(m.value) for m in llm.get_metrics()
           if m.name in ("vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_draft_tokens")}
    return got["vllm:spec_decode_num_accepted_tokens"], got["vllm:spec_decode_num_draft_tokens"]


@pytest.fixture(scope="module")
def ranked(fixtures_dir, tmp_path_factory) -> Path:
    corpus = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:80]
    out = tmp_path_factory.mktemp("vocab") / "ids.json"
    proc = subprocess.run([sys.executable, "-m", "vllm_hust_vspec.tools.vocab", "--tokenizer",
                           str(fixtures_dir / "tokenizer"), "--output", str(out),
                           *map(str, corpus)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    doc = json.loads(out.read_text())
    assert len(doc["ids"]) > SIZE and doc["counts"][2:] == sorted(doc["counts"][2:], reverse=True)
    assert doc["tokens_covered"] == sum(doc["counts"]) == doc["tokens_counted"]
    return out


def _run(fixtures_dir, method: str, prompts: list[str], **settings) -> tuple[list, float, float, list]:
    model, spec = engine_spec(fixtures_dir, method, KMAX)
    with plugin_env(adaptive_policy="fixed", **settings), capture_log() as lines:
        llm = make_llm(model, spec, disable_log_stats=False)
        try:
            tokens = greedy(llm, prompts, max_tokens=32)
            accepted, drafted = _counters(llm)
        finally:
            close(llm)
    return tokens, accepted, drafted, list(lines)


def test_the_drafter_computes_only_the_active_ids_and_output_is_unchanged(fixtures_dir, ranked,
                                                                          tmp_path):
    prompts = load_prompts(fixtures_dir, "code")[:8]
    doc = json.loads(ranked.read_text())
    # the ids the corpus never used, then its rarest
    unused = [i for i in range(doc["vocab_size"]) if i not in set(doc["ids"])]
    unused = (unused + doc["ids"][::-1])[:SIZE]
    cold = tmp_path / "unused.json"
    cold.write_text(json.dumps({**doc, "ids": unused, "counts": [0] * SIZE}))

    full, acc_full, drafted_full, _ = _run(fixtures_dir, "draft_model", prompts)
    active, acc_active, drafted_active, log = _run(
        fixtures_dir, "draft_model", prompts, draft_active_vocab_ids=ranked,
        draft_active_vocab_size=SIZE)
    cold_out, acc_cold, drafted_cold, _ = _run(
        fixtures_dir, "draft_model", prompts, draft_active_vocab_ids=cold)
    int8, acc_int8, drafted_int8, int8_log = _run(
        fixtures_dir, "draft_model", prompts, draft_lm_head_quantization="w8a16")
    eagle, acc_eagle, drafted_eagle, eagle_log = _run(
        fixtures_dir, "eagle", prompts, eagle_draft_active_vocab_ids=ranked,
        eagle_draft_active_vocab_size=SIZE, eagle_draft_lm_head_quantization="w8a16")

    assert active == full and cold_out == full and int8 == full and eagle == full  # lossless
    assert any(f"computes {SIZE} of {doc['vocab_size']} token ids" in x for x in log), log
    assert any(f"computes all {doc['vocab_size']} token ids, weight-only int8" in x
               for x in int8_log), int8_log
    assert any(f"computes {SIZE} of {doc['vocab_size']} token ids, weight-only int8" in x
               for x in eagle_log), eagle_log
    rate = {name: a / d for name, a, d in (("full", acc_full, drafted_full),
                                          ("active", acc_active, drafted_active),
                                          ("unused", acc_cold, drafted_cold),
                                          ("int8", acc_int8, drafted_int8),
                                          ("eagle-active", acc_eagle, drafted_eagle))}
    print("acceptance per drafted token:", {k: round(v, 3) for k, v in rate.items()})
    assert rate["full"] > 0.3
    assert rate["active"] >= 0.85 * rate["full"], rate
    assert rate["int8"] >= 0.9 * rate["full"], rate
    assert rate["unused"] < 0.1 * rate["full"], rate
    assert rate["eagle-active"] > 0.2, rate


def test_ids_of_another_tokenizer_fail_the_start(fixtures_dir, ranked, tmp_path):
    from vllm_hust_vspec.errors import VspecError

    doc = json.loads(ranked.read_text())
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({**doc, "ids": [0, 1, doc["vocab_size"] + 7]}))
    model, spec = engine_spec(fixtures_dir, "draft_model", KMAX)
    with plugin_env(draft_active_vocab_ids=bad):
        with pytest.raises(Exception) as failed:
            make_llm(model, spec)
    text = str(failed.value) + "".join(str(a) for a in getattr(failed.value, "args", ()))
    assert isinstance(failed.value, VspecError) or "outside the model's vocabulary" in text, text
    assert "outside the model's vocabulary" in text and "--draft-active-vocab-ids" in text, text
