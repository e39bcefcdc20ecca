"""AgentProxy: the multi-turn loop that plays a batch of environments with the policy.

Each turn: the context manager builds a prompt per unfinished environment, the rollout workers generate
replies, the replies are parsed into actions, and the environments step. The loop ends after
`agent_proxy.max_turn` turns or as soon as every environment is done.
"""

from dataclasses import replace

import numpy as np

from ragen.config import AgentProxyConfig
from ragen.context_manager import ANSWER_CLOSE, ContextManager, Trajectory
from ragen.env_state_manager import EnvState, EnvStateManager
from verl.protocol import DataProto
from verl.trainer.config import RolloutConfig
from verl.workers.rollout import SamplingParams


class AgentProxy:
    def __init__(self, config: AgentProxyConfig, rollout: RolloutConfig, format_penalty: float, seed: int,
                 actor_rollout_wg, env_manager: EnvStateManager, context: ContextManager):
        self.config, self.format_penalty, self.seed = config, format_penalty, seed
        self.sampling = SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                                       max_new_tokens=rollout.response_length, stop=[ANSWER_CLOSE])
        self.actor_rollout_wg, self.env_manager, self.context = actor_rollout_wg, env_manager, context

    def rollout(self, step: int) -> tuple[DataProto, dict[str, float]]:
        states = self.env_manager.reset(step)
        trajectories = [self.context.start(s.tag, s.obs, s.actions_left) for s in states]
        for turn in range(self.config.max_turn):
            active = [s for s in states if not s.done]
            if not active:
                break
            sampling = replace(self.sampling, seed=self.seed + 1000 * step + turn)
            prompts = DataProto(non_tensor_batch={"prompt_ids": [trajectories[s.env_id].input_ids for s in active]},
                                meta_info={"sampling": sampling})
            responses = self.actor_rollout_wg.generate_sequences(prompts).non_tensor_batch["response_ids"]
            for state, response_ids in zip(active, responses):
                trajectory = trajectories[state.env_id]
                parsed = self.context.parse(self.context.add_response(trajectory, list(response_ids)))
                record = self.env_manager.step(state.env_id, parsed.actions)
                reward = record.reward + (0.0 if parsed.format_ok else self.format_penalty)
                trajectory.turn_rewards.append(reward)
                trajectory.format_ok.append(parsed.format_ok)
                if not state.done and turn + 1 < self.config.max_turn:
                    self.context.add_observation(trajectory, state.obs, reward, state.actions_left)
        batch = self.context.to_batch(trajectories, [s.group_id for s in states], [s.tag for s in states])
        return batch, rollout_metrics(states, trajectories, batch)


def rollout_metrics(states: list[EnvState], trajectories: list[Trajectory], batch: DataProto) -> dict[str, float]:
    """Per-env-tag outcome metrics (`train/<tag>/...`) and batch-wide ones (`rollout/...`)."""
    loss_mask = batch.batch["loss_mask"]
    rewards = batch.batch["token_rewards"].sum(-1).numpy()
    metrics = {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()),
        "rollout/success_rate": float(np.mean([s.success for s in states])),
        "rollout/response_length": float(loss_mask.sum(-1).mean()),  # generated tokens per trajectory
        "rollout/sequence_length": float(batch.batch["attention_mask"].sum(-1).float().mean()),
        "rollout/num_turns": float(np.mean([len(s.turns) for s in states])),
        "rollout/format_ok_rate": float(np.mean([ok for t in trajectories for ok in t.format_ok])),
    }
    for tag in sorted({s.tag for s in states}):
        group = [(s, r) for s, r in zip(states, rewards) if s.tag == tag]
        actions = [ok for s, _ in group for turn in s.turns for ok in turn.valid]
        effective = [ok for s, _ in group for turn in s.turns for ok in turn.effective]
        metrics |= {
            f"train/{tag}/success": float(np.mean([s.success for s, _ in group])),
            f"train/{tag}/reward": float(np.mean([r for _, r in group])),
            f"train/{tag}/num_actions": float(np.mean([s.actions_taken for s, _ in group])),
            f"train/{tag}/valid_action_rate": float(np.mean(actions)) if actions else 0.0,
            f"train/{tag}/effective_action_rate": float(np.mean(effective)) if effective else 0.0,
        }
    return metrics
