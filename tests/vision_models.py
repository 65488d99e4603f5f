"""Processors of five vision-language families, built offline from code (no hub): the tiny BPE
plus each family's image tokens, and the family's real processor class sized for small images;
and a tiny randomly initialised model of each.

Qwen2-VL's is the built-in ``tiny-vlm``'s; Qwen2.5-VL's shares its image processor and template;
LLaVA, Idefics3 (SmolVLM's family, with and without tiles) and Gemma 3 are built here for the
tests, their chat templates ChatML with each family's image placeholder (``<image>``), taking
plain and list content alike (Gemma 3's its own). ``REAL_TEMPLATES`` pairs them with the models'
own chat templates. ``AlbumEnv`` shows pictures of several sizes over several turns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agilerl.train.tiny_model import QWEN2_VL_TEMPLATE, build_tiny_tokenizer, build_tiny_vlm_processor

IMAGE_TEMPLATE = QWEN2_VL_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")


def _tokenizer(tokens: list[str]) -> Any:
    tokenizer = build_tiny_tokenizer("chatml")
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    tokenizer.chat_template = IMAGE_TEMPLATE
    return tokenizer


def qwen2_vl_processor() -> Any:
    return build_tiny_vlm_processor()


def qwen2_5_vl_processor() -> Any:
    """Qwen2.5-VL's processor class over tiny-vlm's image processor and tokenizer (images only:
    its video processor needs torchvision)."""
    from transformers import Qwen2_5_VLProcessor

    from agilerl.train.tiny_model import _images_only

    base = build_tiny_vlm_processor()
    return _images_only(Qwen2_5_VLProcessor)(base.image_processor, base.tokenizer, chat_template=QWEN2_VL_TEMPLATE)


def llava_processor() -> Any:
    """LLaVA-1.5's processor: CLIP preprocessing to 32x32, one ``<image>`` per 8x8 patch (16)."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return LlavaProcessor(
        image_processor=image_processor, tokenizer=_tokenizer(["<image>"]), patch_size=8,
        vision_feature_select_strategy="default", chat_template=IMAGE_TEMPLATE, image_token="<image>",
        num_additional_image_tokens=1,
    )


def gemma3_processor() -> Any:
    """Gemma 3's processor: SigLIP preprocessing to 32x32; an image becomes ``\n\n<start_of_image>``,
    four ``<image_soft_token>`` and ``<end_of_image>\n\n`` (text around the placeholder: where vLLM's
    ids and the processor's differ is wider than the placeholder)."""
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor

    marks = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tokenizer = _tokenizer(["<start_of_turn>", "<end_of_turn>", *marks.values()])
    for name, token in marks.items():  # what Gemma 3's tokenizer names them by
        setattr(tokenizer, name, token)
        setattr(tokenizer, f"{name}_id", tokenizer.convert_tokens_to_ids(token))
    template = (TEMPLATES / "gemma3.jinja").read_text()
    tokenizer.chat_template = template
    image_processor = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    return Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, chat_template=template, image_seq_length=4)


def idefics3_processor(*, split: bool = False) -> Any:
    """Idefics3's (SmolVLM's family): each image becomes ``<fake_token_around_image><global-img>``,
    ``image_seq_len`` ``<image>`` tokens and another ``<fake_token_around_image>``; with ``split``
    the image is also cut into tiles, each with its ``<row_i_col_j>`` token."""
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor

    tiles = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    tokenizer = _tokenizer(["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *tiles])
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=split, size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
    )
    return Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4, chat_template=IMAGE_TEMPLATE)


def square(rgb: tuple[int, int, int], width: int = 40, height: int = 24) -> Any:
    """A ``width`` x ``height`` picture of ``rgb``, patterned (not flat: resizing has something to keep)."""
    import numpy

    pixels = numpy.zeros((height, width, 3), dtype=numpy.uint8)
    pixels[:] = rgb
    pixels[::3, ::5] = 255 - numpy.array(rgb, dtype=numpy.uint8)
    return pixels


class AlbumEnv:
    """Shows a picture at reset and with every answer (two on the second turn), then text."""

    max_turns = 4

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.turn = 0

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        self.turn = 0
        return {"text": f"What is this?{self.text}", "image": square((200, 20, 20))}, {}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.turn += 1
        if self.turn == 1:
            return {"text": "And these?", "images": [square((20, 200, 20), 24, 40), square((20, 20, 200))]}, 0.0, False, False, {}
        if self.turn == 2:
            return f"Now in words.{self.text}", 0.5, False, False, {}
        return {"text": "Last one.", "image": square((90, 90, 90), 64, 64)}, 1.0, False, False, {}


TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
REAL_TEMPLATES = {  # the models' own chat templates (their hub chat_template), on each family's processor
    "Qwen2-VL-Instruct": ("qwen2_vl", "qwen2_vl.jinja", {}),  # Qwen2.5-VL-Instruct's is the same
    "Qwen2-VL-Instruct, add_vision_id": ("qwen2_vl", "qwen2_vl.jinja", {"add_vision_id": True}),  # "Picture 3:"
    "Qwen2.5-VL-Instruct": ("qwen2_5_vl", "qwen2_vl.jinja", {}),
    "SmolVLM-Instruct": ("idefics3", "smolvlm.jinja", {}),  # content as parts only
    "SmolVLM-Instruct, tiles": ("idefics3_tiles", "smolvlm.jinja", {}),
    "llava-1.5-hf": ("llava", "llava_1_5.jinja", {}),  # content as parts only
    "llava-onevision-hf": ("llava", "llava_onevision.jinja", {}),
    "gemma-3-it": ("gemma3", "gemma3.jinja", {}),  # roles must alternate; content trimmed
}


def with_real_template(name: str) -> tuple[Any, dict[str, Any]]:
    """The processor of ``REAL_TEMPLATES[name]``'s family, rendering with that model's own chat
    template, and the template's kwargs."""
    family, file, kwargs = REAL_TEMPLATES[name]
    processor = FAMILIES[family]()
    processor.chat_template = processor.tokenizer.chat_template = (TEMPLATES / file).read_text()
    return processor, kwargs


FAMILIES = {
    "qwen2_vl": qwen2_vl_processor,
    "qwen2_5_vl": qwen2_5_vl_processor,
    "llava": llava_processor,
    "idefics3": idefics3_processor,
    "idefics3_tiles": lambda: idefics3_processor(split=True),
    "gemma3": gemma3_processor,
}


def tiny_llava(processor: Any) -> Any:
    """A randomly initialised tiny LLaVA (a CLIP tower, a Qwen2 LM) matching ``llava_processor()``."""
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    tokenizer = processor.tokenizer
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8,
        ),
        text_config=Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        ),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(0)
    return LlavaForConditionalGeneration(config)


def tiny_idefics3(processor: Any, seed: int = 0) -> Any:
    """A randomly initialised tiny Idefics3 (SmolVLM's architecture) matching ``idefics3_processor()``:
    32x32 images in 8x8 patches, pixel-shuffled by 2: 4 image tokens, as the processor expands."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    tokenizer = processor.tokenizer
    config = Idefics3Config(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        text_config={"model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                     "max_position_embeddings": 2048, "pad_token_id": tokenizer.pad_token_id,
                     "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id},
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Idefics3ForConditionalGeneration(config)


def tiny_qwen2_5_vl(processor: Any) -> Any:
    """A randomly initialised tiny Qwen2.5-VL matching ``qwen2_5_vl_processor()``: windowed
    attention in the vision tower's first block, full in its second."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from agilerl.train.tiny_model import TINY_VLM_PATCH

    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]},
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
            "patch_size": TINY_VLM_PATCH, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "window_size": TINY_VLM_PATCH * 4, "fullatt_block_indexes": [1],
        },
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config)


def tiny_gemma3(processor: Any) -> Any:
    """A randomly initialised tiny Gemma 3 matching ``gemma3_processor()``: a SigLIP tower on 32x32
    pictures in 8x8 patches, pooled to four image tokens."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    tokenizer = processor.tokenizer
    config = Gemma3Config(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 2048,
            "sliding_window": 64, "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": tokenizer.bos_token_id,
        },
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        mm_tokens_per_image=4,
        boi_token_index=tokenizer.boi_token_id, eoi_token_index=tokenizer.eoi_token_id,
        image_token_index=tokenizer.image_token_id,
    )
    torch.manual_seed(0)
    return Gemma3ForConditionalGeneration(config)


def tiny_model(family: str, processor: Any) -> Any:
    """The tiny model of ``family`` (a key of ``FAMILIES``) for its processor."""
    from agilerl.train.tiny_model import build_tiny_vlm

    builders = {"qwen2_vl": build_tiny_vlm, "qwen2_5_vl": tiny_qwen2_5_vl, "llava": tiny_llava, "gemma3": tiny_gemma3}
    return builders.get(family, tiny_idefics3)(processor)
