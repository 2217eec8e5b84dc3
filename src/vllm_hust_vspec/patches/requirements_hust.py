"""Requirement-only patch declarations for vLLM-HUST 0.17 (``vllm-hust``, import name ``vllm``).

Nothing here is applied (``applies=False``): these specs say which host symbols our patches
will need on a 0.17-line host, so ``vllm-hust-vspec-doctor`` can report what such a host has
and lacks.  Facts: read from the 0.17 source tree (each symbol below names its module).

On 0.17 the scheduler-side points (stats, per-request trimming, async placeholders) and the
worker's propose/sample points have the same names as in vLLM 0.32, but the per-step K path
does not exist: no ``SchedulerOutput.num_spec_tokens_to_schedule``, no
``Scheduler.dynamic_sd_lookup``, no ``GPUModelRunner.prev_num_spec_tokens``, and the base
proposer (``vllm/v1/spec_decode/eagle.py``) takes no K.  The doctor reports that as MISSING.
"""

from __future__ import annotations

from vllm_hust_vspec.patchspec import (
    FAMILY_HUST,
    PROCESS_ENGINE,
    PROCESS_FRONTEND,
    PROCESS_WORKER,
    PatchSpec,
    Symbol,
)

_SCHED = "vllm.v1.core.sched.scheduler"
_ASYNC = "vllm.v1.core.sched.async_scheduler"
_OUT = "vllm.v1.core.sched.output"
_RUNNER = "vllm.v1.worker.gpu_model_runner"
_EAGLE = "vllm.v1.spec_decode.eagle"

# Methods whose K may vary per step (settings.FIXED_K_METHODS keep K fixed: per-request
# trimming only).
_VARIABLE_K = ("draft_model", "eagle", "eagle3", "mtp", "ngram", "dflash", "dspark")
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
        why="DFlash/DSpark drafting needs the host's dflash proposer",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="hust-observe-steps",
        target=Symbol(_SCHED, "Scheduler.make_spec_decoding_stats"),
        requires=(
            Symbol(_SCHED, "Scheduler.update_from_output",
                   params=("scheduler_output", "model_runner_output")),
            Symbol("vllm.v1.engine.core", "EngineCore.step"),
        ),
        process=PROCESS_ENGINE,
        family=FAMILY_HUST,
        applies=False,
        why="feed the controller each request's drafted/accepted counts and the step time",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="hust-per-request-k",
        target=Symbol(_SCHED, "Scheduler.update_draft_token_ids",
                      params=("draft_token_ids",)),
        requires=(Symbol(_ASYNC, "AsyncScheduler._update_after_schedule",
                         params=("scheduler_output",)),),
        process=PROCESS_ENGINE,
        family=FAMILY_HUST,
        applies=False,
        why="trim each request's drafts to its K_i (sync: update_draft_token_ids; async: the "
            "placeholder update)",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="hust-worker-observe",
        target=Symbol(_RUNNER, "GPUModelRunner._sample",
                      params=("logits", "spec_decode_metadata")),
        requires=(Symbol(_RUNNER, "GPUModelRunner.take_draft_token_ids"),
                  Symbol("vllm.v1.sample.rejection_sampler", "RejectionSampler.parse_output")),
        process=PROCESS_WORKER,
        family=FAMILY_HUST,
        applies=False,
        why="acceptance per position from the rejection sampler's output",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="hust-per-step-k",
        target=Symbol(_SCHED, "Scheduler.dynamic_sd_lookup"),
        requires=(
            Symbol(_OUT, "SchedulerOutput.num_spec_tokens_to_schedule"),
            Symbol(_RUNNER, "GPUModelRunner.prev_num_spec_tokens"),
            Symbol(_RUNNER, "GPUModelRunner.propose_draft_token_ids"),
        ),
        process=PROCESS_ENGINE,
        family=FAMILY_HUST,
        methods=_VARIABLE_K,
        applies=False,
        why="the per-step K path: the scheduler's K lookup (replaced by the controller), K "
            "carried in SchedulerOutput to the worker, and the runner's stride following the "
            "previous step's K",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="hust-drafter-k",
        target=Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.propose",
                      params=("num_speculative_tokens",)),
        requires=(),
        process=PROCESS_WORKER,
        family=FAMILY_HUST,
        methods=("draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark"),
        applies=False,
        why="the drafter drafts only the step's K tokens (0.17: the base proposer lives in "
            "eagle.py and loops over the fixed num_speculative_tokens)",
        remove_when=_REMOVE,
    ),
    PatchSpec(
        name="hust-drafter-k-ngram",
        target=Symbol("vllm.v1.spec_decode.ngram_proposer", "NgramProposer.propose",
                      params=("num_speculative_tokens",)),
        requires=(),
        process=PROCESS_WORKER,
        family=FAMILY_HUST,
        methods=("ngram",),
        applies=False,
        why="the n-gram proposer proposes only the step's K tokens",
        remove_when=_REMOVE,
    ),
)
