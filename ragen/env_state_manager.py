"""EnvStateManager: the batch of environments of one rollout, their seeds, step budgets and records.

A batch is `env_groups` groups of `group_size` environments. All environments of a group are reset with
the same seed, so they start from the same state and their trajectories can be compared (GRPO). After the
reset each environment's random stream is re-seeded with its place in the group, so that what happens next
(a bandit's payout, a slip on the ice) is drawn independently per trajectory: with one shared draw the
whole group sees the same outcome, a group comparison then measures luck rather than the policy (a bandit
group whose risky pulls all pay 0 teaches "safe" to every risky pull at once), and a step's gradient points
the wrong way far more often. Each environment has a step budget (`max_actions_per_traj`) over all of its
turns.

An invalid action (an answer the environment does not understand: `info["action_is_valid"]` False) changes
nothing, by the environment contract, and is not charged to the budget; it is recorded, and the agent
proxy adds `es_manager.format_penalty` to the turn (RAGEN's rule), so that nonsense never beats play.
"""

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from ragen.config import CustomEnvConfig, EnvGroupsConfig
from ragen.envs import make_env


@dataclass
class TurnRecord:
    actions: list[str]  # actions given this turn (after the budget cut), invalid ones included
    reward: float  # environment reward of the turn (format penalty not included)
    valid: list[bool]  # per executed action: info["action_is_valid"]
    effective: list[bool]  # per executed action: info["action_is_effective"]


@dataclass
class EnvState:
    env_id: int
    group_id: int
    tag: str  # key of custom_envs
    seed: int
    env: gym.Env
    max_actions: int
    obs: str = ""
    actions_taken: int = 0
    done: bool = False
    success: bool = False
    context_truncated: bool = False  # ended because another turn would not fit the model's context
    turns: list[TurnRecord] = field(default_factory=list)

    @property
    def actions_left(self) -> int:
        """Valid actions the budget still allows."""
        return self.max_actions - self.actions_taken


class EnvStateManager:
    def __init__(self, config: EnvGroupsConfig, custom_envs: dict[str, CustomEnvConfig], seed: int):
        self.config, self.seed = config, seed
        self.states: list[EnvState] = []
        mix = config.env_configs
        tags = [tag for tag, n in zip(mix.tags, mix.groups_per_tag(config.env_groups)) for _ in range(n)]
        for group_id, tag in enumerate(tags):
            spec = custom_envs[tag]
            for _ in range(config.group_size):
                env = make_env(spec.env_type, dict(spec.env_config))
                self.states.append(EnvState(env_id=len(self.states), group_id=group_id, tag=tag, seed=-1,
                                            env=env, max_actions=spec.max_actions_per_traj))

    def env_per_tag(self) -> dict[str, gym.Env]:
        """One environment of each tag, for what all of a tag share: instructions, example action."""
        return {state.tag: state.env for state in reversed(self.states)}

    def reset(self, step: int) -> list[EnvState]:
        """Fresh start states for training step `step`; seeds never repeat across steps."""
        for state in self.states:
            state.seed = self.seed + step * self.config.env_groups + state.group_id
            state.obs, _ = state.env.reset(seed=state.seed)
            reseed(state.env, [state.seed, state.env_id % self.config.group_size])
            state.actions_taken, state.done, state.success, state.turns = 0, False, False, []
            state.context_truncated = False
        return self.states

    def step(self, env_id: int, actions: list[str]) -> TurnRecord:
        """Run one turn's actions in order until the episode ends or the step budget is spent."""
        state = self.states[env_id]
        assert not state.done, f"env {env_id} is already done"
        record = TurnRecord(actions=[], reward=0.0, valid=[], effective=[])
        for action in actions:
            if state.actions_left <= 0:
                break
            try:
                state.obs, reward, terminated, truncated, info = state.env.step(action)
            except Exception as e:
                raise RuntimeError(f"environment {state.tag} (env {env_id}, seed {state.seed}) raised on "
                                   f"action {action!r}: {e}") from e
            valid = bool(info["action_is_valid"])
            state.actions_taken += valid  # an invalid action changed nothing: it costs no budget
            record.actions.append(action)
            record.reward += float(reward)
            record.valid.append(valid)
            record.effective.append(bool(info["action_is_effective"]))
            state.success = state.success or bool(info["success"])
            if terminated or truncated:
                state.done = True
                break
        if state.actions_left <= 0:
            state.done = True
        state.turns.append(record)
        return record


def reseed(env: gym.Env, entropy: list[int]) -> None:
    """Set the env's random stream to a fresh one from `entropy`, in place: an env may hand its generator to
    an inner object (FrozenLake's gymnasium lake), which must see the change too."""
    generator = env.unwrapped.np_random
    generator.bit_generator.state = type(generator.bit_generator)(np.random.SeedSequence(entropy)).state
