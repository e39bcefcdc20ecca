"""The root config schema and the start-up checks.

`RagenConfig` is registered with Hydra's ConfigStore as `ragen_schema`; `config/base.yaml` builds on it
and each environment's YAML builds on `base`. Hydra rejects unknown keys and wrong types itself;
`validate()` rejects impossible values, each with a message that names the key, before any model loads.
"""

import math
import os
import typing
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from ragen.envs import ENV_REGISTRY, check_env_config
from verl.trainer.watchdog import ACTIONS, CONDITIONS
from verl.trainer.config import (ActorRolloutRefConfig, AlgorithmConfig, CriticConfig, LoraConfig, OptimConfig,
                                 RayConfig, REPLY_KINDS, TrainerConfig)
from verl.utils import run_folder
from verl.utils.tracking import Tracking


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

    def group_tags(self, env_groups: int) -> list[str]:
        """The tag of each of `env_groups` groups, in order."""
        return [tag for tag, n in zip(self.tags, self.groups_per_tag(env_groups)) for _ in range(n)]


@dataclass
class CurriculumConfig:
    """Level difficulty that changes during training (ragen/curriculum.py); `es_manager.train` only."""

    type: str = "none"  # none | schedule (E2H Gaussian over levels by step) | adaptive (follows training success)
    key: str = "search_depth"  # int field of every training tag's env_config that a level sets (overriding it)
    levels: list[int] = field(default_factory=list)  # values of `key` from easy to hard, e.g. [5, 10, 20, 30]
    steps: int = "${trainer.total_training_steps}"  # schedule: T, the step at which the centre reaches the hardest level (and stays)
    mu_exp: float = 0.5  # schedule: the Gaussian's centre is (step / steps) ** mu_exp * (len(levels) - 1)
    sigma: float = 0.5  # schedule: its width in levels; a small one fades the easy levels out sooner
    window: int = 5  # adaptive: steps at a level whose mean success may move it
    target_success_high: float = 0.6  # adaptive: one level harder when the window's mean success is above this (1: never)
    target_success_low: float = 0.2  # adaptive: one level easier when it is below this (0: never)


@dataclass
class EnvGroupsConfig:
    env_groups: int = 8  # distinct start states (seeds) per batch
    group_size: int = 16  # trajectories per start state (GRPO compares within a group)
    env_configs: EnvMixConfig = field(default_factory=EnvMixConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)  # training only: validation stays fixed
    # true: a group's environments also share their random stream after the start (common random numbers): equal
    # moves meet equal luck, so a group compares moves, not luck, when its samples mostly agree (FrozenLake's slips;
    # the k-th draw is shared, whatever moves came before). Deterministic steps (Sokoban, Countdown): no effect
    shared_randomness: bool = False
    # validation: the start seeds themselves, one a group (env_groups their number), e.g. boards no run trained on
    # (scripts/seen_boards.py --pick-unseen); null: trainer.val_seed + group. Training: null (trainer.seed's)
    seeds: list[int] | None = None


@dataclass
class EsManagerConfig:
    format_penalty: float = -0.1  # added to a turn's reward when the reply is malformed or an action is invalid
    env_step_timeout_s: float | None = None  # an env.step() running longer fails its trajectory; null: no limit
    max_env_failure_share: float = 0.25  # stop the run when more of a rollout's trajectories failed in env.step
    train: EnvGroupsConfig = field(default_factory=EnvGroupsConfig)
    # validation: a fixed set of start states, the same at every validation; group_size > 1 gives pass@k
    val: EnvGroupsConfig = field(default_factory=lambda: EnvGroupsConfig(env_groups=64, group_size=1))


@dataclass
class EnvServerConfig:
    """Where a tag's environments run: in this process (neither url nor spawn), on a running environment server
    (`url`), or on servers the run starts and stops (`spawn`): `python -m ragen.envs.serve` (docs/environments.md)."""

    url: str | None = None  # a running server, e.g. http://127.0.0.1:8000
    spawn: bool = False  # start `workers` servers for the run with `python` (stopped at its end, also on a crash)
    python: str | None = None  # the spawned servers' interpreter, e.g. another virtualenv's bin/python; null: this one
    workers: int = 1  # spawned servers; the tag's environments are spread over them
    timeout_s: float = 30.0  # one request's limit (connect, send, answer)
    retries: int = 3  # attempts after a connection error, 429 or 503 (others are never retried), 0.5 s apart, doubling
    # a server's token comes from $RAGEN_ENV_SERVER_TOKEN only: a config value is saved with every checkpoint


@dataclass
class CustomEnvConfig:
    env_type: str = "sokoban"  # key of ragen.envs.ENV_REGISTRY (of the server's, when the env is served)
    max_actions_per_traj: int = 10  # step budget of one trajectory, over all its turns
    env_config: dict[str, Any] = field(default_factory=dict)  # fields of the env's config dataclass
    server: EnvServerConfig = field(default_factory=EnvServerConfig)  # run in-process, or on an env server

    @property
    def served(self) -> bool:
        return self.server.url is not None or self.server.spawn


