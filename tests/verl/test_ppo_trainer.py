"""The training loop's stages with scripted worker groups: which stages run, in which order, on what."""

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.config import REPLY_KINDS, AlgorithmConfig, KLControlConfig, RolloutConfig, TrainerConfig
from verl.trainer.ppo_trainer import PPOTrainer, groups_per_multiple, with_advantages
from verl.trainer.watchdog import WatchdogStop
from verl.utils.tracking import Tracking


def rollout_batch(rewards: list[float], group_size: int, env_failed: list[bool] | None = None,
                  log_probs: list[float] | None = None) -> DataProto:
    """One prompt token, two generated tokens, the trajectory's reward on the last one; the rollout's
    log-prob of each generated token is `log_probs` (one per trajectory; -1 by default)."""
    n = len(rewards)
    env_failed = [False] * n if env_failed is None else env_failed
    token_rewards = torch.zeros(n, 3)  # (B, T)
    token_rewards[:, 2] = torch.tensor(rewards)
    rollout_log_probs = torch.tensor([[0.0, lp, lp] for lp in ([-1.0] * n if log_probs is None else log_probs)])
    return DataProto(batch={"input_ids": torch.arange(3).repeat(n, 1), "loss_mask": torch.tensor([[0., 1, 1]] * n),
                            "attention_mask": torch.ones(n, 3, dtype=torch.long),
                            "rollout_log_probs": rollout_log_probs,
                            "token_rewards": token_rewards, "trajectory_rewards": torch.tensor(rewards),
                            "state_ids": torch.zeros(n, 3, dtype=torch.long),
                            "turn_ids": torch.zeros(n, 3, dtype=torch.long),
                            "reply_kinds": torch.tensor([[0, ANSWER, FORMAT]] * n)},  # `Up` then `</answer>`
                     non_tensor_batch={"group_ids": np.arange(n) // group_size, "env_failed": np.array(env_failed)})


ANSWER, FORMAT = REPLY_KINDS.index("answer") + 1, REPLY_KINDS.index("format") + 1


@dataclass
class Rollout:
    batch: DataProto
    metrics: dict
    records: list


class ScriptedAgent:
    def __init__(self, batch: DataProto):
        self.batch = batch

    def reseed(self, offset):
        pass

    def rollout(self, step):
        records = [{"tag": "Bandit", "seed": i, "turns": [{"reward": r.item()}]}
                   for i, r in enumerate(self.batch.batch["trajectory_rewards"])]
        return Rollout(self.batch, {"rollout/reward_mean": 0.0}, records)


class RecordingWorkers:
    """Stands in for a worker group: records the calls and the batch sizes, returns fixed tensors."""

    world_size = 1

    def __init__(self, calls: list, name: str):
        self.calls, self.name = calls, name

    def __getattr__(self, method):
        def call(data=None, *args):
            self.calls.append((self.name, method, len(data) if isinstance(data, DataProto) else None))
            if method == "compute_log_prob":
                return DataProto(batch={"old_log_probs": torch.full((len(data), 3), -1.0)})
            if method == "compute_ref_log_prob":
                return DataProto(batch={"ref_log_probs": torch.full((len(data), 3), -1.5)})
            if method == "compute_values":
                return DataProto(batch={"values": torch.full((len(data), 3), 0.25)})
            if method == "update_actor":
                assert {"advantages", "adv_mask"} <= data.batch.keys()
                self.update_keys = set(data.batch.keys())
                return {"actor/pg_loss": 0.0}
            if method == "update_critic":
                assert {"returns", "values", "adv_mask"} <= data.batch.keys()
                return {"critic/vf_loss": 0.0}
        return call


def make_trainer(tmp_path, rewards, group_size=2, algorithm=None, rollout=None, critic=True, use_reference=False,
                 steps=1, critic_warmup=0, samples_multiple=1, on_policy_batch=0):
    calls = []
    config = TrainerConfig(total_training_steps=steps, critic_warmup=critic_warmup, default_local_dir=str(tmp_path),
                           rollout_data_dir=None, logger=["jsonl"])
    trainer = PPOTrainer(config, algorithm or AlgorithmConfig(), rollout or RolloutConfig(rollout_filter_value=1.0),
                         RecordingWorkers(calls, "actor"), RecordingWorkers(calls, "critic") if critic else None,
                         ScriptedAgent(rollout_batch(rewards, group_size)), Tracking(["jsonl"], str(tmp_path)),
                         use_reference=use_reference, samples_multiple=samples_multiple,
                         on_policy_batch=on_policy_batch, run_config={"model_path": "tiny"})
    return trainer, calls


def test_a_step_runs_the_stages_in_order(tmp_path):
    trainer, calls = make_trainer(tmp_path, [1.0, 0.0, 1.0, 1.0], use_reference=True)
    trainer.fit()
    assert [(who, what) for who, what, _ in calls] == [
        ("actor", "compute_log_prob"), ("actor", "compute_ref_log_prob"), ("critic", "compute_values"),
        ("critic", "update_critic"), ("actor", "update_actor"), ("actor", "save_checkpoint"),
        ("critic", "save_checkpoint")]


def test_without_critic_or_reference_those_stages_do_not_run(tmp_path):
    trainer, calls = make_trainer(tmp_path, [1.0, 0.0], algorithm=AlgorithmConfig(adv_estimator="grpo"), critic=False)
    trainer.fit()
    assert [what for _, what, _ in calls] == ["compute_log_prob", "update_actor", "save_checkpoint"]


@pytest.mark.parametrize("on_policy_batch, kl_in_reward, scored", [
    (0, False, True), (3, False, True),  # 4 trajectories: more than one on-policy mini-batch
    (4, False, False), (8, False, False),  # one mini-batch of one epoch: the sampling policy is the current one
    (4, True, True)])  # the KL penalty in the reward needs the old log-probs
def test_old_log_probs_are_scored_unless_the_update_is_on_policy(tmp_path, on_policy_batch, kl_in_reward, scored):
    algorithm = AlgorithmConfig(adv_estimator="grpo", use_kl_in_reward=kl_in_reward)
    trainer, calls = make_trainer(tmp_path, [1.0, 0.0, 0.0, 1.0], algorithm=algorithm, critic=False,
                                  use_reference=kl_in_reward, on_policy_batch=on_policy_batch)
    trainer.fit()
    assert ("compute_log_prob" in [what for _, what, _ in calls]) == scored
    assert ("old_log_probs" in trainer.actor_rollout_wg.update_keys) == scored


def test_critic_warmup_skips_the_actor_update(tmp_path):
    trainer, calls = make_trainer(tmp_path, [1.0, 0.0], steps=3, critic_warmup=2)
    trainer.fit()
    assert [what for _, what, _ in calls].count("update_critic") == 3
    assert [what for _, what, _ in calls].count("update_actor") == 1


@pytest.mark.parametrize("estimator", ["gae", "grpo", "rloo", "reinforce"])
@pytest.mark.parametrize("rewards, group_size, updates", [
    ([1.0, 1.0, 0.0, 0.0], 2, False),  # every group agrees: advantages are 0 or critic noise
    ([1.0, 0.0, 0.0, 0.0], 2, True),
    ([1.0, 1.0], 1, False),  # groups of one: the batch is the group
    ([1.0, 0.0], 1, True),
])
def test_no_actor_step_when_no_trajectory_beat_another(tmp_path, estimator, rewards, group_size, updates):
    if estimator in ("grpo", "rloo") and group_size == 1:
        pytest.skip("needs groups")
    if estimator == "reinforce":  # A = R: a batch of rewards 1 and 0 is signal even when groups agree
        updates = any(rewards)
    trainer, calls = make_trainer(tmp_path, rewards, group_size=group_size, critic=estimator == "gae",
                                  algorithm=AlgorithmConfig(adv_estimator=estimator))
    trainer.fit()
    whats = [what for _, what, _ in calls]
    assert whats.count("update_actor") == int(updates)
    assert whats.count("update_critic") == int(estimator == "gae")  # the critic still learns the values
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert logged["actor/zero_variance_skip"] == float(not updates)


def test_the_zero_variance_skip_can_be_turned_off(tmp_path):
    trainer, calls = make_trainer(tmp_path, [1.0, 1.0, 0.0, 0.0],
                                  algorithm=AlgorithmConfig(skip_zero_variance_batches=False))
    trainer.fit()
    assert [what for _, what, _ in calls].count("update_actor") == 1


def test_explained_variance_is_not_logged_for_constant_returns(tmp_path):
    trainer, _ = make_trainer(tmp_path, [1.0, 1.0, 1.0, 1.0])
    trainer.fit()
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert "critic/vf_explained_var" not in logged and "critic/returns_mean" in logged


def test_filter_keeps_the_groups_with_the_most_reward_spread(tmp_path):
    # groups of 2: stds 0, 0.707, 0, 1.414 -> top 25% (1 of 4) is group 3, top 50% groups 3 and 1
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    trainer, calls = make_trainer(tmp_path, rewards, rollout=RolloutConfig(rollout_filter_value=0.25))
    batch, metrics = trainer.filter(rollout_batch(rewards, 2))
    assert batch.non_tensor_batch["group_ids"].tolist() == [3, 3]
    assert metrics["rollout/filter_kept_ratio"] == 0.25 and metrics["rollout/empty_after_filter"] == 0
    assert metrics["rollout/chosen_in_group_std"] == pytest.approx(2 ** 0.5)
    assert metrics["rollout/in_group_std"] == pytest.approx((2 ** 0.5 + 2 ** -0.5) / 4)
    assert metrics["rollout/filter_score_mean"] == pytest.approx((2 ** 0.5 + 2 ** -0.5) / 4)  # the score is the std
    assert metrics["rollout/chosen_filter_score_mean"] == pytest.approx(2 ** 0.5)
    trainer.rollout_config.rollout_filter_value = 0.5
    assert trainer.filter(rollout_batch(rewards, 2))[0].non_tensor_batch["group_ids"].tolist() == [1, 1, 3, 3]
    trainer.rollout_config.rollout_filter_type = "smallest"
    assert trainer.filter(rollout_batch(rewards, 2))[0].non_tensor_batch["group_ids"].tolist() == [0, 0, 2, 2]
    trainer.rollout_config.rollout_filter_value = 0.25
    trainer.rollout_config.rollout_filter_include_zero = False  # the zero-std groups go first: group 1 is lowest
    assert trainer.filter(rollout_batch(rewards, 2))[0].non_tensor_batch["group_ids"].tolist() == [1, 1]


@pytest.mark.parametrize("metric, filter_type, kept", [
    ("reward", "largest", [3]),  # group means 1, 0.5, 0, 1.5
    ("reward_sum", "smallest", [2]),
    ("entropy", "largest", [0]),  # minus the mean log-prob of the sampled tokens: 2, 1, 1, 0.5
    ("length", "largest", [0]),  # every trajectory generated 2 tokens: ties keep the first group
])
def test_filter_ranks_groups_by_the_configured_metric(tmp_path, metric, filter_type, kept):
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 2.0, 1.0]
    rollout = RolloutConfig(rollout_filter_value=0.25, rollout_filter_metric=metric, rollout_filter_type=filter_type)
    trainer, _ = make_trainer(tmp_path, rewards, rollout=rollout)
    batch, metrics = trainer.filter(rollout_batch(rewards, 2, log_probs=[-2, -2, -1, -1, -1, -1, -0.5, -0.5]))
    assert sorted(set(batch.non_tensor_batch["group_ids"].tolist())) == kept


def test_filter_top_p_keeps_the_share_of_the_summed_score(tmp_path):
    # groups of 2: stds 0, 0.707, 0, 1.414 (total 2.12); 0.9 of it needs both spread groups; 0.6 group 3 alone
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    rollout = RolloutConfig(rollout_filter_strategy="top_p", rollout_filter_value=0.9,
                            rollout_filter_include_zero=False)
    trainer, _ = make_trainer(tmp_path, rewards, rollout=rollout)
    assert trainer.filter(rollout_batch(rewards, 2))[0].non_tensor_batch["group_ids"].tolist() == [1, 1, 3, 3]
    trainer.rollout_config.rollout_filter_value = 0.6
    assert trainer.filter(rollout_batch(rewards, 2))[0].non_tensor_batch["group_ids"].tolist() == [3, 3]


def test_filter_keeps_whole_mini_batches_in_top_p_mode(tmp_path):
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    trainer, _ = make_trainer(tmp_path, rewards, samples_multiple=4,
                              rollout=RolloutConfig(rollout_filter_value=0.5, rollout_filter_strategy="top_p"))
    # group 3 alone holds 2/3 of the summed std, but 2 trajectories do not fill a mini-batch of 4
    batch, _ = trainer.filter(rollout_batch(rewards, 2))
    assert batch.non_tensor_batch["group_ids"].tolist() == [1, 1, 3, 3]
    assert groups_per_multiple(samples_multiple=4, group_size=2) == 2
    assert groups_per_multiple(samples_multiple=8, group_size=16) == 1
    # without the zero-std groups: half the spread needs the 2 best of the 3 others, one whole mini-batch
    trainer.samples_multiple, trainer.rollout_config.rollout_filter_include_zero = 4, False
    batch, _ = trainer.filter(rollout_batch([1.0, 0.0, 1.0, 1.0, 2.0, 0.0, 0.0, 2.0], 2))
    assert batch.non_tensor_batch["group_ids"].tolist() == [2, 2, 3, 3]


def test_filter_never_keeps_a_group_with_a_failed_environment(tmp_path):
    # groups of 2: stds 0, 0.707, 0, 1.414; group 3, the most informative, had a failed environment
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    failed = [False] * 7 + [True]
    trainer, _ = make_trainer(tmp_path, rewards, rollout=RolloutConfig(rollout_filter_value=0.25))
    batch, metrics = trainer.filter(rollout_batch(rewards, 2, env_failed=failed))
    assert batch.non_tensor_batch["group_ids"].tolist() == [1, 1]  # the best of the others
    assert metrics["rollout/env_failed_groups"] == 1
    assert metrics["rollout/chosen_in_group_std"] == pytest.approx(0.5 ** 0.5)
    assert metrics["rollout/filter_score_mean"] == pytest.approx(0.5 ** 0.5 / 3)  # over the 3 healthy groups
    # filter off, mini-batches of 2 groups: the 3 healthy groups are all kept, the second mini-batch short
    trainer.rollout_config.rollout_filter_value, trainer.samples_multiple = 1.0, 4
    batch, metrics = trainer.filter(rollout_batch(rewards, 2, env_failed=failed))
    assert batch.non_tensor_batch["group_ids"].tolist() == [0, 0, 1, 1, 2, 2]
    assert metrics["rollout/filter_kept_ratio"] == 0.75
    # four ranks: 6 trajectories cannot be shared equally, so the group with the least spread is left out
    trainer.actor_rollout_wg.world_size = 4
    batch, _ = trainer.filter(rollout_batch(rewards, 2, env_failed=failed))
    assert batch.non_tensor_batch["group_ids"].tolist() == [0, 0, 1, 1]


def test_a_step_in_which_every_group_failed_skips_the_update(tmp_path):
    rewards = [1.0, 0.0, 1.0, 0.0]
    trainer, calls = make_trainer(tmp_path, rewards, algorithm=AlgorithmConfig(adv_estimator="grpo"), critic=False)
    trainer.agent.batch = rollout_batch(rewards, 2, env_failed=[True, False, False, True])
    trainer.config.rollout_data_dir = str(tmp_path / "rollouts")
    trainer.fit()
    assert [what for _, what, _ in calls] == ["save_checkpoint"]
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert logged["rollout/filter_kept_ratio"] == 0 and logged["perf/update_tokens"] == 0
    assert logged["rollout/empty_after_filter"] == 1 and "rollout/filter_score_mean" not in logged  # no score
    records = [json.loads(line) for line in (tmp_path / "rollouts" / "train" / "step_1.jsonl").read_text().splitlines()]
    assert [r["turns"][0]["advantage"] for r in records] == [None] * 4


def test_filter_runs_before_scoring(tmp_path):
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    trainer, calls = make_trainer(tmp_path, rewards, rollout=RolloutConfig(rollout_filter_value=0.5))
    trainer.fit()
    assert {size for _, what, size in calls if what != "save_checkpoint"} == {4}
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    # generated: 2 tokens of each of the 8 trajectories; trained on: 3 tokens of each of the 4 kept
    assert (logged["perf/generated_tokens"], logged["perf/update_tokens"]) == (16, 12)
    assert logged["perf/rollout_tokens_per_s"] == pytest.approx(16 / logged["timing_s/gen"])


def test_advantages_are_added_with_their_mask(tmp_path):
    trainer, _ = make_trainer(tmp_path, [1.0, 0.0], algorithm=AlgorithmConfig(adv_estimator="grpo"), critic=False)
    batch = trainer.agent.batch.union(DataProto(batch={"old_log_probs": torch.zeros(2, 3)}))
    batch, metrics = trainer.compute_advantage(batch)
    assert batch.batch["adv_mask"].tolist() == [[0, 1, 1]] * 2
    assert batch.batch["advantages"][:, 1].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)
    assert "critic/vf_explained_var" not in metrics  # no critic


