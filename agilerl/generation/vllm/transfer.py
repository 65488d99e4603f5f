"""The weight push to ``vllm serve`` replicas through vLLM's weight-transfer API (``nccl``, ``agilerl_gloo``).

The trainer joins one process group with every worker of every replica (itself rank 0, the
replicas' workers after it, each replica at its own rank offset) through vLLM's own trainer-side
engine, and each push is one broadcast that all replicas receive at once: no disk, no shared
file system. The replicas must be started with ``--weight-transfer-config '{"backend": ...}'``
and ``VLLM_SERVER_DEV_MODE=1``; the trainer needs vllm importable (vLLM's trainer engine).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

from agilerl.errors import EndpointError
from agilerl.generation.vllm import gloo as vllm_gloo
from agilerl.ports import free_port

__all__ = ["PushedWeights", "ReplicaClients", "WeightTransfer"]

# the user's names for vLLM's backends -> (vLLM's name, the trainer's init info)
BACKENDS: dict[str, tuple[str, Any]] = {
    "nccl": ("nccl", NCCLTrainerInitInfo),
    "gloo": (vllm_gloo.BACKEND, vllm_gloo.GlooTrainerInitInfo),
}

Calls = Callable[[str, str, Sequence[dict[str, Any] | None]], list[Any]]  # (method, path, a body per replica)


class PushedWeights(WeightSource):
    """The weights of the current push (vLLM's engine replays its source each round)."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, Any]] = []

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in self.pairs]

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.pairs)


class ReplicaClients:
    """vLLM's weight-sync client protocol, each call made on every replica at once.

    The workers' init carries each replica's own rank offset, so the replicas' workers take
    distinct ranks in the one group.
    """

    def __init__(self, calls: Calls, rank_offsets: list[int]) -> None:
        self._calls = calls
        self._offsets = rank_offsets
        self.version: str | None = None  # what finish_weight_update marks the replicas' weights with

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._calls("POST", "init_weight_transfer_engine", [
            {"init_info": {**init_info, "rank_offset": offset}} for offset in self._offsets
        ])

    def shutdown_weight_transfer_engine(self) -> None:
        self._each("shutdown_weight_transfer_engine", None)

    def start_weight_update(self) -> None:
        self._each("start_weight_update", None)

    def update_weights(self, update_info: Any) -> None:
        self._each("update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = weight_version or self.version
        self._each("finish_weight_update", None if version is None else {"weight_version": version})

    def _each(self, path: str, body: dict[str, Any] | None) -> None:
        self._calls("POST", path, [body] * len(self._offsets))


class WeightTransfer:
    """One process group from the trainer to every replica's workers; :meth:`push` broadcasts the weights."""

    def __init__(self, backend: str, base_urls: Sequence[str], calls: Calls, address: str | None = None) -> None:
        vllm_gloo.register()  # the trainer side of agilerl_gloo (vLLM loads its plugins only in its own processes)
        name, init_info = BACKENDS[backend]
        configs = calls("GET", "server_info?config_format=json", [None] * len(base_urls))
        for url, info in zip(base_urls, configs):
            served = ((info or {}).get("vllm_config") or {}).get("weight_transfer_config") or {}
            if served.get("backend") != name:
                raise EndpointError(
                    f"{url} serves with weight transfer {served.get('backend')!r}, not {name!r}; start it with "
                    f"--weight-transfer-config '{{\"backend\": \"{name}\"}}' (and VLLM_SERVER_DEV_MODE=1)"
                )
        sizes = [int(reply["world_size"]) for reply in calls("GET", "get_world_size", [None] * len(base_urls))]
        offsets = list(itertools.accumulate([1, *sizes[:-1]]))  # the trainer is rank 0
        self.client = ReplicaClients(calls, offsets)
        self.source = PushedWeights()
        host = address or vllm_gloo.local_address_towards(urlsplit(base_urls[0]).hostname or "127.0.0.1")
        self.engine = WeightTransferTrainerFactory.trainer_init(
            init_info(master_address=host, master_port=free_port(host), world_size=1 + sum(sizes), rank=0),
            client=self.client, source=self.source,
        )

    def push(self, weights: list[tuple[str, Any]], version: str) -> None:
        """``weights`` to every replica, their weights marked ``version`` when all hold them."""
        self.client.version = version
        self.source.pairs = weights
        try:
            self.engine.send_weights()
        finally:
            self.source.pairs = []

    def close(self) -> None:
        self.engine.shutdown()
        self.client.shutdown_weight_transfer_engine()

