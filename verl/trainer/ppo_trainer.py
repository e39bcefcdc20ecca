"""The training loop: one step = rollout, filter, score, advantage, update, record (DESIGN.md).

The trainer runs on the driver and owns no model: it calls worker groups and an agent that produces
rollouts. Each stage is a line of `fit()` or of `train_on()` and returns a batch or a dict of metrics. The critic worker
group exists only when the advantage estimator uses values; the reference policy only when KL is on.
"""

import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from verl.protocol import DataProto
from verl.single_controller.worker_group import WorkerDiedError
from verl.trainer.collapse import collapse_metrics, cross_scoring_pairs, repeat_to_multiple, score_matrix
from verl.trainer.config import AlgorithmConfig, RolloutConfig, TrainerConfig
from verl.trainer.core_algos import (ADV_ESTIMATORS, ADV_MASKS, FILTER_METRICS, KL_CONTROLLERS, apply_kl_penalty,
                                     balanced_order, explained_variance, group_index, group_mean_std, masked_mean,
                                     kinds_mask, select_groups, turn_end_mask)
from verl.trainer.watchdog import ROLLBACK_SEED_STRIDE, Event, Watchdog, WatchdogStop
from verl.utils import batch_file, checkpoint
from verl.utils.tracking import Tracking, duration, progress, write_jsonl


class RolloutProducer(Protocol):
    def rollout(self, step: int):
        """Play a batch of trajectories with the current policy; return an object with `.batch` (DataProto;
        per trajectory its `group_ids` and `env_failed` flag among the non-tensors), `.metrics` (dict[str,
        float]) and `.records` (list of JSON-able dicts, one per trajectory)."""

    def reseed(self, offset: int) -> None:
        """Shift every later rollout's seeds (start states and sampling) by `offset`: a watchdog rollback
        replays the steps after its checkpoint on other start states."""


