"""The env registry. Every test here covers whatever is registered, so an env added by the README's guide
("Add your own environment") is checked without editing them."""

import dataclasses
import re

import gymnasium
import pytest

from ragen.envs import (
    ENV_REGISTRY,
    BanditConfig,
    BanditEnv,
    CountdownConfig,
    CountdownEnv,
    FrozenLakeConfig,
    FrozenLakeEnv,
    SokobanConfig,
    SokobanEnv,
    check_env_config,
    make_env,
)


def test_the_bundled_envs_are_registered():
    assert ENV_REGISTRY.items() >= {
        "bandit": (BanditEnv, BanditConfig),
        "countdown": (CountdownEnv, CountdownConfig),
        "frozen_lake": (FrozenLakeEnv, FrozenLakeConfig),
        "sokoban": (SokobanEnv, SokobanConfig),
    }.items()


@pytest.mark.parametrize("env_type", sorted(ENV_REGISTRY))
def test_registry_holds_env_and_config_classes(env_type):
    env_cls, config_cls = ENV_REGISTRY[env_type]
    assert issubclass(env_cls, gymnasium.Env) and dataclasses.is_dataclass(config_cls)
    env = make_env(env_type)  # every config field has a default
    assert type(env) is env_cls and type(env.config) is config_cls


def test_make_env_builds_config_from_dict():
    env = make_env("sokoban", {"dim_x": 7, "num_boxes": 2})
    assert isinstance(env, SokobanEnv)
    assert (env.config.dim_x, env.config.dim_y, env.config.num_boxes) == (7, 6, 2)
    assert len(env.reset(seed=0)[0].split("\n")[0]) == 7


def test_make_env_defaults_and_int_for_float():
    assert make_env("bandit").config.safe_arm_name == "phoenix"
    env = make_env("bandit", {"risky_reward": 2})
    assert env.config.risky_reward == 2.0 and type(env.config.risky_reward) is float


@pytest.mark.parametrize("build", [make_env, check_env_config])
def test_unknown_env_type_names_it_and_lists_registered(build):
    with pytest.raises(ValueError, match="'frozenlake'.*" + re.escape(str(sorted(ENV_REGISTRY)))):
        build("frozenlake", {})


@pytest.mark.parametrize("build", [make_env, check_env_config])
def test_unknown_key_names_it_and_lists_fields(build):
    with pytest.raises(ValueError, match=r"'dimx'.*'dim_x'.*'search_depth'"):
        build("sokoban", {"dimx": 7})


@pytest.mark.parametrize("env_type", sorted(ENV_REGISTRY))
def test_every_env_rejects_an_unknown_key_and_lists_its_fields(env_type):
    fields = sorted(f.name for f in dataclasses.fields(ENV_REGISTRY[env_type][1]))
    with pytest.raises(ValueError, match="'no_such_key'.*" + re.escape(str(fields))):
        check_env_config(env_type, {"no_such_key": 1})


@pytest.mark.parametrize(
    "env_type, key, value",
    [("sokoban", "dim_x", "6"), ("sokoban", "num_boxes", 1.5), ("sokoban", "max_steps", True),
     ("bandit", "risky_prob", "0.3"), ("bandit", "safe_arm_name", 3), ("frozen_lake", "is_slippery", 1),
     ("frozen_lake", "p", "0.8"), ("countdown", "num_numbers", 3.0), ("sokoban", "symbols", 7)],
)
def test_wrong_type_names_the_key(env_type, key, value):
    with pytest.raises(ValueError, match=key):
        check_env_config(env_type, {key: value})


def test_bad_value_fails_in_check_env_config():
    with pytest.raises(ValueError, match="num_boxes"):
        check_env_config("sokoban", {"num_boxes": 0})
    check_env_config("sokoban", {"num_boxes": 2})
