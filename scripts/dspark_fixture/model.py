"""The DSpark drafter for training, written to compute what vLLM 0.32 computes.

It mirrors ``vllm/model_executor/models/qwen3_dflash.py`` (the parallel backbone) and
``qwen3_dspark.py`` (the Markov and confidence heads), in the anchor-as-first block layout
(``sample_from_anchor``, DeepSpec's and vLLM's default):

* context: the target's residual stream after layers ``target_layer_ids`` at every position
  before the anchor, concatenated, ``fc``, then ``hidden_norm``; each layer projects it with
  its own k/v weights, ``k_norm``, RoPE at the context positions (vLLM writes these into the
  drafter's KV cache, ``precompute_and_store_context_kv``);
* query block of width N at positions a..a+N-1: the anchor token (the token the target just
  produced at a) and N-1 mask tokens; a stack of Qwen3 decoder layers (q/k norms, RoPE),
  attention over the context and the whole block (non-causal inside the block); ``norm``;
* block slot j predicts the token at a+j+1: ``lm_head(h_j) + W1[prev_j] @ W2^T``, ``prev_0``
  the anchor, ``prev_j`` the token chosen at slot j-1 (sampled left to right);
* confidence of slot j: ``sigmoid(proj([h_j ; W1[prev_j]]))``, the probability that slot j
  is accepted given that the slots before it were.

Parameter names are the checkpoint names vLLM's ``Qwen3DSparkForCausalLM`` loads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fixtures import heads as H

#: The drafter's shape (a Qwen3 stack as wide as the target, so its copies of the target's
#: embedding and LM head fit) and its DSpark options.
SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
MARKOV_RANK = 32
#: DFlash/DSpark layer-id convention: ``i`` = the residual stream after target layer ``i``.
TARGET_LAYER_IDS = [0, 1, 2]
#: Widths the drafter is trained at (every width up to the widest, so a step that drafts
#: fewer tokens sees a block like those it learnt from).
MAX_WIDTH = 7


class Layer(nn.Module):
    def __init__(self, shape: dict, eps: float) -> None:
        super().__init__()
        h, hd = shape["hidden_size"], shape["head_dim"]
        self.heads, self.kv_heads, self.head_dim = shape["num_attention_heads"], shape["num_key_value_heads"], hd
        self.input_layernorm = H.RMSNorm(h, eps)
        self.post_attention_layernorm = H.RMSNorm(h, eps)
        attn = nn.Module()
        attn.q_proj = nn.Linear(h, self.heads * hd, bias=False)
        attn.k_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        attn.v_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        attn.o_proj = nn.Linear(self.heads * hd, h, bias=False)
        attn.q_norm = H.RMSNorm(hd, eps)
        attn.k_norm = H.RMSNorm(hd, eps)
        self.self_attn = attn
        self.mlp = H.MLP(h, shape["intermediate_size"])

    def _kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.self_attn
        b, t, _ = x.shape
        k = a.k_norm(a.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = a.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return H._rotate(k, cos.unsqueeze(1), sin.unsqueeze(1)), v

    def forward(self, h: torch.Tensor, ctx: torch.Tensor, cos_q, sin_q, cos_c, sin_c,
                mask: torch.Tensor) -> torch.Tensor:
        """``h`` [B, Q, H] the block slots, ``ctx`` [B, T, H] the normed context states,
        ``mask`` [B, Q, T + Q] (True = attend)."""
        a = self.self_attn
        b, q_len, _ = h.shape
        x = self.input_layernorm(h)
        q = a.q_norm(a.q_proj(x).view(b, q_len, self.heads, self.head_dim)).transpose(1, 2)
        q = H._rotate(q, cos_q.unsqueeze(1), sin_q.unsqueeze(1))
        k_blk, v_blk = self._kv(x, cos_q, sin_q)
        k_ctx, v_ctx = self._kv(ctx, cos_c, sin_c)
        rep = self.heads // self.kv_heads
        k = torch.cat((k_ctx, k_blk), dim=2).repeat_interleave(rep, dim=1)
        v = torch.cat((v_ctx, v_blk), dim=2).repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1))
        h = h + a.o_proj(o.transpose(1, 2).reshape(b, q_len, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


class DSparkDraft(nn.Module):
    def __init__(self, target_cfg: dict, vocab: int, mask_token_id: int) -> None:
        super().__init__()
        h, eps = SHAPE["hidden_size"], target_cfg["rms_norm_eps"]
        self.vocab, self.mask_token_id, self.eps = vocab, mask_token_id, eps
        self.theta = rope_theta(target_cfg)
        self.embed_tokens = nn.Embedding(vocab, h)
        self.mask_embedding = nn.Parameter(torch.zeros(h))  # written into embed_tokens[mask] on save
        self.fc = nn.Linear(len(TARGET_LAYER_IDS) * target_cfg["hidden_size"], h, bias=False)
        self.hidden_norm = H.RMSNorm(h, eps)
        self.layers = nn.ModuleList([Layer(SHAPE, eps) for _ in range(SHAPE["num_hidden_layers"])])
        self.norm = H.RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, vocab, bias=False)
        self.markov_w1 = nn.Embedding(vocab, MARKOV_RANK)
        self.markov_w2 = nn.Linear(MARKOV_RANK, vocab, bias=False)  # weight [V, r] as vLLM's ParallelLMHead
        self.confidence = nn.Linear(h + MARKOV_RANK, 1, bias=True)
        nn.init.zeros_(self.markov_w2.weight)  # the Markov bias starts at nothing

    def init_from_target(self, target: nn.Module) -> None:
        """Copy the target's embedding and LM head (kept frozen) and start the mask slot
        from the mean embedding."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
            self.lm_head.weight.copy_(target.lm_head.weight)
            self.mask_embedding.copy_(target.model.embed_tokens.weight.mean(0))
        self.embed_tokens.requires_grad_(False)
        self.lm_head.requires_grad_(False)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.embed_tokens(ids)
        return torch.where((ids == self.mask_token_id).unsqueeze(-1), self.mask_embedding.to(e.dtype), e)

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(aux))

    def backbone(self, block_ids: torch.Tensor, block_pos: torch.Tensor, ctx: torch.Tensor,
                 ctx_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, Q, H] of the block slots (after ``norm``)."""
        cos_t, sin_t = H.rope(int(max(block_pos.max(), ctx_pos.max())) + 1, SHAPE["head_dim"], self.theta)
        cos_q, sin_q = cos_t[block_pos], sin_t[block_pos]
        cos_c, sin_c = cos_t[ctx_pos], sin_t[ctx_pos]
        h = self.embed(block_ids)
        for layer in self.layers:
            h = layer(h, ctx, cos_q, sin_q, cos_c, sin_c, mask)
        return self.norm(h)

    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(self.markov_w1(prev))

    def slot_logits(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) + self.markov_bias(prev)

    def confidence_logit(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        feats = torch.cat((hidden, self.markov_w1(prev)), dim=-1).float()
        return self.confidence(feats).squeeze(-1)

    @torch.no_grad()
    def draft(self, hidden: torch.Tensor, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy left-to-right drafting over a block's hidden states [B, N, H]: tokens
        [B, N] and confidence logits [B, N] (before calibration)."""
        prev, toks, conf = anchor, [], []
        for j in range(hidden.shape[1]):
            conf.append(self.confidence_logit(hidden[:, j], prev))
            prev = self.slot_logits(hidden[:, j], prev).argmax(-1)
            toks.append(prev)
        return torch.stack(toks, 1), torch.stack(conf, 1)

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The parameters under the names ``Qwen3DSparkForCausalLM.load_weights`` reads."""
        emb = self.embed_tokens.weight.detach().clone()
        emb[self.mask_token_id] = self.mask_embedding.detach()
        out = {"embed_tokens.weight": emb, "fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm.weight,
               "norm.weight": self.norm.weight, "lm_head.weight": self.lm_head.weight,
               "markov_head.markov_w1.weight": self.markov_w1.weight,
               "markov_head.markov_w2.weight": self.markov_w2.weight,
               "confidence_head.proj.weight": self.confidence.weight,
               "confidence_head.proj.bias": self.confidence.bias}
        for i, layer in enumerate(self.layers):
            for name, p in layer.named_parameters():
                out[f"layers.{i}.{name}"] = p
        return {k: v.detach().float().contiguous().clone() for k, v in out.items()}


def rope_theta(target_cfg: dict) -> float:
    """The target's RoPE base (newer transformers keep it under ``rope_parameters``)."""
    theta = target_cfg.get("rope_theta") or (target_cfg.get("rope_parameters") or {}).get("rope_theta")
    if theta is None:
        raise ValueError("the target's config has no rope_theta")
    return float(theta)


