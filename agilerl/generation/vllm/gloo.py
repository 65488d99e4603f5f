"""``agilerl_gloo``: vLLM's weight-transfer protocol over a gloo group, for servers without GPUs.

vLLM's ``nccl`` backend streams the trainer's weights straight into every replica's workers, no
disk between them, but only between GPUs. This backend keeps everything of it (the same
trainer-side engine, rendezvous fields, update info and layerwise reload on the workers) and swaps
the NCCL communicator for a gloo process group on CPU tensors. So it runs on CPU servers and
across machines without a shared file system, and it is how the trainer side of the NCCL path is
tested on a CPU.

vLLM loads it into every process of a ``vllm serve`` through the ``vllm.general_plugins`` entry
point (this package installed in the server's environment); start the server with
``--weight-transfer-config '{"backend": "agilerl_gloo"}'``.
"""

from __future__ import annotations

import datetime
import socket
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, TrainerInitInfo, WeightSource
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLTrainerWeightTransferEngine,
    NCCLWeightTransferEngine,
    NCCLWeightTransferUpdateInfo,
)

__all__ = [
    "BACKEND",
    "GlooTrainerInitInfo",
    "GlooTrainerWeightTransferEngine",
    "GlooWeightTransferEngine",
    "local_address_towards",
    "register",
]

BACKEND = "agilerl_gloo"
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=5)  # replicas loading a large model join late


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in each of its processes, maybe twice."""
    for factory, name in (
        (WeightTransferEngineFactory, "GlooWeightTransferEngine"),
        (WeightTransferTrainerFactory, "GlooTrainerWeightTransferEngine"),
    ):
        try:
            factory.register_engine(BACKEND, __name__, name)
        except ValueError:  # registered already
            pass


def _gloo_group(master_address: str, master_port: int, rank: int, world_size: int) -> Any:
    """A gloo group of its own (``torch.distributed``'s default group stays untouched), rank 0 hosting the store."""
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    store = TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=RENDEZVOUS_TIMEOUT)
    options = ProcessGroupGloo._Options()
    options._timeout = RENDEZVOUS_TIMEOUT
    # the interface that reaches the trainer: gloo would otherwise take the hostname's address
    options._devices = [ProcessGroupGloo.create_device(hostname=local_address_towards(master_address))]
    return ProcessGroupGloo(PrefixStore("agilerl-weights", store), rank, world_size, options)


def local_address_towards(host: str) -> str:
    """This host's address on the route to ``host``: the one a peer there can reach back."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # no packet is sent: this only asks for the route
        return probe.getsockname()[0]


def _settle(future: Future[Any], call: Any, *args: Any) -> None:
    try:
        future.set_result(call(*args))
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
        future.set_exception(exc)


class GlooWeightTransferEngine(NCCLWeightTransferEngine):
    """The worker side: NCCL's engine (init info, update info, layerwise reload) receiving over gloo."""

    def init_transfer_engine(self, init_info: NCCLWeightTransferInitInfo) -> None:
        if init_info.master_address is None or init_info.master_port is None:
            raise ValueError(f"{BACKEND} needs master_address and master_port (it has no unique-id rendezvous)")
        config = self.parallel_config
        rank = config.data_parallel_index * config.world_size + config.rank + init_info.rank_offset
        self.model_update_group = _gloo_group(init_info.master_address, init_info.master_port, rank, init_info.world_size)

    def receive_weights(self, update_info: NCCLWeightTransferUpdateInfo) -> None:
        if self.model_update_group is None:
            raise RuntimeError(f"{BACKEND}: receive_weights before init_weight_transfer_engine")
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
            weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
            self.model_update_group.broadcast(weight, 0).wait()
            self.model.load_weights([(name, weight)])

    def shutdown(self) -> None:
        self.model_update_group = None  # a gloo group closes when it is dropped


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """NCCL's trainer init info under this backend's name (one rendezvous: address and port)."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int


class GlooTrainerWeightTransferEngine(NCCLTrainerWeightTransferEngine):
    """The trainer side: NCCL's ``send_weights`` round (start, update beside the broadcast, finish) over gloo."""

    init_info_cls = GlooTrainerInitInfo

    @classmethod
    def trainer_init(
        cls, init_info: GlooTrainerInitInfo, *, client: Any, source: WeightSource | None = None
    ) -> GlooTrainerWeightTransferEngine:
        if source is None:
            raise ValueError(f"{BACKEND} weight transfer requires a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, packed=False)
        if not engine.is_sender:
            return engine
        workers = NCCLWeightTransferInitInfo(
            master_address=init_info.master_address, master_port=init_info.master_port,
            rank_offset=1, world_size=init_info.world_size,
        )
        # the workers block in the rendezvous inside their init call, so both run at once; a worker
        # that refuses (no such backend, no weight transfer configured) fails the init at once
        # instead of leaving the trainer in the rendezvous until it times out
        group: Future[Any] = Future()
        opening = threading.Thread(  # a daemon: a rendezvous left waiting never holds the process at exit
            target=_settle, args=(group, _gloo_group, init_info.master_address, init_info.master_port, 0,
                                  init_info.world_size), daemon=True,
        )
        opening.start()
        client.init_weight_transfer_engine(worker_init_payload(workers))
        engine.model_update_group = group.result()
        return engine

    def _broadcast(self, source: WeightSource, meta: list[ParamMeta]) -> None:
        assert self.model_update_group is not None, "trainer_init() must be called before _broadcast()"
        for _name, tensor in self._checked_iter(source, meta):
            self.model_update_group.broadcast(tensor.detach().to("cpu").contiguous(), 0).wait()

    def shutdown(self) -> None:
        self.model_update_group = None
