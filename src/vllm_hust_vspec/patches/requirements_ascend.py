"""Requirement-only patch declarations for vLLM-Ascend 0.23+ (``vllm_ascend``).

Nothing here is applied (``applies=False``): these specs say which vLLM-Ascend symbols our
patches will need on an NPU host, so ``vllm-hust-vspec-doctor --ascend-root ...`` can report
what that host has and lacks.  Facts: read from vLLM-Ascend's source tree (each symbol
below names its module).

The scheduler side is upstream vLLM's (the engine core runs vLLM's ``Scheduler`` unless a
custom ``scheduler_cls`` overrides it), so the per-request points are declared on the
``vllm`` tree; everything the NPU worker runs is declared on the ``vllm_ascend`` tree.  On
0.23 the base proposer's ``_propose`` takes no K (only vLLM-Ascend HEAD added it) and there
is no DSpark proposer: the doctor reports both as MISSING.
"""

from __future__ import annotations

from vllm_hust_vspec.patchspec import (
    FAMILY_ASCEND,
    PROCESS_ENGINE,
    PROCESS_FRONTEND,
    PROCESS_WORKER,
    PatchSpec,
    Symbol,
)

_A = "vllm_ascend"
_RUNNER = "vllm_ascend.worker.model_runner_v1"
_BASE = "vllm_ascend.spec_decode.llm_base_proposer"
_SCHED = "vllm.v1.core.sched.scheduler"

_REMOVE = "when our NPU patches land (these specs then become applied patches)"


def _drafter(name: str, module: str, cls: str, methods: tuple[str, ...]) -> PatchSpec:
    return PatchSpec(
        name=name,
        target=Symbol(f"vllm_ascend.spec_decode.{module}", cls, root=_A),
        requires=(Symbol("vllm_ascend.spec_decode", "get_spec_decode_method", root=_A),),
        process=PROCESS_WORKER,
        family=FAMILY_ASCEND,
        methods=methods,
        adaptive=False,
        applies=False,
        why=f"the NPU proposer for {', '.join(methods)}",
        remove_when=_REMOVE,
    )


SPECS: tuple[PatchSpec, ...] = (
    PatchSpec(
        name="ascend-platform",
        target=Symbol("vllm_ascend.platform", "NPUPlatform.check_and_update_config", root=_A),
        requires=(Symbol("vllm_ascend.utils", "update_cudagraph_capture_sizes", root=_A),),
        process=PROCESS_FRONTEND,
        family=FAMILY_ASCEND,
        adaptive=False,
        applies=False,
        why="the NPU platform rewrites capture sizes after vLLM; our sizes must survive it",
        remove_when=_REMOVE,
    ),
    _drafter("ascend-drafter-eagle", "eagle_proposer", "AscendEagleProposer",
             ("eagle", "eagle3", "mtp")),
    _drafter("ascend-drafter-draft-model", "draft_proposer", "AscendDraftModelProposer",
             ("draft_model",)),
    _drafter("ascend-drafter-ngram", "ngram_proposer", "AscendNgramProposer", ("ngram",)),
    _drafter("ascend-drafter-suffix", "suffix_proposer", "AscendSuffixDecodingProposer",
             ("suffix",)),
    _drafter("ascend-drafter-medusa", "medusa_proposer", "AscendMedusaProposer", ("medusa",)),
    _drafter("ascend-drafter-dflash", "dflash_proposer", "AscendDflashProposer", ("dflash",)),
    _drafter("ascend-drafter-dspark", "dspark_proposer", "AscendDSparkProposer", ("dspark",)),
    PatchSpec(
        name="ascend-per-request-k",
        target=Symbol(_SCHED, "Scheduler.update_draft_token_ids", params=("draft_token_ids",)),
        requires=(Symbol(_SCHED, "Scheduler.make_spec_decoding_stats"),
                  Symbol("vllm.v1.core.sched.async_scheduler",
                         "AsyncScheduler._update_after_schedule")),
        process=PROCESS_ENGINE,
        family=FAMILY_ASCEND,
        applies=False,
        why="per-request trimming and acceptance feedback in the engine core (upstream "
            "scheduler, inherited by the Ascend schedulers)",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="ascend-worker-observe",
        target=Symbol(_RUNNER, "NPUModelRunner._sample",
                      params=("logits", "spec_decode_metadata"), root=_A),
        requires=(Symbol("vllm_ascend.sample.rejection_sampler",
                         "AscendRejectionSampler.forward", root=_A),
                  Symbol("vllm_ascend.worker.worker", "NPUWorker.take_draft_token_ids",
                         root=_A)),
        process=PROCESS_WORKER,
        family=FAMILY_ASCEND,
        applies=False,
        why="acceptance per position on the NPU runner",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="ascend-graph-sizes",
        target=Symbol(_RUNNER, "NPUModelRunner._check_and_update_cudagraph_mode", root=_A),
        requires=(Symbol(_RUNNER, "NPUModelRunner.capture_model", root=_A),),
        process=PROCESS_WORKER,
        family=FAMILY_ASCEND,
        applies=False,
        why="ACL graph sizes for every verify width",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="ascend-per-step-k",
        target=Symbol(_BASE, "AscendSpecDecodeBaseProposer._propose",
                      params=("num_speculative_tokens",), root=_A),
        requires=(
            Symbol(_RUNNER, "NPUModelRunner.propose_draft_token_ids", root=_A),
            Symbol(_BASE, "AscendSpecDecodeBaseProposer._run_merged_draft", root=_A),
            Symbol(_BASE, "AscendSpecDecodeBaseProposer.num_speculative_tokens", root=_A),
        ),
        process=PROCESS_WORKER,
        family=FAMILY_ASCEND,
        methods=("draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark"),
        applies=False,
        why="the per-step K path on NPU: the base proposer must draft only K tokens (the "
            "merged draft ACL graph otherwise replays Kmax steps)",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="ascend-drafter-k-ngram",
        target=Symbol("vllm_ascend.spec_decode.ngram_proposer", "AscendNgramProposer.propose",
                      params=("num_speculative_tokens",), root=_A),
        requires=(),
        process=PROCESS_WORKER,
        family=FAMILY_ASCEND,
        methods=("ngram",),
        applies=False,
        why="the NPU n-gram proposer proposes only the step's K tokens (0.23 defines propose "
            "per vLLM version; every definition must take K)",
        remove_when=_REMOVE,
    ),
)
