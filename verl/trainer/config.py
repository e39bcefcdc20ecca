"""Config schema of the trainer core: the actor/rollout/ref worker, the algorithm, the trainer loop.

Dataclasses are the schema (types, defaults, one-line docs); `config/*.yaml` only override them.
Key names follow veRL so that users' command-line overrides carry over unchanged. Each component
receives its own sub-config, never the root.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class OptimConfig:
    lr: float = 1e-6  # AdamW learning rate
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW (beta1, beta2), each in [0, 1)
    weight_decay: float = 0.0  # 0 so that weights move only where the loss has a gradient
    # constant | cosine (to min_lr_ratio * lr at the last step); stepped once per update that took an optimizer step
    lr_scheduler: str = "constant"
    lr_warmup_steps: int = 0  # linear warm-up from 0 over this many updates (at most total_training_steps)
    min_lr_ratio: float = 0.0  # cosine only
    total_training_steps: int = "${trainer.total_training_steps}"  # the cosine's length


@dataclass
class ModelConfig:
    path: str = "${model_path}"  # resolved at start-up (bundled model, local folder or hub id)
    dtype: str = "auto"  # auto (bf16 on a GPU or a fast-bf16 CPU, else fp32) | bfloat16 | float32; master weights fp32
    enable_gradient_checkpointing: bool = False  # recompute activations in backward: far less memory, ~30% slower
    cpu_offload: bool = False  # FSDP keeps the weight shards, gradients and optimizer step in CPU memory (for GPUs)


@dataclass
class LoraConfig:
    """LoRA RL (PEFT): only low-rank adapters train; the reference policy is the model with them switched off."""

    rank: int = 0  # 0: full fine-tuning
    alpha: int = 16
    target_modules: Any = "all-linear"  # "all-linear" or a list of module names, e.g. [q_proj, v_proj]
    save_merged: bool = False  # also write global_step_N/actor_merged/, a full model with the adapter merged


@dataclass
class ActorConfig:
    ppo_mini_batch_size: int = 32  # trajectories per optimizer step
    ppo_micro_batch_size_per_gpu: int = 4  # trajectories per forward/backward (gradient accumulation)
    ppo_epochs: int = 1  # passes over the rollout batch per training step
    clip_ratio_low: float = 0.2  # PPO clip: ratio >= 1 - clip_ratio_low
    clip_ratio_high: float = 0.28  # decoupled upper clip: ratio <= 1 + clip_ratio_high (StarPO-S clips higher)
    clip_ratio_c: float = 3.0  # dual clip: for A < 0 the loss is at most -A * clip_ratio_c (must be > 1)
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean
    entropy_coeff: float = 0.001  # entropy bonus weight (RAGEN's default)
    use_kl_loss: bool = False  # add kl_loss_coef * KL(policy || reference) to the loss (loads a reference model)
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"  # kl/k1 | abs | mse/k2 | low_var_kl/k3 (core_algos.KL_PENALTIES)
    grad_clip: float = 1.0  # max global gradient norm
    # truncated importance sampling: weight each token's PPO loss by min(p_trainer / p_rollout, cap), correcting
    # for the rollout engine's copy of the policy (bf16) differing from the trainer's; None: off
    tis_imp_ratio_cap: float | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class ValKwargs:
    """Sampling for validation and `python -m ragen.eval`; temperature 0 is greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k