@dataclass
class RewardNormalizationConfig:
    """RAGEN's reward normalisation of each trajectory's total reward, before the advantage estimator."""

    grouping: str = "state"  # state: per start-state group | batch: the whole batch | inductive: per env tag
    method: str = "identity"  # identity (ARPO) | mean | mean_std | asym_clip (mean_std clipped to [-1, 3])


@dataclass
class WorldModelRewardConfig:
    """VAGEN's per-turn reward for the states a `reply_format=world_model` reply writes (ragen/world_model_reward.py)."""

    observation: float = 0.0  # weight of the <observation> span's credit against the state the turn answered
    prediction: float = 0.0  # weight of the <prediction> span's credit against the state after the turn's actions
    credit: str = "partial"  # exact: 1 for the whole state, else 0 | partial: the share of objects (or cells) right


@dataclass
class AgentProxyConfig:
    max_turn: int = 5  # LLM turns per trajectory
    max_actions_per_turn: int = 2  # actions parsed from one <answer>; extra ones are dropped
    action_sep: str = "||"  # separator between actions inside <answer>
    enable_think: bool = True  # ask for <think>...</think> before <answer>; the prompt opens <think> (false: <answer>)
    max_context_window: int = -1  # turns shown in a prompt, the current one included; -1 shows all
    use_turn_scores: bool = False  # each turn's reward on its last generated token, else the sum on the last
    # plain: <think>...</think><answer>...</answer> | world_model (SPA): the thought holds
    # <observation>current state</observation> ... <prediction>state after the actions</prediction>
    reply_format: str = "plain"
    # the next state message names the turn's actions that changed nothing (the env's info["action_is_effective"]
    # false), e.g. "Down had no effect.": with a context window of 1 a policy cannot otherwise tell that its move
    # hit a wall, and greedy decoding repeats it on the unchanged state until the turns run out
    no_effect_feedback: bool = False
    reward_normalization: RewardNormalizationConfig = field(default_factory=RewardNormalizationConfig)
    world_model_reward: WorldModelRewardConfig = field(default_factory=WorldModelRewardConfig)


@dataclass
class LoggingConfig:
    """The HTML trajectory browser (ragen/trajectory_browser.py); RAGEN's key names."""

    log_images: bool = True  # trajectory pages with the rendered states (ragen.train.trajectory_pages says when)
    # <log_image_dir>/{step,val_step}_<N>/ and index.html, inside the run folder; serve with http.server
    log_image_dir: str = "${trainer.default_local_dir}/pages"
    log_image_step_size: int = 4  # training steps 1, every this many, and the last; every validation
    log_n_image_per_batch: int = 32  # trajectories per logged step, spread over the start states; -1: all


@dataclass
class RagenConfig:
    model_path: str = "bundled:SmolLM2-135M-Instruct"  # bundled model, local HF folder, or hub id
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)  # for the actor; the critic trains in full
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    es_manager: EsManagerConfig = field(default_factory=EsManagerConfig)
    agent_proxy: AgentProxyConfig = field(default_factory=AgentProxyConfig)
    custom_envs: dict[str, CustomEnvConfig] = field(default_factory=dict)


ConfigStore.instance().store(name="ragen_schema", node=RagenConfig)
# `${ragen_min:5,${trainer.total_training_steps}}`: the recipes' LR warm-up, cut to the run when it is shorter
OmegaConf.register_new_resolver("ragen_min", lambda *values: min(values), replace=True)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"


def compose_recipe(config_name: str = "base", overrides: Sequence[str] = ()) -> RagenConfig:
    """A recipe composed with Hydra overrides taken as they are. Tools compose through
    `ragen.overrides.load_config`, which translates old RAGEN keys and refuses unknown ones first."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name, overrides=list(overrides)))


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix."""


