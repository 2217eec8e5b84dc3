"""A Qwen2 target and its Qwen2 EAGLE-1 head, rewritten from the trained Llama fixtures.

Qwen2's decoder is Llama's with q/k/v biases: the target with zero biases computes the Llama
target's function, and the EAGLE head (checkpoint architecture ``Qwen2ForCausalLMEagle``, as
vSpec 0.14's Qwen2.5 heads) keeps the Llama head's weights and no biases at all, the case
whose missing biases the plugin's head must fill with zeros.  Seconds, no training; the
trained pair stays the one the builder hashes.
"""

from __future__ import annotations

import json
import pathlib
import shutil

_COPY = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
_KEEP = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "num_key_value_heads", "hidden_act", "max_position_embeddings",
         "rms_norm_eps", "rope_parameters", "tie_word_embeddings", "bos_token_id",
         "eos_token_id", "pad_token_id", "initializer_range")


def _qwen2_config(llama: dict, architectures: list[str]) -> dict:
    n = llama["num_hidden_layers"]
    cfg = {k: llama[k] for k in _KEEP if k in llama}
    cfg.update(architectures=architectures, model_type="qwen2", dtype=llama.get("dtype", "float32"),
               use_sliding_window=False, max_window_layers=n,
               layer_types=["full_attention"] * n)
    return cfg


def _write(src: pathlib.Path, dst: pathlib.Path, architectures: list[str], biases: bool) -> None:
    from safetensors.torch import load_file, save_file
    import torch

    dst.mkdir(parents=True, exist_ok=True)
    llama = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(_qwen2_config(llama, architectures), indent=2))
    state = load_file(str(src / "model.safetensors"))
    if biases:
        for name, t in list(state.items()):
            for proj in ("q_proj", "k_proj", "v_proj"):
                if name.endswith(f".self_attn.{proj}.weight"):
                    state[name[: -len("weight")] + "bias"] = torch.zeros(t.shape[0], dtype=t.dtype)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"))
    for name in _COPY:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


def qwen2_pair(fixtures: pathlib.Path, out: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """(target, EAGLE head) directories under ``out``."""
    target, head = out / "target-qwen2", out / "eagle-qwen2"
    _write(fixtures / "target", target, ["Qwen2ForCausalLM"], biases=True)
    _write(fixtures / "eagle", head, ["Qwen2ForCausalLMEagle"], biases=False)
    return target, head
