"""The ONE option schema of vllm-hust-vspec.

Every option is declared once here: name (= TOML ``[serve]`` key and argparse ``dest``),
type, default, help, choices or range, CLI flag, env var and legacy env aliases.  Everything
else is generated from this table: the launcher's argparse parser, TOML validation, the env
transport that carries settings from the launcher into every vLLM process, and
``docs/options.md``.

This module imports only the leaf modules :mod:`.names`, :mod:`.errors` and :mod:`.checks`
of ours, and nothing heavy (no vllm, no torch).

Scopes:
  * ``plugin``   -- read by the plugin inside vLLM; travels as ``HUST_VSPEC_<NAME>``.
  * ``host``     -- becomes a vLLM server argument; passed only when set (vLLM's default
                    otherwise), never exported as ``HUST_VSPEC_*``.
  * ``launcher`` -- used by the launcher itself (model lookup, platform, config paths).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from vllm_hust_vspec.vocab_ids import load as load_vocab_ids
from vllm_hust_vspec.retired import check_environment
from vllm_hust_vspec.checks import decimal_key, is_int
from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.names import MAX_ENTROPY, POLICIES, STOP_MODES

ENV_PREFIX = "HUST_VSPEC_"
LEGACY_ENV_PREFIXES = ("HUST_SPECSLO_", "HUST_SPECASCEND_")
ENABLE_ENV = "HUST_VSPEC_ENABLED"

_TYPES = ("bool", "int", "float", "str", "path", "int_list", "str_list")


class SettingsError(VspecError, ValueError):
    """Bad option value, unknown key or wrong type.  The message names the source
    (file, key, flag or env var) and what was expected."""


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    type: str
    default: Any
    help: str
    scope: str = "plugin"
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    flag: str | None = None  # defaults to --name-with-dashes
    legacy_env: tuple[str, ...] = ()  # irregular old env names (prefix aliases are automatic)
    negatable: bool = True  # bools get --no-<flag>
    group: str = "general"
    vllm_flag: str | None = None  # host scope: the vLLM server argument it becomes
    negatable_host: bool = True  # host bools: vLLM has --no-<flag> (else off passes nothing)
    toml: bool = True  # accepted as a TOML [serve] key
    cli: bool = True  # has a command-line flag

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise TypeError(f"option {self.name}: unknown type {self.type!r}")
        if self.scope not in ("plugin", "host", "launcher"):
            raise TypeError(f"option {self.name}: unknown scope {self.scope!r}")

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str | None:
        """The transport env var (plugin scope only)."""
        return ENV_PREFIX + self.name.upper() if self.scope == "plugin" else None

    @property
    def env_aliases(self) -> tuple[str, ...]:
        """Legacy env names, read but losing to :attr:`env`."""
        if self.scope != "plugin":
            return self.legacy_env
        automatic = tuple(p + self.name.upper() for p in LEGACY_ENV_PREFIXES)
        return self.legacy_env + automatic

    def type_label(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        return {
            "bool": "boolean",
            "int": "integer",
            "float": "number",
            "str": "string",
            "path": "path",
            "int_list": "list of integers",
            "str_list": "list of strings",
        }[self.type]

    def range_label(self) -> str:
        lo = "" if self.minimum is None else f"{self.minimum:g}"
        hi = "" if self.maximum is None else f"{self.maximum:g}"
        if not lo and not hi:
            return ""
        return f"[{lo or '-inf'}, {hi or 'inf'}]"


# --------------------------------------------------------------------------- methods

# Canonical speculative methods (vLLM's speculative_config "method" names) and the aliases
# users know from vSpec 0.14 and from the host.  Shared by the launcher, the plugin and the
# doctor.  "none" means no speculation.
METHODS = ("draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix", "medusa", "dflash",
           "dspark", "none")
# The host's MTP model-type aliases (vllm/config/speculative.py MTPModelTypes) all mean "mtp".
_MTP_ALIASES = ("deepseek_mtp", "mimo_mtp", "mimo_v2_mtp", "qwen3_next_mtp", "qwen3_5_mtp",
                "glm4_moe_mtp", "ernie_mtp", "longcat_flash_mtp", "pangu_ultra_moe_mtp",
                "step3p5_mtp", "gemma4_mtp")
METHOD_ALIASES = {"draft": "draft_model", **{a: "mtp" for a in _MTP_ALIASES}}
# Methods whose V1 proposer asserts K == Kmax: K may not vary per step for them.
FIXED_K_METHODS = ("suffix", "medusa", "ngram_gpu")
# Methods that take a separate draft/head checkpoint.
METHODS_WITH_DRAFT_MODEL = ("draft_model", "eagle", "eagle3", "medusa", "dflash", "dspark")


def canonical_method(name: str, source: str = "method") -> str:
    """Map a method name or alias to its canonical name; unknown -> SettingsError."""
    key = name.strip().lower()
    key = METHOD_ALIASES.get(key, key)
    if key not in METHODS:
        known = ", ".join(METHODS + tuple(METHOD_ALIASES))
        raise SettingsError(f"{source}: unknown speculative method {name!r} (known: {known})")
    return key


# --------------------------------------------------------------------------- the schema

OPTIONS: tuple[Option, ...] = (
    # ---- controller (adaptive core) -------------------------------------------------
    Option("adaptive_speculation", "bool", True,
           "Let the controller choose K every step. Off: the host's fixed "
           "num_speculative_tokens (the plugin only observes).", group="controller"),
    Option("adaptive_policy", "str", "online",
           "Controller policy: fixed (constant K), schedule (batch-size table, same semantics "
           "as vLLM's num_speculative_tokens_per_batch_size), online (default: maximise "
           "expected goodput from online estimates), profile (offline latency profile "
           "corrected online), budget (confidence x cost-table verify budget), sweep "
           "(cycle K for tests).", choices=POLICIES, group="controller",
           legacy_env=("HUST_VSPEC_ADAPTIVE_POLICY_NAME",)),
    Option("adaptive_fixed_gamma", "int", None,
           "K for the fixed policy (default: Kmax).", minimum=0, group="controller"),
    Option("adaptive_schedule", "str", None,
           "Batch-size -> K table for the schedule policy, e.g. '1-4:4,5-32:2' "
           "(ranges of batch sizes, inclusive).", group="controller"),
    Option("adaptive_sweep", "int_list", None,
           "K values the sweep policy cycles through, one per step (default 0..Kmax).",
           minimum=0, group="controller"),
    Option("adaptive_profile", "path", None,
           "Latency profile JSON for the profile policy (written by "
           "vllm-hust-vspec-fit-profile; schema_version 1 profiles of vSpec 0.14 load too).",
           legacy_env=("HUST_VSPEC_ADAPTIVE_PROFILE_PATH",), group="controller"),
    Option("adaptive_min_gamma", "int", 0,
           "Smallest K the controller may choose (0 = no speculation allowed).",
           minimum=0, group="controller"),
    Option("adaptive_control_interval", "int", 1,
           "Steps between K decisions (1 = every step).", minimum=1, group="controller"),
    Option("adaptive_hysteresis", "float", 0.01,
           "Relative goodput gain a new K (budget: a new depth cap) must promise before the controller switches.",
           minimum=0.0, maximum=1.0, group="controller"),
    Option("adaptive_switch_error", "float", 0.5,
           "Online and budget policies: standard deviations of the step-cost model's own "
           "error (in the two candidates' cells at this batch size) a predicted gain must "
           "also clear before the policy switches K (budget: its depth cap); 0 leaves only "
           "--adaptive-hysteresis.  Without it, noisy step "
           "times at large batch made online switch between near-tied Ks every few steps.",
           minimum=0.0, maximum=10.0, group="controller"),
    Option("adaptive_max_gamma_step", "int", 8,
           "Largest change of K between two decisions.", minimum=1, group="controller"),
    Option("adaptive_ewma_weight", "float", 0.03,
           "Per-step decay of the acceptance estimator (memory ~1/weight steps at small "
           "batch; at large batch the memory is capped at ~128 request-steps).",
           minimum=1e-6, maximum=1.0, group="controller"),
    Option("adaptive_online_exploration", "float", 0.01,
           "Share of decisions that probe another K (one probe every 1/exploration "
           "decisions, cycling over every candidate, so each K is revisited at least once "
           "per (number of candidates)/exploration decisions; upward probes draft the "
           "probed K for a quarter of the batch).", minimum=0.0, maximum=1.0,
           group="controller"),
    Option("adaptive_online_warmup_samples", "int", 2,
           "Warm-up rounds of the online policy: each round probes Kmax, the minimum and "
           "the middle K once before the policy trusts its models.",
           minimum=1, group="controller"),
    Option("adaptive_online_window", "int", 256,
           "Half-life (in steps) of the step-cost model's samples.", minimum=8,
           group="controller"),
    Option("adaptive_cost_probe", "bool", True,
           "Before the server reports ready, time a few decode steps of every K at batch "
           "1, 4 and 16 (at most max_num_seqs) with synthetic requests, and seed the step-cost "
           "model of the online and budget policies with them (about 20 s on a 2-core CPU; a "
           "fresh server then prices K at every load from its first step). The probe's "
           "times are a prior: a K that contends is still timed once while serving.",
           group="controller"),
    Option("adaptive_k0_drafter", "str", "skip",
           "What the draft-model drafter does on a K = 0 step (synchronous scheduling): skip "
           "(no forward; a request that drafts again first has the tokens it missed run "
           "through the drafter, so its drafts are those of a drafter that never sat out) or "
           "run (the host's own forward over every request, as vLLM does). Other methods run "
           "the host's forward.", choices=("skip", "run"), group="controller"),
    Option("adaptive_stop", "str", "off",
           "Per-request stop: cut a request's draft where its survival (estimated "
           "probability that every earlier draft token is accepted) or its draft confidence "
           "falls below --adaptive-stop-threshold, or (entropy) before the first draft "
           "token whose top-8 entropy is above --adaptive-stop-entropy.", choices=STOP_MODES,
           group="controller"),
    Option("adaptive_stop_threshold", "float", 0.1,
           "Threshold of the per-request stop.", minimum=0.0, maximum=1.0,
           group="controller"),
    # the most a top-8 entropy can be is ln 8 (names.ENTROPY_TOPK = 8)
    Option("adaptive_stop_entropy", "float", 1.0,
           "Entropy threshold (nats) of --adaptive-stop entropy: a draft is cut before the "
           "first token whose entropy over the drafter's 8 most likely tokens is above it "
           "(0 = one sure token, ln 8 = 2.08 = eight equally likely ones; 1.0 = about e = 2.7 "
           "equally likely tokens).",
           minimum=0.0, maximum=MAX_ENTROPY, group="controller"),
    Option("adaptive_dspark_calibration", "path", None,
           "Start-up calibration grid (JSON, docs/calibration.md) for the budget policy, "
           "instead of the built-in defaults; measured before the server reports ready.",
           group="controller"),
    Option("adaptive_dspark_cost_table_output", "path", None,
           "Save the cost table the start-up calibration fits to this new file (an existing "
           "file is refused; the directory must exist).", group="controller"),
    Option("adaptive_dspark_cost_table", "path", None,
           "Saved cost table for the budget policy: skip the start-up calibration; the table "
           "must match --gamma and the running configuration.", group="controller"),
    Option("adaptive_compare", "str_list", None,
           "Benchmark mode: these policies (fixed:K, online, budget, profile, schedule) take "
           "turns inside this one engine, in windows of --adaptive-compare-window decisions, "
           "each with its own controller; each window's speed goes to the decision trace "
           "(needs --adaptive-trace-file) for vllm-hust-vspec-bench to pair. Lossless like "
           "every policy; not for serving.", group="controller"),
    Option("adaptive_compare_window", "int", 16,
           "Decisions per window of --adaptive-compare (the first step of each window is "
           "not measured: it verifies the previous policy's drafts).", minimum=4,
           group="controller"),
    Option("adaptive_compare_waves", "bool", False,
           "With --adaptive-compare: a window per wave of requests instead of per "
           "--adaptive-compare-window decisions; a new window begins at the first decision "
           "whose running requests are all new. For a client that sends each wave once per "
           "compared policy and waits for it (vllm-hust-vspec-bench ab --paired-waves), so that "
           "every policy serves the same texts.", group="controller"),
    Option("adaptive_refill_batch", "int", None,
           "Admission control: while requests run and others wait, admit waiting requests "
           "only once min(N, waiting) batch slots are free, so that the batch refills in "
           "cohorts of N (0: the method's cohort, 8 for draft_model and 4 for the others, as "
           "vSpec 0.14). Unset: no admission control (1 is the same). Scheduling only: "
           "every output token is unchanged.", minimum=0, group="controller"),
    Option("adaptive_refill_max_wait_steps", "int", 8,
           "Starvation bound of --adaptive-refill-batch: after this many consecutive steps "
           "of holding, the waiting requests are admitted as slots allow.", minimum=1,
           group="controller"),
    # ---- observability ---------------------------------------------------------------
    Option("adaptive_trace", "bool", False,
           "Write the decision trace to ./vspec-decisions-<pid>.jsonl (legacy switch; "
           "--adaptive-trace-file names the file).", group="observability"),
    Option("adaptive_trace_file", "path", None,
           "Append the decision trace (JSON lines, one per step) to this file.",
           group="observability"),
    Option("adaptive_record_trace", "path", None,
           "Record the run in the simulator's trace format (run at fixed Kmax).",
           group="observability"),
    Option("adaptive_log_interval", "float", 10.0,
           "Seconds between the controller's summary log lines (0 = off).", minimum=0.0,
           group="observability"),
    Option("adaptive_inject_fault", "int", 0,
           "Fault drill: the controller raises at this decision step (0 = never), so that "
           "the fallback to the safe K, its log line and its metrics can be seen on a real "
           "server; outputs stay lossless.", minimum=0, group="observability"),
    # ---- speculation (launcher scope: becomes vLLM's --speculative-config) -----------
    Option("method", "str", "draft_model",
           "Speculative method (aliases: draft = draft_model; the host's MTP model types, "
           "e.g. qwen3_5_mtp, = mtp). none = no speculation: no --speculative-config and the "
           "plugin stays off.", scope="launcher", choices=METHODS + tuple(METHOD_ALIASES),
           group="speculation"),
    Option("target_model", "str", None,
           "Target model: a local directory, or a bare name looked up in the model registry "
           "and under --model-dir. Never downloaded.", scope="launcher",
           legacy_env=("HUST_VSPEC_TARGET_MODEL",), group="speculation"),
    Option("draft_model", "str", None,
           "Draft model / EAGLE head (draft_model, eagle, eagle3, ...): a local directory or "
           "a bare name (as --target-model). MTP and ngram take none.", scope="launcher",
           legacy_env=("HUST_VSPEC_DRAFT_MODEL", "HUST_VSPEC_EAGLE_MODEL"),
           group="speculation"),
    Option("model_dir", "path", None,
           "Directory under which bare model names are looked up.", scope="launcher",
           legacy_env=("HUST_VSPEC_MODEL_DIR",), group="speculation"),
    Option("model_registry", "path", None,
           "JSON or TOML file mapping model names to local paths (consulted before "
           "--model-dir).", scope="launcher", legacy_env=("HUST_VSPEC_MODEL_REGISTRY",),
           group="speculation"),
    Option("gamma", "int", None,
           "Kmax: vLLM's num_speculative_tokens, the upper bound the controller chooses K "
           "under (sizes buffers and graph captures). Default 4 (6 for mtp).", minimum=1,
           maximum=64, scope="launcher", group="speculation"),
    Option("prompt_lookup_min", "int", None,
           "ngram: shortest n-gram matched in the prompt (vLLM's prompt_lookup_min).",
           minimum=1, scope="launcher", group="speculation"),
    Option("prompt_lookup_max", "int", None,
           "ngram: longest n-gram matched in the prompt (vLLM's prompt_lookup_max).",
           minimum=1, scope="launcher", group="speculation"),
    Option("draft_active_vocab_ids", "path", None,
           "draft_model: a ranked token-id list (JSON, written by vllm-hust-vspec-vocab from "
           "a corpus's token counts); the drafter's LM head computes only these ids (the "
           "first draft_active_vocab_size of them), the target still verifies every token, "
           "so greedy output is unchanged.", group="speculation"),
    Option("draft_active_vocab_size", "int", 0,
           "draft_model: how many ids of draft_active_vocab_ids the drafter's LM head "
           "computes (0: all of the file's).", minimum=0, group="speculation"),
    Option("eagle_draft_active_vocab_ids", "path", None,
           "eagle / eagle3: the same as draft_active_vocab_ids for the EAGLE head's LM head "
           "(a head that shares the target's LM head keeps the target's whole).",
           group="speculation"),
    Option("eagle_draft_active_vocab_size", "int", 0,
           "eagle / eagle3: how many ids of eagle_draft_active_vocab_ids the head computes "
           "(0: all of the file's).", minimum=0, group="speculation"),
    # ---- lossy acceptance (opt-in; refused by --protocol and bench ab) ------------------
    Option("eagle_relaxed_accept_topk", "int", 1,
           "LOSSY. eagle / eagle3: accept a greedy request's draft token when it is among the "
           "target's top K tokens at its position (1: strict, the default). Output then "
           "differs from the target's own greedy output.", minimum=1, maximum=64,
           group="acceptance"),
    Option("eagle_relaxed_accept_after_tokens", "int", 0,
           "LOSSY rule above: verify strictly while a request has fewer than N output tokens.",
           minimum=0, group="acceptance"),
    Option("confidence_accept_margin", "float", None,
           "LOSSY. Accept a greedy request's draft token when the target's logit of it is "
           "within M of the target's best logit at its position (unset: strict).", minimum=0.0,
           group="acceptance"),
    Option("confidence_accept_from_position", "int", 0,
           "LOSSY rule above: only from this draft position on (0: the first draft).",
           minimum=0, group="acceptance"),
    Option("confidence_accept_after_tokens", "int", 0,
           "LOSSY rule above: verify strictly while a request has fewer than N output tokens.",
           minimum=0, group="acceptance"),
    Option("confidence_protected_token_ids", "int_list", None,
           "LOSSY rule above: token ids always verified strictly, as the draft's token or the "
           "target's best (e.g. EOS).", minimum=0, group="acceptance"),
    Option("draft_lm_head_quantization", "str", "none",
           "draft_model: the drafter's LM head as weight-only int8 (w8a16: int8 rows, one "
           "scale per row, bfloat16 activations) or as loaded (none); the target verifies "
           "every token, so output is unchanged. On a CPU it pays for 1-4 drafted rows per "
           "pass and is slower from 16 on (docs/plugin.md).", choices=("none", "w8a16"),
           group="speculation"),
    Option("eagle_draft_lm_head_quantization", "str", "none",
           "eagle / eagle3: the same as draft_lm_head_quantization for the EAGLE head's LM "
           "head.", choices=("none", "w8a16"), group="speculation"),
    Option("draft_tensor_parallel_size", "int", None,
           "Tensor-parallel ranks of the drafter (vLLM's speculative-config "
           "draft_tensor_parallel_size; unset: vLLM's default, the target's).", minimum=1,
           scope="launcher", group="speculation"),
    Option("mtp_local_argmax_reduction", "bool", None,
           "mtp: reduce the drafter's argmax locally on each tensor-parallel rank before "
           "gathering (vLLM's speculative-config use_local_argmax_reduction; vSpec's flag of "
           "the same name).", scope="launcher", group="speculation"),
    Option("eagle_disable_draft_torch_compile", "bool", None,
           "Run the drafter eager, without torch.compile or graphs, while the target keeps "
           "its graph mode (vLLM's speculative-config enforce_eager; vSpec's flag of the "
           "same name, which meant EAGLE, works for every model drafter here).",
           scope="launcher", group="speculation"),
    # ---- graphs (launcher scope: becomes --enforce-eager / --compilation-config) -------
    Option("graph_mode", "str", None,
           "Graph mode: eager (--enforce-eager), or a cudagraph_mode for "
           "--compilation-config (piecewise, full-decode-only, full-and-piecewise, full). "
           "Unset: vLLM's default. CPU hosts capture no graphs (vLLM runs them without).",
           choices=("eager", "piecewise", "full-decode-only", "full-and-piecewise", "full"),
           scope="launcher", group="graphs"),
    Option("capture_sizes", "int_list", None,
           "Explicit graph capture sizes (vLLM's cudagraph_capture_sizes), instead of the "
           "capture policy's (graph-capable platforms; a CPU host captures no graphs).",
           minimum=1, scope="launcher", group="graphs"),
    Option("capture_policy", "str", "auto",
           "How graph capture sizes cover every verify width K+1 the controller may choose "
           "(graph-capable platforms): auto (batch buckets 1,2,4,8 then every 8), exact "
           "(every batch size up to 16, then every 8), power2 (powers of two), steady (1 and "
           "max_num_seqs only).", choices=("auto", "exact", "power2", "steady"),
           scope="launcher", group="graphs"),
    # ---- vLLM server arguments (host scope: passed only when set) -----------------------
    Option("served_model_name", "str", None, "Model name the server answers to.",
           scope="host", vllm_flag="--served-model-name", group="server"),
    Option("max_num_seqs", "int", None, "Largest batch (requests per step).", minimum=1,
           maximum=65536, scope="host", vllm_flag="--max-num-seqs", group="server"),
    Option("max_num_batched_tokens", "int", None, "Token budget of one step.", minimum=1,
           scope="host", vllm_flag="--max-num-batched-tokens", group="server"),
    Option("max_model_len", "int", None, "Context length.", minimum=1, scope="host",
           vllm_flag="--max-model-len", group="server"),
    Option("dtype", "str", None, "Weight/activation dtype.",
           choices=("auto", "half", "float16", "bfloat16", "float", "float32"),
           scope="host", vllm_flag="--dtype", group="server"),
    Option("generation_config", "str", None,
           "Default sampling parameters: vllm (vLLM's own) or auto (the model's "
           "generation_config.json).", choices=("vllm", "auto"), scope="host",
           vllm_flag="--generation-config", group="server"),
    Option("async_scheduling", "bool", None, "Asynchronous scheduling.", scope="host",
           vllm_flag="--async-scheduling", group="server"),
    Option("prefix_caching", "bool", None, "Automatic prefix caching.", scope="host",
           vllm_flag="--enable-prefix-caching", group="server"),
    Option("chunked_prefill", "bool", None, "Chunked prefill.", scope="host",
           vllm_flag="--enable-chunked-prefill", group="server"),
    Option("host", "str", None, "Address the server binds.", scope="host",
           vllm_flag="--host", group="server"),
    Option("port", "int", None, "Port the server listens on.", minimum=1, maximum=65535,
           scope="host", vllm_flag="--port", group="server"),
    Option("gpu_memory_utilization", "float", None,
           "Share of accelerator memory vLLM may use.", minimum=0.01, maximum=1.0,
           scope="host", vllm_flag="--gpu-memory-utilization", group="server"),
    Option("tensor_parallel_size", "int", None, "Tensor-parallel ranks.", minimum=1,
           scope="host", vllm_flag="--tensor-parallel-size", group="server"),
    Option("kv_cache_dtype", "str", None,
           "KV cache data type (vLLM's --kv-cache-dtype: auto, bfloat16, fp8, ...).",
           scope="host", vllm_flag="--kv-cache-dtype", group="server"),
    Option("block_size", "int", None, "Tokens per KV cache block.", minimum=1,
           scope="host", vllm_flag="--block-size", group="server"),
    Option("language_model_only", "bool", None,
           "Load only the language model of a multimodal checkpoint (vLLM's "
           "--language-model-only).", scope="host", vllm_flag="--language-model-only",
           group="server"),
    Option("disable_log_stats", "bool", None,
           "Turn off vLLM's engine statistics (vLLM's --disable-log-stats): its periodic "
           "log lines and its /metrics, and with them the plugin's vllm_hust_vspec:* "
           "metrics (the decision trace stays). Unset or off: vLLM keeps them.", scope="host",
           vllm_flag="--disable-log-stats", group="server", negatable_host=False),
    # ---- launcher -----------------------------------------------------------------------
    Option("device", "str", None,
           "Accelerators to use, e.g. 0,1 (CUDA_VISIBLE_DEVICES on cuda, "
           "ASCEND_RT_VISIBLE_DEVICES on npu; not available on cpu).", scope="launcher",
           group="launcher"),
    Option("target_platform", "str", None,
           "Platform to build the command for (default: detected). With --dry-run it makes "
           "the output independent of this machine.", choices=("cpu", "cuda", "npu"),
           scope="launcher", group="launcher"),
    Option("protocol", "str", None,
           "A validated benchmark contract (arc-easy, qwen35-frontier-mtp2): its settings "
           "are the base and the ones it pins may not be changed.", scope="launcher",
           group="launcher"),
    Option("extra_args", "str_list", (),
           "Native vLLM server arguments, appended verbatim (on the command line: after "
           "--).", scope="launcher", cli=False, group="launcher"),
    Option("config", "path", None,
           "TOML file: [serve] holds these options by name, [env] extra environment "
           "variables for the server (never HUST_VSPEC_*).", scope="launcher", toml=False,
           legacy_env=("VSPEC_CONFIG", "SPECSLO_CONFIG", "SPECASCEND_CONFIG"),
           group="launcher"),
    Option("dry_run", "bool", False,
           "Print the environment and the server command instead of starting it.",
           scope="launcher", toml=False, negatable=False, group="launcher"),
    Option("json", "bool", False,
           "With --dry-run: print {executable, argv, env} as JSON.", scope="launcher",
           toml=False, negatable=False, group="launcher"),
)

_BY_NAME = {o.name: o for o in OPTIONS}


def option(name: str) -> Option:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise SettingsError(f"unknown option {name!r}") from None


def options(scope: str | None = None) -> tuple[Option, ...]:
    return tuple(o for o in OPTIONS if scope is None or o.scope == scope)


# --------------------------------------------------------------------------- parsing

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_value(opt: Option, raw: Any, source: str) -> Any:
    """Convert and validate ``raw`` (a string from env/CLI, or a TOML value).

    ``source`` names where it came from (``"config.toml: [serve] gamma"``,
    ``"env HUST_VSPEC_X"``, ``"--flag"``) and appears in every error."""
    if raw is None:
        return None
    value = _convert(opt, raw, source)
    _check_range(opt, value, source)
    return value


def _fail(opt: Option, raw: Any, source: str, extra: str = "") -> SettingsError:
    msg = f"{source}: expected {opt.type_label()}, got {raw!r}"
    return SettingsError(msg + (f" ({extra})" if extra else ""))


def _convert(opt: Option, raw: Any, source: str) -> Any:
    return _CONVERTERS[opt.type](opt, raw, source)


def _to_bool(opt: Option, raw: Any, source: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise _fail(opt, raw, source)


def _to_int(opt: Option, raw: Any, source: str) -> int:
    if is_int(raw):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            raise _fail(opt, raw, source) from None
    raise _fail(opt, raw, source)


def _to_float(opt: Option, raw: Any, source: str) -> float:
    if isinstance(raw, bool):
        raise _fail(opt, raw, source)
    if isinstance(raw, (int, float)):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            raise _fail(opt, raw, source) from None
    else:
        raise _fail(opt, raw, source)
    if not math.isfinite(value):
        raise _fail(opt, raw, source, "must be finite")
    return value


def _to_str(opt: Option, raw: Any, source: str) -> str:
    if not isinstance(raw, str):
        raise _fail(opt, raw, source)
    if opt.choices and raw not in opt.choices:
        raise _fail(opt, raw, source)
    if opt.type == "path" and not raw.strip():
        raise _fail(opt, raw, source, "empty path")
    if opt.type == "path" and ("\n" in raw or "\r" in raw):
        raise _fail(opt, raw, source, "a line break in a path")
    if opt.type == "path" and "\x00" in raw:  # open() refuses it with a bare ValueError
        raise _fail(opt, raw, source, "a NUL byte in a path")
    return raw


def _list_items(opt: Option, raw: Any, source: str) -> list[Any]:
    if isinstance(raw, str):
        return [p.strip() for p in raw.split(",") if p.strip()]
    if isinstance(raw, (list, tuple)):
        return list(raw)
    raise _fail(opt, raw, source)


def _to_str_list(opt: Option, raw: Any, source: str) -> tuple[str, ...]:
    items = _list_items(opt, raw, source)
    if not all(isinstance(i, str) for i in items):
        raise _fail(opt, raw, source)
    return tuple(items)


def _to_int_list(opt: Option, raw: Any, source: str) -> tuple[int, ...]:
    out = []
    for i in _list_items(opt, raw, source):
        if isinstance(i, bool):
            raise _fail(opt, raw, source)
        if isinstance(i, int):
            out.append(i)
            continue
        try:
            out.append(int(str(i)))
        except ValueError:
            raise _fail(opt, raw, source) from None
    return tuple(out)


_CONVERTERS = {
    "bool": _to_bool,
    "int": _to_int,
    "float": _to_float,
    "str": _to_str,
    "path": _to_str,
    "int_list": _to_int_list,
    "str_list": _to_str_list,
}


def _check_range(opt: Option, value: Any, source: str) -> None:
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        if (opt.minimum is not None and v < opt.minimum) or (
            opt.maximum is not None and v > opt.maximum
        ):
            raise SettingsError(
                f"{source}: {v!r} is out of range {opt.range_label()} for {opt.cli_flag}"
            )


def format_env_value(opt: Option, value: Any) -> str:
    """The env transport's string form: bools 1/0, lists comma-separated."""
    if opt.type == "bool":
        return "1" if value else "0"
    if opt.type in ("int_list", "str_list"):
        return ",".join(str(v) for v in value)
    if opt.type == "float":
        return repr(float(value))
    return str(value)