@pytest.mark.parametrize("spans, adv_mask, loss_mask", [
    (list(REPLY_KINDS), [0, 1, 1], [0, 1, 1]),  # the default: every generated token
    (["answer"], [0, 1, 1], [0, 1, 0]),  # the turn's last token keeps its advantage (its reward sits there)
    (["format"], [0, 0, 1], [0, 0, 1]),
])
def test_tricos_masks_narrow_the_advantages_and_the_loss_to_kinds_of_text(tmp_path, spans, adv_mask, loss_mask):
    algorithm = AlgorithmConfig(adv_estimator="grpo", adv_spans=spans, loss_spans=spans)
    trainer, _ = make_trainer(tmp_path, [1.0, 0.0], algorithm=algorithm, critic=False)
    batch = trainer.agent.batch.union(DataProto(batch={"old_log_probs": torch.zeros(2, 3)}))
    batch, _ = trainer.compute_advantage(batch)
    assert batch.batch["adv_mask"].tolist() == [adv_mask] * 2
    assert batch.batch["loss_mask"].tolist() == [loss_mask] * 2  # what the actor trains on
    assert (batch.batch["advantages"][:, 0] == 0).all() and (batch.batch["advantages"][:, 1] != 0).tolist() == \
        [bool(adv_mask[1])] * 2


