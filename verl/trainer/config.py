"""Config schema of the trainer core: the actor/rollout/ref worker, the algorithm, the trainer loop.

Dataclasses are the schema (types, defaults, one-line docs); `config/*.yaml` only override them.
Key names follow veRL so that users' command-line overrides carry over unchanged. Each component
receives its own sub-config, never the root.
"""

from dataclasses import dataclass, field


@dataclass
class OptimConfig:
    lr: float = 1e-6  # AdamW learning rate
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0  # 0 so that weights move only where the loss has a gradient


@dataclass
class ModelConfig:
    path: str = "${model_path}"  # resolved at start-up (bundled model, local folder or hub id)
    dtype: str = "bfloat16"  # compute dtype of forward passes (bf16 autocast); master weights stay fp32


@dataclass
class ActorConfig:
    ppo_mini_batch_size: int = 32  # trajectories per optimizer step
    ppo_micro_batch_size_per_gpu: int = 4  # trajectories per forward/backward (gradient accumulation)
    ppo_epochs: int = 1  # passes over the rollout batch per training step
    clip_ratio_low: float = 0.2  # PPO clip: ratio >= 1 - clip_ratio_low
    clip_ratio_high: float = 0.28  # decoupled upper clip: ratio <= 1 + clip_ratio_high
    entropy_coeff: float = 0.001  # entropy bonus weight (RAGEN's default)
    grad_clip: float = 1.0  # max global gradient norm
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class ValKwargs:
    """Sampling for validation and `python -m ragen.eval`; temperature 0 is greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k


@dataclass
class RolloutConfig:
    name: str = "hf"  # rollout engine: hf (transformers generate) | vllm (optional extra)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    response_length: int = 400  # max new tokens per turn
    max_model_len: int | None = None  # longest trajectory in tokens; None: the model's max_position_embeddings
    dtype: str = "bfloat16"  # weights of the rollout engine (never fp16 on CPU: no fast kernels)
    log_prob_micro_batch_size_per_gpu: int = 8  # trajectories per forward when scoring log-probs
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # key of core_algos.ADV_ESTIMATORS
    norm_adv_by_std_in_grpo: bool = True  # GRPO: divide by the group's reward std (False: Dr. GRPO)


@dataclass
class TrainerConfig:
    project_name: str = "ragen"
    experiment_name: str = "test"
    total_training_steps: int = 200
    backend: str = "ray"  # ray: workers are Ray actors; local: in-process (pdb-friendly, no Ray)
    nnodes: int = 1
    n_gpus_per_node: int = 1  # ranks per node when CUDA is available
    n_cpu_ranks_per_node: int = 1  # ranks per node on a CPU-only machine
    seed: int = 42  # seeds environments and sampling
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    test_freq: int = 10  # validate every this many steps (and after the last); -1: never during training
    val_before_train: bool = True  # validate the initial model first: the baseline of every val curve
    # every rollout's trajectories as JSONL (train/step_N.jsonl, val/step_N.jsonl); null: not saved
    rollout_data_dir: str | None = "${trainer.default_local_dir}/rollouts"


@dataclass
class RayConfig:
    address: str | None = None  # None starts a local cluster; "auto" or host:port joins one
    num_cpus_per_worker: float = 0.5  # fractional, so small machines never deadlock on CPU slots
