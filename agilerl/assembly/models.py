"""Loading the model and tokenizer a manifest's ``model:`` section names.

A registered model (``tiny``, built offline in a second, is the built-ins'; plugins add more
through ``register_models``) is built by its plugin; anything else is a local folder, a local ``.gguf`` file (dequantised by transformers; needs ``gguf``) or a Hugging Face hub
id. Optional LoRA adapters come from peft.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.errors import ModelLoadError
from agilerl.images import ImageLimits
from agilerl.generation.media import attach_processor, limit_images, processor_of
from agilerl.registry import get_registry, resolve
from agilerl.manifest.settings import LoraSettings, ModelSettings

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["load_model_and_tokenizer", "load_tokenizer"]

def load_model_and_tokenizer(
    settings: ModelSettings,
    *,
    base_dir: str | Path | None = None,
    seed: int = 0,
    checkpoint: str | Path | None = None,
) -> tuple[PreTrainedModel, Any]:
    """The model (with LoRA adapters when configured) and its tokenizer.

    ``checkpoint`` (a folder ``save_checkpoint`` wrote) replaces the named weights, so a resumed
    run continues from the saved ones; with LoRA it holds only the adapters.
    """
    if checkpoint is not None and settings.lora is None:
        if settings.name_or_path in get_registry().names("model"):
            model, tokenizer = resolve("model", settings.name_or_path)(seed=seed)
            if processor_of(tokenizer) is not None:  # its processor is built from code, not loaded
                model = type(model).from_pretrained(str(checkpoint))
                limit_images(tokenizer, ImageLimits(max_pixels=settings.max_image_pixels, max_images=settings.max_images))
                return model, tokenizer
        return _from_pretrained(str(checkpoint), None, settings)
    if settings.name_or_path in get_registry().names("model"):
        model, tokenizer = resolve("model", settings.name_or_path)(seed=seed)
    else:
        model, tokenizer = _from_pretrained(*_locate(settings.name_or_path, base_dir), settings)
    if settings.lora is not None:
        model = _with_lora(model, settings.lora, checkpoint)
    limit_images(tokenizer, ImageLimits(max_pixels=settings.max_image_pixels, max_images=settings.max_images))
    return model, tokenizer


def load_tokenizer(name_or_path: str, *, base_dir: str | Path | None = None) -> Any:
    """The tokenizer of a registered model, a local folder or ``.gguf`` file, or a hub id."""
    if name_or_path in get_registry().names("model"):
        return resolve("model", name_or_path)(seed=0)[1]
    from transformers import AutoTokenizer

    source, gguf_file = _locate(name_or_path, base_dir)
    try:
        return AutoTokenizer.from_pretrained(source, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot load a tokenizer from {name_or_path!r}: {exc}. Name a registered model "
            "(agilerl models list), a local folder or .gguf file, or a hub id."
        ) from None


def _locate(name_or_path: str, base_dir: str | Path | None) -> tuple[str, str | None]:
    """``(source, gguf_file)``: a local folder or ``.gguf`` file (relative to the manifest) if
    one exists, else the hub id unchanged. transformers reads a GGUF file as a name in a folder."""
    for candidate in (Path(base_dir or ".") / name_or_path, Path(name_or_path)):
        if candidate.is_dir():
            return str(candidate.resolve()), None
        if candidate.is_file() and candidate.suffix == ".gguf":
            return str(candidate.resolve().parent), candidate.name
    return name_or_path, None


def _from_pretrained(source: str, gguf_file: str | None, settings: ModelSettings) -> tuple[PreTrainedModel, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        with _gguf_bars_follow_transformers(gguf_file):
            if gguf_file is None and _is_vision_language(source):
                # Qwen2-VL / Qwen2.5-VL, SmolVLM / Idefics3, LLaVA: the processor renders images
                from transformers import AutoModelForImageTextToText, AutoProcessor

                tokenizer = attach_processor(AutoProcessor.from_pretrained(source))
                model = AutoModelForImageTextToText.from_pretrained(source, dtype=getattr(torch, settings.dtype))
                return _with_pad(model, tokenizer)
            tokenizer = AutoTokenizer.from_pretrained(source, **where)
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=getattr(torch, settings.dtype), **where, **_dequantized(gguf_file)
            )
    except ImportError as exc:  # a package the model needs: gguf for a .gguf file, or the model's own
        hint = " Install it: pip install 'agilerl-envlayer[gguf]'." if gguf_file else ""
        raise ModelLoadError(f"model.name_or_path {settings.name_or_path!r}: {exc}{hint}") from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"model.name_or_path {settings.name_or_path!r}: cannot load {source!r} ({exc}). "
            "Use 'tiny' (built in, offline), a local folder holding a saved model, a local .gguf "
            "file, or a hub id that is in the local cache or downloadable (HF_HUB_OFFLINE=1 "
            "forbids downloads)."
        ) from None
    return _with_pad(model, tokenizer)


def _with_pad(model: PreTrainedModel, tokenizer: Any) -> tuple[PreTrainedModel, Any]:
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _is_vision_language(source: str) -> bool:
    """Whether ``source`` holds an image-text-to-text model (its config names a vision tower)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError):
        return False  # the loaders below report it
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES and hasattr(config, "vision_config")


@contextmanager
def _gguf_bars_follow_transformers(gguf_file: str | None) -> Iterator[None]:
    """transformers' GGUF converter draws its bar with tqdm directly, ignoring
    ``disable_progress_bar()`` (what ``--no-progress`` sets); make it follow that switch."""
    from transformers.utils import logging as hf_logging

    if gguf_file is None or hf_logging.is_progress_bar_enabled():
        yield
        return
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    drawn = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(drawn, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = drawn


def _dequantized(gguf_file: str | None) -> dict[str, Any]:
    """Plain trainable weights from a GGUF file. Without this, transformers >= 5 may keep them in
    GGUF blocks (with a GGUF kernel), and marks the model quantized either way, and a quantized
    model cannot be saved: every checkpoint would fail."""
    if gguf_file is None:
        return {}
    try:
        from transformers import GgufConfig
    except ImportError:  # transformers < 5 always dequantises
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _with_lora(model: PreTrainedModel, lora: LoraSettings, checkpoint: str | Path | None) -> Any:
    try:
        import peft
    except ImportError:
        raise ModelLoadError(
            "model.lora needs peft: pip install 'agilerl-envlayer[lora]' (or remove model.lora)."
        ) from None
    if checkpoint is not None:
        return peft.PeftModel.from_pretrained(model, str(checkpoint), is_trainable=True)
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)