def validate(cfg: RagenConfig, world_size: int) -> None:
    """Reject impossible values at start-up, before any model or worker is created."""
    _validate_run(cfg, world_size)
    _validate_seeds(cfg)
    _validate_rollout(cfg)
    _validate_optimization(cfg)
    _validate_algorithm(cfg)
    _validate_batch_sizes(cfg, world_size)
    _validate_envs(cfg)
    _validate_curriculum(cfg)
    _validate_env_failures(cfg)
    _validate_watchdog(cfg)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _validate_run(cfg: RagenConfig, world_size: int) -> None:
    """The trainer loop: its ranks, schedule, checkpoints and logs. The rank counts come first: the batch
    checks divide by `world_size`."""
    trainer, logging = cfg.trainer, cfg.logging
    _check(trainer.backend in ("ray", "local"), f"trainer.backend={trainer.backend!r}: use 'ray' or 'local'")
    for name in ("nnodes", "n_gpus_per_node", "n_cpu_ranks_per_node"):
        _check(getattr(trainer, name) >= 1, f"trainer.{name} must be >= 1")
    _check(world_size == 1 or trainer.backend == "ray", "trainer.backend=local runs one rank: set the ranks to 1")
    _check(trainer.total_training_steps >= 1, "trainer.total_training_steps must be >= 1")
    _check(0 <= trainer.critic_warmup < trainer.total_training_steps,
           f"trainer.critic_warmup must be in [0, trainer.total_training_steps - 1 = "
           f"{trainer.total_training_steps - 1}]: the actor trains only after it")
    _check(trainer.test_freq == -1 or trainer.test_freq >= 1,
           "trainer.test_freq must be >= 1, or -1 to never validate during training")
    _check(trainer.save_freq == -1 or trainer.save_freq >= 1,
           "trainer.save_freq must be >= 1, or -1 to save only after the last step")
    mode = trainer.resume_mode
    _check(mode in ("auto", "disable") or (Path(mode) / "trainer_state.json").is_file(),
           f"trainer.resume_mode={mode!r}: use auto, disable, or the path of a checkpoint (a global_step_N folder)")
    _check(trainer.max_actor_ckpt_to_keep is None or trainer.max_actor_ckpt_to_keep >= 1,
           "trainer.max_actor_ckpt_to_keep must be >= 1, or null to keep every checkpoint")
    _check(trainer.resumable_checkpoints is None or trainer.resumable_checkpoints >= 1,
           "trainer.resumable_checkpoints must be >= 1, or null for every checkpoint to keep its optimizer state")
    _check(trainer.max_consecutive_nonfinite_steps >= 0,
           "trainer.max_consecutive_nonfinite_steps must be >= 1, or 0 to never stop")
    _check(trainer.collapse_mi_inputs == 0 or trainer.collapse_mi_inputs >= 2,
           "trainer.collapse_mi_inputs must be >= 2 (one input has nothing to tell apart), or 0 to not measure "
           "template collapse")
    _check(trainer.collapse_mi_replies >= 1, "trainer.collapse_mi_replies must be >= 1 (replies per input)")
    _check(set(trainer.logger) <= set(Tracking.SUPPORTED),
           f"trainer.logger={list(trainer.logger)}: choose from {list(Tracking.SUPPORTED)}")
    for key in ("project_name", "experiment_name"):
        problem = run_folder.check_name(f"trainer.{key}", getattr(trainer, key))
        _check(problem is None, problem)
    _check((problem := run_folder.check_run_dir(trainer.default_local_dir)) is None, problem)
    for key, path in (("trainer.rollout_data_dir", trainer.rollout_data_dir), ("logging.log_image_dir",
                                                                                logging.log_image_dir)):
        if path is not None:
            _check((problem := run_folder.check_inside(key, path, trainer.default_local_dir)) is None, problem)
    own_checkpoint = mode not in ("auto", "disable") and \
        Path(mode).resolve().parent == Path(trainer.default_local_dir).resolve()
    _check(not (trainer.overwrite and own_checkpoint),
           f"trainer.overwrite=true moves {trainer.default_local_dir} aside, and trainer.resume_mode={mode} is in it: "
           "resume from it without overwrite, or start afresh with trainer.resume_mode=disable as well")
    _check(math.isfinite(cfg.ray.num_cpus_per_worker) and cfg.ray.num_cpus_per_worker > 0,
           "ray.num_cpus_per_worker must be finite and > 0 (a fraction such as 0.5 is fine)")
    _check(logging.log_image_step_size >= 1, "logging.log_image_step_size must be >= 1")
    _check(logging.log_n_image_per_batch >= 1 or logging.log_n_image_per_batch == -1,
           "logging.log_n_image_per_batch must be >= 1, or -1 for every trajectory")


