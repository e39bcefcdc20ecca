from verl.single_controller.base import DATA_PARALLEL, ONE_TO_ALL, Worker, register
from verl.single_controller.worker_group import LocalWorkerGroup, RayWorkerGroup, WorkerDiedError, WorkerGroup

__all__ = ["DATA_PARALLEL", "ONE_TO_ALL", "LocalWorkerGroup", "RayWorkerGroup", "Worker", "WorkerDiedError",
           "WorkerGroup", "register"]