def test_kl_in_reward_penalises_every_generated_token(tmp_path):
    algorithm = AlgorithmConfig(adv_estimator="reinforce_plus_plus", use_kl_in_reward=True, kl_penalty="kl",
                                kl_ctrl=KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=1.0, horizon=10))
    trainer, _ = make_trainer(tmp_path, [1.0, 0.0], algorithm=algorithm, critic=False, use_reference=True)
    batch = trainer.agent.batch.union(DataProto(batch={"old_log_probs": torch.full((2, 3), -1.0),
                                                       "ref_log_probs": torch.full((2, 3), -1.5)}))
    _, metrics = trainer.compute_advantage(batch)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.5)  # log pi_old - log pi_ref on generated tokens
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    # adaptive: the error 0.5 / 1 - 1 = -0.5 is clipped to -0.2; 2 samples of a 10-sample horizon
    assert trainer.kl_ctrl.value == pytest.approx(0.1 * (1 - 0.2 * 2 / 10))


def test_two_ranks_get_shares_of_equal_tokens(tmp_path):
    trainer, _ = make_trainer(tmp_path, [1.0, 0.0, 1.0, 0.0])
    trainer.actor_rollout_wg.world_size = 2
    batch = rollout_batch([1.0, 0.0, 1.0, 0.0], group_size=2)
    batch.batch["attention_mask"] = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 0, 0]])  # 3, 1, 3, 1 tokens
    balanced = trainer.balance(batch)
    first, second = balanced.chunk(2)
    assert first.batch["attention_mask"].sum() == second.batch["attention_mask"].sum() == 4
    assert sorted(balanced.batch["trajectory_rewards"].tolist()) == [0.0, 0.0, 1.0, 1.0]  # a permutation


