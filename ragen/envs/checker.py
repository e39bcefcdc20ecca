"""`check_env`: does a text environment keep the contract the rest of RAGEN relies on?

Gymnasium's own checker covers spaces, seeding and the 5-tuple; this one adds what a text agent needs: string
observations equal to the "ansi" render (pictures aside: an `<image>` line stands for each of
`info["images"]`, (H, W, 3) uint8 arrays), the three `info` keys, invalid text that changes nothing (not the
state, not the random stream, not the step count), episodes that end, and a format example that is an action
without the reply tags (it need not be valid: the bandit's names no arm). Run it on every new environment
(README: "Add your own environment").
"""

import dataclasses
import re
import warnings

import gymnasium
import numpy as np
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from ragen.envs.utils import IMAGE_PLACEHOLDER, step_info

INFO_KEYS = tuple(step_info(valid=False, effective=False, success=False))  # the keys every step's info carries
INVALID_ACTIONS = (
    "",
    "   ",
    "definitely not an action",
    "<answer></answer>",
    "</answer>",
    "\x00\x01",
    "↑ ⟶ ✓",
    "a" * 10_000,
)


class EnvContractError(Exception):
    """The environment breaks the RAGEN environment contract (DESIGN.md, "Environments")."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise EnvContractError(message)


def check_env(env: gymnasium.Env, seed: int = 0, max_episode_steps: int = 1000) -> None:
    """Raise EnvContractError naming the first broken rule; return None when `env` keeps the contract.

    The env is reset and stepped many times; its state afterwards is arbitrary. `max_episode_steps` bounds
    how many valid actions an episode may take before it must terminate or truncate.
    """
    env = env.unwrapped
    _require(isinstance(getattr(env, "instructions", None), str) and env.instructions.strip() != "",
             f"{type(env).__name__} needs a non-empty str attribute `instructions` (used in the prompt)")
    examples = getattr(env, "example_actions", None)
    _require(isinstance(examples, tuple) and len(examples) > 0
             and all(isinstance(a, str) and a.strip() != "" for a in examples),
             f"{type(env).__name__} needs `example_actions`, a non-empty tuple of non-empty str (the prompt's "
             "format example)")
    _require(isinstance(getattr(env, "action_choices", ""), str),
             f"{type(env).__name__}.action_choices, if set, is a str: the moves listed in every state message")
    _require(callable(getattr(env, "sample_action", None)),
             f"{type(env).__name__} needs `sample_action(rng) -> str` (a random well-formed action)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its advice on Box bounds and render fps is not meant for text envs
        try:
            gymnasium_check_env(env, skip_render_check=True)
        except (AssertionError, AttributeError) as e:  # AttributeError: no observation_space / action_space
            raise EnvContractError(f"gymnasium's env checker: {e}") from e

    _check_reset(env, seed)
    reference = _play(env, seed, max_episode_steps)
    _require(reference == _play(env, seed, max_episode_steps),
             "the same seed and the same actions gave a different episode: draw randomness only from "
             "self.np_random and reseed it in reset(seed=...) via super().reset(seed=seed)")
    _require(reference == _play(env, seed, max_episode_steps, interleave_invalid=True),
             "interleaving invalid actions changed the episode: an invalid action must leave the state, the "
             "random stream and the step count untouched")
    _check_example_actions(env, seed)
    _check_rgb_array(env, seed)
    _check_truncation(env, seed)


def _check_reset(env: gymnasium.Env, seed: int) -> None:
    result = env.reset(seed=seed)
    _require(isinstance(result, tuple) and len(result) == 2, "reset() must return (obs, info)")
    obs, info = result
    _require(isinstance(obs, str), f"reset() must return a str observation, got {type(obs).__name__}")
    _require(isinstance(info, dict), f"reset() must return an info dict, got {type(info).__name__}")
    _check_observation(env, obs, info)
    _require(env.reset(seed=seed)[0] == obs, "reset(seed=s) twice must give the same first observation")


def _check_observation(env: gymnasium.Env, obs: str, info: dict) -> None:
    """The text equals the "ansi" render, or is pictures only; one picture in `info["images"]` per placeholder."""
    images = info.get("images", [])
    _require(obs.count(IMAGE_PLACEHOLDER) == len(images),
             f"the observation holds {obs.count(IMAGE_PLACEHOLDER)} {IMAGE_PLACEHOLDER} placeholder(s) and "
             f"info['images'] {len(images)} picture(s): one picture per placeholder, in order")
    _require(all(isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim == 3 and x.shape[2] == 3
                 for x in images), "each of info['images'] must be an (H, W, 3) uint8 numpy array")
    if env.render_mode == "ansi":
        text = "\n".join(line for line in obs.split("\n") if line != IMAGE_PLACEHOLDER)
        _require(text == env.render() or (images and text == ""),
                 "the observation must equal render() in 'ansi' mode (besides its picture placeholders' lines)")


def _check_step(env: gymnasium.Env, action: str) -> tuple:
    result = env.step(action)
    _require(isinstance(result, tuple) and len(result) == 5,
             "step() must return (obs, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = result
    _require(isinstance(obs, str), f"step() must return a str observation, got {type(obs).__name__}")
    _require(isinstance(reward, float), f"reward must be a Python float, got {type(reward).__name__}")
    _require(isinstance(terminated, bool) and isinstance(truncated, bool),
             "terminated and truncated must be Python bools")
    _require(isinstance(info, dict) and all(isinstance(info.get(k), bool) for k in INFO_KEYS),
             f"info must carry the bools {INFO_KEYS}, got {info!r}")
    _require(not (terminated and truncated), "an episode that terminated must not also report truncated")
    _check_observation(env, obs, info)
    return result


def _check_invalid(env: gymnasium.Env, action: str, obs: str) -> None:
    next_obs, reward, terminated, truncated, info = _check_step(env, action)
    _require(not info["action_is_valid"], f"invalid action {action[:40]!r} was reported valid")
    _require(next_obs == obs and reward == 0.0 and not terminated and not truncated,
             f"invalid action {action[:40]!r} must leave the state unchanged with reward 0.0 and not end the "
             "episode")


def _play(env: gymnasium.Env, seed: int, max_steps: int, interleave_invalid: bool = False) -> list:
    """One episode of random valid actions from a fixed rng; the transcript of what happened."""
    rng = np.random.default_rng([seed, 1])  # not default_rng(seed): that is the env's own stream for this seed
    obs, _ = env.reset(seed=seed)
    transcript = [obs]
    for step in range(max_steps):
        if interleave_invalid:
            _check_invalid(env, INVALID_ACTIONS[step % len(INVALID_ACTIONS)], obs)
        action = env.sample_action(rng)
        _require(isinstance(action, str), f"sample_action must return a str, got {type(action).__name__}")
        obs, reward, terminated, truncated, info = _check_step(env, action)
        _require(info["action_is_valid"], f"sample_action gave {action!r}, which the env reports invalid")
        transcript.append((action, obs, reward, terminated, truncated, info["success"]))
        if terminated or truncated:
            return transcript
    raise EnvContractError(
        f"an episode of random valid actions did not end within {max_steps} steps: give the env a step limit "
        "(`max_steps`) that sets truncated=True"
    )


def _check_example_actions(env: gymnasium.Env, seed: int) -> None:
    """The prompt joins example_actions in <answer></answer> to show the format. They need not be valid actions
    (the bandit's names no arm, so as not to favour one), but each is an action, not a reply."""
    for action in env.example_actions:
        _require(not re.search(r"</?(think|answer)>", action),
                 f"example action {action!r} must be the action alone: the prompt adds the tags")
        env.reset(seed=seed)
        _check_step(env, action)


def _check_rgb_array(env: gymnasium.Env, seed: int) -> None:
    if "rgb_array" not in env.metadata.get("render_modes", []):
        return
    mode = env.render_mode
    env.reset(seed=seed)
    env.render_mode = "rgb_array"
    try:
        picture = env.render()
    finally:
        env.render_mode = mode
    _require(isinstance(picture, np.ndarray) and picture.dtype == np.uint8 and picture.ndim == 3
             and picture.shape[2] == 3, "render() in 'rgb_array' mode must return an (H, W, 3) uint8 array")


def _check_truncation(env: gymnasium.Env, seed: int, limit: int = 3, tries: int = 20) -> None:
    """For envs with a `config.max_steps`: an episode cut by the limit reports truncated, not terminated.

    Plays the same seeds and actions in a copy limited to `limit` steps and in one with a far higher limit;
    where only the limited copy ends after `limit` steps, that end is the limit's.
    """
    config = getattr(env, "config", None)
    if not (dataclasses.is_dataclass(config) and "max_steps" in {f.name for f in dataclasses.fields(config)}):
        return
    short = type(env)(dataclasses.replace(config, max_steps=limit))
    long = type(env)(dataclasses.replace(config, max_steps=limit + max(config.max_steps, 1000)))
    for episode_seed in range(seed, seed + tries):
        short_end = _play(short, episode_seed, limit)[-1]
        long_play = _play(long, episode_seed, limit + max(config.max_steps, 1000))
        if len(long_play) - 1 <= limit:
            continue  # the episode ended by itself within the limit: no truncation to see
        _, _, _, terminated, truncated, _ = short_end
        _require(truncated and not terminated,
                 f"after max_steps={limit} valid actions the episode must end with truncated=True and "
                 f"terminated=False (got terminated={terminated}, truncated={truncated})")
        return
    raise EnvContractError(f"could not see a truncation in {tries} episodes: every random episode ended within "
                           f"{limit} actions")