def _validate_rollout(cfg: RagenConfig) -> None:
    """Sampling, the rollout engine and the multi-turn agent loop."""
    from verl.utils.model import DTYPES  # torch imports; keep `ragen.config` light
    from verl.workers.rollout import ROLLOUT_ENGINES
    from ragen.world_model_reward import CREDITS  # imports the context manager, which imports this module

    rollout, val, proxy = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.rollout.val_kwargs, cfg.agent_proxy
    _check(rollout.name in ROLLOUT_ENGINES,
           f"actor_rollout_ref.rollout.name={rollout.name!r}: choose one of {sorted(ROLLOUT_ENGINES)}")
    _check(rollout.dtype == "auto" or rollout.dtype in DTYPES,
           f"actor_rollout_ref.rollout.dtype={rollout.dtype!r}: choose auto or one of {sorted(DTYPES)}")
    _check(math.isfinite(rollout.temperature) and rollout.temperature > 0,
           "actor_rollout_ref.rollout.temperature must be finite and > 0")
    _check(math.isfinite(val.temperature) and val.temperature >= 0,
           "actor_rollout_ref.rollout.val_kwargs.temperature must be finite and >= 0 (0 is greedy)")
    for key, knobs in (("actor_rollout_ref.rollout", rollout), ("actor_rollout_ref.rollout.val_kwargs", val)):
        _check(0 < knobs.top_p <= 1, f"{key}.top_p must be in (0, 1]")
        _check(knobs.top_k >= 0, f"{key}.top_k must be >= 0 (0 disables top-k)")
    _check(rollout.response_length >= 1, "actor_rollout_ref.rollout.response_length must be >= 1")
    _check(rollout.max_model_len is None or rollout.max_model_len > rollout.response_length,
           "actor_rollout_ref.rollout.max_model_len must exceed response_length")
    _check(math.isfinite(cfg.es_manager.format_penalty) and cfg.es_manager.format_penalty <= 0,
           "es_manager.format_penalty must be finite and <= 0 (it is added to a malformed turn's reward)")
    _check(proxy.max_turn >= 1, "agent_proxy.max_turn must be >= 1")
    _check(proxy.max_actions_per_turn >= 1, "agent_proxy.max_actions_per_turn must be >= 1")
    _check(bool(proxy.action_sep.strip()), "agent_proxy.action_sep must not be blank")
    _check(proxy.max_context_window == -1 or proxy.max_context_window >= 1,
           "agent_proxy.max_context_window must be -1 (every turn) or >= 1")
    world = proxy.world_model_reward
    _check(world.credit in CREDITS,
           f"agent_proxy.world_model_reward.credit={world.credit!r}: choose one of {list(CREDITS)}")
    for key in ("observation", "prediction"):
        _check(math.isfinite(getattr(world, key)), f"agent_proxy.world_model_reward.{key} must be finite")
    _check(proxy.reply_format == "world_model" or (world.observation == 0 and world.prediction == 0),
           "agent_proxy.world_model_reward rewards the <observation> and <prediction> spans: it needs "
           "agent_proxy.reply_format=world_model (and agent_proxy.enable_think=true)")