def test_records_get_each_turns_advantage(tmp_path):
    trainer, _ = make_trainer(tmp_path, [1.0, 0.0, 1.0, 1.0], algorithm=AlgorithmConfig(adv_estimator="grpo"),
                              critic=False, rollout=RolloutConfig(rollout_filter_value=0.5))
    trainer.config.rollout_data_dir = str(tmp_path / "rollouts")
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / "rollouts" / "train" / "step_1.jsonl").read_text().splitlines()]
    # group 0 (1, 0) is kept: +-0.707; group 1 (1, 1) has no spread and is filtered out
    assert [r["turns"][0]["advantage"] for r in records] == pytest.approx([0.7071, -0.7071, None, None], abs=1e-4)
    assert [r["trained_tokens"] for r in records] == [
        {"spans": [[1, 3]], "advantages": [0.707, 0.707], "updated": True},
        {"spans": [[1, 3]], "advantages": [-0.707, -0.707], "updated": True}, None, None]


def test_records_get_the_tokens_trained_on_with_their_advantages():
    """Per trajectory: the [start, end) runs of loss_mask (state tokens between replies, the prompt and the
    padding left out) and one rounded advantage per trained token; None for a trajectory the filter dropped."""
    loss_mask = torch.tensor([[0., 1, 1, 0, 0, 1, 0, 0],  # prompt, reply, state, reply, padding
                              [0., 0, 1, 1, 1, 1, 1, 1]])  # a reply that runs to the last position
    advantages = torch.tensor([[9., 0.12345, -2.5, 9, 9, 1e-5, 9, 9],
                               [9., 9, -0.5, -0.5, 0.25, 0.25, 0.25, 0.0004]])
    kept = DataProto(batch={"advantages": advantages * loss_mask, "loss_mask": loss_mask, "adv_mask": loss_mask,
                            "reply_kinds": loss_mask.long() * FORMAT,
                            "turn_ids": torch.tensor([[0, 0, 0, 1, 1, 1, -1, -1], [0, 0, 0, 0, 0, 0, 0, 0]])},
                     non_tensor_batch={"record_index": np.array([2, 0])})  # rows in another order than the records
    records = [{"turns": [{}]}, {"turns": [{}]}, {"turns": [{}, {}]}]
    records = with_advantages(records, kept)
    assert records[2]["trained_tokens"] == {"spans": [[1, 3], [5, 6]], "advantages": [0.123, -2.5, 0.0],
                                            "updated": True}
    assert records[0]["trained_tokens"] == {"spans": [[2, 8]], "advantages": [-0.5, -0.5, 0.25, 0.25, 0.25, 0.0],
                                            "updated": True}
    assert not with_advantages(records, kept, updated=False)[0]["trained_tokens"]["updated"]  # no actor step
    assert records[1]["trained_tokens"] is None  # dropped by the filter
    assert [t["advantage"] for t in records[2]["turns"]] == pytest.approx([(0.12345 - 2.5) / 2, 1e-5])
    assert all(r["trained_tokens"] is None for r in with_advantages(records, kept[np.zeros(2, bool)]))  # none kept


