"""What each host speculative method allows the controller to do (vLLM >= 0.24, V1 runner).

Facts from the host's proposers (see the reference map, section 1.7):

* ``draft_model``, ``eagle``, ``eagle3``, ``mtp`` (and dflash/gemma4/step3p5, which share the
  ``SpecDecodeBaseProposer`` loop) honour a per-step K and draft only K tokens; at K = 0 the
  host's drafter still runs one forward to keep its KV cache in sync, except for the draft
  model, EAGLE, EAGLE-3, MTP, DFlash and DSpark under synchronous scheduling, where the
  ``drafter-k0``, ``eagle-k0`` and ``dflash-k0`` patches run none and catch the drafter up
  when its requests draft again (``runtime/drafter_sync.py``; the EAGLE family and DFlash
  from kept target hidden states);
* ``ngram`` (CPU) honours K <= Kmax and may draft fewer (short matches); no drafter forward;
* ``suffix``, ``medusa``, ``ngram_gpu`` assert K == Kmax: K stays Kmax, only the verified
  prefix of each request is trimmed;
* ``custom_class`` gets no K, ``extract_hidden_states`` needs K == 1: not adaptive.
"""

from __future__ import annotations

from typing import Any

from vllm_hust_vspec.settings import FIXED_K_METHODS

# Methods whose drafter forward runs even at K = 0 (draft_min_steps = 1 in the cost model).
MODEL_DRAFTERS = ("draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark")
# Model drafters whose K = 0 steps run no forward (patches drafter-k0, eagle-k0, dflash-k0),
# under sync scheduling (a DSpark draft runs on the DFlash proposer: "dflash" in the worker).
K0_SKIPPED = ("draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark")
# Of those, the drafters that read the target's hidden states (their rows are kept by KV slot).
K0_HIDDEN = ("eagle", "eagle3", "mtp", "dflash", "dspark")
# Of those, the drafters whose KV at a context position is a function of the target's hidden
# state there alone (DFlash's context K/V projection): their catch-up writes that K/V, no
# drafter forward.
K0_CONTEXT = ("dflash", "dspark")
# Methods vLLM >= 0.33 lets vary K on its V1 model runner: ``VllmConfig.
# _maybe_disable_dynamic_sd_for_v1`` turns dynamic SD off for every other method there
# ("V1 requires proposer support"; V2 truncates drafts centrally and takes any method).
HOST_V1_DYNAMIC_SD = ("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash")
HOST_V1_GATE = "_maybe_disable_dynamic_sd_for_v1"
# Methods whose V1 proposer lives in a module of its own that some vLLM releases lack
# (vllm/v1/spec_decode/<file>): Medusa's was removed in 0.33.
PROPOSER_FILES = {"medusa": "medusa.py"}
# Admission control's cohort for --adaptive-refill-batch 0, by method (vSpec 0.14's: 8 for the
# serial draft model, whose steps cost most per drafted token, 4 for every other method).
REFILL_DEFAULT = {"draft_model": 8}
REFILL_DEFAULT_OTHER = 4
# Methods the plugin cannot drive at all.
UNSUPPORTED = {
    "custom_class": "the host calls a custom proposer without the per-step K",
    "extract_hidden_states": "the host requires num_speculative_tokens == 1 for it",
}


def served_method(spec: Any) -> str:
    """The method a host ``SpeculativeConfig`` serves: ``dspark`` for a DSpark draft that the
    front end handed to the V1 runner's DFlash proposer (its config says ``dflash`` there,
    ``runtime/dspark.py``), else the config's own method."""
    method = str(spec.method)
    draft = getattr(spec, "draft_model_config", None)
    if method == "dflash" and getattr(getattr(draft, "hf_config", None), "hust_dspark", False):
        return "dspark"
    return method


def varies_k(method: str) -> bool:
    """True when the batch K may change from step to step for ``method``."""
    return method not in FIXED_K_METHODS


def host_fixes_k(vllm_config: Any, method: str) -> bool:
    """True when the host itself keeps K fixed for ``method``: vLLM >= 0.33 (its config class
    has the V1 gate) on the V1 model runner, for a method outside its V1 list."""
    if method in HOST_V1_DYNAMIC_SD or not hasattr(type(vllm_config), HOST_V1_GATE):
        return False
    return not bool(getattr(vllm_config, "use_v2_model_runner", False))


def draft_forwards(method: str, k: int, skip_k0: bool = True) -> int:
    """Drafter forward passes in a step that drafts ``k`` tokens (``skip_k0``: the
    ``drafter-k0`` skip is in effect -- synchronous scheduling, ``adaptive_k0_drafter`` skip)."""
    if method == "ngram" or method in ("suffix", "ngram_gpu"):
        return 0
    if k == 0 and skip_k0 and method in K0_SKIPPED:
        return 0
    return max(k, 1)


def host_lacks(method: str, vllm_dir: Any) -> str | None:
    """Why the vLLM tree at ``vllm_dir`` (a ``pathlib.Path`` to its ``vllm`` package) cannot
    run ``method``, or None; read from the tree's files (nothing imported)."""
    name = PROPOSER_FILES.get(method)
    if name is None or (vllm_dir / "v1" / "spec_decode" / name).is_file():
        return None
    return (f"the installed vLLM has no {method} proposer (vllm/v1/spec_decode/{name}; "
            "vLLM 0.33 removed it)")
