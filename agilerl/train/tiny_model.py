"""The ``tiny`` model and tokenizer (the built-ins register them as model ``tiny``), built offline
in seconds; public here so that ``agilerl.llm_envs`` re-exports the builders inside the contract.

Tests, examples and the README's main job use them: a byte-level BPE wrapped in
``PreTrainedTokenizerFast`` with a ChatML (or Llama-3-style) chat template, and a few-layer
Qwen2 model sized to it. Nothing is downloaded.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Literal

from agilerl.errors import InvalidArgument

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "CHATML_TEMPLATE",
    "LLAMA3_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tiny_tokenizer",
    "build_tiny_model",
    "tiny_model_and_tokenizer",
    "VLM_SPECIAL_TOKENS",
    "QWEN2_VL_TEMPLATE",
    "build_tiny_vlm_processor",
    "build_tiny_vlm",
    "tiny_vlm_and_tokenizer",
]

CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\n' }}{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
"""ChatML, as Qwen and SmolLM use it, with tools rendered into the system turn."""

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{- message['content'] | trim }}{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{%- endif %}"
)
"""The Llama-3 layout: header tokens, trimmed content, ``<|eot_id|>`` ends each turn."""

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

_WORDS = (
    "the a an is are was to of and in on for with you your my it that this guess number "
    "higher lower correct wrong too high low answer question think step user assistant system "
    "tool call result reward game turn try again between pick please reply only digits equation "
    "countdown target use numbers each once make what which how many plus minus times divided "
    "hello world yes no true false done right left up down start end value sum product"
).split()


def _corpus() -> list[str]:
    lines = [" ".join(_WORDS[i : i + 7]) for i in range(0, len(_WORDS), 3)]
    lines += [f"{i} + {i * 7 % 100} = {i + i * 7 % 100}, {i * 3}." for i in range(200)]
    lines += ["Guess a number between 1 and 10. Too high! Too low! Correct!"] * 20
    lines += ["\n\n".join(_WORDS[:20]), "{\"name\": \"guess\", \"type\": \"function\"}"]
    return lines


def build_tiny_tokenizer(
    template: Literal["chatml", "llama3"] = "chatml", vocab_size: int = 512
) -> PreTrainedTokenizerFast:
    """A byte-level BPE (digits split one by one) with a real chat template; deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if template == "chatml":
        eos, chat_template = "<|im_end|>", CHATML_TEMPLATE
    elif template == "llama3":
        eos, chat_template = "<|eot_id|>", LLAMA3_TEMPLATE
    else:
        raise InvalidArgument(f"template must be 'chatml' or 'llama3', got {template!r}")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token=eos,
        pad_token="<|endoftext|>",
        chat_template=chat_template,
        padding_side="left",
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised few-layer Qwen2 causal LM matching ``tokenizer``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def tiny_model_and_tokenizer(*, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The registered ``tiny`` model: what ``model.name_or_path: tiny`` trains."""
    tokenizer = build_tiny_tokenizer("chatml")
    return build_tiny_model(tokenizer, seed=seed), tokenizer


# -- tiny-vlm: a tiny Qwen2-VL and its processor, built offline ---------------------------------

VLM_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
"""Qwen2-VL's vision tokens: an image is ``<|vision_start|><|image_pad|><|vision_end|>`` in the
template's text, and the processor repeats ``<|image_pad|>`` once per merged patch."""

# ChatML whose content may be a list of parts, as Qwen2-VL's own template renders them
QWEN2_VL_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] == 'image' or 'image' in part -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- render(messages[0]['content']) + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\n' }}{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + render(message['content']) + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
"""ChatML with image parts rendered as Qwen2-VL renders them."""

TINY_VLM_PATCH = 8
"""Pixels per patch side; with a 2x2 merge one image token covers 16x16 pixels."""


def build_tiny_vlm_processor(*, max_pixels: int = 64 * 64) -> Any:
    """A Qwen2-VL processor: the tiny BPE plus the vision tokens, and an image processor sized for
    small pictures (at most ``max_pixels``, so at most ``max_pixels / 256`` image tokens)."""
    from transformers import Qwen2VLProcessor

    try:
        from transformers import Qwen2VLImageProcessorPil as ImageProcessor
    except ImportError:  # transformers < 5
        from transformers import Qwen2VLImageProcessor as ImageProcessor

    tokenizer = build_tiny_tokenizer("chatml")
    tokenizer.add_special_tokens({"additional_special_tokens": VLM_SPECIAL_TOKENS})
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    side = TINY_VLM_PATCH * 2
    image_processor = ImageProcessor(
        patch_size=TINY_VLM_PATCH, merge_size=2, temporal_patch_size=2,
        min_pixels=side * side, max_pixels=max_pixels,
    )
    return _images_only(Qwen2VLProcessor)(image_processor, tokenizer, chat_template=QWEN2_VL_TEMPLATE)


@functools.cache
def _images_only(processor_class: type) -> type:
    """``processor_class`` without its video processor (which needs torchvision): images only."""
    from transformers import ProcessorMixin

    def __init__(self: Any, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs: Any) -> None:
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return type(processor_class.__name__, (processor_class,), {"__init__": __init__, "__module__": __name__})


def build_tiny_vlm(
    processor: Any, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, seed: int = 0
) -> PreTrainedModel:
    """A randomly initialised few-layer Qwen2-VL (vision tower and language model) for ``processor``."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VLM_SPECIAL_TOKENS}
    head_dim = hidden_size // num_heads
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": hidden_size * 4,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_heads,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [head_dim // 4, head_dim // 8, head_dim // 8]},
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": hidden_size,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": TINY_VLM_PATCH,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config)


def tiny_vlm_and_tokenizer(*, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The registered ``tiny-vlm``: the model and its tokenizer carrying the processor
    (``agilerl.generation.media.attach_processor``)."""
    from agilerl.generation.media import attach_processor

    processor = build_tiny_vlm_processor()
    return build_tiny_vlm(processor, seed=seed), attach_processor(processor)