# ---- non-finite numbers and the metrics log --------------------------------------------------------------
NAN = float("nan")


def test_a_non_finite_reward_stops_the_run_naming_its_env_and_seed(tmp_path):
    trainer, calls = make_trainer(tmp_path, [1.0, NAN, 0.0, float("inf")])
    with pytest.raises(FloatingPointError, match=r"2 of 4 trajectories got a non-finite reward \(env tag 'Bandit', "
                                                 r"seed 1: reward nan; env tag 'Bandit', seed 3: reward inf\)"):
        trainer.fit()
    assert calls == []  # nothing scored, nothing trained


def test_non_finite_critic_values_stop_the_run_before_any_update(tmp_path):
    trainer, calls = make_trainer(tmp_path, [1.0, 0.0, 1.0, 1.0])
    trainer.critic_wg.compute_values = lambda data: DataProto(batch={"values": torch.full((len(data), 3), NAN)})
    with pytest.raises(FloatingPointError, match=r"8 of 8 values .* are non-finite: the critic diverged"):
        trainer.fit()
    assert [what for _, what, _ in calls if what.startswith("update")] == []


def test_a_non_finite_kl_penalty_stops_the_run_and_leaves_the_kl_coefficient_finite(tmp_path):
    algorithm = AlgorithmConfig(adv_estimator="reinforce_plus_plus", use_kl_in_reward=True,
                                kl_ctrl=KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=1.0, horizon=10))
    trainer, _ = make_trainer(tmp_path, [1.0, 0.0], algorithm=algorithm, critic=False, use_reference=True)
    batch = trainer.agent.batch.union(DataProto(batch={"old_log_probs": torch.full((2, 3), -1.0),
                                                       "ref_log_probs": torch.tensor([[0, NAN, -1.5]] * 2)}))
    with pytest.raises(FloatingPointError, match="token_rewards .* KL penalty"):
        trainer.compute_advantage(batch)
    assert trainer.kl_ctrl.value == 0.1


