"""Workers and how a call on a worker group reaches them.

A worker is one rank. Its public methods carry a dispatch mode (`@register`), which tells the worker
group how to spread one call over the ranks and how to gather the answers:
- ONE_TO_ALL: every rank gets the same arguments (init, broadcast); rank 0's answer is returned.
- DATA_PARALLEL: the first argument, a DataProto, is cut into one chunk per rank; DataProto answers
  are concatenated in rank order, metric dicts are reduced over ranks by name (tracking.reduce_metrics:
  `*_max` the maximum, `*_min` the minimum, any other the mean).
"""

import os
import socket
from typing import Any, Callable

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.utils import memory
from verl.utils.fsdp import init_single_rank_group
from verl.utils.tracking import quiet_libraries, reduce_metrics

ONE_TO_ALL = "one_to_all"
DATA_PARALLEL = "data_parallel"


def register(dispatch: str) -> Callable:
    def decorate(method: Callable) -> Callable:
        method.dispatch = dispatch
        return method

    return decorate


class Worker:
    """One rank. With several ranks it joins a torch.distributed group (gloo on CPU, NCCL on GPU).
    `verbose=False` silences the libraries' progress bars and notices in this process (`trainer.verbose`)."""

    def __init__(self, rank: int, world_size: int, init_method: str | None, verbose: bool = True):
        self.rank, self.world_size, self.verbose = rank, world_size, verbose
        if not verbose:
            quiet_libraries()
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # FSDP's device mesh uses the current device
        else:
            # Ray pins actors with fractional CPUs to one thread; share the cores this process may run on
            # (all of the machine's, or those `taskset` gave it) instead.
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world_size))
            memory.keep_freed_blocks()
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        if world_size == 1:  # FSDP shards over a group even alone: one code path for any number of ranks
            init_single_rank_group(self.backend)
        elif init_method is not None:
            self.init_distributed(init_method)

    def init_distributed(self, init_method: str) -> None:
        if self.world_size > 1:
            dist.init_process_group(self.backend, init_method=init_method, rank=self.rank, world_size=self.world_size)

    def master_address(self) -> str:
        """Where rank 0 listens for the others: its own node's address and a port free there."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return f"tcp://{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"

    def node_id(self) -> str:
        """The Ray node this rank runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()


def split_args(dispatch: str, world_size: int, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    if dispatch == ONE_TO_ALL:
        return [(args, kwargs)] * world_size
    assert dispatch == DATA_PARALLEL and isinstance(args[0], DataProto), "data-parallel calls take a DataProto first"
    return [((chunk, *args[1:]), kwargs) for chunk in args[0].chunk(world_size)]


def collect(dispatch: str, results: list[Any]) -> Any:
    if dispatch == ONE_TO_ALL:
        return results[0]
    if isinstance(results[0], DataProto):
        return DataProto.concat(results)
    if isinstance(results[0], dict):
        return reduce_metrics({k: [r[k] for r in results] for k in results[0]})
    return results
