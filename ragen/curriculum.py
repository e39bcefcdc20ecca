"""Curricula: the level (a value of one int field of the env config, e.g. Sokoban's `search_depth`) that each
training group's start state is generated at, changing during training (`es_manager.train.curriculum`).

A small policy learns only from groups where some trajectories succeed and some fail (a group's signal is
strongest near 50 % success), so it starts on easy levels and moves to hard ones; the easy ones must then fade
out, or it overfits them (E2H Reasoner, arXiv 2506.06632). Two rules:

- `schedule` (E2H's Gaussian): at step t of T, mu = (t/T)^mu_exp * (K-1) and level i of K has probability
  p_i ∝ exp(-(i - mu)^2 / (2 sigma^2)). Each group's level is drawn from p with a generator seeded by the
  group's seed, so the levels of a step are a function of the run's seed and the step: a resume replays them.
- `adaptive`: every group plays the current level; after each rollout the step's success rate joins a window of
  the last `window` steps at that level, and a full window whose mean is above `target_success_high` moves one
  level harder, below `target_success_low` one level easier (the window then starts over). Its state (level,
  window) goes into checkpoints (`state_dict`), so a resume or a watchdog rollback continues from it.

Validation never has a curriculum: its start states stay fixed so that curves compare across steps.
"""

from typing import Protocol

import numpy as np

from ragen.config import CurriculumConfig

# Entropy word that keeps the level draw independent of the env's own streams, seeded by the group's seed
# alone (its reset) and by [seed, EPISODE_STREAM, place in group] (ragen.env_state_manager)
LEVEL_STREAM = 0x6C6576656C  # "level"


class Curriculum(Protocol):
    def levels(self, step: int, group_seeds: list[int]) -> list[int]:
        """The value of the curriculum's key for each group of training step `step`."""

    def observe(self, levels: list[int], successes: list[bool]) -> None:
        """The outcome of a training rollout: each trajectory's level and whether it succeeded."""

    def state_dict(self) -> dict:
        """What a resume needs to continue (JSON-able)."""

    def load_state_dict(self, state: dict) -> None:
        ...


def gaussian_level_probs(step: int, total_steps: int, num_levels: int, mu_exp: float, sigma: float) -> np.ndarray:
    """E2H's schedule: p_i ∝ exp(-(i - mu)^2 / (2 sigma^2)), mu = (t/T)^mu_exp * (K-1), t/T capped at 1. (K,)"""
    mu = min(step / total_steps, 1.0) ** mu_exp * (num_levels - 1)
    weights = np.exp(-(np.arange(num_levels) - mu) ** 2 / (2 * sigma ** 2))
    return weights / weights.sum()


class ScheduleCurriculum:
    """Levels drawn from E2H's Gaussian schedule, one per group, reproducibly from the group's seed."""

    def __init__(self, config: CurriculumConfig):
        self.config = config

    def levels(self, step: int, group_seeds: list[int]) -> list[int]:
        cfg = self.config
        probs = gaussian_level_probs(step, cfg.steps, len(cfg.levels), cfg.mu_exp, cfg.sigma)
        return [cfg.levels[np.random.default_rng([seed, LEVEL_STREAM]).choice(len(probs), p=probs)]
                for seed in group_seeds]

    def observe(self, levels: list[int], successes: list[bool]) -> None:
        pass  # the schedule follows the step only

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class AdaptiveCurriculum:
    """One level for the whole batch, one step harder or easier when the recent success leaves the target band."""

    def __init__(self, config: CurriculumConfig):
        self.config = config
        self.level = 0  # index into config.levels; the easiest first
        self.window: list[float] = []  # success rates of the last steps played at this level, oldest first

    def levels(self, step: int, group_seeds: list[int]) -> list[int]:
        return [self.config.levels[self.level]] * len(group_seeds)

    def observe(self, levels: list[int], successes: list[bool]) -> None:
        cfg = self.config
        at_level = [ok for level, ok in zip(levels, successes) if level == cfg.levels[self.level]]
        if not at_level:
            return
        self.window = (self.window + [float(np.mean(at_level))])[-cfg.window:]
        if len(self.window) < cfg.window:
            return
        rate = float(np.mean(self.window))
        if rate > cfg.target_success_high and self.level < len(cfg.levels) - 1:
            self.level, self.window = self.level + 1, []
        elif rate < cfg.target_success_low and self.level > 0:
            self.level, self.window = self.level - 1, []

    def state_dict(self) -> dict:
        return {"level": self.level, "window": list(self.window)}

    def load_state_dict(self, state: dict) -> None:
        if "level" not in state:  # only a forced resume can change the curriculum's type
            raise ValueError("the checkpoint was saved without an adaptive curriculum: resume with the "
                             "es_manager.train.curriculum.type it was saved with")
        if not 0 <= state["level"] < len(self.config.levels):  # only a forced resume can change the levels
            raise ValueError(f"the checkpoint's curriculum is at level {state['level'] + 1} of a list that now has "
                             f"{len(self.config.levels)}: resume with the es_manager.train.curriculum.levels it was "
                             "saved with")
        self.level, self.window = state["level"], list(state["window"])


CURRICULA: dict[str, type] = {"schedule": ScheduleCurriculum, "adaptive": AdaptiveCurriculum}  # and "none"


def make_curriculum(config: CurriculumConfig) -> Curriculum | None:
    """The curriculum `config.type` names; None for `none`."""
    return None if config.type == "none" else CURRICULA[config.type](config)


def curriculum_metrics(levels: list[int], successes: list[bool]) -> dict[str, float]:
    """`curriculum/level_mean` over the batch and `curriculum/success@<value>` per level played."""
    metrics = {"curriculum/level_mean": float(np.mean(levels))}
    for value in sorted(set(levels)):
        metrics[f"curriculum/success@{value}"] = float(np.mean([ok for v, ok in zip(levels, successes) if v == value]))
    return metrics