@pytest.mark.parametrize("skipped, limit, steps_run", [
    ([1, 1, 1, 1, 1], 3, 3),  # stops after the third step in a row
    ([1, 1, 0, 2, 1], 3, 5),  # a step that took all its optimizer steps starts the count again
    ([1, 1, 1, 1, 1], 0, 5),  # 0: never stops
])
def test_the_run_stops_after_consecutive_steps_that_skipped_an_optimizer_step(tmp_path, skipped, limit, steps_run):
    trainer, calls = make_trainer(tmp_path, [1.0, 0.0, 1.0, 1.0], steps=len(skipped))
    trainer.config.max_consecutive_nonfinite_steps, trainer.config.save_freq = limit, 1
    script = iter(skipped)
    trainer.actor_rollout_wg.update_actor = lambda data: {"actor/nonfinite_skipped_steps": float(next(script))}
    if steps_run < len(skipped):
        with pytest.raises(FloatingPointError, match="3 training steps in a row skipped an optimizer step"):
            trainer.fit()
        saves = calls.count(("actor", "save_checkpoint", None))
        assert saves == steps_run - 1, "the step that stopped the run must not be checkpointed"
    else:
        trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, steps_run + 1))  # the last step's metrics are logged
    assert [row["actor/nonfinite_skipped_steps"] for row in rows] == skipped[:steps_run]


