import random
import string
from dataclasses import dataclass

import gymnasium
import pytest
from gymnasium import spaces

from ragen.overrides import load_config
from ragen.envs import ENV_REGISTRY, EnvContractError, check_env, make_env
from ragen.envs.utils import step_info


@pytest.mark.parametrize("env_type", sorted(ENV_REGISTRY))
def test_every_registered_env_passes(env_type):
    check_env(make_env(env_type))


@pytest.mark.parametrize("tag", sorted(load_config().custom_envs))
def test_every_configured_env_passes(tag):
    spec = load_config().custom_envs[tag]
    check_env(make_env(spec.env_type, dict(spec.env_config)), seed=3)


@dataclass
class WalkConfig:
    max_steps: int = 5


class Walk(gymnasium.Env):
    """A correct toy env: "right" moves right with probability 1/2 (cell 3 wins), "stay" does nothing."""

    metadata = {"render_modes": ["ansi"]}
    instructions = "Walk right to cell 3. Actions: right, stay."
    example_actions = ("right",)

    def __init__(self, config: WalkConfig = WalkConfig(), render_mode: str = "ansi"):
        self.config = config
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=16, charset=string.digits + "cel ")
        self.action_space = spaces.Text(max_length=16)
        self.position, self.steps = 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.steps = int(self.np_random.integers(2)), 0
        return self.render(), {}

    def step(self, action):
        if action.strip().lower() not in ("right", "stay"):
            return self.render(), 0.0, False, False, step_info(False, False, False)
        self.steps += 1
        moved = action.strip().lower() == "right" and self.np_random.random() < 0.5
        self.position += int(moved)
        done = self.position >= 3
        truncated = not done and self.steps >= self.config.max_steps
        return self.render(), float(done), done, truncated, step_info(True, moved, done)

    def render(self):
        return f"cell {self.position}"

    def sample_action(self, rng):
        return ["right", "stay"][rng.integers(2)]


def test_correct_toy_env_passes():
    check_env(Walk())


class InvalidCountsAsStep(Walk):
    def step(self, action):
        if action.strip().lower() not in ("right", "stay"):
            self.steps += 1
        return super().step(action)


class GlobalRandom(Walk):
    noise = 0

    def reset(self, *, seed=None, options=None):
        self.noise = random.randint(0, 10**6)  # not from self.np_random: the same seed gives another start
        return super().reset(seed=seed)

    def render(self):
        return f"cell {self.position} {self.noise}"


class MissingInfoKey(Walk):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        del info["action_is_effective"]
        return obs, reward, terminated, truncated, info


class NeverEnds(Walk):
    def step(self, action):
        obs, reward, _, _, info = super().step(action)
        self.position = min(self.position, 2)
        return self.render(), reward, False, False, info


class BadExample(Walk):
    example_actions = ("right", "<answer>right</answer>")


class ExampleNotATuple(Walk):
    example_actions = "right"


class IntReward(Walk):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, int(reward), terminated, truncated, info


class InvalidReportedValid(Walk):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "action_is_valid": True}


class NoSampleAction(Walk):
    sample_action = None


class LimitReportedAsTerminated(Walk):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, False, info


class NoActionSpace(Walk):
    def __init__(self):
        super().__init__()
        del self.action_space


@pytest.mark.parametrize(
    "env_cls, message",
    [
        (InvalidCountsAsStep, "interleaving invalid actions"),
        (GlobalRandom, "deterministic|same seed"),
        (MissingInfoKey, "info must carry"),
        (NeverEnds, "did not end"),
        (BadExample, "must be the action alone"),
        (ExampleNotATuple, "example_actions"),
        (IntReward, "Python float"),
        (InvalidReportedValid, "reported valid"),
        (NoSampleAction, "sample_action"),
        (LimitReportedAsTerminated, "truncated=True"),
        (NoActionSpace, "action space"),
    ],
)
def test_broken_env_is_caught_with_a_message(env_cls, message):
    with pytest.raises(EnvContractError, match=message):
        check_env(env_cls(), max_episode_steps=50)