def block_mask(anchors: torch.Tensor, ctx_len: int, width: int) -> torch.Tensor:
    """[B, A*width, ctx_len + A*width]: slot of block b sees context positions < its anchor
    and every slot of its own block."""
    b, a = anchors.shape
    q = a * width
    blk = torch.arange(q) // width
    anchor_of_q = anchors[:, blk]  # [B, Q]
    ctx_ok = torch.arange(ctx_len).view(1, 1, -1) < anchor_of_q.unsqueeze(-1)
    same = (blk.view(-1, 1) == blk.view(1, -1)).unsqueeze(0).expand(b, q, q)
    return torch.cat((ctx_ok, same), dim=-1)


def config(target_cfg: dict, vocab: int, mask_token_id: int, token_ids: dict, width: int,
           temperatures: list[float]) -> dict:
    """The ``config.json`` of the drafter (a Qwen3 config vLLM maps to
    ``Qwen3DSparkForCausalLM``)."""
    return {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3",
        **SHAPE, "vocab_size": vocab, "rms_norm_eps": target_cfg["rms_norm_eps"],
        "rope_theta": rope_theta(target_cfg),
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta(target_cfg)},
        "max_position_embeddings": target_cfg["max_position_embeddings"],
        "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
        "torch_dtype": "float32", **token_ids,
        "target_hidden_size": target_cfg["hidden_size"],
        "num_target_layers": target_cfg["num_hidden_layers"],
        "block_size": width, "sample_from_anchor": True,
        "target_layer_ids": list(TARGET_LAYER_IDS), "mask_token_id": mask_token_id,
        "dflash_config": {"target_layer_ids": list(TARGET_LAYER_IDS), "mask_token_id": mask_token_id,
                          "use_aux_hidden_state": True, "causal": False},
        "markov_rank": MARKOV_RANK, "markov_head_type": "low_rank",
        "enable_confidence_head": True, "confidence_head_with_markov": True,
        # Per-slot temperatures of the confidence logits (sequential temperature scaling,
        # fitted by the fixture builder); vllm-hust-vspec's DSpark proposer applies them.
        "hust_confidence_temperatures": [float(t) for t in temperatures],
    }
