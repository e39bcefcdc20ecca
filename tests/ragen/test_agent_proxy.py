"""The multi-turn loop with a scripted policy in place of the rollout workers."""

import threading

import pytest
import torch

from ragen.agent_proxy import AgentProxy, pass_at_k, repetition_rate, replies
from ragen.config import AgentProxyConfig, CustomEnvConfig, EnvGroupsConfig, EnvMixConfig
from ragen.context_manager import ContextManager, Trajectory
from ragen.env_state_manager import EnvFailureError, EnvStateManager
from verl.protocol import DataProto
from verl.workers.rollout import SamplingParams


class ScriptedPolicy:
    """Answers every prompt with the same reply; counts the generate calls."""

    def __init__(self, tokenizer, reply: str):
        self.ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.calls, self.prompts = [], []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls.append(len(prompts))
        self.prompts.append([list(p) for p in prompts.non_tensor_batch["prompt_ids"]])
        return DataProto(non_tensor_batch={"response_ids": [list(self.ids) for _ in range(len(prompts))],
                                           "response_log_probs": [[-1.0] * len(self.ids) for _ in range(len(prompts))]})


def make_proxy(tokenizer, tag, env, reply, max_turn, max_model_len=1 << 30, split="train", response_length=400,
               **config):
    config = AgentProxyConfig(max_turn=max_turn, max_actions_per_turn=1, **config)
    env_manager = EnvStateManager(EnvGroupsConfig(env_groups=2, group_size=2, env_configs=EnvMixConfig([tag], [2])),
                                  {tag: env}, seed=0)
    context = ContextManager.for_envs(tokenizer, config, env_manager.env_per_tag(), [tokenizer.eos_token_id],
                                      max_model_len=max_model_len)
    policy = ScriptedPolicy(tokenizer, reply)
    sampling = SamplingParams(max_new_tokens=response_length)
    return AgentProxy(config, sampling, -0.1, 0, policy, env_manager, context, split), policy


def test_loop_stops_as_soon_as_every_env_is_done(tokenizer):
    proxy, policy = make_proxy(tokenizer, "Bandit", CustomEnvConfig(env_type="bandit", max_actions_per_traj=1),
                               "ok</think><answer>dragon</answer>", max_turn=3)
    rollout = proxy.rollout(step=1)
    batch, metrics = rollout.batch, rollout.metrics
    assert policy.calls == [4]  # one turn: every bandit is done after its pull
    assert metrics["train/Bandit/success"] == 1.0 and metrics["rollout/format_ok_rate"] == 1.0
    rewards = batch.batch["token_rewards"].sum(-1)
    assert set(rewards.tolist()) <= {0.0, 1.0}  # the risky arm pays 1 or 0, no format penalty


def test_malformed_replies_get_the_format_penalty_every_turn(tokenizer):
    proxy, policy = make_proxy(tokenizer, "Sokoban", CustomEnvConfig(env_type="sokoban", max_actions_per_traj=10),
                               "I refuse to use the format", max_turn=3)
    rollout = proxy.rollout(step=1)
    batch, metrics = rollout.batch, rollout.metrics
    assert policy.calls == [4, 4, 4]
    assert torch.allclose(batch.batch["token_rewards"].sum(-1), torch.full((4,), -0.3))
    assert metrics["rollout/num_turns"] == 3 and metrics["train/Sokoban/num_actions"] == 0
    # three generated replies per trajectory, each masked in, nothing else
    assert (batch.batch["loss_mask"].sum(-1) == 3 * len(policy.ids)).all()


SOKOBAN = CustomEnvConfig(env_type="sokoban", max_actions_per_traj=10)


@pytest.mark.parametrize("feedback", [True, False])
def test_no_effect_feedback_names_the_move_that_changed_nothing(tokenizer, feedback):
    """Pressing Up until the player stands under a wall: each turn after a move that changed nothing says so in
    its state message (`no_effect_feedback`), and no other turn does; without the option no turn does."""
    proxy, policy = make_proxy(tokenizer, "Sokoban", SOKOBAN, "hmm</think><answer>Up</answer>", max_turn=6,
                               no_effect_feedback=feedback)
    rollout = proxy.rollout(step=1)
    for env_id, record in enumerate(rollout.records):
        effective = [turn["action_effective"] for turn in record["turns"]]
        assert [False] in effective  # the player reached the top wall within 6 moves in every level
        for turn in range(1, len(effective)):
            message = tokenizer.decode(policy.prompts[turn][env_id]).split("<|im_start|>user")[-1]
            assert ("Up had no effect." in message) == (feedback and effective[turn - 1] == [False])
            assert "Turn" in message and "had no effect" not in message.split("Turn")[1]  # before the state


