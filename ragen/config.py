"""The root config schema and the start-up checks.

`RagenConfig` is registered with Hydra's ConfigStore as `ragen_schema`; `config/base.yaml` builds on it
and each environment's YAML builds on `base`. Hydra rejects unknown keys and wrong types itself;
`validate()` rejects impossible values, each with a message that names the key, before any model loads.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from ragen.envs import ENV_REGISTRY, check_env_config
from verl.trainer.config import ActorRolloutRefConfig, AlgorithmConfig, RayConfig, TrainerConfig


@dataclass
class EnvMixConfig:
    tags: list[str] = field(default_factory=lambda: ["SimpleSokoban"])  # keys of custom_envs
    n_groups: list[int] = field(default_factory=lambda: [8])  # groups per tag, summing to env_groups; [] splits evenly

    def groups_per_tag(self, env_groups: int) -> list[int]:
        """`n_groups`, or an even split of `env_groups` over the tags (the first tags take the remainder)."""
        if self.n_groups:
            return list(self.n_groups)
        share, extra = divmod(env_groups, len(self.tags))
        return [share + (i < extra) for i in range(len(self.tags))]


@dataclass
class EnvGroupsConfig:
    env_groups: int = 8  # distinct start states (seeds) per batch
    group_size: int = 16  # trajectories per start state (GRPO compares within a group)
    env_configs: EnvMixConfig = field(default_factory=EnvMixConfig)


@dataclass
class EsManagerConfig:
    format_penalty: float = -0.1  # added to a turn's reward when the reply is malformed
    train: EnvGroupsConfig = field(default_factory=EnvGroupsConfig)
    # validation: a fixed set of start states, the same at every validation; group_size > 1 gives pass@k
    val: EnvGroupsConfig = field(default_factory=lambda: EnvGroupsConfig(env_groups=64, group_size=1))


@dataclass
class CustomEnvConfig:
    env_type: str = "sokoban"  # key of ragen.envs.ENV_REGISTRY
    max_actions_per_traj: int = 10  # step budget of one trajectory, over all its turns
    env_config: dict[str, Any] = field(default_factory=dict)  # fields of the env's config dataclass


@dataclass
class AgentProxyConfig:
    max_turn: int = 5  # LLM turns per trajectory
    max_actions_per_turn: int = 2  # actions parsed from one <answer>; extra ones are dropped
    action_sep: str = "||"  # separator between actions inside <answer>
    enable_think: bool = True  # ask for <think>...</think> before <answer> (and force the opening tag)
    max_context_window: int = -1  # turns shown in a prompt, the current one included; -1 shows all
    use_turn_scores: bool = False  # each turn's reward on its last generated token, else the sum on the last


@dataclass
class RagenConfig:
    model_path: str = "bundled:SmolLM2-135M-Instruct"  # bundled model, local HF folder, or hub id
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    es_manager: EsManagerConfig = field(default_factory=EsManagerConfig)
    agent_proxy: AgentProxyConfig = field(default_factory=AgentProxyConfig)
    custom_envs: dict[str, CustomEnvConfig] = field(default_factory=dict)


ConfigStore.instance().store(name="ragen_schema", node=RagenConfig)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"


def load_config(config_name: str = "base", overrides: Sequence[str] = ()) -> RagenConfig:
    """Compose a recipe with Hydra overrides, as `train.sh` does, for tools other than the trainer."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name, overrides=list(overrides)))


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix."""


def validate(cfg: RagenConfig, world_size: int) -> None:
    """Reject impossible values at start-up, before any model or worker is created."""
    from verl.trainer.core_algos import ADV_ESTIMATORS  # torch import; keep `ragen.config` light
    from verl.workers.rollout import ROLLOUT_ENGINES

    def check(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    actor, rollout, train = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.es_manager.train
    check(cfg.trainer.backend in ("ray", "local"), f"trainer.backend={cfg.trainer.backend!r}: use 'ray' or 'local'")
    check(cfg.trainer.total_training_steps >= 1, "trainer.total_training_steps must be >= 1")
    check(world_size == 1 or cfg.trainer.backend == "ray", "trainer.backend=local runs one rank: set the ranks to 1")
    check(cfg.algorithm.adv_estimator in ADV_ESTIMATORS,
          f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}: choose one of {sorted(ADV_ESTIMATORS)}")
    check(rollout.name in ROLLOUT_ENGINES,
          f"actor_rollout_ref.rollout.name={rollout.name!r}: choose one of {sorted(ROLLOUT_ENGINES)}")
    check(rollout.temperature > 0, "actor_rollout_ref.rollout.temperature must be > 0")
    check(rollout.val_kwargs.temperature >= 0, "actor_rollout_ref.rollout.val_kwargs.temperature must be >= 0 "
          "(0 is greedy)")
    check(0 < rollout.val_kwargs.top_p <= 1, "actor_rollout_ref.rollout.val_kwargs.top_p must be in (0, 1]")
    check(rollout.max_model_len is None or rollout.max_model_len > rollout.response_length,
          "actor_rollout_ref.rollout.max_model_len must exceed response_length")
    check(cfg.agent_proxy.max_context_window == -1 or cfg.agent_proxy.max_context_window >= 1,
          "agent_proxy.max_context_window must be -1 (every turn) or >= 1")
    check(0 < rollout.top_p <= 1, "actor_rollout_ref.rollout.top_p must be in (0, 1]")
    check(rollout.response_length >= 1, "actor_rollout_ref.rollout.response_length must be >= 1")
    for name in ("clip_ratio_low", "clip_ratio_high"):
        check(0 < getattr(actor, name) < 1, f"actor_rollout_ref.actor.{name} must be in (0, 1)")
    check(cfg.agent_proxy.max_turn >= 1, "agent_proxy.max_turn must be >= 1")
    check(cfg.agent_proxy.max_actions_per_turn >= 1, "agent_proxy.max_actions_per_turn must be >= 1")
    check(bool(cfg.agent_proxy.action_sep.strip()), "agent_proxy.action_sep must not be blank")

    # Batch sizes: the rollout batch splits into ranks, then mini-batches, then micro-batches.
    batch_size = train.env_groups * train.group_size
    check(train.env_groups >= 1 and train.group_size >= 1, "es_manager.train.env_groups and group_size must be >= 1")
    check(cfg.algorithm.adv_estimator != "grpo" or train.group_size >= 2,
          "algorithm.adv_estimator=grpo compares trajectories within a group: es_manager.train.group_size must be >= 2")
    check(batch_size % actor.ppo_mini_batch_size == 0,
          f"es_manager.train.env_groups * group_size = {batch_size} is not divisible by "
          f"actor_rollout_ref.actor.ppo_mini_batch_size = {actor.ppo_mini_batch_size}")
    check(actor.ppo_mini_batch_size % world_size == 0,
          f"actor_rollout_ref.actor.ppo_mini_batch_size = {actor.ppo_mini_batch_size} is not divisible by "
          f"the number of ranks ({world_size})")
    per_rank = actor.ppo_mini_batch_size // world_size
    check(per_rank % actor.ppo_micro_batch_size_per_gpu == 0,
          f"actor_rollout_ref.actor.ppo_mini_batch_size per rank = {per_rank} is not divisible by "
          f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = {actor.ppo_micro_batch_size_per_gpu}")

    # Environments: each mix must name defined envs and add up to its env_groups.
    for split, groups in (("train", train), ("val", cfg.es_manager.val)):
        mix, key = groups.env_configs, f"es_manager.{split}"
        check(groups.env_groups >= 1 and groups.group_size >= 1, f"{key}.env_groups and group_size must be >= 1")
        check(len(mix.tags) > 0 and len(mix.n_groups) in (0, len(mix.tags)),
              f"{key}.env_configs.tags must be non-empty and n_groups empty (an even split) or one per tag")
        n_groups = mix.groups_per_tag(groups.env_groups)
        check(sum(n_groups) == groups.env_groups and min(n_groups) >= 1,
              f"{key}.env_configs.n_groups = {n_groups} must be >= 1 each and sum to {key}.env_groups = "
              f"{groups.env_groups}")
        for tag in mix.tags:
            check(tag in cfg.custom_envs, f"{key}.env_configs.tags: {tag!r} is not defined under custom_envs "
                                          f"(defined: {sorted(cfg.custom_envs)})")
    for tag, env in cfg.custom_envs.items():
        check(env.env_type in ENV_REGISTRY,
              f"custom_envs.{tag}.env_type={env.env_type!r}: registered types are {sorted(ENV_REGISTRY)}")
        check(env.max_actions_per_traj >= 1, f"custom_envs.{tag}.max_actions_per_traj must be >= 1")
        try:
            check_env_config(env.env_type, dict(env.env_config))
        except ValueError as e:
            raise ConfigError(f"custom_envs.{tag}.env_config: {e}") from e
