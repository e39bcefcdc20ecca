"""Text environments, registered by string id.

To add an environment, write a `gymnasium.Env` subclass with a config dataclass (see `bandit.py`) and add
one line to `ENV_REGISTRY`. `make_env` builds the config from a plain dict (a YAML `env_config`) and
rejects unknown keys and wrong types with a message that names them.
"""

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

import gymnasium

from ragen.envs.bandit import BanditConfig, BanditEnv
from ragen.envs.checker import EnvContractError, check_env
from ragen.envs.countdown import CountdownConfig, CountdownEnv
from ragen.envs.frozen_lake import FrozenLakeConfig, FrozenLakeEnv
from ragen.envs.gym_sokoban import GymSokobanConfig, GymSokobanEnv  # imports gym_sokoban only when built
from ragen.envs.sokoban import SokobanConfig, SokobanEnv

ENV_REGISTRY: dict[str, tuple[type[gymnasium.Env], type]] = {
    "bandit": (BanditEnv, BanditConfig),
    "countdown": (CountdownEnv, CountdownConfig),
    "frozen_lake": (FrozenLakeEnv, FrozenLakeConfig),
    "gym_sokoban": (GymSokobanEnv, GymSokobanConfig),
    "sokoban": (SokobanEnv, SokobanConfig),
}


def _lookup(env_type: str) -> tuple[type[gymnasium.Env], type]:
    if env_type not in ENV_REGISTRY:
        raise ValueError(f"unknown env_type {env_type!r}; registered types are {sorted(ENV_REGISTRY)}")
    return ENV_REGISTRY[env_type]


def build_env_config(env_type: str, env_config: Mapping[str, Any] | None = None) -> Any:
    """The env's config dataclass from a plain dict; its `__post_init__` then checks the values."""
    config_cls = _lookup(env_type)[1]
    field_types = typing.get_type_hints(config_cls)
    kwargs = {}
    for key, value in (env_config or {}).items():
        if key not in field_types:
            raise ValueError(f"unknown {env_type} config key {key!r}; valid keys are {sorted(field_types)}")
        expected = field_types[key]
        # YAML writes 1.0 as 1, so ints are fine for float fields; bool is an int subclass but never meant.
        accepted = (int, float) if expected is float else (expected,)
        if isinstance(value, bool) != (expected is bool) or not isinstance(value, accepted):
            raise ValueError(
                f"{env_type} config key {key!r} must be {expected.__name__}, got {type(value).__name__} {value!r}"
            )
        kwargs[key] = float(value) if expected is float else value
    return config_cls(**kwargs)


def check_env_config(env_type: str, env_config: Mapping[str, Any]) -> None:
    """Raise ValueError for an unknown env_type, key, type or value, without building the env."""
    build_env_config(env_type, env_config)


def make_env(env_type: str, env_config: Mapping[str, Any] | None = None) -> gymnasium.Env:
    env_cls = _lookup(env_type)[0]
    return env_cls(build_env_config(env_type, env_config))


__all__ = [
    "ENV_REGISTRY",
    "BanditConfig",
    "BanditEnv",
    "CountdownConfig",
    "CountdownEnv",
    "SokobanConfig",
    "SokobanEnv",
    "EnvContractError",
    "FrozenLakeConfig",
    "FrozenLakeEnv",
    "GymSokobanConfig",
    "GymSokobanEnv",
    "build_env_config",
    "check_env",
    "check_env_config",
    "make_env",
]
