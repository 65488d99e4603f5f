"""Processors of three vision-language families, built offline from code (no hub): the tiny BPE
plus each family's image tokens, and the family's real processor class sized for small images.

``QWEN2_VL`` is the built-in ``tiny-vlm``'s; LLaVA and Idefics3 (SmolVLM's processor family) are
built here for the tests. Their chat templates are ChatML with each family's image placeholder
(``<image>``), taking plain and list content alike.
"""

from __future__ import annotations

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


def llava_processor() -> Any:
    """LLaVA-1.5's processor: CLIP preprocessing to 32x32, one ``<image>`` per 8x8 patch (16)."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return LlavaProcessor(
        image_processor=image_processor, tokenizer=_tokenizer(["<image>"]), patch_size=8,
        vision_feature_select_strategy="default", chat_template=IMAGE_TEMPLATE, image_token="<image>",
        num_additional_image_tokens=1,
    )


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


FAMILIES = {"qwen2_vl": qwen2_vl_processor, "llava": llava_processor, "idefics3": idefics3_processor}


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


def tiny_idefics3(processor: Any) -> Any:
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
    torch.manual_seed(0)
    return Idefics3ForConditionalGeneration(config)
