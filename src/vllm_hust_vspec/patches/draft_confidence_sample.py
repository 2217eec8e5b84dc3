"""Patch ``SpecDecodeBaseProposer._sample_draft_tokens``: record each draft position's confidence.

What:   wraps ``vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer._sample_draft_tokens``
        (the one call that turns a drafting pass's hidden states into draft token ids, for
        draft_model, EAGLE, EAGLE-3 and MTP).  Only while the ``draft-propose``
        patch has armed the drafter (the engine asked for confidences this step) it appends
        the pass's (confidence, top-8 entropy) per row, float32, see
        :mod:`.draft_confidence_signals`.  Greedy drafts: the logits are computed once here
        (``compute_logits``, the host's vocabulary constraint and id mapping when the draft
        vocabulary differs), the token is their argmax as in the host's ``_greedy_sample``;
        with ``use_local_argmax_reduction`` the host's own ``_greedy_sample`` picks the token
        and full logits are computed in addition (confidence = the largest probability).
        Sampled drafts (``draft_sample_method="probabilistic"``): the host samples, the
        signals come from the probabilities it returns.  Unarmed, it calls the host at once.
Why:    the host drafts by argmax and throws the probabilities away; the budget policy and the
        confidence stop need them per request and position.
Remove: when the V1 proposers return their draft probabilities/confidences for greedy drafts
        (vLLM's V2 runner does so only for DSpark, ``adaptive_verification``).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_WORKER, PatchSpec, Symbol

_BASE = "vllm.v1.spec_decode.llm_base_proposer"

SPEC = PatchSpec(
    name="draft-confidence-sample",
    target=Symbol(_BASE, "SpecDecodeBaseProposer._sample_draft_tokens",
                  params=("hidden_states", "sampling_metadata")),
    requires=(
        Symbol(_BASE, "SpecDecodeBaseProposer._greedy_sample", params=("hidden_states",)),
        Symbol(_BASE, "SpecDecodeBaseProposer.use_local_argmax_reduction"),
        Symbol(_BASE, "SpecDecodeBaseProposer.use_heterogeneous_vocab"),
        Symbol(_BASE, "SpecDecodeBaseProposer.vocab_mapping"),
        Symbol(_BASE, "SpecDecodeBaseProposer._enable_probabilistic_draft_probs"),
        Symbol("vllm.v1.spec_decode.vocab_mapping", "VocabMapping.constrain_draft_logits"),
        Symbol("vllm.v1.spec_decode.vocab_mapping", "VocabMapping.map_draft_to_target_ids"),
        Symbol("vllm.v1.sample.metadata", "SamplingMetadata.all_greedy"),
    ),
    process=PROCESS_WORKER,
    why="per-position draft confidence and top-k entropy from the draft's own probabilities",
    remove_when="the V1 proposers return draft confidences for greedy drafts",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.patches import draft_confidence_signals as signals

    records_attr = signals.RECORDS

    @functools.wraps(original)
    def _sample_draft_tokens(self: Any, hidden_states: Any, sampling_metadata: Any) -> Any:
        records = self.__dict__.get(records_attr)
        if records is None:
            return original(self, hidden_states, sampling_metadata)
        if self._enable_probabilistic_draft_probs and not sampling_metadata.all_greedy:
            token_ids, probs = original(self, hidden_states, sampling_metadata)
            if probs is not None:
                records.append(signals.from_probs(probs, token_ids))
            return token_ids, probs
        hetero = self.use_heterogeneous_vocab
        if self.use_local_argmax_reduction:
            token_ids = self._greedy_sample(hidden_states)
            logits = self.model.compute_logits(hidden_states)
            if hetero:
                logits = self.vocab_mapping.constrain_draft_logits(logits)
        else:
            logits = self.model.compute_logits(hidden_states)
            if hetero:
                logits = self.vocab_mapping.constrain_draft_logits(logits)
            token_ids = logits.argmax(dim=-1)
            if hetero:
                token_ids = self.vocab_mapping.map_draft_to_target_ids(token_ids)
        records.append(signals.from_logits(logits))
        return token_ids, None

    return _sample_draft_tokens
