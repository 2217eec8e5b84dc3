"""DSpark on vLLM's V1 model runner (the CPU host, V1 GPU hosts).

vLLM 0.32 runs DSpark only in its V2 GPU runner and refuses it on V1.  A Qwen3 DSpark draft
(``Qwen3DSparkModel``, vLLM's ``Qwen3DSparkForCausalLM``) is a DFlash backbone
(``DFlashQwen3ForCausalLM``: context K/V from the target's hidden states, one non-causal pass
over the block) plus a Markov head and a confidence head.  With the plugin enabled,
:func:`run_on_v1` (frontend, on the resolved ``SpeculativeConfig``) hands such a draft to the
V1 runner's DFlash proposer, and two worker patches make that proposer draft DSpark's way:

* ``dspark-inputs`` lays out the anchor-as-first block: the anchor (the token the target
  just produced) and ``K - 1`` mask tokens, every slot sampled (:func:`block_inputs`);
* ``dspark-sample`` samples the block left to right with the Markov bias and, when the engine
  asked for draft signals, records the confidence head's calibrated per-slot confidences
  (:func:`sample_block`).

Greedy drafts only (DSpark's rule for random target sampling is the point-mass proposal,
which the host's rejection sampler applies to drafts without probabilities).  The block is
``K`` wide, the step's K: the host passes it to ``propose`` every step (dynamic SD).
torch is imported inside the worker functions only.
"""

from __future__ import annotations

from typing import Any

from vllm_hust_vspec.settings import SettingsError

ARCHITECTURE = "Qwen3DSparkModel"
#: drafter instance attribute: the anchors (next token ids) of the step being drafted
ANCHORS = "_vspec_dspark_anchors"
#: ``config.json`` key of the per-slot confidence temperatures (the fixture builder's
#: sequential temperature scaling; 1.0 for slots it does not list)
TEMPERATURES = "hust_confidence_temperatures"


def v1_runner(envs: Any = None, has_triton: bool | None = None, out_of_tree: bool | None = None) -> bool:
    """Whether this host will draft with vLLM's own V1 model runner (as
    ``VllmConfig.use_v2_model_runner`` decides before it looks at the speculative method:
    ``VLLM_USE_V2_MODEL_RUNNER``, else V2 exactly where Triton is).  An out-of-tree platform
    (vLLM-Ascend) has its own runner and its own DSpark drafter: not this one."""
    if out_of_tree is None:
        from vllm.platforms import current_platform

        out_of_tree = current_platform.is_out_of_tree()
    if out_of_tree:
        return False
    if envs is None:
        import vllm.envs as envs
    if has_triton is None:
        from vllm.triton_utils import HAS_TRITON as has_triton
    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    if forced is not None:
        return not forced
    return not has_triton


def _layer_ids(hf: Any, dflash: dict) -> list[int] | None:
    for ids in (dflash.get("target_layer_ids"), getattr(hf, "dspark_target_layer_ids", None),
                getattr(hf, "target_layer_ids", None)):
        if ids:
            return [int(i) for i in ids]
    return None


def run_on_v1(config: Any) -> None:
    """Hand a DSpark ``config`` (host ``SpeculativeConfig``, method ``dspark``) to the V1
    runner's DFlash proposer: check the draft, give its ``dflash_config`` the target layer ids
    and mask token the proposer reads, and set the method the V1 runner knows (``dflash``:
    the host then builds ``DFlashProposer``, collects the target's aux hidden states and
    stops refusing the config).  The draft stays a DSpark model: its ``hf_config`` carries
    ``hust_dspark`` and the worker patches key on the loaded model's Markov head."""
    draft = config.draft_model_config
    where = f"--method dspark (draft {getattr(draft, 'model', '?')})"
    archs = list(getattr(draft, "architectures", None) or [])
    if ARCHITECTURE not in archs:
        raise SettingsError(
            f"{where}: on vLLM's V1 model runner vllm-hust-vspec runs Qwen3 DSpark drafts "
            f"(config.json architectures [{ARCHITECTURE!r}]); this draft is {archs}")
    hf = draft.hf_config
    if not getattr(hf, "sample_from_anchor", True):
        raise SettingsError(
            f"{where}: config.json sample_from_anchor=false (the 1 + N fill-in layout) is not "
            "supported on vLLM's V1 model runner; vllm-hust-vspec drafts the anchor-as-first "
            "block (sample_from_anchor=true, DeepSpec's layout)")
    if getattr(hf, "dspark_draft_topk", None) is not None or getattr(config, "dspark_draft_topk", None):
        raise SettingsError(f"{where}: dspark_draft_topk (top-k Markov drafting) is not supported on "
                            "vLLM's V1 model runner; drafts are greedy over the full vocabulary")
    if getattr(config, "draft_sample_method", "greedy") not in (None, "greedy"):
        raise SettingsError(f"{where}: draft_sample_method={config.draft_sample_method!r}: DSpark "
                            "drafts are greedy (the target side may sample: point-mass proposals)")
    if not getattr(hf, "markov_rank", None):
        raise SettingsError(f"{where}: config.json has no markov_rank: not a DSpark draft")
    dflash = getattr(hf, "dflash_config", None) or {}
    ids = _layer_ids(hf, dflash)
    if not ids:
        raise SettingsError(f"{where}: config.json names no target layers (dflash_config."
                            "target_layer_ids, dspark_target_layer_ids or target_layer_ids)")
    mask = dflash.get("mask_token_id", getattr(hf, "mask_token_id", None))
    if mask is None:
        raise SettingsError(f"{where}: config.json has no mask_token_id")
    hf.dflash_config = {**dflash, "target_layer_ids": ids, "mask_token_id": int(mask),
                        "use_aux_hidden_state": True}
    hf.hust_dspark = True
    config.method = "dflash"


