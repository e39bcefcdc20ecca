"""Worker groups: N ranks of one worker class, called as if they were one object.

`group.update_actor(batch)` looks up the method's dispatch mode, splits the call over the ranks, runs it,
and gathers the answers. RayWorkerGroup runs each rank as a Ray actor; LocalWorkerGroup runs a single
rank in this process, so a breakpoint in a worker stops right there (and no Ray is needed).
"""

from typing import Any

from verl.single_controller.base import collect, split_args


class WorkerDiedError(RuntimeError):
    """A worker process ended in the middle of a call (killed, out of memory, a crash in native code)."""


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
    """Rank i runs as a Ray actor; with a placement group of B bundles, on bundle i * B // world_size: one
    bundle per rank (GPUs) or one per node (several CPU nodes). Two groups given the same placement group
    (actor and critic) thus share each GPU rank by rank, never two ranks of one group. `node_ids[i]`: the
    Ray node rank i runs on."""

    def __init__(self, worker_cls: type, *args, world_size: int, num_cpus: float, num_gpus: float,
                 placement_group=None, **kwargs):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        super().__init__(worker_cls, world_size)
        remote_cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(worker_cls)
        self.actors = []
        for rank in range(world_size):
            options = {} if placement_group is None else {"scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group, placement_group_bundle_index=rank * placement_group.bundle_count // world_size)}
            self.actors.append(remote_cls.options(**options).remote(*args, rank=rank, world_size=world_size,
                                                                     init_method=None, **kwargs))
        # torch.distributed meets at rank 0's node, which may not be the driver's
        init_method = ray.get(self.actors[0].master_address.remote())
        ray.get([actor.init_distributed.remote(init_method) for actor in self.actors])
        self.node_ids: list[str] = ray.get([actor.node_id.remote() for actor in self.actors])

    def _run(self, name, per_rank):
        """Every rank's answer, in rank order. The first rank to fail ends the call at once: its peers may
        be waiting for it in a collective that will never complete, so waiting for them would hang."""
        import ray

        calls = [getattr(actor, name).remote(*args, **kwargs) for actor, (args, kwargs) in zip(self.actors, per_rank)]
        answers, pending = [None] * len(calls), list(calls)
        while pending:
            (done,), pending = ray.wait(pending, num_returns=1)
            try:
                answers[calls.index(done)] = ray.get(done)
            except ray.exceptions.RayError as error:
                raise self._first_death(calls, name, grace_s=5.0) or error
        return answers

    def _first_death(self, calls: list, name: str, grace_s: float) -> "WorkerDiedError | None":
        """A rank that died makes its peers fail too (gloo: connection reset), often first: give the other
        calls a moment to report, and name the dead rank if there is one."""
        import ray

        ray.wait(calls, num_returns=len(calls), timeout=grace_s)
        for rank, call in enumerate(calls):
            try:
                ray.get(call, timeout=0)
            except ray.exceptions.RayActorError as error:
                died = WorkerDiedError(f"{self.worker_cls.__name__} rank {rank} (a Ray actor process) died during "
                                       f"{name}(): {type(error).__name__}")
                died.__cause__ = error
                return died
            except Exception:  # another rank's error, or not finished within the grace period
                continue
        return None


def gpu_placement_group(world_size: int, num_cpus: float):
    """One bundle per rank (a whole GPU and the CPUs of the workers on it), ready before it is returned."""
    import ray

    group = ray.util.placement_group([{"GPU": 1, "CPU": num_cpus}] * world_size, strategy="PACK")
    ray.get(group.ready())
    return group


def node_placement_group(nnodes: int, ranks_per_node: int, num_cpus: float):
    """One bundle per node, each on a different node (STRICT_SPREAD), holding the CPUs of its ranks' workers;
    ready before it is returned."""
    import ray

    group = ray.util.placement_group([{"CPU": ranks_per_node * num_cpus}] * nnodes, strategy="STRICT_SPREAD")
    ray.get(group.ready())
    return group