def _validate_optimization(cfg: RagenConfig) -> None:
    """The trained models (the critic's settings too, even when no critic trains): dtype, optimizer, clipping."""
    lora = cfg.lora
    for key, model in (("actor_rollout_ref.model", cfg.actor_rollout_ref.model), ("critic.model", cfg.critic.model)):
        _check(model.dtype in ("auto", "bfloat16", "float32"),
               f"{key}.dtype={model.dtype!r}: use auto, bfloat16 or float32 (float16 has no fast CPU kernels "
               "and would need loss scaling, which this trainer does not do)")
    for key, trainer in (("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor), ("critic", cfg.critic)):
        _check(math.isfinite(trainer.grad_clip) and trainer.grad_clip > 0,
               f"{key}.grad_clip must be finite and > 0 (the max gradient norm)")
        _validate_optim(f"{key}.optim", trainer.optim)
    _check(lora.rank >= 0 and lora.alpha > 0, "lora.rank must be >= 0 (0: off) and lora.alpha > 0")
    _check(isinstance(lora.target_modules, list) or lora.target_modules == "all-linear",
           f"lora.target_modules={lora.target_modules!r}: use all-linear or a list such as [q_proj,v_proj]")


def _validate_optim(key: str, optim: OptimConfig) -> None:
    """AdamW and its learning-rate schedule (`verl.workers.ppo_update.make_optimizer`)."""
    _check(math.isfinite(optim.lr) and optim.lr > 0, f"{key}.lr must be finite and > 0")
    _check(len(optim.betas) == 2 and all(0 <= beta < 1 for beta in optim.betas),
           f"{key}.betas={list(optim.betas)}: give two numbers, each in [0, 1)")
    _check(math.isfinite(optim.weight_decay) and optim.weight_decay >= 0, f"{key}.weight_decay must be finite and >= 0")
    _check(optim.lr_scheduler in ("constant", "cosine"), f"{key}.lr_scheduler must be constant or cosine")
    _check(0 <= optim.min_lr_ratio <= 1, f"{key}.min_lr_ratio must be in [0, 1]")
    _check(optim.total_training_steps >= 1, f"{key}.total_training_steps must be >= 1")
    _check(0 <= optim.lr_warmup_steps <= optim.total_training_steps,
           f"{key}.lr_warmup_steps must be in [0, {key}.total_training_steps = {optim.total_training_steps}]")


def _validate_seeds(cfg: RagenConfig) -> None:
    """Training start states are seeds trainer.seed + step * env_groups + group (steps 1..total): they must
    never be validation states (trainer.val_seed + group, or the list es_manager.val.seeds)."""
    train, val, trainer = cfg.es_manager.train, cfg.es_manager.val, cfg.trainer
    first, last = trainer.seed + train.env_groups, trainer.seed + (trainer.total_training_steps + 1) * train.env_groups
    _check(trainer.seed >= 0 and trainer.val_seed >= 0, "trainer.seed and trainer.val_seed must be >= 0")
    _check(train.seeds is None, "es_manager.train.seeds must be null: training draws new start states every step "
           "from trainer.seed (a list of seeds is for validation: es_manager.val.seeds)")
    if val.seeds is not None:
        seeds = list(val.seeds)
        _check(len(seeds) == val.env_groups, f"es_manager.val.seeds holds {len(seeds)} seeds, one a group: set "
               f"es_manager.val.env_groups={len(seeds)} (it is {val.env_groups})")
        _check(all(isinstance(s, int) and s >= 0 for s in seeds), "es_manager.val.seeds must be ints >= 0")
        _check(len(set(seeds)) == len(seeds), "es_manager.val.seeds repeats a seed: a group plays each start state")
        inside = sorted(s for s in seeds if first <= s < last)
        _check(not inside, f"es_manager.val.seeds {inside[:5]} are training start states (seeds {first}..{last - 1})")
        return
    _check(last <= trainer.val_seed or trainer.val_seed + val.env_groups <= first,
           f"the training start states (seeds {first}..{last - 1}) overlap the validation ones (trainer.val_seed = "
           f"{trainer.val_seed} .. {trainer.val_seed + val.env_groups - 1}): move trainer.val_seed or trainer.seed")


def _validate_algorithm(cfg: RagenConfig) -> None:
    from verl.trainer import core_algos as algos

    algo, actor, rollout = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    norm, group_size = cfg.agent_proxy.reward_normalization, cfg.es_manager.train.group_size

    def one_of(key: str, value: str, choices) -> None:
        _check(value in choices, f"{key}={value!r}: choose one of {sorted(choices)}")

    one_of("algorithm.adv_estimator", algo.adv_estimator, algos.ADV_ESTIMATORS)
    one_of("algorithm.adv_mask", algo.adv_mask, algos.ADV_MASKS)
    one_of("algorithm.kl_penalty", algo.kl_penalty, algos.KL_PENALTIES)
    one_of("algorithm.kl_ctrl.type", algo.kl_ctrl.type, algos.KL_CONTROLLERS)
    one_of("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type, algos.KL_PENALTIES)
    one_of("actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode, algos.LOSS_AGG_MODES)
    one_of("agent_proxy.reward_normalization.grouping", norm.grouping, ("state", "batch", "inductive"))
    one_of("agent_proxy.reward_normalization.method", norm.method, algos.REWARD_NORMALIZERS)
    for key in ("loss_spans", "adv_spans"):
        kinds = list(getattr(algo, key))
        _check(set(kinds) <= set(REPLY_KINDS), f"algorithm.{key}={kinds}: choose among {list(REPLY_KINDS)}")
    _check(len(algo.loss_spans) > 0, f"algorithm.loss_spans is empty: the policy loss would cover no token (choose "
                                     f"among {list(REPLY_KINDS)})")
    _check(set(algo.loss_spans) <= set(algo.adv_spans),
           f"algorithm.loss_spans={list(algo.loss_spans)} trains on kinds of text outside algorithm.adv_spans="
           f"{list(algo.adv_spans)}: their advantage is 0, so they would only dilute the loss; add them to adv_spans")
    estimator = algos.ADV_ESTIMATORS[algo.adv_estimator]
    for name in ("gamma", "lam", "high_level_gamma"):
        _check(0 <= getattr(algo, name) <= 1, f"algorithm.{name} must be in [0, 1]")
    for name in ("clip_ratio_low", "clip_ratio_high"):
        _check(0 < getattr(actor, name) < 1, f"actor_rollout_ref.actor.{name} must be in (0, 1)")
    _check(math.isfinite(actor.clip_ratio_c) and actor.clip_ratio_c > 1,
           "actor_rollout_ref.actor.clip_ratio_c (dual clip) must be finite and > 1")
    cap = actor.tis_imp_ratio_cap
    _check(cap is None or (math.isfinite(cap) and cap > 1),
           f"actor_rollout_ref.actor.tis_imp_ratio_cap={cap}: the cap of an importance weight that is 1 on average "
           "must be finite and > 1 (e.g. 2), or null to turn truncated importance sampling off")
    _check(cap is None or rollout.name != "vllm" or (rollout.top_p == 1.0 and rollout.top_k == 0),
           "actor_rollout_ref.actor.tis_imp_ratio_cap with rollout.name=vllm needs top_p=1 and top_k=0: vLLM's "
           "log-probs are renormalised over the top-k / top-p tokens, the trainer's are not")
    for key, value in (("actor_rollout_ref.actor.entropy_coeff", actor.entropy_coeff),
                       ("actor_rollout_ref.actor.kl_loss_coef", actor.kl_loss_coef),
                       ("algorithm.kl_ctrl.kl_coef", algo.kl_ctrl.kl_coef),
                       ("algorithm.gigpo_step_weight", algo.gigpo_step_weight)):
        _check(math.isfinite(value) and value >= 0, f"{key} must be finite and >= 0")
    _check(math.isfinite(algo.kl_ctrl.target_kl) and algo.kl_ctrl.target_kl > 0 and algo.kl_ctrl.horizon >= 1,
           "algorithm.kl_ctrl.target_kl must be finite and > 0, and algorithm.kl_ctrl.horizon >= 1")
    _check(math.isfinite(cfg.critic.cliprange_value) and cfg.critic.cliprange_value > 0,
           "critic.cliprange_value must be finite and > 0")
    _check(not algo.use_kl_in_reward or estimator.token_level,
           f"algorithm.use_kl_in_reward puts a KL penalty on every token, which algorithm.adv_estimator="
           f"{algo.adv_estimator} does not read: use actor_rollout_ref.actor.use_kl_loss=true instead, or a "
           f"token-level estimator ({sorted(k for k, v in algos.ADV_ESTIMATORS.items() if v.token_level)})")
    _check(not estimator.group_relative or group_size >= 2,
           f"algorithm.adv_estimator={algo.adv_estimator} compares trajectories within a group: "
           "es_manager.train.group_size must be >= 2")
    _check(cfg.trainer.critic_warmup == 0 or estimator.uses_critic,
           f"trainer.critic_warmup needs a critic, and algorithm.adv_estimator={algo.adv_estimator} has none")
    _check(not cfg.agent_proxy.use_turn_scores or norm.method == "identity",
           "agent_proxy.reward_normalization acts on trajectory totals: with agent_proxy.use_turn_scores=true "
           "set agent_proxy.reward_normalization.method=identity")
    _check(norm.grouping != "state" or norm.method == "identity" or group_size >= 2,
           "agent_proxy.reward_normalization.grouping=state with es_manager.train.group_size=1 normalises every "
           "reward to 0: use grouping=batch or a group_size >= 2")
    _validate_rollout_filter(cfg)


def _validate_rollout_filter(cfg: RagenConfig) -> None:
    """The rollout filter's names and values (verl/trainer/core_algos.py, `select_groups`)."""
    from verl.trainer import core_algos as algos

    rollout, key = cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    strategy, value = rollout.rollout_filter_strategy, rollout.rollout_filter_value
    for name, choices in (("rollout_filter_strategy", algos.FILTER_STRATEGIES),
                          ("rollout_filter_metric", algos.FILTER_METRICS),
                          ("rollout_filter_top_p_prob_mode", algos.TOP_P_PROB_MODES)):
        setting = getattr(rollout, name)
        _check(setting in choices, f"{key}.{name}={setting!r}: choose one of {sorted(choices)}")
    _check(rollout.rollout_filter_type in ("largest", "smallest"), f"{key}.rollout_filter_type="
           f"{rollout.rollout_filter_type!r}: choose largest or smallest (RAGEN's std is largest, std_rev smallest, "
           "both with rollout_filter_metric=reward_variance)")
    allowed = {"top_p": (0 < value, "> 0 (the share of the summed score; >= 1 keeps every group)"),
               "top_k": (0 < value <= 1, "in (0, 1] (the fraction of the groups; 1 keeps every group)"),
               "top_k_abs": (value >= 1 and float(value).is_integer(), "a whole number >= 1 (the number of groups)"),
               "min_p": (0 < value <= 1, "in (0, 1] (the fraction of the best score)")}
    ok, what = allowed[strategy]
    _check(math.isfinite(value) and ok, f"{key}.rollout_filter_value={value} with rollout_filter_strategy={strategy} "
                                        f"must be {what}")
    eps = rollout.rollout_filter_selection_eps
    _check(math.isfinite(eps) and eps >= 0, f"{key}.rollout_filter_selection_eps={eps} must be finite and >= 0 "
                                            "(linear top_p stops once the kept scores reach value * sum - this)")
    _check(rollout.rollout_filter_empty_stop_steps >= 0,
           f"{key}.rollout_filter_empty_stop_steps must be >= 1, or 0 to never stop on steps with nothing kept")
    keeps_all = rollout.rollout_filter_include_zero and strategy in ("top_p", "top_k") and value >= 1
    ranks_by_std = rollout.rollout_filter_metric in ("reward_variance", "reward_std")
    _check(keeps_all or not ranks_by_std or cfg.es_manager.train.group_size >= 2,
           f"{key}.rollout_filter_metric={rollout.rollout_filter_metric} is the reward std within a group, which "
           f"needs es_manager.train.group_size >= 2: set {key}.rollout_filter_value=1 (strategy top_k or top_p, "
           "include_zero true) to turn the filter off")


def _validate_batch_sizes(cfg: RagenConfig, world_size: int) -> None:
    """The rollout batch is filtered, then split into ranks, mini-batches and micro-batches."""
    from verl.trainer.core_algos import ADV_ESTIMATORS, top_k_count

    train, rollout = cfg.es_manager.train, cfg.actor_rollout_ref.rollout
    _check(train.env_groups >= 1 and train.group_size >= 1, "es_manager.train.env_groups and group_size must be >= 1")
    _check(rollout.log_prob_micro_batch_size_per_gpu >= 1 and cfg.critic.forward_micro_batch_size_per_gpu >= 1,
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu and critic.forward_micro_batch_size_per_gpu "
           "must be >= 1")
    trainers = [("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor)]
    if ADV_ESTIMATORS[cfg.algorithm.adv_estimator].uses_critic:
        trainers.append(("critic", cfg.critic))
    strategy, value = rollout.rollout_filter_strategy, rollout.rollout_filter_value
    if strategy == "top_k":
        kept_groups = top_k_count(value, train.env_groups)
    elif strategy == "top_k_abs":
        kept_groups = min(int(value), train.env_groups)
    else:  # top_p's and min_p's count varies from step to step: select_groups fills whole mini-batches where it can
        kept_groups = None
    for key, trainer in trainers:
        mini, micro = trainer.ppo_mini_batch_size, trainer.ppo_micro_batch_size_per_gpu
        _check(mini >= 1 and micro >= 1 and trainer.ppo_epochs >= 1,
               f"{key}.ppo_mini_batch_size, ppo_micro_batch_size_per_gpu and ppo_epochs must be >= 1")
        _check(mini % world_size == 0,
               f"{key}.ppo_mini_batch_size = {mini} is not divisible by the number of ranks ({world_size})")
        _check((mini // world_size) % micro == 0, f"{key}.ppo_mini_batch_size per rank = {mini // world_size} is "
               f"not divisible by {key}.ppo_micro_batch_size_per_gpu = {micro}")
        batch_size = train.env_groups * train.group_size
        _check(batch_size % mini == 0, f"es_manager.train.env_groups * group_size = {batch_size} is not divisible "
               f"by {key}.ppo_mini_batch_size = {mini}")
        if kept_groups is not None:
            kept = kept_groups * train.group_size
            _check(kept % mini == 0, f"the rollout filter ({strategy} {value:g} of es_manager.train.env_groups = "
                   f"{train.env_groups}) keeps {kept_groups} groups = {kept} trajectories, which must be a non-zero "
                   f"multiple of {key}.ppo_mini_batch_size = {mini}: change one of them "
                   "(actor_rollout_ref.rollout.rollout_filter_value=1 turns the filter off)")


def _validate_envs(cfg: RagenConfig) -> None:
    """Each mix must name defined envs and add up to its env_groups."""
    for split, groups in (("train", cfg.es_manager.train), ("val", cfg.es_manager.val)):
        mix, key = groups.env_configs, f"es_manager.{split}"
        _check(groups.env_groups >= 1 and groups.group_size >= 1, f"{key}.env_groups and group_size must be >= 1")
        _check(len(mix.tags) > 0 and len(mix.n_groups) in (0, len(mix.tags)),
               f"{key}.env_configs.tags must be non-empty and n_groups empty (an even split) or one per tag")
        n_groups = mix.groups_per_tag(groups.env_groups)
        _check(sum(n_groups) == groups.env_groups and min(n_groups) >= 1,
               f"{key}.env_configs.n_groups = {n_groups} must be >= 1 each and sum to {key}.env_groups = "
               f"{groups.env_groups}")
        for tag in mix.tags:
            _check(tag in cfg.custom_envs, f"{key}.env_configs.tags: {tag!r} is not defined under custom_envs "
                                           f"(defined: {sorted(cfg.custom_envs)})")
    for tag, env in cfg.custom_envs.items():
        _check(env.max_actions_per_traj >= 1, f"custom_envs.{tag}.max_actions_per_traj must be >= 1")
        if env.served:  # the server knows its env types and checks env_config (at the health check, before a rollout)
            _validate_server(f"custom_envs.{tag}.server", env.server)
            continue
        _check(env.env_type in ENV_REGISTRY,
               f"custom_envs.{tag}.env_type={env.env_type!r}: registered types are {sorted(ENV_REGISTRY)}")
        try:
            check_env_config(env.env_type, dict(env.env_config))
        except ValueError as e:
            raise ConfigError(f"custom_envs.{tag}.env_config: {e}") from e


def _validate_server(key: str, server: EnvServerConfig) -> None:
    _check(not (server.url and server.spawn), f"{key}: give url (a running server) or spawn=true, not both")
    if server.url is not None:
        url = urllib.parse.urlsplit(server.url)
        _check(url.scheme in ("http", "https") and url.hostname,
               f"{key}.url={server.url!r} must look like http://127.0.0.1:8000")
    _check(server.workers >= 1, f"{key}.workers must be >= 1")
    _check(server.timeout_s > 0 and server.retries >= 0, f"{key}: timeout_s must be > 0 and retries >= 0")
    if server.python is not None:
        _check(server.spawn, f"{key}.python is the spawned servers' interpreter: set {key}.spawn=true too")
        _check(os.access(server.python, os.X_OK), f"{key}.python={server.python!r} is not an executable file")


def _validate_curriculum(cfg: RagenConfig) -> None:
    """The training curriculum (ragen/curriculum.py): every level must make a valid env of every training tag."""
    from ragen.curriculum import CURRICULA  # it imports this module

    curriculum, key = cfg.es_manager.train.curriculum, "es_manager.train.curriculum"
    _check(cfg.es_manager.val.curriculum.type == "none", "es_manager.val.curriculum.type must be none: validation "
           "plays the same start states every time so that its curves compare; set es_manager.train.curriculum")
    _check(curriculum.type in ("none", *CURRICULA),
           f"{key}.type={curriculum.type!r}: choose one of {['none', *CURRICULA]}")
    if curriculum.type == "none":
        return
    levels = list(curriculum.levels)
    _check(len(levels) > 0, f"{key}.levels is empty: give the values of {key}.key={curriculum.key!r} from easy to "
                            "hard, e.g. [5,10,20,30]")
    _check(len(set(levels)) == len(levels), f"{key}.levels={levels}: each value may appear once")
    for tag in cfg.es_manager.train.env_configs.tags:
        spec = cfg.custom_envs[tag]
        if spec.served:  # its server checks each level's env_config when the session starts
            continue
        fields = typing.get_type_hints(ENV_REGISTRY[spec.env_type][1])
        _check(fields.get(curriculum.key) is int,
               f"{key}.key={curriculum.key!r} is not an int field of the {spec.env_type} config of training tag "
               f"{tag!r}: choose one of {sorted(name for name, kind in fields.items() if kind is int)}")
        for level in levels:
            try:
                check_env_config(spec.env_type, dict(spec.env_config) | {curriculum.key: level})
            except ValueError as e:
                raise ConfigError(f"{key}.levels: {curriculum.key}={level!r} is not valid for training tag "
                                  f"{tag!r}: {e}") from e
    if curriculum.type == "schedule":
        _check(curriculum.steps >= 1, f"{key}.steps must be >= 1 (the step at which the schedule's centre reaches the hardest level)")
        _check(math.isfinite(curriculum.sigma) and curriculum.sigma > 0, f"{key}.sigma must be finite and > 0 (the "
               "Gaussian's width in levels, e.g. 0.5)")
        _check(math.isfinite(curriculum.mu_exp) and curriculum.mu_exp > 0, f"{key}.mu_exp must be finite and > 0 "
               "(1: the centre moves linearly; < 1: it leaves the easy levels sooner)")
    if curriculum.type == "adaptive":
        _check(curriculum.window >= 1, f"{key}.window must be >= 1 (steps at a level before it may change)")
        _check(0 <= curriculum.target_success_low < curriculum.target_success_high <= 1,
               f"{key}: need 0 <= target_success_low < target_success_high <= 1, got "
               f"{curriculum.target_success_low} and {curriculum.target_success_high}")


def _validate_env_failures(cfg: RagenConfig) -> None:
    """What an env.step that raises or hangs may cost (ragen/env_state_manager.py)."""
    es = cfg.es_manager
    _check(es.env_step_timeout_s is None or (math.isfinite(es.env_step_timeout_s) and es.env_step_timeout_s > 0),
           "es_manager.env_step_timeout_s must be finite and > 0, or null for no limit")
    _check(0 <= es.max_env_failure_share <= 1, "es_manager.max_env_failure_share must be in [0, 1] (0: stop at the "
           "first failed env.step; 1: never stop)")


def _validate_watchdog(cfg: RagenConfig) -> None:
    """The rules, and what a rollback needs: checkpoints during the run that keep their optimizer state."""
    watchdog, trainer = cfg.trainer.watchdog, cfg.trainer
    _check(watchdog.action in ACTIONS, f"trainer.watchdog.action={watchdog.action!r}: choose from {list(ACTIONS)}")
    _check(0 <= watchdog.max_rollbacks <= 40, "trainer.watchdog.max_rollbacks must be in [0, 40]: each rollback "
           "shifts the training seeds by 100,000,007, and numpy seeds are 32-bit")
    for name, rule in watchdog.rules.items():
        key = f"trainer.watchdog.rules.{name}"
        _check(rule.condition in CONDITIONS, f"{key}.condition={rule.condition!r}: choose from {list(CONDITIONS)}")
        _check(math.isfinite(rule.threshold), f"{key}.threshold must be finite")
        _check(rule.steps >= 1, f"{key}.steps must be >= 1 (steps in a row before the rule fires)")
        _check(rule.action is None or rule.action in ACTIONS,
               f"{key}.action={rule.action!r}: choose from {list(ACTIONS)}, or null for trainer.watchdog.action")
    rolls_back = any((rule.action or watchdog.action) == "rollback" for rule in watchdog.rules.values())
    _check(not rolls_back or trainer.save_freq >= 1,
           "trainer.watchdog rolls back to a checkpoint saved during the run: set trainer.save_freq >= 1")
