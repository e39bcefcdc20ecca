"""The training loop: one step = rollout, score, advantage, update, record (DESIGN.md).

The trainer runs on the driver and owns no model: it calls worker groups and an agent that produces
rollouts. Each stage is one line of `fit()` and returns a batch or a dict of metrics.
"""

import os
import time
from contextlib import contextmanager
from typing import Protocol

from verl.protocol import DataProto
from verl.trainer.config import AlgorithmConfig, TrainerConfig
from verl.trainer.core_algos import ADV_ESTIMATORS
from verl.utils.tracking import Tracking


class RolloutProducer(Protocol):
    def rollout(self, step: int) -> tuple[DataProto, dict[str, float]]:
        """Play a batch of trajectories with the current policy; return them and their metrics."""


class PPOTrainer:
    def __init__(self, config: TrainerConfig, algorithm: AlgorithmConfig, actor_rollout_wg, agent: RolloutProducer,
                 tracker: Tracking):
        self.config, self.algorithm = config, algorithm
        self.actor_rollout_wg, self.agent, self.tracker = actor_rollout_wg, agent, tracker

    def fit(self) -> None:
        for step in range(1, self.config.total_training_steps + 1):
            metrics: dict[str, float] = {}
            with timed("step", metrics):
                with timed("gen", metrics):
                    batch, rollout_metrics = self.agent.rollout(step)
                with timed("old_log_prob", metrics):
                    batch = batch.union(self.actor_rollout_wg.compute_log_prob(batch))
                with timed("adv", metrics):
                    batch = compute_advantage(batch, self.algorithm)
                with timed("update_actor", metrics):
                    actor_metrics = self.actor_rollout_wg.update_actor(batch)
            self.tracker.log(rollout_metrics | actor_metrics | metrics, step)
        self.save(self.config.total_training_steps)

    def save(self, step: int) -> str:
        path = os.path.join(self.config.default_local_dir, f"global_step_{step}", "actor")
        self.actor_rollout_wg.save_model(path)
        print(f"saved the actor to {path}", flush=True)
        return path


def compute_advantage(batch: DataProto, config: AlgorithmConfig) -> DataProto:
    advantages, returns = ADV_ESTIMATORS[config.adv_estimator](
        token_rewards=batch.batch["token_rewards"], loss_mask=batch.batch["loss_mask"],
        group_ids=batch.non_tensor_batch["group_ids"], config=config)
    return batch.union(DataProto(batch={"advantages": advantages, "returns": returns}))


@contextmanager
def timed(name: str, metrics: dict[str, float]):
    start = time.perf_counter()
    yield
    metrics[f"timing_s/{name}"] = time.perf_counter() - start
