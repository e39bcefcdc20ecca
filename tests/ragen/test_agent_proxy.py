"""The multi-turn loop with a scripted policy in place of the rollout workers."""

import torch

from ragen.agent_proxy import AgentProxy
from ragen.config import AgentProxyConfig, CustomEnvConfig, EnvGroupsConfig, EnvMixConfig
from ragen.context_manager import ContextManager
from ragen.env_state_manager import EnvStateManager
from verl.protocol import DataProto
from verl.trainer.config import RolloutConfig


class ScriptedPolicy:
    """Answers every prompt with the same reply; counts the generate calls."""

    def __init__(self, tokenizer, reply: str):
        self.ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.calls = []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls.append(len(prompts))
        return DataProto(non_tensor_batch={"response_ids": [list(self.ids) for _ in range(len(prompts))]})


def make_proxy(tokenizer, tag, env, reply, max_turn):
    config = AgentProxyConfig(max_turn=max_turn, max_actions_per_turn=1)
    env_manager = EnvStateManager(EnvGroupsConfig(env_groups=2, group_size=2, env_configs=EnvMixConfig([tag], [2])),
                                  {tag: env}, seed=0)
    envs = env_manager.env_per_tag()
    context = ContextManager(tokenizer, config, {tag: envs[tag].instructions}, {tag: envs[tag].example_action},
                             [tokenizer.eos_token_id])
    policy = ScriptedPolicy(tokenizer, reply)
    return AgentProxy(config, RolloutConfig(), -0.1, 0, policy, env_manager, context), policy


def test_loop_stops_as_soon_as_every_env_is_done(tokenizer):
    proxy, policy = make_proxy(tokenizer, "Bandit", CustomEnvConfig(env_type="bandit", max_actions_per_traj=1),
                               "ok</think><answer>dragon</answer>", max_turn=3)
    batch, metrics = proxy.rollout(step=1)
    assert policy.calls == [4]  # one turn: every bandit is done after its pull
    assert metrics["train/Bandit/success"] == 1.0 and metrics["rollout/format_ok_rate"] == 1.0
    rewards = batch.batch["token_rewards"].sum(-1)
    assert set(rewards.tolist()) <= {0.0, 1.0}  # the risky arm pays 1 or 0, no format penalty


def test_malformed_replies_get_the_format_penalty_every_turn(tokenizer):
    proxy, policy = make_proxy(tokenizer, "Sokoban", CustomEnvConfig(env_type="sokoban", max_actions_per_traj=10),
                               "I refuse to use the format", max_turn=3)
    batch, metrics = proxy.rollout(step=1)
    assert policy.calls == [4, 4, 4]
    assert torch.allclose(batch.batch["token_rewards"].sum(-1), torch.full((4,), -0.3))
    assert metrics["rollout/num_turns"] == 3 and metrics["train/Sokoban/num_actions"] == 0
    # three generated replies per trajectory, each masked in, nothing else
    assert (batch.batch["loss_mask"].sum(-1) == 3 * len(policy.ids)).all()
