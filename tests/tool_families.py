"""Tokenizers of each tool-calling family for tests: the tiny BPE with the family's real special
tokens and its real chat template (tests/data/chat_templates), built offline."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"

# family -> (template file, eos, special tokens the family's tokenizer has as single tokens)
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "hermes": ("qwen2_5.jinja", "<|im_end|>", ("<tool_call>", "</tool_call>")),
    "hermes-qwen3": ("qwen3.jinja", "<|im_end|>", ("<tool_call>", "</tool_call>", "<think>", "</think>")),
    "qwen3_coder": ("qwen3_coder.jinja", "<|im_end|>", ("<tool_call>", "</tool_call>")),
    "llama3_json": ("llama3_1.jinja", "<|eot_id|>", ("<|python_tag|>", "<|eom_id|>")),
    "mistral": ("mistral.jinja", "</s>", ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")),
    "granite": ("granite3.jinja", "<|end_of_text|>", ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>")),
    "gemma": ("gemma4.jinja", "<turn|>", ("<bos>", "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", "<|tool>", "<tool|>", '<|"|>', "<|channel>", "<channel|>")),
    "harmony": ("gpt_oss.jinja", "<|return|>", ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>")),
    "deepseek": ("deepseek_v3.jinja", "<｜end▁of▁sentence｜>", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<think>", "</think>")),
}


@lru_cache(maxsize=None)
def family_tokenizer(family: str):
    """The tiny tokenizer with ``family``'s special tokens and chat template."""
    from transformers import PreTrainedTokenizerFast

    from agilerl.train.tiny_model import build_tiny_tokenizer

    template_file, eos, specials = FAMILIES[family]
    base = build_tiny_tokenizer()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer.__class__.from_str(base.backend_tokenizer.to_str()),
        eos_token=eos if eos in specials or eos in base.all_special_tokens else None,
        pad_token="<|endoftext|>",
        chat_template=(TEMPLATES / template_file).read_text(),
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [t for t in specials if t != eos] + ([eos] if eos not in base.get_vocab() else [])})
    if tokenizer.eos_token is None:
        tokenizer.eos_token = eos
    tokenizer.bos_token = {"mistral": "<s>", "gemma": "<bos>", "deepseek": "<｜begin▁of▁sentence｜>", "llama3_json": "<|begin_of_text|>"}.get(family)
    return tokenizer