# --------------------------------------------------------------------------- settings


class Settings(Mapping[str, Any]):
    """Effective option values (every option present; unset ones hold the default)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        data = {o.name: o.default for o in OPTIONS}
        for k, v in (values or {}).items():
            option(k)  # raises for unknown names
            data[k] = v
        object.__setattr__(self, "_data", data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __getattr__(self, key: str) -> Any:
        try:
            return self._data[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("Settings are immutable; use replace()")

    def replace(self, **changes: Any) -> "Settings":
        data = dict(self._data)
        data.update(changes)
        return Settings(data)

    def as_dict(self, scope: str | None = None) -> dict[str, Any]:
        out = {}
        for o in options(scope):
            v = self._data[o.name]
            out[o.name] = list(v) if isinstance(v, tuple) else v
        return out

    def to_env(self) -> dict[str, str]:
        """Every plugin option as ``HUST_VSPEC_<NAME>`` (unset options are omitted,
        which the reader takes as the schema default)."""
        env = {}
        for o in options("plugin"):
            v = self._data[o.name]
            if v is not None:
                env[o.env] = format_env_value(o, v)
        return env

    def __repr__(self) -> str:
        return f"Settings({self._data!r})"


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Read plugin settings from the env transport.  The new name wins over legacy
    aliases; an invalid value raises :class:`SettingsError` naming the variable."""
    environ = os.environ if environ is None else environ
    problem = check_environment(environ)  # vSpec 0.14's variables for its Ascend paths
    if problem is not None:
        raise SettingsError(problem)
    values: dict[str, Any] = {}
    for o in options("plugin"):
        names = (o.env,) + o.env_aliases
        for name in names:
            raw = environ.get(name)
            if raw is None or raw == "" and o.type not in ("str",):
                continue
            values[o.name] = parse_value(o, raw, f"env {name}")
            break
    return validate(Settings(values), source="env")


