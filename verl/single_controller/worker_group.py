"""Worker groups: N ranks of one worker class, called as if they were one object.

`group.update_actor(batch)` looks up the method's dispatch mode, splits the call over the ranks, runs it,
and gathers the answers. RayWorkerGroup runs each rank as a Ray actor; LocalWorkerGroup runs a single
rank in this process, so a breakpoint in a worker stops right there (and no Ray is needed).
"""

import socket
from typing import Any

from verl.single_controller.base import collect, split_args


class WorkerGroup:
    def __init__(self, worker_cls: type, world_size: int):
        self.worker_cls, self.world_size = worker_cls, world_size

    def __getattr__(self, name: str):
        dispatch = getattr(getattr(self.worker_cls, name, None), "dispatch", None)
        if dispatch is None:
            raise AttributeError(f"{self.worker_cls.__name__}.{name} is not a registered worker method")

        def call(*args, **kwargs):
            return collect(dispatch, self._run(name, split_args(dispatch, self.world_size, args, kwargs)))

        return call

    def _run(self, name: str, per_rank: list[tuple[tuple, dict]]) -> list[Any]:
        raise NotImplementedError


class LocalWorkerGroup(WorkerGroup):
    def __init__(self, worker_cls: type, *args, **kwargs):
        super().__init__(worker_cls, world_size=1)
        self.worker = worker_cls(*args, rank=0, world_size=1, init_method=None, **kwargs)

    def _run(self, name, per_rank):
        (args, kwargs), = per_rank
        return [getattr(self.worker, name)(*args, **kwargs)]


class RayWorkerGroup(WorkerGroup):
    def __init__(self, worker_cls: type, *args, world_size: int, num_cpus: float, num_gpus: float, **kwargs):
        import ray

        super().__init__(worker_cls, world_size)
        init_method = f"tcp://{ray.util.get_node_ip_address()}:{_free_port()}"
        remote_cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(worker_cls)
        self.actors = [remote_cls.remote(*args, rank=rank, world_size=world_size, init_method=init_method, **kwargs)
                       for rank in range(world_size)]

    def _run(self, name, per_rank):
        import ray

        return ray.get([getattr(actor, name).remote(*args, **kwargs)
                        for actor, (args, kwargs) in zip(self.actors, per_rank)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
