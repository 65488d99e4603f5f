"""The tiny Qwen2 model and its tokenizer written as a real GGUF file (f32, a few hundred KB), so
GGUF loading is tested offline without a downloaded model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_BLOCK_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_tiny_gguf(path: Path, model: Any, tokenizer: Any) -> Path:
    """``model`` (a Qwen2 from ``build_tiny_model``) and its byte-level BPE ``tokenizer`` as GGUF."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)

    bpe = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens = [f"[UNUSED{i}]" for i in range(config.vocab_size)]
    types = [gguf.TokenType.UNUSED] * config.vocab_size
    for token, index in bpe["model"]["vocab"].items():
        tokens[index], types[index] = token, gguf.TokenType.NORMAL
    for added in bpe["added_tokens"]:
        tokens[added["id"]], types[added["id"]] = added["content"], gguf.TokenType.CONTROL
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in bpe["model"]["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_chat_template(tokenizer.chat_template)

    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if name in _GLOBAL_TENSORS:
            gguf_name = _GLOBAL_TENSORS[name]
        else:
            _, _, block, rest = name.split(".", 3)  # model.layers.<block>.<rest>
            gguf_name = f"blk.{block}.{_BLOCK_TENSORS[rest]}"
        writer.add_tensor(gguf_name, tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