def from_mapping(data: Mapping[str, Any], source: str, scope: str | None = None) -> dict[str, Any]:
    """Validate a TOML-like mapping of option names to values.  Unknown keys and wrong
    types are rejected naming ``source`` and the key.  Returns converted values."""
    out: dict[str, Any] = {}
    known = {o.name for o in options(scope)}
    for key, raw in data.items():
        if key not in known:
            raise SettingsError(f"{source}: unknown key {key!r}")
        out[key] = parse_value(_BY_NAME[key], raw, f"{source} {key}")
    return out


def validate(settings: Settings, source: str = "settings") -> Settings:
    """Cross-option checks that need more than one value."""
    if settings.adaptive_policy == "schedule" and settings.adaptive_schedule:
        parse_schedule(settings.adaptive_schedule, f"{source}: adaptive_schedule")
    if settings.adaptive_policy == "profile" and not settings.adaptive_profile:
        raise SettingsError(
            f"{source}: adaptive_policy 'profile' needs adaptive_profile "
            f"({option('adaptive_profile').cli_flag} / {option('adaptive_profile').env})"
        )
    check_calibration_options(settings, source)
    check_compare(settings, source)
    check_active_vocab(settings, source)
    check_lossy(settings, source)
    return settings


COMPARE_POLICIES = ("online", "budget", "profile", "schedule")  # and fixed:K