# ---- steps whose filter kept nothing ----------------------------------------------------------------------
def empty_filter_trainer(tmp_path, steps: int, limit: int, spread_at: tuple[int, ...] = ()):
    """Every group's rewards are equal, so include_zero=false keeps nothing, except at the steps `spread_at`."""
    rollout = RolloutConfig(rollout_filter_strategy="top_p", rollout_filter_value=0.9,
                            rollout_filter_include_zero=False, rollout_filter_empty_stop_steps=limit)
    trainer, calls = make_trainer(tmp_path, [1.0, 1.0, 0.0, 0.0], steps=steps, rollout=rollout,
                                  algorithm=AlgorithmConfig(adv_estimator="grpo"), critic=False)
    trainer.config.save_freq, trainer.config.rollout_data_dir = 1, str(tmp_path / "rollouts")
    equal, spread = trainer.agent.batch, rollout_batch([1.0, 0.0, 0.0, 0.0], group_size=2)
    trainer.agent.rollout = lambda step: ScriptedAgent(spread if step in spread_at else equal).rollout(step)
    return trainer, calls


def logged(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_empty_filtered_steps_train_on_nothing_and_stop_the_run_after_the_limit_in_a_row(tmp_path, capsys):
    trainer, calls = empty_filter_trainer(tmp_path, steps=6, limit=3)
    with pytest.raises(WatchdogStop, match=r"stopped the run at step 3 \(rollout_filter_empty_stop_steps\)"):
        trainer.fit()
    rows = logged(tmp_path)
    assert [row["step"] for row in rows] == [1, 2, 3]  # each skipped step still counts
    assert [row["rollout/empty_after_filter"] for row in rows] == [1, 1, 1]
    assert [row["rollout/empty_after_filter_steps"] for row in rows] == [1, 2, 3]
    assert [what for _, what, _ in calls] == ["save_checkpoint"] * 2  # no update; steps 1, 2 saved, 3 stopped
    assert (tmp_path / "rollouts" / "train" / "step_3.jsonl").is_file()  # records as usual
    line = next(line for line in capsys.readouterr().out.splitlines() if "rollout_filter_empty_stop_steps" in line)
    assert line.startswith("[watchdog] step 3: rollout_filter_empty_stop_steps: the rollout filter kept no group "
                           "for 3 steps in a row, so nothing was trained on (strategy top_p 0.9 on reward_variance, "
                           "include_zero False): loosen actor_rollout_ref.rollout.rollout_filter_*, or raise "
                           "actor_rollout_ref.rollout.rollout_filter_empty_stop_steps=3 (0: never stop) -> stop")
    assert "kept nothing for 3 steps in a row" in (tmp_path / "watchdog_report.md").read_text()


def test_a_step_that_keeps_groups_starts_the_count_again_and_zero_never_stops(tmp_path):
    trainer, calls = empty_filter_trainer(tmp_path / "a", steps=5, limit=3, spread_at=(3,))
    trainer.fit()  # empty, empty, kept, empty, empty: never 3 in a row
    assert [row["rollout/empty_after_filter"] for row in logged(tmp_path / "a")] == [1, 1, 0, 1, 1]
    assert [row["rollout/empty_after_filter_steps"] for row in logged(tmp_path / "a")] == [1, 2, 2, 3, 4]
    assert [what for _, what, _ in calls].count("update_actor") == 1
    trainer, _ = empty_filter_trainer(tmp_path / "b", steps=4, limit=0)
    trainer.fit()
    assert [row["step"] for row in logged(tmp_path / "b")] == [1, 2, 3, 4]


def test_the_empty_step_streak_survives_a_resume(tmp_path):
    first, _ = empty_filter_trainer(tmp_path, steps=2, limit=3)
    first.fit()  # two empty steps in a row, checkpointed
    resumed, _ = empty_filter_trainer(tmp_path, steps=6, limit=3)
    with pytest.raises(WatchdogStop, match="at step 3"):  # the third in a row, not the third since the resume
        resumed.fit()
    assert [row["rollout/empty_after_filter_steps"] for row in logged(tmp_path)] == [1, 2, 3]


def test_a_fresh_run_in_a_used_folder_logs_only_its_own_steps(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "old": 1}\n{"step": 2, "old": 2}\n{"step": 3, "o',
                                            encoding="utf-8")  # an earlier run, killed in step 3, no checkpoint
    trainer, _ = make_trainer(tmp_path, [1.0, 0.0, 1.0, 1.0], steps=2)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2] and not any("old" in row for row in rows)


def test_the_time_left_counts_each_checkpoint_once_and_not_in_the_steps_pace():
    from verl.trainer.ppo_trainer import time_left
    from verl.utils.tracking import duration

    assert time_left(30.0, 10) == (f"[ragen] the first step took {duration(30)}: the 10 steps left take about "
                                   f"{duration(300)} at that pace (estimate)")
    assert f"the 10 steps left and 2 checkpoint(s) of {duration(5)} take about {duration(310)}" \
        in time_left(30.0, 10, save_s=5.0, saves_left=2)