def test_an_invalid_action_takes_the_format_penalty_and_never_beats_a_valid_move(tokenizer):
    """A well-formed reply whose answer the env does not understand scores like a malformed one (RAGEN's
    rule): no better than a valid Sokoban move that does not solve the level (-0.1 step cost), which also
    brings the solution closer, and worse than either bandit arm."""
    invalid, _ = make_proxy(tokenizer, "Sokoban", SOKOBAN, "hmm</think><answer>The information is incomplete."
                            "</answer>", max_turn=2)
    valid, _ = make_proxy(tokenizer, "Sokoban", SOKOBAN, "hmm</think><answer>Up</answer>", max_turn=2)
    invalid_rollout, valid_rollout = invalid.rollout(step=1), valid.rollout(step=1)
    invalid_rewards = invalid_rollout.batch.batch["trajectory_rewards"]
    assert torch.allclose(invalid_rewards, torch.full((4,), -0.2))  # two turns, each penalised
    assert invalid_rollout.metrics["train/Sokoban/num_actions"] == 0  # nothing was charged to the budget
    assert all(turn["action_valid"] == [False] for record in invalid_rollout.records for turn in record["turns"])
    assert (valid_rollout.batch.batch["trajectory_rewards"] >= invalid_rewards).all()
    bandit = CustomEnvConfig(env_type="bandit", max_actions_per_traj=1)
    nonsense, _ = make_proxy(tokenizer, "Bandit", bandit, "hmm</think><answer>griffin</answer>", max_turn=1)
    arm, _ = make_proxy(tokenizer, "Bandit", bandit, "hmm</think><answer>phoenix</answer>", max_turn=1)
    nonsense_rewards = nonsense.rollout(step=1).batch.batch["trajectory_rewards"]
    assert torch.allclose(nonsense_rewards, torch.full((4,), -0.1))
    assert (arm.rollout(step=1).batch.batch["trajectory_rewards"] > nonsense_rewards).all()


def test_records_hold_every_turn_in_text(tokenizer):
    proxy, _ = make_proxy(tokenizer, "Sokoban", SOKOBAN, "hmm</think><answer>Up</answer>", max_turn=2)
    rollout = proxy.rollout(step=3)
    assert len(rollout.records) == 4
    record = rollout.records[0]
    assert {k: record[k] for k in ("step", "split", "env_id", "group_id", "tag")} == {
        "step": 3, "split": "train", "env_id": 0, "group_id": 0, "tag": "Sokoban"}
    first, second = record["turns"]
    assert first["state"].count("P") + first["state"].count("S") == 1  # the Sokoban grid the model saw
    assert first["response"] == "<think>hmm</think><answer>Up</answer>" and first["actions"] == ["Up"]
    assert first["format_ok"] and first["action_valid"] == [True] and len(first["action_effective"]) == 1
    assert first["reward"] == pytest.approx(-0.1) and not first["done"]
    assert second["state"] != first["state"] or not first["action_effective"][0]
    assert record["reward"] == pytest.approx(first["reward"] + second["reward"])
    assert record["success"] is False and record["context_truncated"] is False


def test_a_trajectory_that_would_outgrow_the_context_ends_without_error(tokenizer):
    probe, _ = make_proxy(tokenizer, "Sokoban", SOKOBAN, "x", max_turn=1)
    first_prompt = len(probe.context.start("Sokoban", probe.env_manager.reset(0)[0].obs, 10).input_ids)
    # room for the first prompt and one reply of 8 tokens, not for a second turn
    proxy, policy = make_proxy(tokenizer, "Sokoban", SOKOBAN, "hmm</think><answer>Up</answer>", max_turn=3,
                               max_model_len=first_prompt + 60, response_length=8)
    rollout = proxy.rollout(step=0)
    assert policy.calls == [4]
    assert rollout.metrics["rollout/context_truncated_rate"] == 1.0
    assert all(r["context_truncated"] and len(r["turns"]) == 1 for r in rollout.records)
    assert (rollout.batch.batch["attention_mask"].sum(-1) <= first_prompt + 60).all()


def test_a_first_prompt_too_long_for_the_model_is_a_clear_error(tokenizer):
    proxy, _ = make_proxy(tokenizer, "Sokoban", SOKOBAN, "x", max_turn=1, max_model_len=100, response_length=8)
    with pytest.raises(ValueError, match="response_length"):
        proxy.rollout(step=0)


def test_validation_split_uses_val_metric_names_and_pass_at_k(tokenizer):
    proxy, _ = make_proxy(tokenizer, "Bandit", CustomEnvConfig(env_type="bandit", max_actions_per_traj=1),
                          "ok</think><answer>dragon</answer>", max_turn=1, split="val")
    metrics = proxy.rollout(step=0).metrics
    assert metrics["val-env/Bandit/success"] == 1.0 and metrics["val-env/Bandit/pass@2"] == 1.0
    assert "val/success_rate" in metrics and not any(k.startswith(("train/", "rollout/")) for k in metrics)


def raise_on_step(action):
    raise ValueError("boom")


