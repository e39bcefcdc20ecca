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
from verl.utils.tracking import Tracking, write_jsonl


class RolloutProducer(Protocol):
    def rollout(self, step: int):
        """Play a batch of trajectories with the current policy; return an object with `.batch` (DataProto),
        `.metrics` (dict[str, float]) and `.records` (list of JSON-able dicts, one per trajectory)."""


class PPOTrainer:
    def __init__(self, config: TrainerConfig, algorithm: AlgorithmConfig, actor_rollout_wg, agent: RolloutProducer,
                 tracker: Tracking, val_agent: RolloutProducer | None = None):
        self.config, self.algorithm = config, algorithm
        self.actor_rollout_wg, self.agent, self.val_agent, self.tracker = actor_rollout_wg, agent, val_agent, tracker

    def fit(self) -> None:
        if self.val_agent is not None and self.config.val_before_train:
            self.tracker.log(self.validate(step=0), step=0)
        last = self.config.total_training_steps
        for step in range(1, last + 1):
            metrics: dict[str, float] = {}
            with timed("step", metrics):
                with timed("gen", metrics):
                    rollout = self.agent.rollout(step)
                    self.save_records(rollout.records, "train", step)
                with timed("old_log_prob", metrics):
                    batch = rollout.batch.union(self.actor_rollout_wg.compute_log_prob(rollout.batch))
                with timed("adv", metrics):
                    batch = compute_advantage(batch, self.algorithm)
                with timed("update_actor", metrics):
                    actor_metrics = self.actor_rollout_wg.update_actor(batch)
                if self.val_agent is not None and self.config.test_freq > 0 and (
                        step % self.config.test_freq == 0 or step == last):
                    metrics |= self.validate(step)
            self.tracker.log(rollout.metrics | actor_metrics | metrics, step)
        self.save(last)

    def validate(self, step: int) -> dict[str, float]:
        """Play the validation set (the same start states every time) with the validation sampling."""
        metrics: dict[str, float] = {}
        with timed("val", metrics):
            rollout = self.val_agent.rollout(0)
        self.save_records(rollout.records, "val", step)
        return rollout.metrics | metrics

    def save_records(self, records: list[dict], split: str, step: int) -> None:
        if self.config.rollout_data_dir is not None:
            write_jsonl(os.path.join(self.config.rollout_data_dir, split, f"step_{step}.jsonl"), records)

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