class PPOTrainer:
    def __init__(self, config: TrainerConfig, algorithm: AlgorithmConfig, rollout_config: RolloutConfig,
                 actor_rollout_wg, critic_wg, agent: RolloutProducer, tracker: Tracking,
                 val_agent: RolloutProducer | None = None, use_reference: bool = False, samples_multiple: int = 1,
                 on_policy_batch: int = 0, on_records: Callable[[list[dict], str, int], None] | None = None, *,
                 run_config: dict, curriculum=None):
        """`critic_wg` is None without a critic. `samples_multiple`: the filter fills whole mini-batches
        of this many trajectories with the next-best groups where enough qualify (core_algos.select_groups).
        `on_policy_batch`: a batch of at most this many trajectories is one actor step on the policy that
        sampled it (one PPO epoch, one mini-batch), so its old log-probs are the current ones and no pass
        computes them (TRL and veRL skip it too); 0 computes them always.
        `on_records(records, split, step)` sees every rollout's records once saved (the HTML browser).
        `run_config`: the run's whole resolved config, written into every checkpoint so that a resume can tell
        what changed (`checkpoint.check_resume`). `curriculum`: the training envs' curriculum (ragen/curriculum.py),
        whose `state_dict()` goes into every checkpoint and comes back with `load_state_dict`; None without one."""
        self.config, self.algorithm, self.rollout_config = config, algorithm, rollout_config
        self.run_config = run_config
        self.actor_rollout_wg, self.critic_wg = actor_rollout_wg, critic_wg
        self.agent, self.val_agent = agent, val_agent
        self.tracker, self.use_reference, self.samples_multiple = tracker, use_reference, samples_multiple
        self.on_records, self.on_policy_batch = on_records, on_policy_batch
        self.curriculum = curriculum
        self.watchdog = Watchdog(config.watchdog, config.default_local_dir)
        self.rollbacks = 0  # watchdog rollbacks so far: each one shifts the training seeds (`reseed`)
        self.empty_steps = self.empty_streak = 0  # steps whose filter kept nothing: in all, and in a row now
        ctrl = algorithm.kl_ctrl
        self.kl_ctrl = KL_CONTROLLERS[ctrl.type](kl_coef=ctrl.kl_coef, target_kl=ctrl.target_kl, horizon=ctrl.horizon)

    def fit(self) -> None:
        done = self.resume()
        if done == 0:
            self.watchdog.start()
            if self.val_agent is not None and self.config.val_before_train:
                self.tracker.log(self.validate(step=0), step=0)
        last = self.config.total_training_steps
        if done >= last:
            print(f"the checkpoint is at step {done} >= trainer.total_training_steps={last}: nothing to train "
                  "(another trainer.experiment_name, or trainer.overwrite=true, starts over)", flush=True)
        nonfinite_steps = 0  # training steps in a row whose update skipped an optimizer step
        started = time.perf_counter()
        bar = progress(None, desc="training steps", initial=done, total=last)
        step = done
        while step < last:
            step += 1
            metrics = self.train_step(step)
            metrics |= self.count_empty_step(metrics)
            events = self.watchdog.observe(step, metrics)
            self.tracker.log(metrics | self.watchdog.metrics(events), step)
            self.watchdog.announce(events)
            action = self.watchdog.decision(events)
            if action == "stop":
                self.stop(events, f"A rule whose action is stop fired at step {step}.")
            if action == "rollback":
                step, nonfinite_steps = self.rollback(events), 0
                bar.reset(total=last)
                bar.update(step)
                continue
            nonfinite_steps = count_nonfinite_steps(nonfinite_steps, metrics,
                                                    self.config.max_consecutive_nonfinite_steps)
            self.stop_after_empty_steps(step)
            step_s, save_s = time.perf_counter() - started, 0.0
            if self.saves_at(step):
                self.save(step)
                save_s = time.perf_counter() - started - step_s
            if step == done + 1 and step < last:  # the steps left at this pace, and the checkpoints they save
                saves = sum(self.saves_at(s) for s in range(step + 1, last + 1))
                print(time_left(step_s, last - step, save_s, saves), flush=True)
            bar.update()
        bar.close()

    def saves_at(self, step: int) -> bool:
        return step == self.config.total_training_steps or (self.config.save_freq > 0
                                                            and step % self.config.save_freq == 0)

    def train_step(self, step: int) -> dict[str, float]:
        """One training step: rollout, collapse diagnostics, filter, `train_on` (score, advantage, update),
        records, and validation when due. Returns every metric of the step."""
        last = self.config.total_training_steps
        metrics: dict[str, float] = {}
        with timed("step", metrics):
            with timed("gen", metrics):
                rollout = self.agent.rollout(step)
            check_finite_rewards(rollout.batch, rollout.records)
            with timed("collapse", metrics):
                metrics |= self.measure_collapse(rollout.batch)
            records = DataProto(non_tensor_batch={"record_index": np.arange(len(rollout.batch))})
            batch, filter_metrics = self.filter(rollout.batch.union(records))
            self.save_batch(batch, step)
            if len(batch) > 0:  # an empty filtered batch skips the update; the step still counts
                batch = self.train_on(batch, step, metrics)
            updated = "timing_s/update_actor" in metrics  # not on a zero-variance skip or in the critic warm-up
            self.save_records(with_advantages(rollout.records, batch, updated), "train", step)
            if self.val_agent is not None and self.config.test_freq > 0 and (
                    step % self.config.test_freq == 0 or step == last):
                metrics |= self.validate(step)
        metrics |= throughput(rollout.batch, batch, metrics)
        return rollout.metrics | filter_metrics | metrics

    def filter(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        """Keep the groups (start states) that score best by `rollout_filter_metric`, with the strategy of
        `rollout_filter_strategy` (StarPO-S: the top 25% by reward std; core_algos.select_groups).

        A group with a trajectory whose environment failed (`env_failed`) is never kept: GRPO's or RLOO's
        baseline over the survivors alone would be biased. The kept trajectories fill whole mini-batches
        (`samples_multiple`) where enough groups qualify, else the last one is short, and every rank gets as
        many; the batch may come back empty (`rollout/empty_after_filter`), and the step then
        trains on nothing."""
        cfg = self.rollout_config
        rewards = batch.batch["trajectory_rewards"]
        index = group_index(batch.non_tensor_batch["group_ids"])
        _, stds = group_mean_std(rewards, index)
        group_stds = torch.zeros(int(index.max()) + 1).index_put_((index,), stds)  # (G,)
        scores = FILTER_METRICS[cfg.rollout_filter_metric](
            trajectory_rewards=rewards, loss_mask=batch.batch["loss_mask"],
            rollout_log_probs=batch.batch["rollout_log_probs"], index=index).float()  # (G,)
        failed_groups = np.unique(index.numpy()[batch.non_tensor_batch["env_failed"].astype(bool)])
        scores[failed_groups] = float("nan")  # never kept
        group_size = len(batch) // len(group_stds)
        kept = select_groups(scores, strategy=cfg.rollout_filter_strategy, value=cfg.rollout_filter_value,
                             largest=cfg.rollout_filter_type == "largest", include_zero=cfg.rollout_filter_include_zero,
                             prob_mode=cfg.rollout_filter_top_p_prob_mode,
                             selection_eps=cfg.rollout_filter_selection_eps,
                             fill=groups_per_multiple(self.samples_multiple, group_size),
                             multiple=groups_per_multiple(self.actor_rollout_wg.world_size, group_size))
        keep = np.isin(index.numpy(), kept.numpy())
        metrics = {"rollout/in_group_std": group_stds.mean().item(),
                   "rollout/filter_kept_ratio": len(kept) / len(group_stds),
                   "rollout/empty_after_filter": float(len(kept) == 0),
                   "rollout/env_failed_groups": float(len(failed_groups))}
        if len(failed_groups) < len(scores):
            metrics["rollout/filter_score_mean"] = scores.nanmean().item()
        if len(kept):
            metrics["rollout/chosen_in_group_std"] = group_stds[kept].mean().item()
            metrics["rollout/chosen_filter_score_mean"] = scores[kept].mean().item()
        return batch[keep], metrics

    def count_empty_step(self, metrics: dict[str, float]) -> dict[str, float]:
        """Count a step whose filter kept nothing (`rollout/empty_after_filter`): the running total is logged
        as `rollout/empty_after_filter_steps`; both counts are saved with checkpoints (`save`, `load`)."""
        empty = bool(metrics["rollout/empty_after_filter"])
        self.empty_steps += empty
        self.empty_streak = self.empty_streak + 1 if empty else 0
        return {"rollout/empty_after_filter_steps": float(self.empty_steps)}

    def stop_after_empty_steps(self, step: int) -> None:
        """Stop the run, as a watchdog stop rule would (a report, `WatchdogStop`), once the filter has kept
        nothing for `rollout_filter_empty_stop_steps` steps in a row (0: never): the run is no longer training."""
        cfg = self.rollout_config
        limit = cfg.rollout_filter_empty_stop_steps
        if not 0 < limit <= self.empty_streak:
            return
        message = (f"the rollout filter kept no group for {self.empty_streak} steps in a row, so nothing was "
                   f"trained on (strategy {cfg.rollout_filter_strategy} {cfg.rollout_filter_value:g} on "
                   f"{cfg.rollout_filter_metric}, include_zero {cfg.rollout_filter_include_zero}): loosen "
                   f"actor_rollout_ref.rollout.rollout_filter_*, or raise "
                   f"actor_rollout_ref.rollout.rollout_filter_empty_stop_steps={limit} (0: never stop)")
        event = Event(step, self.watchdog.attempt, "rollout_filter_empty_stop_steps", "stop",
                      "rollout/empty_after_filter", 1.0, message)
        self.watchdog.announce([event])
        self.stop([event], f"The rollout filter kept nothing for {self.empty_streak} steps in a row: {message}.")

    def train_on(self, batch: DataProto, step: int, metrics: dict[str, float]) -> DataProto:
        """Score the kept trajectories, compute their advantages and update the critic and the actor; returns
        the batch with its advantages, and adds each stage's metrics and timing to `metrics`."""
        batch = self.balance(batch)
        if len(batch) > self.on_policy_batch or self.algorithm.use_kl_in_reward:
            with timed("old_log_prob", metrics):
                batch = batch.union(self.actor_rollout_wg.compute_log_prob(batch))
        if self.use_reference:
            with timed("ref", metrics):
                batch = batch.union(self.actor_rollout_wg.compute_ref_log_prob(batch))
        if self.critic_wg is not None:
            with timed("values", metrics):
                batch = batch.union(self.critic_wg.compute_values(batch))
        with timed("adv", metrics):
            batch, adv_metrics = self.compute_advantage(batch)
        metrics |= adv_metrics
        if self.critic_wg is not None:
            with timed("update_critic", metrics):
                metrics |= self.critic_wg.update_critic(batch)
        metrics["actor/zero_variance_skip"] = float(self.is_zero_variance(batch))
        if step > self.config.critic_warmup and not metrics["actor/zero_variance_skip"]:
            with timed("update_actor", metrics):
                metrics |= self.actor_rollout_wg.update_actor(batch)
        return batch

    def balance(self, batch: DataProto) -> DataProto:
        """Reorder so that every rank's share of the batch holds about the same number of tokens."""
        ranks = self.actor_rollout_wg.world_size
        return batch[balanced_order(batch.batch["attention_mask"].sum(-1).tolist(), ranks)] if ranks > 1 else batch

    def compute_advantage(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        algo, metrics = self.algorithm, {}
        loss_mask, token_rewards = batch.batch["loss_mask"], batch.batch["token_rewards"]
        if algo.use_kl_in_reward:
            token_rewards, kl = apply_kl_penalty(token_rewards, batch.batch["old_log_probs"],
                                                 batch.batch["ref_log_probs"], loss_mask, algo.kl_penalty,
                                                 self.kl_ctrl.value)
            metrics |= {"actor/reward_kl_penalty": kl, "actor/reward_kl_penalty_coeff": self.kl_ctrl.value}
            self.kl_ctrl.update(kl, n_steps=len(batch))
        generated, kinds, ends = loss_mask.bool(), batch.batch["reply_kinds"], turn_end_mask(loss_mask)
        # TRICO: generated tokens outside `adv_spans` carry no advantage; a turn's last token keeps its reward
        adv_mask = ADV_MASKS[algo.adv_mask](loss_mask) * ~(generated & ~kinds_mask(kinds, algo.adv_spans) & ~ends)
        values = batch.batch.get("values", torch.zeros_like(token_rewards))
        advantages, returns = ADV_ESTIMATORS[algo.adv_estimator].fn(
            token_rewards=token_rewards, values=values, adv_mask=adv_mask, turn_ends=ends,
            group_ids=batch.non_tensor_batch["group_ids"], state_ids=batch.batch["state_ids"], config=algo)
        check_finite_advantages({"token_rewards": token_rewards, "values": values, "advantages": advantages,
                                 "returns": returns}, adv_mask)
        metrics |= {"critic/advantages_mean": masked_mean(advantages, adv_mask).item(),
                    "critic/advantages_max": advantages[adv_mask.bool()].max().item(),
                    "critic/advantages_min": advantages[adv_mask.bool()].min().item()}
        if self.critic_wg is not None:
            metrics |= {"critic/returns_mean": masked_mean(returns, adv_mask).item(),
                        "critic/values_mean": masked_mean(values, adv_mask).item()}
            explained = explained_variance(values, returns, adv_mask)
            if explained is not None:  # undefined when every return is the same
                metrics["critic/vf_explained_var"] = explained
        added = DataProto(batch={"adv_mask": adv_mask, "advantages": advantages, "returns": returns})
        trained = loss_mask * kinds_mask(kinds, algo.loss_spans)  # TRICO's loss mask: what the actor trains on
        return DataProto(batch=batch.batch | {"loss_mask": trained}, non_tensor_batch=batch.non_tensor_batch,
                         meta_info=batch.meta_info).union(added), metrics

    def is_zero_variance(self, batch: DataProto) -> bool:
        """Whether the batch says nothing about which actions are better, so the actor takes no step
        (`algorithm.skip_zero_variance_batches`). Without a critic: every advantage is 0. With one: every
        group's trajectories got the same reward (the whole batch's, for groups of one), so any advantage is
        critic noise, whitened to unit scale. The actor's LR schedule advances only with actor steps."""
        if not self.algorithm.skip_zero_variance_batches:
            return False
        if self.critic_wg is None:
            return bool((batch.batch["advantages"][batch.batch["adv_mask"].bool()] == 0).all())
        return equal_rewards_within_groups(batch)

    def measure_collapse(self, batch: DataProto) -> dict[str, float]:
        """Template collapse: how much the policy's first replies depend on their first prompts (collapse/mi, at
        most collapse/mi_ceiling = log M; collapse/retrieval_acc against collapse/retrieval_chance). The policy
        cross-scores `trainer.collapse_mi_replies` replies of each of `trainer.collapse_mi_inputs` distinct
        inputs under every one of them (verl/trainer/collapse.py); no metric when off or with < 2 inputs."""
        if self.config.collapse_mi_inputs == 0:
            return {}
        picked = cross_scoring_pairs(batch, self.config.collapse_mi_inputs, self.config.collapse_mi_replies)
        if picked is None:
            return {}
        pairs, own_input = picked
        scored = self.actor_rollout_wg.compute_log_prob(repeat_to_multiple(pairs, self.actor_rollout_wg.world_size))
        log_probs = scored.batch["old_log_probs"][:len(pairs)]  # (M * N, T); the repeated rows dropped
        scores = score_matrix(log_probs, pairs.batch["loss_mask"], num_replies=len(own_input))
        return collapse_metrics(scores, own_input)

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
        if self.on_records is not None:
            self.on_records(records, split, step)

    def save_batch(self, batch: DataProto, step: int) -> None:
        """The batch `train_on` gets at this step (empty when the filter kept nothing), for `python -m ragen.replay`
        to feed through the same update (`trainer.save_batches`). The thread counts go with it: they set the
        order of float sums, so a replay with other counts may differ in the last bits."""
        if self.config.save_batches and self.config.rollout_data_dir is not None:
            batch_file.write_batch(batch_file.batch_path(self.config.rollout_data_dir, step), batch, step=step,
                                   torch_threads=torch.get_num_threads(), cpus=len(os.sched_getaffinity(0)))

    def save(self, step: int) -> Path:
        """Checkpoint every worker group, the trainer's own state and the run's config; atomic (see
        verl/utils/checkpoint.py). The number of ranks is recorded: each rank resumes its own optimizer shard."""
        staging = checkpoint.staging_path(self.config.default_local_dir, step)
        try:
            return self.write_checkpoint(step)
        except BaseException as e:  # a full disk, a read-only folder, Ctrl-C: no staging folder left behind
            failure = checkpoint.save_failure(self.config.default_local_dir, step, e) \
                if isinstance(e, Exception) and not isinstance(e, WorkerDiedError) else None
            shutil.rmtree(staging, ignore_errors=True)
            if failure is None:
                raise
            raise failure from e

    def write_checkpoint(self, step: int) -> Path:
        staging = checkpoint.staging_dir(self.config.default_local_dir, step)
        self.actor_rollout_wg.save_checkpoint(str(staging / "actor"))
        if self.critic_wg is not None:
            self.critic_wg.save_checkpoint(str(staging / "critic"))
        state = {"step": step, "world_size": self.actor_rollout_wg.world_size, "kl_coef": self.kl_ctrl.value,
                 "kl_ctrl": {"type": self.algorithm.kl_ctrl.type, "kl_coef": self.algorithm.kl_ctrl.kl_coef},
                 "healthy": self.watchdog.healthy(), "rollbacks": self.rollbacks,
                 "watchdog_streaks": self.watchdog.streaks,
                 "empty_filter_steps": self.empty_steps, "empty_filter_streak": self.empty_streak}
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        path = checkpoint.commit(staging, step, state, self.run_config, keep=self.config.max_actor_ckpt_to_keep,
                                 resumable=self.config.resumable_checkpoints)
        print(f"saved checkpoint {path}", flush=True)
        return path

    def resume(self) -> int:
        """Load the checkpoint `trainer.resume_mode` names; return its step (0: a fresh start).
        Environment seeds and sampling seeds derive from the step, so the steps after it replay exactly.
        Whether the checkpoint fits this run (ranks, settings) was checked at start-up (`checkpoint.check_resume`)."""
        path = checkpoint.resume_path(self.config)
        if path is None:
            return 0
        step = self.load(path)
        self.watchdog.truncate(after_step=step)  # a crashed step's events would be written twice
        print(f"resumed from {path} (step {step})", flush=True)
        return step

    def load(self, path: Path, set_aside_as: str | None = None) -> int:
        """Restore a checkpoint: weights, optimizer and RNG states, the KL controller, the watchdog's rollback
        count (which sets the training seeds), rule streaks and the curriculum's state; metrics logged after its
        step are dropped, or with `set_aside_as` (a rollback) moved to metrics.rolled_back.jsonl."""
        state = checkpoint.read_trainer_state(path)
        checkpoint.set_driver_rng_state(state["rng"])
        self.actor_rollout_wg.load_checkpoint(str(path / "actor"))
        if self.critic_wg is not None:
            self.critic_wg.load_checkpoint(str(path / "critic"))
        configured = {"type": self.algorithm.kl_ctrl.type, "kl_coef": self.algorithm.kl_ctrl.kl_coef}
        if state["kl_ctrl"] == configured:  # a new controller type or initial coefficient restarts it
            self.kl_ctrl.value = state["kl_coef"]
        else:
            self.kl_ctrl.value = configured["kl_coef"]
        if state["rollbacks"]:
            self.set_rollbacks(state["rollbacks"])
        self.watchdog.restore(state["watchdog_streaks"])
        self.empty_steps, self.empty_streak = state["empty_filter_steps"], state["empty_filter_streak"]
        if self.curriculum is not None and "curriculum" in state:
            self.curriculum.load_state_dict(state["curriculum"])
        elif self.curriculum is not None:  # a forced resume that added a curriculum
            print(f"{path} was saved without a curriculum: this run's starts at its beginning", flush=True)
        self.tracker.truncate(after_step=state["step"], set_aside_as=set_aside_as)  # else logged twice
        return state["step"]

    def rollback(self, events: list[Event]) -> int:
        """Go back to the newest checkpoint saved while no rule was tripping (and that kept its optimizer
        state), shift the training seeds so that the steps after it see other start states and samples, and
        return its step. Stops the run instead when there is none or `max_rollbacks` are used up."""
        step = events[0].step
        target = checkpoint.newest_resumable_checkpoint(self.config.default_local_dir, step, healthy_only=True,
                                                         verified=True)
        if target is None:
            self.stop(events, "A rule asked to roll back, but no checkpoint saved before it was healthy and kept its "
                              "optimizer state (save more often: trainer.save_freq, trainer.resumable_checkpoints).")
        if self.rollbacks >= self.config.watchdog.max_rollbacks:
            self.stop(events, f"A rule asked to roll back after {self.rollbacks} rollbacks "
                              f"(trainer.watchdog.max_rollbacks={self.config.watchdog.max_rollbacks}).")
        rollbacks = self.rollbacks + 1  # counted over the whole run: the checkpoint's count is older
        rolled_back = self.load(target, set_aside_as=f"try {self.rollbacks}, undone at step {step}")
        checkpoint.abandon_after(self.config.default_local_dir, rolled_back)
        self.set_rollbacks(rollbacks)
        print(f"[watchdog] rolled back from step {step} to {target} (step {rolled_back}); rollback "
              f"{self.rollbacks} of at most {self.config.watchdog.max_rollbacks}, training seeds shifted by "
              f"{self.rollbacks * ROLLBACK_SEED_STRIDE}", flush=True)
        return rolled_back

    def set_rollbacks(self, count: int) -> None:
        """The training seeds and the watchdog's attempt number follow the rollbacks so far."""
        self.rollbacks = count
        self.agent.reseed(count * ROLLBACK_SEED_STRIDE)
        self.watchdog.reset(attempt=count)

    def stop(self, events: list[Event], reason: str) -> None:
        """End the run with the watchdog's report."""
        healthy = checkpoint.newest_resumable_checkpoint(self.config.default_local_dir, events[0].step,
                                                         healthy_only=True, verified=True)
        report = self.watchdog.write_report(events, reason, healthy)
        raise WatchdogStop(f"the watchdog stopped the run at step {events[0].step} "
                           f"({', '.join(e.rule for e in events)}); report: {report}")


def time_left(first_step_s: float, steps_left: int, save_s: float = 0.0, saves_left: int = 0) -> str:
    """The rest of the run at the pace of its first step, its checkpoint counted once per checkpoint still to
    save (`save_s`: its duration, 0 when the first step saved none): an estimate, since replies grow or
    shrink and validations come only every few steps."""
    saving = f" and {saves_left} checkpoint(s) of {duration(save_s)}" if save_s and saves_left else ""
    total = first_step_s * steps_left + (save_s * saves_left if save_s else 0.0)
    return (f"[ragen] the first step took {duration(first_step_s)}: the {steps_left} steps left{saving} take "
            f"about {duration(total)} at that pace (estimate)")


def with_advantages(records: list[dict], batch: DataProto, updated: bool = True) -> list[dict]:
    """Each turn's record gets the mean advantage of its generated tokens that carry one (`adv_mask`), and each
    trajectory's record the tokens the update trained on (`loss_mask`, narrowed to `algorithm.loss_spans`), for
    the trajectory browser's heat map: `trained_tokens` = {"spans": the [start, end) runs of `loss_mask` over the
    trajectory's tokens, "advantages": one per trained token, in order, to 3 decimals, "updated": whether the
    actor took an update on them this step} (compact: about 7 bytes a generated token). None: dropped by the
    filter."""
    for record in records:
        record["trained_tokens"] = None
        for turn in record["turns"]:
            turn["advantage"] = None
    if len(batch) == 0:  # nothing was trained on this step
        return records
    advantages, mask, turn_ids = batch.batch["advantages"], batch.batch["loss_mask"].bool(), batch.batch["turn_ids"]
    carrying = (batch.batch["reply_kinds"] > 0) & batch.batch["adv_mask"].bool()  # generated, with an advantage
    no_token = torch.zeros(1, dtype=torch.int)
    for row, index in enumerate(batch.non_tensor_batch["record_index"]):
        for k, turn in enumerate(records[index]["turns"]):
            tokens = carrying[row] & (turn_ids[row] == k)
            turn["advantage"] = advantages[row][tokens].mean().item() if tokens.any() else None
        # +1 where a run of trained tokens starts, -1 one past its end
        edges = torch.diff(mask[row].int(), prepend=no_token, append=no_token).nonzero().flatten().tolist()
        records[index]["trained_tokens"] = {"spans": [edges[i:i + 2] for i in range(0, len(edges), 2)],
                                            "advantages": [round(a, 3) for a in advantages[row][mask[row]].tolist()],
                                            "updated": updated}
    return records


def check_finite_rewards(batch: DataProto, records: list[dict]) -> None:
    """Stop on a non-finite trajectory reward, naming its environment and seed: trained on, it would turn its
    whole group's (GRPO) or batch's (whitened GAE) advantages into NaN. A backstop: RAGEN's own rollout
    already fails the trajectory of an env.step that returns one (ragen/env_state_manager.py)."""
    rewards = batch.batch["trajectory_rewards"]
    bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
    if bad:
        where = "; ".join(f"env tag {records[i]['tag']!r}, seed {records[i]['seed']}: reward {rewards[i].item()}"
                          for i in bad[:5])
        raise FloatingPointError(f"{len(bad)} of {len(rewards)} trajectories got a non-finite reward ({where}). "
                                 "An environment's step() must return a finite reward: replay that env tag and "
                                 "seed to find the state that produces it")


# Why a tensor of the advantage computation can be non-finite when the ones computed before it are finite
NONFINITE_CAUSES = {
    "token_rewards": "the environments' rewards are finite, so the KL penalty (algorithm.use_kl_in_reward) is "
                     "not: the old or reference log-probs hold inf or NaN",
    "values": "the critic diverged; lower critic.optim.lr",
    "advantages": "the advantage estimator overflowed on finite rewards and values",
    "returns": "the advantage estimator overflowed on finite rewards and values",
}


def check_finite_advantages(tensors: dict[str, torch.Tensor], adv_mask: torch.Tensor) -> None:
    """Stop before a non-finite number reaches the update: name the first of `tensors` (each computed from
    the ones before it) with one on the advantage tokens, and its likely cause."""
    for name, tensor in tensors.items():
        bad = ~torch.isfinite(tensor[adv_mask.bool()])
        if bad.any():
            raise FloatingPointError(f"{int(bad.sum())} of {bad.numel()} {name} (on the tokens of adv_mask) are "
                                     f"non-finite: {NONFINITE_CAUSES[name]}")


def count_nonfinite_steps(streak: int, metrics: dict[str, float], limit: int) -> int:
    """The number of training steps in a row, this one included, whose actor or critic update skipped an
    optimizer step on a non-finite gradient norm (a step without an update keeps the count). Raises when it
    reaches `limit` (0: never): the run has diverged, and skipping on would only look alive."""
    skipped = [metrics[f"{role}/nonfinite_skipped_steps"] for role in ("actor", "critic")
               if f"{role}/nonfinite_skipped_steps" in metrics]
    if not skipped:
        return streak
    streak = streak + 1 if any(skipped) else 0
    if 0 < limit <= streak:
        raise FloatingPointError(
            f"{streak} training steps in a row skipped an optimizer step on a non-finite loss or gradient norm "
            "(actor/ and critic/nonfinite_skipped_steps in metrics.jsonl): the run has diverged. Resume from the "
            "last checkpoint with a lower learning rate or grad_clip, or raise "
            "trainer.max_consecutive_nonfinite_steps (0: never stop)")
    return streak


def equal_rewards_within_groups(batch: DataProto) -> bool:
    """Whether every group's trajectories got the same reward (the whole batch's, for groups of one)."""
    index = group_index(batch.non_tensor_batch["group_ids"])
    if torch.bincount(index).max() == 1:
        index = torch.zeros_like(index)
    _, stds = group_mean_std(batch.batch["trajectory_rewards"], index)
    return bool((stds == 0).all())


def groups_per_multiple(samples_multiple: int, group_size: int) -> int:
    """The smallest number of groups whose trajectories are a multiple of `samples_multiple`."""
    return samples_multiple // np.gcd(samples_multiple, group_size)


def throughput(rollout: DataProto, batch: DataProto, metrics: dict[str, float]) -> dict[str, float]:
    """Tokens the rollout generated (all trajectories) and the update trained on (the kept ones, prompts
    included), and the rollout's tokens per second of its wall time (environment steps included)."""
    generated = rollout.batch["loss_mask"].sum().item()
    return {"perf/generated_tokens": generated, "perf/rollout_tokens_per_s": generated / metrics["timing_s/gen"],
            "perf/update_tokens": batch.batch["attention_mask"].sum().item()}


@contextmanager
def timed(name: str, metrics: dict[str, float]):
    start = time.perf_counter()
    yield
    metrics[f"timing_s/{name}"] = time.perf_counter() - start