# ---------------------------------------------------------------- worker side (torch)

def is_dspark(drafter: Any) -> bool:
    """Whether ``drafter`` (a host ``DFlashProposer``) drafts with a DSpark model."""
    model = getattr(drafter, "model", None)
    return model is not None and hasattr(model, "markov_bias") and hasattr(model, "compute_draft_logits")


def block_inputs(original: Any, drafter: Any, next_token_ids: Any, args: tuple, kwargs: dict) -> Any:
    """The host's DFlash input layout with ``K - 1`` mask tokens after the anchor (so the
    query block is the anchor and K - 1 masks, ``K`` slots at positions p..p+K-1), every
    slot sampled; the anchors are kept for the Markov head's first step."""
    k = drafter.num_speculative_tokens
    drafter.num_speculative_tokens = k - 1
    try:
        num_tokens, _, cad = original(drafter, *args, **kwargs)
    finally:
        drafter.num_speculative_tokens = k
    drafter.__dict__[ANCHORS] = next_token_ids
    return num_tokens, drafter.arange[:num_tokens], cad


def temperatures(model: Any, k: int) -> list[float]:
    hf = getattr(getattr(model, "config", None), TEMPERATURES, None) or []
    return [float(hf[j]) if j < len(hf) else 1.0 for j in range(k)]


def sample_block(drafter: Any, hidden_states: Any, records: list | None, from_logits: Any) -> Any:
    """Greedy left-to-right drafting of each request's block: slot j's token is the argmax
    of the backbone's logits plus the Markov bias of the token chosen at slot j-1 (the
    anchor for slot 0).  Returns the draft ids flat ``(num_reqs * K,)`` in target
    vocabulary.  With ``records`` (a list) it appends one (confidence, entropy) pass of
    ``num_reqs * K`` rows: the confidence head's calibrated confidence where the draft has
    one (else the draft's own probability), and the top-k entropy; ``from_logits(logits)``
    gives (probability, entropy) per row (the draft-confidence signals' arithmetic)."""
    import torch

    model = drafter.model
    k = drafter.num_speculative_tokens
    rows = hidden_states.shape[0]
    b = rows // k
    base = model.compute_draft_logits(hidden_states).view(b, k, -1)
    hidden = hidden_states.view(b, k, -1)
    prev = drafter.__dict__.pop(ANCHORS)[:b]
    tokens = torch.empty((b, k), dtype=torch.long, device=hidden_states.device)
    head = getattr(model.model, "confidence_head", None) if records is not None else None
    temps = temperatures(model, k) if head is not None else None
    conf, ent = [], []
    for j in range(k):
        embed = model.markov_embed(prev)
        logits = base[:, j] + model.markov_bias(embed)
        prev = logits.argmax(dim=-1)
        tokens[:, j] = prev
        if records is not None:
            c, e = from_logits(logits)
            if head is not None:
                c = torch.sigmoid(head(hidden[:, j], embed).float() / temps[j])
            conf.append(c)
            ent.append(e)
    if records is not None:
        records.append((torch.stack(conf, 1).reshape(-1), torch.stack(ent, 1).reshape(-1)))
    return model.map_draft_to_target(tokens.view(-1))
