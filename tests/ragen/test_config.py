import pytest
from hydra.errors import ConfigCompositionException

from ragen.config import ConfigError, RagenConfig, load_config, validate


def load(recipe: str, *overrides: str) -> RagenConfig:
    return load_config(recipe, overrides)


@pytest.mark.parametrize("recipe", ["sokoban", "bandit", "frozen_lake", "countdown"])
@pytest.mark.parametrize("scale", ["cpu", "gpu"])
def test_recipes_compose_and_validate(recipe, scale):
    cfg = load(recipe, f"scale={scale}")
    validate(cfg, world_size=1)
    assert cfg.es_manager.train.env_configs.n_groups == [cfg.es_manager.train.env_groups]
    assert cfg.actor_rollout_ref.model.path == cfg.model_path


def test_gpu_scale_uses_ragen_sizes():
    train = load("sokoban", "scale=gpu").es_manager.train
    assert (train.env_groups, train.group_size) == (8, 16)


def test_veRL_style_overrides_carry_over():
    cfg = load("sokoban", "trainer.total_training_steps=3", "algorithm.adv_estimator=grpo",
               "actor_rollout_ref.actor.clip_ratio_high=0.3", "es_manager.train.group_size=8",
               "agent_proxy.max_turn=2", "model_path=/some/model")
    assert cfg.trainer.total_training_steps == 3 and cfg.actor_rollout_ref.actor.clip_ratio_high == 0.3
    assert cfg.actor_rollout_ref.model.path == "/some/model"


@pytest.mark.parametrize("override", ["trainer.no_such_key=1", "actor_rollout_ref.actor.clip_ratio=0.2",
                                      "trainer.total_training_steps=many"])
def test_unknown_keys_and_wrong_types_fail_naming_the_key(override):
    with pytest.raises(ConfigCompositionException) as error:
        load("sokoban", override)
    assert override.split("=")[0].split(".")[-1] in str(error.value.__cause__ or error.value)


@pytest.mark.parametrize("overrides, key", [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=3"], "ppo_mini_batch_size"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"], "ppo_micro_batch_size_per_gpu"),
    (["es_manager.train.group_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"], "group_size"),
    (["algorithm.adv_estimator=nope"], "adv_estimator"),
    (["es_manager.train.env_configs.tags=[Nope]"], "tags"),
    (["es_manager.train.env_configs.n_groups=[1]"], "n_groups"),
    (["+custom_envs.SimpleSokoban.env_config.dim_z=3"], "dim_z"),
    (["custom_envs.SimpleSokoban.env_type=chess"], "env_type"),
    (["actor_rollout_ref.rollout.temperature=0"], "temperature"),
    (["trainer.backend=slurm"], "backend"),
])
def test_impossible_values_fail_at_startup_naming_the_key(overrides, key):
    cfg = load("sokoban", "scale=cpu", *overrides)
    with pytest.raises(ConfigError, match=key):
        validate(cfg, world_size=1)


def test_batch_must_split_over_ranks():
    cfg = load("sokoban", "scale=cpu", "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    with pytest.raises(ConfigError, match="ranks"):
        validate(cfg, world_size=3)


def test_a_mix_of_environments_per_batch():
    cfg = load("sokoban", "scale=gpu", "es_manager.train.env_configs.tags=[SimpleSokoban,FrozenLake,Countdown]",
               "es_manager.train.env_configs.n_groups=[4,2,2]")
    validate(cfg, world_size=1)
    assert cfg.es_manager.val.env_configs.tags == ["SimpleSokoban", "FrozenLake", "Countdown"]
    assert cfg.es_manager.val.env_configs.groups_per_tag(cfg.es_manager.val.env_groups) == [22, 21, 21]
    with pytest.raises(ConfigError, match=r"n_groups = \[4, 3\] must be >= 1 each and sum to es_manager.train"):
        validate(load("sokoban", "scale=gpu", "es_manager.train.env_configs.tags=[SimpleSokoban,FrozenLake]",
                      "es_manager.train.env_configs.n_groups=[4,3]"), world_size=1)