@dataclass
class RolloutConfig:
    # rollout engine: torch (our decode loop over the model's HF layers; Llama, Qwen2/3, Mistral) |
    # hf (transformers generate; any model) | vllm (optional extra)
    name: str = "torch"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    response_length: int = 400  # max new tokens per turn
    max_model_len: int | None = None  # longest trajectory in tokens; None: the model's max_position_embeddings
    dtype: str = "auto"  # rollout weights: auto (as model.dtype's) | bfloat16 | float32 | float16 (never on CPU)
    # after every weight sync, compare fingerprints of the trainer's and the engine's live weights; a mismatch
    # stops the run (verl/utils/fingerprint.py)
    check_weight_sync: bool = True
    log_prob_micro_batch_size_per_gpu: int = 8  # trajectories per forward when scoring log-probs
    # rollout filter (StarPO-S, with RAGEN-2's strategies): train only on the start-state groups that score
    # highest (or lowest) by rollout_filter_metric, whole groups at a time (verl/trainer/core_algos.py)
    rollout_filter_strategy: str = "top_k"  # top_p | top_k | top_k_abs | min_p
    # top_p: share of the summed score (>= 1: every group) | top_k: fraction of the groups (1: every group) |
    # top_k_abs: number of groups | min_p: fraction of the best score (smallest: the lowest score / value)
    rollout_filter_value: float = 0.25
    rollout_filter_type: str = "largest"  # largest: keep the highest scores | smallest: the lowest
    # reward_variance (alias reward_std): in-group reward std | reward: mean reward | reward_sum | entropy: mean
    # -log-prob of the sampled tokens (the rollout's own log-probs, no extra pass) | entropy_variance (alias
    # entropy_std): the in-group std of that | length: mean generated tokens
    rollout_filter_metric: str = "reward_variance"
    rollout_filter_include_zero: bool = True  # false: first drop the groups whose score is 0 (no reward spread)
    rollout_filter_top_p_prob_mode: str = "linear"  # top_p over the scores themselves | softmax: over softmax(scores)
    rollout_filter_selection_eps: float = 0.01  # linear top_p: stop once the kept scores reach value * sum - this
    # a step whose filter keeps nothing trains on nothing; stop after this many such steps in a row (0: never)
    rollout_filter_empty_stop_steps: int = 5
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class CriticConfig:
    """The value model: the policy's architecture with a scalar head, trained on the GAE returns."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(
        enable_gradient_checkpointing="${actor_rollout_ref.model.enable_gradient_checkpointing}"))
    ppo_mini_batch_size: int = "${actor_rollout_ref.actor.ppo_mini_batch_size}"  # trajectories per optimizer step
    ppo_micro_batch_size_per_gpu: int = "${actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu}"
    forward_micro_batch_size_per_gpu: int = "${actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu}"
    ppo_epochs: int = "${actor_rollout_ref.actor.ppo_epochs}"
    cliprange_value: float = 0.5  # new values stay within old values +- this in the clipped value loss
    grad_clip: float = 1.0
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive (Ziegler et al.: steer the coefficient towards target_kl)
    kl_coef: float = 0.001  # (initial) coefficient of the KL penalty in the reward
    target_kl: float = 0.1  # adaptive only
    horizon: int = 10000  # adaptive only: samples over which the coefficient may change by ~20%


# the kinds of generated text, for TRICO's selective masks (`algorithm.loss_spans`, `algorithm.adv_spans`): inside
# <think> (outside the two state spans), inside <observation>, inside <prediction>, inside <answer>, and the rest
# (the tags themselves, text outside them, the end-of-turn token)
REPLY_KINDS = ("think", "observation", "prediction", "answer", "format")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "gae"  # key of core_algos.ADV_ESTIMATORS; gae and bi_level_gae train a critic
    gamma: float = 1.0  # token-level discount (gae, bi_level_gae, reinforce_plus_plus)
    lam: float = 1.0  # GAE lambda
    high_level_gamma: float = 0.95  # discount across turns (bi_level_gae, gigpo)
    norm_adv_by_std_in_grpo: bool = True  # grpo/gigpo: divide by the group's reward std (False: Dr. GRPO)
    whiten_advantages: bool = True  # gae/bi_level_gae: zero mean, unit std over the batch's tokens (as veRL)
    gigpo_step_weight: float = 1.0  # gigpo: weight of the step-level (same-state) advantage
    adv_mask: str = "response"  # tokens that carry advantages and values: response | trajectory (state tokens too)
    # TRICO's loss mask (VAGEN): the kinds of generated text (REPLY_KINDS) the policy loss covers; within adv_spans
    loss_spans: list[str] = field(default_factory=lambda: list(REPLY_KINDS))
    # TRICO's advantage mask: the kinds of generated text that carry advantages and values (and every turn's last
    # token, where its reward sits)
    adv_spans: list[str] = field(default_factory=lambda: list(REPLY_KINDS))
    # no actor step on a batch where every group's rewards are equal: its advantages are 0 or critic noise
    skip_zero_variance_batches: bool = True
    use_kl_in_reward: bool = False  # subtract kl_ctrl.kl_coef * KL(old || ref) from each generated token's reward
    kl_penalty: str = "kl"  # estimator of that KL (core_algos.KL_PENALTIES)
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)


@dataclass
class WatchdogRule:
    """One rule of the training-health watchdog (verl/trainer/watchdog.py)."""

    metric: str  # a key of metrics.jsonl, e.g. actor/entropy
    condition: str = "below"  # below | above (the threshold) | nonfinite (NaN or inf)
    threshold: float = 0.0
    steps: int = 1  # fire after this many steps in a row (steps without the metric do not count)
    action: str | None = None  # warn | stop | rollback | off; null: trainer.watchdog.action


def default_watchdog_rules() -> dict[str, WatchdogRule]:
    """Signals of a run going wrong, with thresholds far from what a healthy CPU recipe shows on the bundled
    model (bandit learning: entropy 0.9 -> 0.6, repetition 0.36 -> 0.59, in-group std 0.04-0.3, collapse/mi
    0.3-0.4 nats; sokoban's first step: collapse/mi 0.2; rollout_kl 0.0015 with the bf16 engine)."""
    return {
        "reward_std_zero": WatchdogRule(metric="rollout/in_group_std", condition="below", threshold=1e-6, steps=5),
        "entropy_floor": WatchdogRule(metric="actor/entropy", condition="below", threshold=0.05, steps=3),
        "repetition_ceiling": WatchdogRule(metric="rollout/response_repetition", condition="above", threshold=0.95,
                                           steps=3),
        "template_collapse": WatchdogRule(metric="collapse/mi", condition="below", threshold=0.02, steps=3),
        "logprob_mismatch": WatchdogRule(metric="actor/rollout_kl", condition="above", threshold=0.05, steps=2),
        "nonfinite_updates": WatchdogRule(metric="actor/nonfinite_skipped_steps", condition="above", threshold=0.0,
                                          steps=2),
        "nonfinite_loss": WatchdogRule(metric="actor/pg_loss", condition="nonfinite", steps=1),
    }


@dataclass
class WatchdogConfig:
    """Rules over each step's metrics that warn, stop the run with a report, or roll it back to the newest
    checkpoint saved while no rule was tripping and go on with other seeds (docs/reading-a-run.md,
    'Training health')."""

    action: str = "warn"  # off | warn | stop | rollback: what a firing rule does unless it names its own action
    rules: dict[str, WatchdogRule] = field(default_factory=default_watchdog_rules)
    max_rollbacks: int = 3  # then the next rollback stops the run instead


@dataclass
class TrainerConfig:
    project_name: str = "ragen"
    experiment_name: str = "test"
    total_training_steps: int = 200
    backend: str = "ray"  # ray: workers are Ray actors; local: in-process (pdb-friendly, no Ray)
    nnodes: int = 1
    n_gpus_per_node: int = 1  # ranks per node when CUDA is available
    n_cpu_ranks_per_node: int = 1  # ranks per node on a CPU-only machine
    seed: int = 42  # seeds the training start states (seed + step * env_groups + group) and sampling
    # validation start states are seeds val_seed + group: the same whatever trainer.seed, never trained on
    val_seed: int = 1_000_000
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    # also the libraries' output: per-worker model load/save progress bars, load reports, Ray's notices
    verbose: bool = False
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    test_freq: int = 10  # validate every this many steps (and after the last); -1: never after val_before_train
    val_before_train: bool = True  # validate the initial model first: the baseline of every val curve
    critic_warmup: int = 0  # train only the critic for this many steps first (< total_training_steps)
    save_freq: int = 20  # checkpoint every this many steps (and after the last); -1: only after the last
    resume_mode: str = "auto"  # auto: from the latest checkpoint in default_local_dir, if any | disable | <path>
    resume_force: bool = False  # resume even though model, LoRA shape, estimator or training envs changed
    # a run starts afresh or branches only into an empty default_local_dir; true: whatever is there is first
    # renamed to <default_local_dir>.old-<time>/ (never deleted), and the run starts in an empty folder
    overwrite: bool = False
    max_actor_ckpt_to_keep: int | None = 2  # keep only the newest N checkpoints; null keeps all
    # the newest N checkpoints keep their optimizer state (a resume needs it); older ones keep only their
    # weights, a third of the size (to evaluate, or to start a new run from); null: every checkpoint keeps it.
    # 2: one to fall back to if the newest is damaged (the newest one that verifies is kept resumable anyway)
    resumable_checkpoints: int | None = 2
    # stop after this many steps in a row whose update skipped an optimizer step (non-finite gradient); 0: never
    max_consecutive_nonfinite_steps: int = 3
    # every rollout's trajectories as JSONL (train/step_N.jsonl, val/step_N.jsonl); null: not saved
    rollout_data_dir: str | None = "${trainer.default_local_dir}/rollouts"
    # also each training step's update batch (the kept trajectories) as train/step_N.batch.safetensors there,
    # ~0.1-0.3 MB a step on the CPU recipes: `python -m ragen.replay` feeds it through that step's update again
    save_batches: bool = True
    # template collapse (RAGEN-2): mutual information between first prompts and first replies, cross-scored by
    # the policy on this many distinct first prompts per step (collapse/* metrics, verl/trainer/collapse.py); 0: off
    collapse_mi_inputs: int = 4
    collapse_mi_replies: int = 2  # replies per first prompt; each is scored under every input
    # training-health rules: warn (default), stop or roll back when a run goes wrong (verl/trainer/watchdog.py)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)


@dataclass
class RayConfig:
    address: str | None = None  # None starts a local cluster; "auto" or host:port joins one
    num_cpus_per_worker: float = 0.5  # fractional, so small machines never deadlock on CPU slots