def compare_entries(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """The policies of ``adaptive_compare`` ("fixed:K" or a name), () when it is off."""
    return tuple(settings["adaptive_compare"] or ())


def policies_in_use(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """The policy names this engine runs: the compared ones, else ``adaptive_policy``."""
    entries = compare_entries(settings)
    if entries:
        return tuple(e.partition(":")[0] for e in entries)
    return (settings["adaptive_policy"],)


def check_compare(settings: Mapping[str, Any], source: str) -> None:
    """``adaptive_compare``: two or more known, distinct policies, a decision trace to
    write the windows to, and no recording run (which needs one fixed K); waves only with it."""
    entries = compare_entries(settings)
    if not entries:
        if settings["adaptive_compare_waves"]:
            raise SettingsError(
                f"{source}: adaptive_compare_waves ({option('adaptive_compare_waves').cli_flag}) "
                f"shapes the windows of adaptive_compare ({option('adaptive_compare').cli_flag}), "
                f"which is not set")
        return
    flag = f"{option('adaptive_compare').cli_flag} / {option('adaptive_compare').env}"
    for entry in entries:
        name, _, arg = entry.partition(":")
        if name == "fixed" and decimal_key(arg) is not None:
            continue
        if name in COMPARE_POLICIES and not arg:
            continue
        raise SettingsError(
            f"{source}: adaptive_compare ({flag}): {entry!r} is not a policy to compare "
            f"(give fixed:K or one of {', '.join(COMPARE_POLICIES)})")
    if len(entries) < 2 or len(set(entries)) < len(entries):
        raise SettingsError(
            f"{source}: adaptive_compare ({flag}) needs two or more different policies, "
            f"got {','.join(entries)}")
    if not settings["adaptive_speculation"]:
        raise SettingsError(f"{source}: adaptive_compare ({flag}) needs the controller on "
                            f"(adaptive_speculation)")
    if not settings["adaptive_trace_file"]:
        raise SettingsError(
            f"{source}: adaptive_compare ({flag}) writes its windows to the decision trace: "
            f"set adaptive_trace_file ({option('adaptive_trace_file').cli_flag})")
    if settings["adaptive_record_trace"]:
        raise SettingsError(f"{source}: adaptive_compare and adaptive_record_trace conflict "
                            f"(a recording runs at one fixed K)")


# Start-up calibration options (budget policy): grid, output, saved table.
CALIBRATION_OPTIONS = ("adaptive_dspark_calibration", "adaptive_dspark_cost_table_output",
                        "adaptive_dspark_cost_table")


def check_calibration_options(settings: Mapping[str, Any], source: str) -> None:
    """The start-up calibration options belong to the budget policy; a saved cost table
    replaces the calibration, so it takes neither a grid nor an output."""
    budget = settings["adaptive_speculation"] and "budget" in policies_in_use(settings)
    for name in CALIBRATION_OPTIONS:
        if settings[name] and not budget:
            what = ("the controller is off" if not settings["adaptive_speculation"]
                    else f"adaptive_policy is {settings['adaptive_policy']!r}")
            raise SettingsError(
                f"{source}: {name} ({option(name).cli_flag} / {option(name).env}) is read by "
                f"the budget policy only, but {what}"
            )
    if settings["adaptive_dspark_cost_table"]:
        for name in CALIBRATION_OPTIONS[:2]:
            if settings[name]:
                raise SettingsError(
                    f"{source}: {name} ({option(name).cli_flag}) and adaptive_dspark_cost_table "
                    f"({option('adaptive_dspark_cost_table').cli_flag}) conflict: a saved cost "
                    f"table skips the start-up calibration"
                )


# The drafter's LM head options of each method: (ids file, size, quantization).
DRAFT_HEAD = {
    "draft_model": ("draft_active_vocab_ids", "draft_active_vocab_size",
                    "draft_lm_head_quantization"),
    "eagle": ("eagle_draft_active_vocab_ids", "eagle_draft_active_vocab_size",
              "eagle_draft_lm_head_quantization"),
    "eagle3": ("eagle_draft_active_vocab_ids", "eagle_draft_active_vocab_size",
               "eagle_draft_lm_head_quantization"),
}


def _head_set(settings: Mapping[str, Any], names: tuple[str, str, str]) -> str | None:
    """The first of a method's head options set away from its default, else None."""
    ids, size, quant = names
    for name in (ids, size, quant):
        if settings[name] != option(name).default:
            return name
    return None


def check_active_vocab(settings: Mapping[str, Any], source: str) -> None:
    """A size needs its ids file (the tool ranks ids by a corpus's counts: a size alone
    would have to guess which ids); the file is one the tool wrote."""
    for ids, size, _ in sorted(set(DRAFT_HEAD.values())):
        if settings[size] and not settings[ids]:
            raise SettingsError(
                f"{source}: {size}={settings[size]} ({option(size).cli_flag}) needs "
                f"{ids} ({option(ids).cli_flag}): a ranked id list from vllm-hust-vspec-vocab")
        if settings[ids]:
            try:
                load_vocab_ids(settings[ids], int(settings[size]))
            except VspecError as exc:
                raise SettingsError(f"{source}: {ids} ({option(ids).cli_flag}): {exc}") from None


def draft_head_for(settings: Mapping[str, Any], method: str,
                   source: str) -> tuple[str | None, int, str, str] | None:
    """(ids file or None, size, quantization, the option that names it) of the LM head
    ``method``'s drafter computes, or None for the host's own; the head options of another
    method's drafter set for this one are an error."""
    mine = DRAFT_HEAD.get(method)
    for names in sorted(set(DRAFT_HEAD.values())):
        name = _head_set(settings, names)
        if names != mine and name is not None:
            raise SettingsError(
                f"{source}: {name} ({option(name).cli_flag}) is for method(s) "
                f"{', '.join(m for m, o in DRAFT_HEAD.items() if o == names)}, not {method}")
    if mine is None or _head_set(settings, mine) is None:
        return None
    ids, size, quant = mine
    named = ids if settings[ids] else quant
    return settings[ids] or None, int(settings[size]), str(settings[quant]), option(named).cli_flag


_RELAXED_TUNING = ("eagle_relaxed_accept_after_tokens",)
_MARGIN_TUNING = ("confidence_accept_from_position", "confidence_accept_after_tokens",
                  "confidence_protected_token_ids")


def lossy_rules(settings: Mapping[str, Any]) -> tuple[str, ...]:
    """The lossy acceptance rules in effect, as labels (() when verification is strict)."""
    out = []
    if settings["eagle_relaxed_accept_topk"] > 1:
        after = settings["eagle_relaxed_accept_after_tokens"]
        out.append(f"relaxed-top{settings['eagle_relaxed_accept_topk']}"
                   + (f"-after{after}" if after else ""))
    if settings["confidence_accept_margin"] is not None:
        out.append(f"margin{settings['confidence_accept_margin']:g}"
                   + (f"-from{settings['confidence_accept_from_position']}"
                      if settings["confidence_accept_from_position"] else "")
                   + (f"-after{settings['confidence_accept_after_tokens']}"
                      if settings["confidence_accept_after_tokens"] else ""))
    return tuple(out)


def check_lossy(settings: Mapping[str, Any], source: str) -> None:
    """A rule's tuning options need the rule."""
    for rule, tuning in (("eagle_relaxed_accept_topk", _RELAXED_TUNING),
                         ("confidence_accept_margin", _MARGIN_TUNING)):
        on = (settings[rule] > 1) if rule == "eagle_relaxed_accept_topk" else (
            settings[rule] is not None)
        for name in tuning:
            if settings[name] not in (0, None, ()) and not on:
                raise SettingsError(
                    f"{source}: {name} ({option(name).cli_flag}) tunes {rule} "
                    f"({option(rule).cli_flag}), which is not set: verification is strict")


def check_kmax(settings: Settings, kmax: int, source: str = "settings") -> None:
    """Checks against Kmax (vLLM's num_speculative_tokens), known only once the
    speculative config is."""
    if settings.adaptive_min_gamma > kmax:
        raise SettingsError(
            f"{source}: adaptive_min_gamma={settings.adaptive_min_gamma} exceeds "
            f"num_speculative_tokens (Kmax) = {kmax}"
        )
    if settings.adaptive_fixed_gamma is not None and settings.adaptive_fixed_gamma > kmax:
        raise SettingsError(
            f"{source}: adaptive_fixed_gamma={settings.adaptive_fixed_gamma} exceeds Kmax = {kmax}"
        )
    for entry in compare_entries(settings):
        name, _, arg = entry.partition(":")
        k = decimal_key(arg)
        if name == "fixed" and k is not None and k > kmax:
            raise SettingsError(f"{source}: adaptive_compare entry {entry!r} exceeds Kmax = {kmax}")
    for k in settings.adaptive_sweep or ():
        if k > kmax:
            raise SettingsError(f"{source}: adaptive_sweep value {k} exceeds Kmax = {kmax}")
    if settings.adaptive_schedule:
        parse_schedule(settings.adaptive_schedule, f"{source}: adaptive_schedule", kmax)


ScheduleEntry = tuple[int, int, int]
SCHEDULE_EXAMPLE = "'1-4:4,5-32:2'"


def parse_schedule(
    table: str | Iterable[Any], source: str, kmax: int | None = None
) -> list[ScheduleEntry]:
    """THE schedule parser: a batch-size -> K table with the semantics of vLLM's
    ``num_speculative_tokens_per_batch_size``, given as text (``'1-4:4,5-32:2'``: inclusive
    ranges ``LO-HI:K``, a single number ``'8:1'`` is the range 8-8) or as the host's table
    (a list of ``(lo, hi, K)``).  Returns the entries sorted; ranges must not overlap and the
    first must start at batch size 1 (as vLLM requires); with ``kmax`` every K is in
    ``[0, kmax]``.  Errors are one :class:`SettingsError` (a ValueError) naming ``source``
    and the entry."""
    entries = _schedule_text(table, source) if isinstance(table, str) else _schedule_rows(table, source)
    if not entries:
        raise SettingsError(source, None, f"empty table {table!r} (e.g. {SCHEDULE_EXAMPLE})")
    out = sorted(entries)
    prev_end = 0
    for lo, hi, k in out:
        if lo <= 0 or hi < lo:
            raise SettingsError(source, None, f"bad batch-size range {lo}-{hi}")
        if k < 0 or (kmax is not None and k > kmax):
            bound = f"[0, {kmax}] (kmax)" if kmax is not None else "[0, Kmax]"
            raise SettingsError(source, None,
                                f"K={k} for batch sizes {lo}-{hi} is out of range {bound}")
        if lo <= prev_end:
            raise SettingsError(source, None, f"range {lo}-{hi} overlaps the previous one")
        prev_end = hi
    if out[0][0] != 1:
        raise SettingsError(
            source, None,
            f"the first range must start at batch size 1 (got {out[0][0]}-{out[0][1]}), "
            f"as vLLM requires",
        )
    return out


def _schedule_text(text: str, source: str) -> list[ScheduleEntry]:
    entries: list[ScheduleEntry] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            rng, k = part.split(":")
            if "-" in rng:
                lo_s, hi_s = rng.split("-")
                lo, hi = int(lo_s), int(hi_s)
            else:
                lo = hi = int(rng)
            entries.append((lo, hi, int(k)))
        except ValueError:
            raise SettingsError(
                source, None,
                f"bad entry {part!r} in {text!r} (expected LO-HI:K, e.g. {SCHEDULE_EXAMPLE})",
            ) from None
    return entries


def _schedule_rows(rows: Iterable[Any], source: str) -> list[ScheduleEntry]:
    try:
        rows = list(rows)
    except TypeError:  # neither text nor a table of rows
        raise SettingsError(source, None, f"expected a table like {SCHEDULE_EXAMPLE} or "
                                          f"(LO, HI, K) rows, got {rows!r}") from None
    entries: list[ScheduleEntry] = []
    for row in rows:
        if (not isinstance(row, (list, tuple)) or len(row) != 3
                or not all(is_int(v) for v in row)):
            raise SettingsError(source, None,
                                f"bad entry {row!r} (expected (LO, HI, K) integers)")
        entries.append((int(row[0]), int(row[1]), int(row[2])))
    return entries


def iter_env_names() -> Iterable[str]:
    """Every env name the schema reads (for docs and the launcher's [env] guard)."""
    for o in options("plugin"):
        yield o.env
        yield from o.env_aliases