def test_an_env_that_raises_ends_only_its_trajectory_and_is_flagged(tokenizer):
    proxy, policy = make_proxy(tokenizer, "Sokoban", SOKOBAN, "hmm</think><answer>Up</answer>", max_turn=3)
    proxy.env_manager.states[1].env.step = raise_on_step
    rollout = proxy.rollout(step=1)
    assert policy.calls == [4, 3, 3]  # the others play on
    assert [r["env_error"] for r in rollout.records] == [None, "ValueError: boom", None, None]
    assert rollout.records[1]["success"] is False and len(rollout.records[1]["turns"]) == 1
    assert rollout.batch.non_tensor_batch["env_failed"].tolist() == [False, True, False, False]
    assert rollout.metrics["rollout/env_failures"] == 1 and rollout.metrics["rollout/env_failure_rate"] == 0.25


def test_a_hanging_env_in_validation_counts_as_unsuccessful(tokenizer):
    proxy, _ = make_proxy(tokenizer, "Bandit", CustomEnvConfig(env_type="bandit", max_actions_per_traj=1),
                          "ok</think><answer>dragon</answer>", max_turn=1, split="val")
    proxy.env_manager.env_step_timeout_s = 0.2
    release = threading.Event()
    proxy.env_manager.states[2].env.step = lambda action: release.wait()
    try:
        rollout = proxy.rollout(step=0)
    finally:
        release.set()
    assert rollout.records[2]["env_error"].startswith("TimeoutError") and rollout.records[2]["success"] is False
    assert rollout.metrics["val-env/Bandit/success"] == 0.75 and rollout.metrics["val/env_failures"] == 1


def test_too_many_failed_envs_stop_the_rollout_naming_one(tokenizer):
    proxy, _ = make_proxy(tokenizer, "Sokoban", SOKOBAN, "hmm</think><answer>Up</answer>", max_turn=2)
    for state in proxy.env_manager.states[:2]:  # 2 of 4 > the default share 0.25
        state.env.step = raise_on_step
    with pytest.raises(EnvFailureError, match=r"env tag 'Sokoban', seed 2: ValueError: boom"):
        proxy.rollout(step=1)


class Outcome:
    def __init__(self, group_id, success):
        self.group_id, self.success = group_id, success


def test_pass_at_k_is_the_unbiased_estimate():
    # group 0: 1 success of 4; group 1: 0 of 4; group 2: 4 of 4
    states = [Outcome(0, s) for s in (True, False, False, False)] + [Outcome(1, False)] * 4 + [Outcome(2, True)] * 4
    result = pass_at_k(states)
    assert result["pass@1"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert result["pass@4"] == pytest.approx((1 + 0 + 1) / 3)


def test_repetition_rate_counts_repeated_ngrams_within_and_across_replies():
    assert repetition_rate([[1, 2, 3, 4, 5]], n=4) == 0.0  # 2 distinct 4-grams of 2
    assert repetition_rate([[1, 2, 3, 4], [1, 2, 3, 4]], n=4) == 0.5  # the echo: the same reply twice
    assert repetition_rate([[7] * 10], n=4) == pytest.approx(1 - 1 / 7)  # one 4-gram, 7 times
    assert repetition_rate([[1, 2]], n=4) == 0.0  # too short to have any


def test_replies_are_the_generated_spans_of_each_turn():
    trajectory = Trajectory(input_ids=[1, 2, 3, 4, 5, 6, 7], loss_mask=[0, 1, 1, 0, 0, 1, 1])
    assert replies(trajectory) == [[2, 3], [6, 7]]


def test_rollout_reports_the_echo_trap_signal(tokenizer):
    proxy, _ = make_proxy(tokenizer, "Bandit", CustomEnvConfig(env_type="bandit", max_actions_per_traj=1),
                          "ok ok ok ok ok</think><answer>dragon</answer>", max_turn=1)
    repetition = proxy.rollout(step=1).metrics["rollout/response_repetition"]
    assert 0.75 <= repetition < 1  # four identical replies: at least 3 of every 4 n-grams are repeats


def test_reward_metrics_are_raw_rewards_even_when_normalised(tokenizer):
    proxy, _ = make_proxy(tokenizer, "Bandit", CustomEnvConfig(env_type="bandit", max_actions_per_traj=1),
                          "ok</think><answer>dragon</answer>", max_turn=1)
    step = next(step for step in range(1, 50) if proxy.rollout(step=step).metrics["rollout/reward_mean"] != 0)
    raw = proxy.rollout(step=step)  # a step where some risky pull paid
    proxy.context.config.reward_normalization.grouping = "batch"
    proxy.context.config.reward_normalization.method = "mean_std"
    normalised = proxy.rollout(step=step)
    assert normalised.metrics["rollout/reward_mean"] == raw.metrics["rollout/reward_mean"] != 0
    assert normalised.batch.batch["token_rewards"].sum().item() == pytest.approx(0, abs=1e-5)  # what is trained on
