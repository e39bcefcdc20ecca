import pytest
import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller import DATA_PARALLEL, ONE_TO_ALL, LocalWorkerGroup, RayWorkerGroup, Worker, register


class EchoWorker(Worker):
    def __init__(self, offset: int, *, rank: int, world_size: int, init_method: str | None):
        super().__init__(rank, world_size, init_method)
        self.offset = offset

    @register(DATA_PARALLEL)
    def shift(self, data: DataProto) -> DataProto:
        return DataProto(batch={"y": data.batch["x"] + self.offset}, non_tensor_batch={"rank": [self.rank] * len(data)})

    @register(DATA_PARALLEL)
    def rank_metric(self, data: DataProto) -> dict[str, float]:
        return {"rank": float(self.rank), "n": float(len(data))}

    @register(ONE_TO_ALL)
    def sum_of_ranks(self) -> float:
        total = torch.tensor([float(self.rank)])
        if self.world_size > 1:
            dist.all_reduce(total)
        return total.item()

    def not_registered(self):
        return 1


@pytest.fixture
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


def test_ray_group_splits_gathers_and_joins_a_process_group(ray_cluster):
    # Defined here so Ray ships the class by value to its worker processes.
    group = RayWorkerGroup(type("RayEcho", (EchoWorker,), {}), 10, world_size=2, num_cpus=0.5, num_gpus=0)
    out = group.shift(DataProto(batch={"x": torch.arange(5)}))
    assert out.batch["y"].tolist() == [10, 11, 12, 13, 14]  # rank order preserved
    assert sorted(set(out.non_tensor_batch["rank"])) == [0, 1]
    assert group.sum_of_ranks() == 1.0  # gloo all-reduce across the two actors
    assert group.rank_metric(DataProto(batch={"x": torch.arange(4)})) == {"rank": 0.5, "n": 2.0}


def test_local_group_runs_in_process():
    group = LocalWorkerGroup(EchoWorker, 1)
    assert group.shift(DataProto(batch={"x": torch.arange(3)})).batch["y"].tolist() == [1, 2, 3]
    assert group.sum_of_ranks() == 0.0
    assert group.worker.offset == 1  # the very object: a breakpoint in a worker stops here
    with pytest.raises(AttributeError, match="not a registered worker method"):
        group.not_registered()


class GpuReport(Worker):
    def gpu_ids(self) -> list:
        import ray

        return ray.get_gpu_ids()


def test_two_groups_on_one_placement_group_share_each_gpu_rank_by_rank():
    ray = pytest.importorskip("ray")
    from verl.single_controller.worker_group import gpu_placement_group

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, configure_logging=False)  # GPUs Ray believes in
    try:
        gpus = gpu_placement_group(world_size=2, num_cpus=1)
        groups = [RayWorkerGroup(type(f"Gpu{i}", (GpuReport,), {}), world_size=2, num_cpus=0.5, num_gpus=0.5,
                                 placement_group=gpus) for i in range(2)]
        ids = [ray.get([a.gpu_ids.remote() for a in group.actors]) for group in groups]
        assert ids[0][0] != ids[0][1]  # the two ranks of one group never share a GPU
        assert ids[0] == ids[1]  # rank i of the actor and rank i of the critic do
    finally:
        ray.shutdown()


def test_a_node_placement_group_puts_each_node_s_ranks_together_and_the_nodes_apart(two_node_ray_cluster):
    import ray

    from verl.single_controller.worker_group import node_placement_group

    ray.init(address=two_node_ray_cluster.address, configure_logging=False)
    try:
        group = RayWorkerGroup(type("NodeEcho", (EchoWorker,), {}), 0, world_size=4, num_cpus=0.5, num_gpus=0,
                               placement_group=node_placement_group(nnodes=2, ranks_per_node=2, num_cpus=0.5))
        first, second = group.node_ids[:2], group.node_ids[2:]
        assert first[0] == first[1] and second[0] == second[1] and first[0] != second[0]
        assert group.sum_of_ranks() == 6.0  # gloo all-reduce across the two nodes
    finally:
        ray.shutdown()  # before the cluster goes: Ray refuses to remove the node a driver is connected to
