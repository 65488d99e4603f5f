"""vLLM servers as the policy: ``vllm serve`` replicas in other processes or on other machines.

Start each replica with the options that keep it token-exact and its weights pushable::

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR --port 8000 \\
        --logprobs-mode processed_logprobs --generation-config vllm

``VLLM_SERVER_DEV_MODE`` turns on the routes the weight push uses. Generation posts token ids to
``/v1/completions`` (``return_token_ids``, ``logprobs=0``), one request per prompt, all at once;
the copies of one prompt (a GRPO group) go to one replica, so its prefix cache serves them. A
prompt that shows images goes to vLLM's token-in route, ``/inference/v1/generate``, with its
pictures (the completions route takes none): a vision model's replicas also need
``--enable-scale-out`` (vllm >= 0.32) and the model's processor saved beside it.

The weight push goes one of three ways (``weight_transfer``):

- ``disk``: the weights are written as safetensors into ``weights_dir`` (a folder every replica
  reads: on one machine any folder, across machines a shared file system) and every replica
  ``reload_weights`` from it. Any platform, no vllm in the trainer.
- ``nccl``: vLLM's NCCL weight transfer (:mod:`agilerl.generation.vllm.transfer`), GPU to GPU, no disk;
  the replicas run with ``--weight-transfer-config '{"backend": "nccl"}'``.
- ``gloo``: the same protocol over gloo (:mod:`agilerl.generation.vllm.gloo`), CPU tensors, no disk
  and no shared file system; the replicas run with ``'{"backend": "agilerl_gloo"}'``.

Either way every replica's prefix cache is reset after the push, and its weights are marked with
the push's version, checked before each generation and push: a replica that lost them (a
restart) reloads them from ``weights_dir``, or is left out until a new transfer group takes it
in. Under a launched trainer (several ranks) rank 0 pushes and the others wait for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from agilerl.concurrency import shared_loop
from agilerl.errors import AgileRLWarning, EndpointError, InvalidArgument, ReplyTooLarge
from agilerl.generation.policy import Generation, SamplingParams
from agilerl.generation.vllm.policy import WeightTransferKind, _stop_ids, check_expansion, engine_requests, to_generation
from agilerl.generation.weights import hf_weights
from agilerl.peers import DEFAULT_MAX_REPLY_BYTES, read_capped_text, redact

if TYPE_CHECKING:
    import aiohttp
    import torch

    from agilerl.generation.media import VisionMedia

__all__ = ["VLLMServerPolicy", "WEIGHT_TRANSFERS"]

WEIGHT_TRANSFERS: tuple[str, ...] = get_args(WeightTransferKind)


class VLLMServerPolicy:
    """Generation on ``base_urls`` (vllm serve replicas); ``load_weights`` pushes by ``weight_transfer``
    (``transfer_address``: the trainer's address the replicas reach, by default this host's on the
    route to the first replica)."""

    def __init__(
        self,
        base_urls: Sequence[str],
        tokenizer: Any,
        *,
        weights_dir: str | Path | None = None,
        weight_transfer: WeightTransferKind = "disk",
        transfer_address: str | None = None,
        max_model_len: int | None = None,
        request_timeout_s: float = 600,
        initial_weights: Any = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        if not base_urls:
            raise InvalidArgument("VLLMServerPolicy needs at least one base URL (http://host:port of vllm serve)")
        self.base_urls = [url.rstrip("/").removesuffix("/v1") for url in base_urls]
        if weight_transfer not in WEIGHT_TRANSFERS:
            raise InvalidArgument(f"weight_transfer {weight_transfer!r} is not one of {', '.join(WEIGHT_TRANSFERS)}")
        if weight_transfer == "disk" and weights_dir is None:
            raise InvalidArgument("weight_transfer 'disk' needs weights_dir (a folder every replica reads)")
        self.weight_transfer = weight_transfer
        self.weights_dir = None if weights_dir is None else Path(weights_dir)
        self._transfer_address = transfer_address
        self._transfer: Any = None  # vllm_transfer.WeightTransfer, opened at the first push
        # each push marks the replicas' weights (vLLM's /weight_info): a replica that lost them shows
        self._run, self._pushes, self._version, self._versioned = uuid.uuid4().hex[:12], 0, None, True
        self.stops = _stop_ids(tokenizer)
        config = getattr(initial_weights, "config", None)
        self.max_model_len = max_model_len or getattr(config, "max_position_embeddings", None)
        self._timeout_s = request_timeout_s
        self.max_reply_bytes = max_reply_bytes
        self._loop = shared_loop()
        self._session: aiohttp.ClientSession | None = None
        if initial_weights is not None:  # the replicas start from the trainer's weights
            self.load_weights(hf_weights(initial_weights))

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        requests = engine_requests(prompts, params, self.max_model_len, self.stops)
        out = [Generation([], [], "context") for _ in prompts]
        replicas = self._holding_the_last_push() if requests else self.base_urls
        replica_of: dict[tuple[int, ...], str] = {}
        calls = []
        for i, fields in requests:
            key = tuple(prompts[i])
            url = replica_of.setdefault(key, replicas[len(replica_of) % len(replicas)])
            calls.append((i, url, fields))
        results = self._loop.run(self._all(self._complete(url, prompts[i], fields) for i, url, fields in calls))
        for (i, _, fields), (ids, logprobs, finish) in zip(calls, results):
            out[i] = to_generation(ids, logprobs, finish, fields["max_tokens"], params.max_new_tokens)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        rank, world = _trainer_rank()
        if rank == 0:
            self._pushes += 1
            version = f"agilerl-{self._run}-{self._pushes}"
            if self.weight_transfer == "disk":
                self._write(weights)
                self._reload(self.base_urls, version)
            else:
                self._transferred().push(list(weights), version)
                self._each("POST", "reset_prefix_cache", [None] * len(self.base_urls))
            self._version = version
        if world > 1:  # no rank generates before the replicas hold the new weights
            import torch.distributed

            torch.distributed.barrier()
            if rank and self._versioned:  # rank 0's version, for this rank's checks before generating
                reply = self._each("GET", "weight_info", [None], self.base_urls[:1], missing_ok=True)[0]
                self._version, self._versioned = (reply or {}).get("weight_version"), reply is not None

    def _holding_the_last_push(self) -> list[str]:
        """The replicas to generate on: those holding the last push. One that lost it (a restart)
        reloads it from ``weights_dir``; over a transfer group it is left out until the next push."""
        stale = self._stale()
        if not stale:
            return self.base_urls
        if self.weight_transfer == "disk":
            warnings.warn(
                f"the weights on {', '.join(map(redact, stale))} are not the last pushed (a restart?): reloading "
                f"them from {self.weights_dir}", AgileRLWarning, 3,
            )
            self._reload(stale, str(self._version))
            return self.base_urls
        fresh = [url for url in self.base_urls if url not in stale]
        if not fresh:
            raise EndpointError(
                f"no replica holds the last pushed weights ({', '.join(map(redact, stale))} restarted?); they get them again at "
                "the next push, so resume from the last checkpoint, or use weight_transfer 'disk', which reloads a "
                "restarted replica from weights_dir"
            )
        warnings.warn(
            f"the weights on {', '.join(map(redact, stale))} are not the last pushed (a restart?): generating on "
            f"{', '.join(map(redact, fresh))} until the next push", AgileRLWarning, 3,
        )
        return fresh

    def _stale(self) -> list[str]:
        """The replicas whose weights are not the last push (none before the first, and none on a
        vLLM without weight versions: it answers 404 and is not asked again)."""
        if self._version is None or not self._versioned:
            return []
        replies = self._each("GET", "weight_info", [None] * len(self.base_urls), missing_ok=True)
        if any(reply is None for reply in replies):
            self._versioned = False
            return []
        return [url for url, reply in zip(self.base_urls, replies) if reply.get("weight_version") != self._version]

    def _write(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        assert self.weights_dir is not None
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

    def _reload(self, urls: list[str], version: str) -> None:
        """``urls`` load the weights in ``weights_dir`` and are marked with ``version``."""
        assert self.weights_dir is not None
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.weights_dir.resolve())}}
        self._each("POST", "collective_rpc", [body] * len(urls), urls)
        if self._versioned:
            self._each("POST", "update_weight_version", [{"new_version": version}] * len(urls), urls, missing_ok=True)
        self._each("POST", "reset_prefix_cache", [None] * len(urls), urls)

    def _transferred(self) -> Any:
        if self._transfer is not None and (stale := self._stale()):
            # a replica that lost the last push left the group (a restart, another trainer): a
            # broadcast would wait for it until the rendezvous times out (NCCL: for ever)
            warnings.warn(
                f"the weights on {', '.join(stale)} are not the last pushed (a restart?): opening a new "
                "weight-transfer group", AgileRLWarning, 3,
            )
            self._close_transfer()
        if self._transfer is None:
            try:
                from agilerl.generation.vllm.transfer import WeightTransfer
            except ImportError as exc:
                raise InvalidArgument(
                    f"weight_transfer {self.weight_transfer!r} drives vLLM's trainer-side transfer engine, which needs "
                    f"vllm in the trainer's environment ({exc}); or use weight_transfer 'disk'"
                ) from None
            self._transfer = WeightTransfer(self.weight_transfer, self.base_urls, self._each, self._transfer_address)
        return self._transfer

    def sleep(self) -> None:
        """Servers keep their memory: they serve while the trainer steps."""

    def close(self) -> None:
        self._close_transfer()
        if self._session is not None:
            session, self._session = self._session, None
            self._loop.run(session.close())

    def _close_transfer(self) -> None:
        if self._transfer is not None:
            transfer, self._transfer = self._transfer, None
            try:
                transfer.close()
            except EndpointError as exc:  # a replica gone already holds no group to drop
                warnings.warn(f"the weight-transfer group was not closed on every replica: {exc}", AgileRLWarning, 3)

    async def _all(self, calls: Iterable[Any]) -> list[Any]:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s))
            self._loop.at_stop(self._session.close)
        return list(await asyncio.gather(*calls))

    async def _complete(
        self, url: str, prompt: Sequence[int], fields: dict[str, Any]
    ) -> tuple[list[int], list[float], str]:
        media = getattr(prompt, "media", None)
        if media is not None and media.images:
            return await self._complete_with_images(url, prompt, media, fields)
        body = {k: v for k, v in fields.items() if k != "detokenize"}
        body |= {"prompt": list(prompt), "return_token_ids": True}
        reply = await self._request("POST", f"{url}/v1/completions", body, again_on_reset=True)
        try:
            choice = reply["choices"][0]
            return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"]), choice["finish_reason"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(
                f"{redact(url)}/v1/completions answered without choices[0].token_ids and logprobs: {str(reply)[:200]}; "
                "is it vllm serve (>= 0.11, which returns token ids)?"
            ) from None

    async def _complete_with_images(
        self, url: str, prompt: Sequence[int], media: VisionMedia, fields: dict[str, Any]
    ) -> tuple[list[int], list[float], str]:
        """An image prompt through vLLM's token-in route (``/inference/v1/generate``; the
        completions route takes no images): the ids with each image's placeholder as the template
        wrote it, and the pictures as PNG data URLs of the pixels the processor saw. vLLM expands
        them as the processor did (checked against the prompt ids it reports)."""
        body = {
            "token_ids": media.engine_ids(prompt),
            "content_parts": [{"type": "image_url", "url": image.pixels_data_url()} for image in media.images],
            "sampling_params": fields,
            "return_token_ids": True,
        }
        route = f"{url}/inference/v1/generate"
        refused = (
            f"; images go to vllm serve's token-in route, {route}: start the replicas with --enable-scale-out (vllm >= 0.32)"
        )
        reply = await self._request("POST", route, body, again_on_reset=True, refused=refused)
        try:
            choice = reply["choices"][0]
            ids, logprobs = list(choice["token_ids"]), [step["logprob"] for step in choice["logprobs"]["content"]]
            expanded = reply["prompt_token_ids"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(redact(
                f"{route} answered without choices[0].token_ids, logprobs and prompt_token_ids: {str(reply)[:200]}"
            )) from None
        check_expansion(prompt, expanded, f"vllm serve at {redact(url)}")
        return ids, logprobs, choice["finish_reason"]

    def _each(
        self, method: str, path: str, bodies: Sequence[dict[str, Any] | None], urls: Sequence[str] | None = None,
        missing_ok: bool = False,
    ) -> list[Any]:
        """``method path`` on every replica (or ``urls``) at once, ``bodies[i]`` to the i-th; their
        replies (``None`` for a route the server lacks, with ``missing_ok``)."""
        return self._loop.run(self._all(
            self._request(method, f"{url}/{path}", body, missing_ok) for url, body in zip(urls or self.base_urls, bodies)
        ))

    async def _request(
        self, method: str, url: str, body: dict[str, Any] | None, missing_ok: bool = False,
        again_on_reset: bool = False, refused: str = "",
    ) -> Any:
        """One request; ``again_on_reset``: a completion whose connection the server reset or closed
        is sent once more, on a new connection (a kept-alive connection the server closed as it was
        reused: seen with two replicas on a loaded host). Nothing else is retried here. ``refused``
        ends the error of a 403 or 404 (what turns the route on)."""
        import aiohttp

        assert self._session is not None
        for attempt in (0, 1):
            try:
                async with self._session.request(method, url, json=body) as response:
                    text = await read_capped_text(
                        response, self.max_reply_bytes, url=url, setting="generation.max_reply_bytes"
                    )
                break
            except ReplyTooLarge as exc:
                raise EndpointError(str(exc)) from None
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                reset = isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)) and not isinstance(
                    exc, aiohttp.ClientConnectorError  # refused: the replica is down, not a closed connection
                )
                if not (again_on_reset and reset and attempt == 0):
                    raise EndpointError(redact(
                        f"cannot reach {url} ({type(exc).__name__}: {exc or 'timed out'}); is vllm serve running?"
                    )) from None
        if response.status == 404 and missing_ok:
            return None
        if response.status == 404 and not url.endswith(("/completions", "/generate")):
            raise EndpointError(f"{redact(url)}: 404; start the server with VLLM_SERVER_DEV_MODE=1 to push weights")
        if response.status != 200:
            hint = refused if response.status in (403, 404) else ""
            raise EndpointError(redact(f"{url} answered {response.status}: {text[:300]}{hint}"))
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            raise EndpointError(f"{redact(url)} answered 200 with a body that is not JSON: {text[:200]!r}") from None


def _trainer_rank() -> tuple[int, int]:
    """This process's rank among the trainer's and how many there are (a launcher's ``RANK`` before
    its group is up, when no barrier can be held; ``0, 1`` when not launched)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), 1
