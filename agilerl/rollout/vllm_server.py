"""vLLM servers as the policy: ``vllm serve`` replicas in other processes or on other machines.

Start each replica with the options that keep it token-exact and its weights pushable::

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR --port 8000 \\
        --logprobs-mode processed_logprobs --generation-config vllm

``VLLM_SERVER_DEV_MODE`` turns on the ``/collective_rpc`` and ``/reset_prefix_cache`` routes
the weight push uses. Generation posts token ids to ``/v1/completions`` (``return_token_ids``,
``logprobs=0``), one request per prompt, all at once; the copies of one prompt (a GRPO group)
go to one replica, so its prefix cache serves them. The weight push writes the weights as
safetensors into ``weights_dir`` (a folder every replica reads: on one machine any folder, across
machines a shared file system) and asks every replica to ``reload_weights`` from it, a path that
works on any platform, CPUs included. (On GPUs vLLM's NCCL weight transfer avoids the disk;
this class does not use it.)
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.concurrency import shared_loop
from agilerl.errors import EndpointError, InvalidArgument
from agilerl.rollout.policy import Generation, SamplingParams
from agilerl.rollout.vllm_policy import _stop_ids, engine_requests, to_generation
from agilerl.rollout.weights import hf_weights

if TYPE_CHECKING:
    import aiohttp
    import torch

__all__ = ["VLLMServerPolicy"]


class VLLMServerPolicy:
    """Generation on ``base_urls`` (vllm serve replicas); ``load_weights`` pushes through ``weights_dir``."""

    def __init__(
        self,
        base_urls: Sequence[str],
        tokenizer: Any,
        *,
        weights_dir: str | Path,
        max_model_len: int | None = None,
        request_timeout_s: float = 600,
        initial_weights: Any = None,
    ) -> None:
        if not base_urls:
            raise InvalidArgument("VLLMServerPolicy needs at least one base URL (http://host:port of vllm serve)")
        self.base_urls = [url.rstrip("/").removesuffix("/v1") for url in base_urls]
        self.weights_dir = Path(weights_dir)
        self.stops = _stop_ids(tokenizer)
        config = getattr(initial_weights, "config", None)
        self.max_model_len = max_model_len or getattr(config, "max_position_embeddings", None)
        self._timeout_s = request_timeout_s
        self._loop = shared_loop()
        self._session: aiohttp.ClientSession | None = None
        if initial_weights is not None:  # the replicas start from the trainer's weights
            self.load_weights(hf_weights(initial_weights))

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        requests = engine_requests(prompts, params, self.max_model_len, self.stops)
        out = [Generation([], [], "context") for _ in prompts]
        replica_of: dict[tuple[int, ...], str] = {}
        calls = []
        for i, fields in requests:
            key = tuple(prompts[i])
            url = replica_of.setdefault(key, self.base_urls[len(replica_of) % len(self.base_urls)])
            calls.append((i, url, fields))
        results = self._loop.run(self._all(self._complete(url, list(prompts[i]), fields) for i, url, fields in calls))
        for (i, _, fields), (ids, logprobs, finish) in zip(calls, results):
            out[i] = to_generation(ids, logprobs, finish, fields["max_tokens"], params.max_new_tokens)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        self.weights_dir.mkdir(parents=True, exist_ok=True)
        tensors, seen = {}, set()
        for name, tensor in weights:
            tensor = tensor.detach().cpu().contiguous()
            # a tied weight (lm_head = embeddings) is stored twice: safetensors refuses shared
            # storage, and vLLM's in-place reload leaves a weight the file lacks in a wrong state
            tensors[name] = tensor.clone() if tensor.data_ptr() in seen else tensor
            seen.add(tensor.data_ptr())
        partial = self.weights_dir / ".model.safetensors.partial"
        save_file(tensors, str(partial))
        os.replace(partial, self.weights_dir / "model.safetensors")  # a replica never reads half a file
        path = str(self.weights_dir.resolve())
        body = {"method": "reload_weights", "kwargs": {"weights_path": path}}
        self._loop.run(self._all(self._post(f"{url}/collective_rpc", body) for url in self.base_urls))
        self._loop.run(self._all(self._post(f"{url}/reset_prefix_cache", None) for url in self.base_urls))

    def sleep(self) -> None:
        """Servers keep their memory: they serve while the trainer steps."""

    def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            self._loop.run(session.close())

    async def _all(self, calls: Iterable[Any]) -> list[Any]:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s))
            self._loop.at_stop(self._session.close)
        return list(await asyncio.gather(*calls))

    async def _complete(self, url: str, prompt: list[int], fields: dict[str, Any]) -> tuple[list[int], list[float], str]:
        body = {k: v for k, v in fields.items() if k != "detokenize"}
        reply = await self._post(f"{url}/v1/completions", {**body, "prompt": prompt, "return_token_ids": True})
        try:
            choice = reply["choices"][0]
            return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"]), choice["finish_reason"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(
                f"{url}/v1/completions answered without choices[0].token_ids and logprobs: {str(reply)[:200]}; "
                "is it vllm serve (>= 0.11, which returns token ids)?"
            ) from None

    async def _post(self, url: str, body: dict[str, Any] | None) -> Any:
        import aiohttp

        assert self._session is not None
        try:
            async with self._session.post(url, json=body) as response:
                text = await response.text()
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise EndpointError(f"cannot reach {url} ({type(exc).__name__}: {exc or 'timed out'}); is vllm serve running?") from None
        if response.status == 404 and not url.endswith("/completions"):
            raise EndpointError(f"{url}: 404; start the server with VLLM_SERVER_DEV_MODE=1 to push weights")
        if response.status != 200:
            raise EndpointError(f"{url} answered {response.status}: {text[:300]}")
        return json.loads(text) if text else None
