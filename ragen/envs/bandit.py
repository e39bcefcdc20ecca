"""Two-armed bandit: one pull between a safe arm and a risky arm with the higher expected value.

The arms are known only by their names. Which name is listed first is drawn per seed, so a policy can
only learn the better arm by its name, not by its position in the prompt. The risky arm pays
`risky_reward` with probability `risky_prob` and nothing otherwise; its expected value is higher than the
safe arm's steady `safe_reward`, so choosing it is the success criterion.

An answer pulls the arm it names: "dragon", "I choose Dragon." (exactly one arm named as a word, ignoring
case). An answer that names neither arm or both is invalid and pulls nothing.

The format example must not name an arm: the 135M model copies it, so an example that named the safe arm
gave the safe arm p ~ 0.6 and the risky one p ~ 0.002 before training, and RL had nothing to reinforce.
"""

import re
import string
from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces

from ragen.envs.utils import step_info

INSTRUCTIONS_TEMPLATE = (
    "You face two slot-machine arms: {arms}. One pays a small reward every time; the other sometimes "
    "pays much more and otherwise nothing. You pull one arm once.\n"
    "Answer with the name of the arm to pull: {actions}."
)
EXAMPLE_WORDS = ("griffin", "unicorn", "kraken")  # the format example: a name that is no arm's
MAX_TEXT_LENGTH = 1024  # bound of the text spaces; they exist for gymnasium's checker, not for sampling


@dataclass
class BanditConfig:
    safe_arm_name: str = "phoenix"  # arm that always pays safe_reward
    risky_arm_name: str = "dragon"  # arm that pays risky_reward with probability risky_prob, else 0
    safe_reward: float = 0.1  # payout of the safe arm (RAGEN's lo_arm_score)
    risky_reward: float = 1.0  # payout of the risky arm when it pays
    risky_prob: float = 0.25  # probability that the risky arm pays

    def __post_init__(self) -> None:
        for name in ("safe_arm_name", "risky_arm_name"):
            value = getattr(self, name)
            if not value.strip() or value != value.strip():
                raise ValueError(f"{name}={value!r} must be a non-empty name without surrounding whitespace")
        if names(self.safe_arm_name, self.risky_arm_name) or names(self.risky_arm_name, self.safe_arm_name):
            raise ValueError(
                f"safe_arm_name {self.safe_arm_name!r} and risky_arm_name {self.risky_arm_name!r}: one names the "
                "other (ignoring case), so an answer could not name one alone; give the arms distinct names"
            )
        if not 0.0 <= self.risky_prob <= 1.0:
            raise ValueError(f"risky_prob={self.risky_prob} must be in [0, 1]")
        risky_value = self.risky_prob * self.risky_reward
        if risky_value <= self.safe_reward:
            raise ValueError(
                f"the risky arm's expected value risky_prob * risky_reward = {risky_value:g} must exceed "
                f"safe_reward = {self.safe_reward:g}: raise risky_prob or risky_reward, or lower safe_reward"
            )


def names(arm: str, text: str) -> bool:
    """Whether `text` names `arm` as a whole word (not inside another word), ignoring case."""
    return re.search(rf"(?<!\w){re.escape(arm.lower())}(?!\w)", text.lower()) is not None


def _instructions(config: BanditConfig) -> str:
    """Name the arms alphabetically, so the prompt does not reveal which one is safe."""
    arms = sorted([config.safe_arm_name, config.risky_arm_name])
    return INSTRUCTIONS_TEMPLATE.format(arms=" and ".join(arms), actions=", ".join(arms))


class BanditEnv(gymnasium.Env):
    """One pull of a two-armed bandit; the action is an answer that names exactly one arm, ignoring case."""

    metadata = {"render_modes": ["ansi"]}
    # The class attributes describe the default arms; an instance rewrites them for its configured names.
    instructions: str = _instructions(BanditConfig())
    # The format example names no arm (see the module docstring); an answer that copies it is invalid.
    example_actions: tuple[str, ...] = (EXAMPLE_WORDS[0],)

    def __init__(self, config: BanditConfig, render_mode: str = "ansi") -> None:
        self.config = config
        self.render_mode = render_mode
        self.instructions = _instructions(config)
        arms = {config.safe_arm_name.lower(), config.risky_arm_name.lower()}
        self.example_actions = (next(word for word in EXAMPLE_WORDS if word not in arms),)
        self.observation_space = spaces.Text(max_length=MAX_TEXT_LENGTH, charset=string.printable)
        self.action_space = spaces.Text(max_length=MAX_TEXT_LENGTH, charset=string.printable)
        self.arm_order: tuple[str, str] = (config.safe_arm_name, config.risky_arm_name)
        self.pulled: tuple[str, float] | None = None  # (arm, reward) once the arm has been pulled

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Draw the order in which the arms are listed; `options` are not used."""
        super().reset(seed=seed)
        safe, risky = self.config.safe_arm_name, self.config.risky_arm_name
        self.arm_order = (safe, risky) if self.np_random.random() < 0.5 else (risky, safe)
        self.pulled = None
        return self.render(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        named = [arm for arm in self.arm_order if names(arm, action)]
        if len(named) != 1:
            return self.render(), 0.0, False, False, step_info(valid=False, effective=False, success=False)
        arm = named[0]

        is_risky = arm == self.config.risky_arm_name
        if not is_risky:
            reward = self.config.safe_reward
        elif self.np_random.random() < self.config.risky_prob:
            reward = self.config.risky_reward
        else:
            reward = 0.0
        self.pulled = (arm, float(reward))
        return self.render(), float(reward), True, False, step_info(valid=True, effective=True, success=is_risky)

    def sample_action(self, rng: np.random.Generator) -> str:
        return self.arm_order[rng.integers(2)]

    def render(self) -> str:
        arms = f"Arms: {', '.join(self.arm_order)}."
        if self.pulled is None:
            return f"{arms} Choose one."
        arm, reward = self.pulled
        return f"{arms} You pulled {arm} and got {reward:g}."
