"""Register the plugin's out-of-tree models with vLLM where the host has none of its own.

``Qwen2ForCausalLMEagle`` (vSpec 0.14's name for a Qwen2 EAGLE-1 head) and the names vLLM's
``EAGLEConfig`` derives from a head's architectures (``"Eagle" + arch``): each is registered
through ``ModelRegistry.register_model`` by module path (imported only when a model of that
architecture loads), and only where the host's registry lacks it, so a host that has its own
keeps it.
"""

from __future__ import annotations

from vllm_hust_vspec.patchspec import PROCESS_FRONTEND, PatchSpec, Symbol

_QWEN2 = "vllm.model_executor.models.qwen2"
_UTILS = "vllm.model_executor.models.utils"
_REGISTRY = "vllm.model_executor.models.registry"

# What the registration and the model touch in the host, for the doctor (not a patch: nothing
# of the host is replaced; the host's registry takes one more entry where it lacks it).
SPEC = PatchSpec(
    name="qwen2-eagle-model",
    target=Symbol(_REGISTRY, "_ModelRegistry.register_model", params=("model_arch", "model_cls")),
    requires=(
        Symbol(_REGISTRY, "_ModelRegistry.get_supported_archs"),
        Symbol(_QWEN2, "Qwen2DecoderLayer.__init__", params=("config", "cache_config",
                                                             "quant_config", "prefix")),
        Symbol(_QWEN2, "Qwen2ForCausalLM"),
        Symbol(_QWEN2, "Qwen2Model.hf_to_vllm_mapper"),
        Symbol(_UTILS, "AutoWeightsLoader"),
        Symbol(_UTILS, "get_draft_quant_config"),
        Symbol(_UTILS, "process_eagle_weight"),
        Symbol("vllm.compilation.decorators", "support_torch_compile"),
    ),
    process=PROCESS_FRONTEND,
    methods=("eagle",),
    adaptive=False,
    applies=False,
    why="Qwen2 EAGLE-1 heads (vSpec 0.14's Qwen2ForCausalLMEagle) on hosts without one",
    remove_when="vLLM registers an EAGLE-1 head for Qwen2 itself",
)

QWEN2_EAGLE = "vllm_hust_vspec.models.qwen2_eagle:EagleQwen2ForCausalLM"
QWEN2_EAGLE_ARCHITECTURES = ("EagleQwen2ForCausalLM", "EagleQwen2ForCausalLMEagle",
                             "Qwen2ForCausalLMEagle")


def register_models() -> tuple[str, ...]:
    """Register what the host lacks; returns the architectures registered here."""
    from vllm import ModelRegistry

    have = set(ModelRegistry.get_supported_archs())
    added = tuple(a for a in QWEN2_EAGLE_ARCHITECTURES if a not in have)
    for arch in added:
        ModelRegistry.register_model(arch, QWEN2_EAGLE)
    return added


def host_has_own(registry_source: str) -> tuple[str, ...]:
    """The Qwen2 EAGLE architectures a host's ``registry.py`` source names itself (the doctor
    reads it without importing the host)."""
    return tuple(a for a in QWEN2_EAGLE_ARCHITECTURES if f'"{a}"' in registry_source)
