"""The EAGLE-1 draft head of a Qwen2 / Qwen2.5 target, for vLLM's V1 ``EagleProposer``.

vSpec 0.14's users serve Qwen2.5 targets with EAGLE-1 heads (checkpoints whose
``architectures`` is ``Qwen2ForCausalLMEagle`` or ``Qwen2ForCausalLM``); vLLM 0.32 has an
EAGLE-1 head for Llama but none for Qwen2, and vLLM-HUST removed its own from the built-in
list.  vLLM's ``EAGLEConfig`` names the draft architecture ``"Eagle" + arch``, so the head is
registered as ``EagleQwen2ForCausalLM`` and ``EagleQwen2ForCausalLMEagle`` (and
``Qwen2ForCausalLMEagle``) by :mod:`.registration`.

The head is the EAGLE-1 layout vLLM uses for Llama, on Qwen2's decoder layers (their
attention has q/k/v biases): ``fc`` maps ``[embedding ; target hidden state]`` to one hidden
state, then the decoder layers, the first without its input norm, and no final norm.  It
shares the target's embedding and LM head unless the checkpoint has its own.  q/k/v biases a
checkpoint lacks (heads trained without them) are zero: the same function as a head without
biases, on every rank and every run.
"""

# no ``from __future__ import annotations``: vLLM's support_torch_compile reads the forward's
# annotations as types to find the dynamic dimensions
from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.qwen2 import Qwen2DecoderLayer, Qwen2ForCausalLM, Qwen2Model
from vllm.model_executor.models.utils import (AutoWeightsLoader, get_draft_quant_config,
                                              maybe_prefix, process_eagle_weight)

_QKV_BIAS = ".self_attn.qkv_proj.bias"


@support_torch_compile
class EagleQwen2Model(nn.Module):
    """The head's body: ``fc``, then the decoder layers (named after the target's layers, so
    that their attention layers get their own KV cache)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "",
                 start_layer_id: int = 0) -> None:
        super().__init__()
        spec = vllm_config.speculative_config
        assert spec is not None and spec.draft_model_config is not None
        self.config = config = spec.draft_model_config.hf_config
        quant_config = get_draft_quant_config(vllm_config)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                   prefix=maybe_prefix(prefix, "embed_tokens"))
        self.layers = nn.ModuleList(
            Qwen2DecoderLayer(config, vllm_config.cache_config, quant_config,
                              prefix=maybe_prefix(prefix, f"layers.{i + start_layer_id}"))
            for i in range(config.num_hidden_layers))
        # EAGLE-1 feeds the first layer the fused input without normalising it
        self.layers[0].input_layernorm = nn.Identity()
        self.fc = ReplicatedLinear(input_size=2 * config.hidden_size,
                                   output_size=config.hidden_size,
                                   bias=bool(getattr(config, "eagle_fc_bias", False)),
                                   params_dtype=vllm_config.model_config.dtype,
                                   quant_config=quant_config, prefix=maybe_prefix(prefix, "fc"),
                                   return_bias=False)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(torch.cat((self.embed_tokens(input_ids), hidden_states), dim=-1))
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, h, residual)
        h = h + residual
        return h, h


class EagleQwen2ForCausalLM(Qwen2ForCausalLM):
    """What vLLM's ``EagleProposer`` loads for a Qwen2 EAGLE-1 head."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)
        spec = vllm_config.speculative_config
        assert spec is not None and spec.draft_model_config is not None
        self.config = spec.draft_model_config.hf_config
        if getattr(self.config, "draft_vocab_size", None) is None:
            self.config.draft_vocab_size = self.config.vocab_size
        target_layers = vllm_config.model_config.get_num_layers(vllm_config.parallel_config)
        self.model = EagleQwen2Model(vllm_config=vllm_config,
                                     prefix=maybe_prefix(prefix, "model"),
                                     start_layer_id=target_layers)
        self.logits_processor = LogitsProcessor(self.config.vocab_size,
                                                scale=getattr(self.config, "logit_scale", 1.0))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs_embeds is not None:
            raise NotImplementedError(f"{type(self).__name__} takes no multimodal inputs")
        return self.model(input_ids, positions, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The checkpoint's weights (names with or without ``model.``); the q/k/v biases it
        lacks stay zero.  Returns every parameter name that now holds a defined value (the
        host's loader then checks that none is left undefined)."""
        zeroed = set()
        for name, param in self.named_parameters():
            if name.endswith(_QKV_BIAS):
                param.data.zero_()
                zeroed.add(name)

        def renamed(item: tuple[str, torch.Tensor]) -> tuple[str, torch.Tensor]:
            name, tensor = item
            if not name.startswith(("model.", "lm_head")):
                name = "model." + name
            process_eagle_weight(self, name)
            return name, tensor

        loaded = AutoWeightsLoader(self).load_weights(map(renamed, weights),
                                                      mapper=Qwen2Model.hf_to_vllm_mapper)
        # without its own embedding the proposer gives the head the target's (load_model)
        shared = (set() if getattr(self, "has_own_embed_tokens", False)
                  else {n for n, _ in self.named_parameters() if ".embed_tokens." in n})
        return set(loaded) | zeroed | shared
