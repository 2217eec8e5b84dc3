"""Requirement-only declarations for vLLM-HUST 0.17 (``vllm-hust``, import name ``vllm``).

Nothing here is applied (``applies=False``): the plugin entry point and the drafter classes
the 0.17 runtime patches rely on without patching them, so ``vllm-hust-vspec-doctor`` reports
them on a 0.17-line host.  The applied 0.17 patch set is in the ``hust_*`` modules (per-step
K: ``hust-step-k`` in the engine core, ``hust-draft-k`` in the worker; the vllm family's
observers and draft cuts declared again: ``hust_shared``).

0.17 has no ``dflash`` proposer: DFlash / DSpark need a vLLM >= 0.24 host
(``hust-drafter-dflash``, checked only for ``--method dflash`` / ``dspark``).
"""

from __future__ import annotations

from vllm_hust_vspec.patchspec import (
    FAMILY_HUST,
    PROCESS_FRONTEND,
    PROCESS_WORKER,
    PatchSpec,
    Symbol,
)

_EAGLE = "vllm.v1.spec_decode.eagle"
_REMOVE = "when vLLM-HUST rebases onto vLLM >= 0.24 (then the vllm-family patches apply)"

SPECS: tuple[PatchSpec, ...] = (
    PatchSpec(
        name="hust-plugin-entry",
        target=Symbol("vllm.plugins", "load_general_plugins"),
        requires=(Symbol("vllm.model_executor.models.registry", "_ModelRegistry.register_model"),),
        process=PROCESS_FRONTEND,
        family=FAMILY_HUST,
        adaptive=False,
        applies=False,
        why="register() is loaded through vllm.general_plugins and registers draft archs",
        remove_when="never: this is the plugin interface itself",
    ),
    PatchSpec(
        name="hust-drafter-eagle",
        target=Symbol(_EAGLE, "EagleProposer.propose"),
        requires=(Symbol(_EAGLE, "SpecDecodeBaseProposer.num_speculative_tokens"),),
        process=PROCESS_WORKER,
        family=FAMILY_HUST,
        methods=("eagle", "eagle3", "mtp"),
        adaptive=False,
        applies=False,
        why="the EAGLE/MTP drafter whose draft depth the plugin bounds",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="hust-drafter-draft-model",
        target=Symbol("vllm.v1.spec_decode.draft_model", "DraftModelProposer"),
        requires=(),
        process=PROCESS_WORKER,
        family=FAMILY_HUST,
        methods=("draft_model",),
        adaptive=False,
        applies=False,
        why="the separate draft-model proposer",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="hust-drafter-ngram",
        target=Symbol("vllm.v1.spec_decode.ngram_proposer", "NgramProposer.propose"),
        requires=(),
        process=PROCESS_WORKER,
        family=FAMILY_HUST,
        methods=("ngram",),
        adaptive=False,
        applies=False,
        why="the n-gram proposer",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="hust-drafter-dflash",
        target=Symbol("vllm.v1.spec_decode.dflash", "DFlashProposer"),
        requires=(),
        process=PROCESS_WORKER,
        family=FAMILY_HUST,
        methods=("dflash", "dspark"),
        adaptive=False,
        applies=False,
        asked_only=True,
        why="DFlash/DSpark drafting needs the host's dflash proposer (0.17 has none: the "
            "doctor checks it only for --method dflash/dspark)",
        remove_when=_REMOVE,
    ),
)
