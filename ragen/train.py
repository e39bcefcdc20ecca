"""Train an agent: `python -m ragen.train --config-name sokoban key=value ...` (what `train.sh` runs).

Start-up order matters: the config is checked completely before any model loads or worker starts, so a
typo costs a second, not a model load. Ray (when `trainer.backend=ray`) is started here and shut down on
every exit path, Ctrl-C and errors included. The run opens with a banner and ends, Ctrl-C included, with a
summary of what it saved (ragen/run_report.py).
"""

import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import OmegaConf

from ragen.agent_proxy import AgentProxy
from ragen.plot import plot_run
from ragen.run_report import print_banner, summary
from ragen.trajectory_browser import write_index, write_step
from ragen.config import ConfigError, EnvGroupsConfig, RagenConfig, validate
from ragen.context_manager import ANSWER_CLOSE, ContextManager
from ragen.env_state_manager import EnvStateManager
from ragen.envs.remote import RemoteEnvError, stop_servers
from ragen.overrides import rewrite_argv
from verl.single_controller import LocalWorkerGroup, RayWorkerGroup, WorkerDiedError
from verl.single_controller.worker_group import gpu_placement_group, node_placement_group
from verl.trainer.core_algos import ADV_ESTIMATORS
from verl.trainer.ppo_trainer import PPOTrainer
from verl.trainer.watchdog import WatchdogStop
from verl.utils import checkpoint, memory, run_folder
from verl.utils.fingerprint import WeightSyncError
from verl.utils.model import (ModelNotFoundError, eos_token_ids, load_processor, load_tokenizer,
                              max_context_length, resolve_dtype, resolve_model_path)
from verl.utils.tracking import Tracking, quiet_libraries
from verl.workers.actor import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker
from verl.workers.rollout import SamplingParams

GPU_SHARE = 0.5  # the actor and critic worker groups share each GPU (colocated), as in veRL


def world_size(cfg: RagenConfig) -> int:
    per_node = cfg.trainer.n_gpus_per_node if torch.cuda.is_available() else cfg.trainer.n_cpu_ranks_per_node
    return per_node * cfg.trainer.nnodes


def run(cfg: RagenConfig) -> list[Path]:
    """Train; return the learning-curve PNGs drawn after the last step."""
    ranks = world_size(cfg)
    validate(cfg, ranks)
    if not cfg.trainer.verbose:
        quiet_libraries()
    run_config = OmegaConf.to_container(OmegaConf.structured(cfg))  # saved with each checkpoint, paths as given
    # a model that does not exist is named as such, before a resume could call it a changed setting
    cfg.actor_rollout_ref.model.path = resolve_model_path(cfg.actor_rollout_ref.model.path)
    cfg.critic.model.path = resolve_model_path(cfg.critic.model.path)
    # another run's folder, a damaged checkpoint: stop now
    run_folder.claim(cfg.trainer, run_config, own=hydra_output_dir())
    checkpoint.check_resume(cfg.trainer, ranks, run_config)  # a checkpoint this run cannot continue: stop now
    use_critic = ADV_ESTIMATORS[cfg.algorithm.adv_estimator].uses_critic
    use_reference = cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    run_folder.check_writable(cfg.trainer.default_local_dir, checkpoint_bytes(cfg, use_critic))
    print_banner(cfg, use_critic)
    check_memory(cfg, ranks, use_critic, use_reference)
    tracker = Tracking(cfg.trainer.logger, cfg.trainer.default_local_dir, cfg.trainer.project_name,
                       cfg.trainer.experiment_name, config=run_config)
    with worker_backend(cfg), finishing(tracker):
        make_trainer(cfg, ranks, tracker, run_config).fit()
    return plot_run(cfg.trainer.default_local_dir) if "jsonl" in cfg.trainer.logger else []


def hydra_output_dir() -> Path | None:
    """The folder Hydra made for this run (`hydra.run.dir`), or None outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None


def make_trainer(cfg: RagenConfig, ranks: int, tracker: Tracking, run_config: dict) -> PPOTrainer:
    """The run's worker groups (started, models loaded), rollout agents and trainer, inside `worker_backend`:
    what `run` trains with and `python -m ragen.replay` replays steps with."""
    actor = cfg.actor_rollout_ref.actor
    tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.path)
    use_critic = ADV_ESTIMATORS[cfg.algorithm.adv_estimator].uses_critic
    use_reference = actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    placement = rank_placement(cfg, ranks)
    actor_rollout_wg = make_worker_group(cfg, ActorRolloutRefWorker, (cfg.actor_rollout_ref, cfg.lora), ranks,
                                         placement)
    if cfg.trainer.backend == "ray":
        print(f"[ragen] Ray nodes of the actor ranks: {' '.join(actor_rollout_wg.node_ids)}", flush=True)
    actor_rollout_wg.init_model(use_reference=use_reference)
    critic_wg = make_worker_group(cfg, CriticWorker, (cfg.critic,), ranks, placement) if use_critic else None
    if critic_wg is not None:
        critic_wg.init_model()
    agent = make_agent(cfg, "train", actor_rollout_wg, tokenizer)
    val_agent = make_agent(cfg, "val", actor_rollout_wg, tokenizer)
    mini_batch = np.lcm(actor.ppo_mini_batch_size, cfg.critic.ppo_mini_batch_size if use_critic else 1)
    return PPOTrainer(cfg.trainer, cfg.algorithm, cfg.actor_rollout_ref.rollout, actor_rollout_wg, critic_wg, agent,
                      tracker, val_agent, use_reference=use_reference, samples_multiple=int(mini_batch),
                      on_policy_batch=actor.ppo_mini_batch_size if actor.ppo_epochs == 1 else 0,
                      on_records=trajectory_pages(cfg), run_config=run_config,
                      curriculum=agent.env_manager.curriculum)


def trajectory_pages(cfg: RagenConfig):
    """HTML pages of the trajectories of training steps 1, every `log_image_step_size`-th and the last (a
    short run shows its start and end), and of every validation (the same start states each time, so a
    level can be compared across steps), each with a fresh index (`<log_image_dir>/`, inside the run folder;
    `python -m http.server -d <log_image_dir>`)."""
    logging, last = cfg.logging, cfg.trainer.total_training_steps
    pages_dir = Path(logging.log_image_dir)

    def on_records(records: list[dict], split: str, step: int) -> None:
        due = split == "val" or step in (1, last) or step % logging.log_image_step_size == 0
        if logging.log_images and due:
            write_step(records, pages_dir, step, logging.log_n_image_per_batch, cfg.custom_envs, split)
            write_index(pages_dir)

    return on_records


@contextmanager
def finishing(tracker: Tracking):
    """Close the loggers (wandb uploads, tensorboard flushes) on every exit path."""
    try:
        yield
    finally:
        tracker.finish()


def checkpoint_bytes(cfg: RagenConfig, use_critic: bool) -> int:
    """About the size of one checkpoint: the weights as saved and two fp32 Adam moments per trained parameter
    (the optimizer state), for the actor and the critic."""
    shape = memory.model_shape(cfg.actor_rollout_ref.model.path)
    weight_bytes = 2 if resolve_dtype(cfg.actor_rollout_ref.model.dtype) == "bfloat16" else 4
    trained = memory.lora_params(cfg.actor_rollout_ref.model.path, cfg.lora.rank, cfg.lora.target_modules) \
        if cfg.lora.rank > 0 else shape.params
    return shape.params * weight_bytes + trained * 8 + (shape.params * (4 + 8) if use_critic else 0)


def check_memory(cfg: RagenConfig, ranks: int, use_critic: bool, use_reference: bool) -> None:
    """Print the per-rank memory estimate (verl/utils/memory.py); stop if it exceeds what a rank has."""
    actor, rollout, lora = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.lora
    shape = memory.model_shape(cfg.actor_rollout_ref.model.path)
    trainable = memory.lora_params(cfg.actor_rollout_ref.model.path, lora.rank, lora.target_modules) / shape.params \
        if lora.rank > 0 else 1.0
    tokens = 500 + cfg.agent_proxy.max_turn * (rollout.response_length + 150)  # an upper guess of a trajectory
    parts = memory.estimate_per_rank(
        shape, world_size=ranks, sharded=False, trainable_fraction=trainable, reference=use_reference and lora.rank == 0,
        critic=use_critic, rollout_bytes=2 if resolve_dtype(rollout.dtype) != "float32" else 4,
        micro_batch=max(actor.ppo_micro_batch_size_per_gpu, rollout.log_prob_micro_batch_size_per_gpu),
        tokens=min(tokens, rollout.max_model_len or tokens),
        generated_tokens=cfg.agent_proxy.max_turn * rollout.response_length,
        checkpointing=cfg.actor_rollout_ref.model.enable_gradient_checkpointing)
    total = sum(parts.values())
    available = memory.available_per_rank(ranks // cfg.trainer.nnodes)
    print(f"[ragen] memory per rank (estimate): {total:.1f} GiB of {available:.1f} GiB = "
          + ", ".join(f"{k} {v:.2f}" for k, v in parts.items() if v), flush=True)
    if total > available:
        raise ConfigError(f"the estimated {total:.1f} GiB per rank exceed the {available:.1f} GiB a rank has: use "
                          "more ranks (trainer.n_gpus_per_node / nnodes), lora.rank > 0, smaller micro-batches, or "
                          "actor_rollout_ref.model.enable_gradient_checkpointing=true")


def rank_placement(cfg: RagenConfig, ranks: int):
    """Where the Ray ranks run, shared rank by rank by the actor and critic groups. GPUs: one bundle per GPU.
    Several CPU nodes: one bundle per node, each on a different node. One CPU node: no placement group."""
    if cfg.trainer.backend == "local":
        return None
    import ray

    if (nodes := sum(node["Alive"] for node in ray.nodes())) < cfg.trainer.nnodes:
        raise ConfigError(f"trainer.nnodes={cfg.trainer.nnodes} but the Ray cluster has {nodes} node(s): start Ray "
                          "on every node and join it with ray.address (docs/checkpoints.md, 'Several machines'), or lower nnodes")
    num_cpus = 2 * cfg.ray.num_cpus_per_worker  # an actor and a critic worker per rank
    if torch.cuda.is_available():
        return gpu_placement_group(ranks, num_cpus)
    return node_placement_group(cfg.trainer.nnodes, ranks // cfg.trainer.nnodes, num_cpus) \
        if cfg.trainer.nnodes > 1 else None


def make_worker_group(cfg: RagenConfig, worker_cls: type, configs: tuple, ranks: int, placement=None):
    """`placement`: a placement group from `rank_placement`, or None (Ray places the ranks)."""
    if cfg.trainer.backend == "local":
        return LocalWorkerGroup(worker_cls, *configs, verbose=cfg.trainer.verbose)
    return RayWorkerGroup(worker_cls, *configs, world_size=ranks, num_cpus=cfg.ray.num_cpus_per_worker,
                          num_gpus=GPU_SHARE if torch.cuda.is_available() else 0, placement_group=placement,
                          verbose=cfg.trainer.verbose)


def make_agent(cfg: RagenConfig, split: str, actor_rollout_wg, tokenizer) -> AgentProxy:
    """The rollout loop for training (`es_manager.train`, training sampling, new start states each step)
    or validation (`es_manager.val`, `rollout.val_kwargs` sampling, the same start states every time)."""
    rollout, model_path = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model.path
    groups: EnvGroupsConfig = cfg.es_manager.train if split == "train" else cfg.es_manager.val
    seed = cfg.trainer.seed if split == "train" else cfg.trainer.val_seed
    env_manager = EnvStateManager(groups, cfg.custom_envs, seed, limits=cfg.es_manager)
    context = ContextManager.for_envs(tokenizer, cfg.agent_proxy, env_manager.env_per_tag(),
                                      eos_ids=eos_token_ids(model_path, tokenizer),
                                      max_model_len=rollout.max_model_len or max_context_length(model_path),
                                      processor=load_processor(model_path))
    knobs = rollout if split == "train" else rollout.val_kwargs
    sampling = SamplingParams(temperature=knobs.temperature, top_p=knobs.top_p, top_k=knobs.top_k,
                              max_new_tokens=rollout.response_length, stop=[ANSWER_CLOSE])
    return AgentProxy(cfg.agent_proxy, sampling, cfg.es_manager.format_penalty, seed, actor_rollout_wg,
                      env_manager, context, split)


def stop_on_signals() -> None:
    """Ctrl-C (SIGINT) ends the run with its summary (`main`), also when it was started in the background of a
    script, which starts it with SIGINT ignored; so does SIGTERM (`kill`, `timeout`, a batch scheduler). Either
    way Ray and the env servers are stopped on the way out."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@contextmanager
def worker_backend(cfg: RagenConfig):
    if cfg.trainer.backend == "local":
        yield
        return
    import ray

    on_sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(address=cfg.ray.address, include_dashboard=False, configure_logging=False)
    try:
        signal.signal(signal.SIGTERM, on_sigterm)  # ray.init put its own in place: an exit without our summary
        yield
    finally:
        ray.shutdown()


@hydra.main(config_path="../config", config_name="base", version_base="1.3")
def main(cfg) -> None:
    started, config = time.time(), OmegaConf.to_object(cfg)
    try:
        plots = run(config)
    except KeyboardInterrupt:  # Ctrl-C: what was saved instead of a traceback; 130 = killed by SIGINT
        print(summary(config, started), flush=True)
        sys.exit(130)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    except ModelNotFoundError as e:
        sys.exit(f"model not found: {e}")
    except checkpoint.ResumeError as e:
        sys.exit(f"cannot resume: {e}")
    except run_folder.RunFolderError as e:
        sys.exit(f"run folder: {e}")
    except checkpoint.SaveError as e:
        sys.exit(f"stopped: {e}")
    except WeightSyncError as e:  # through Ray it also carries the worker's traceback; `cause` is the error itself
        sys.exit(f"stopped: {getattr(e, 'cause', e)}")
    except WatchdogStop as e:  # the run went wrong: its summary and the curves that show where
        plots = plot_run(config.trainer.default_local_dir) if "jsonl" in config.trainer.logger else []
        print(summary(config, started, watchdog_stop=True), flush=True)
        sys.exit(f"stopped: {e}" + (f"; plots: {' '.join(map(str, plots))}" if plots else ""))
    except WorkerDiedError as e:
        last = checkpoint.latest_checkpoint(cfg.trainer.default_local_dir)
        sys.exit(f"stopped: {e}. " + (f"The last checkpoint is {last}: run the same command with "
                                      "trainer.resume_mode=auto (the default) to resume from it"
                                      if last else "No checkpoint was written yet"))
    except RemoteEnvError as e:  # an env server that cannot be started or used, found before the first rollout
        sys.exit(f"env server: {e}")
    finally:  # spawned env servers; at exit and, should this process be killed, by the kernel too
        stop_servers()
    print(summary(config, started, plots), flush=True)


def pick_scale() -> None:
    """Batch sizes follow the machine unless the user picked a scale: RAGEN's on a GPU, small on a CPU."""
    if not any(arg.startswith(("scale=", "+scale=", "~scale")) for arg in sys.argv[1:]):
        sys.argv.append(f"scale={'gpu' if torch.cuda.is_available() else 'cpu'}")


def check_overrides() -> None:
    """Before Hydra parses the command line: old RAGEN key names become today's, with a notice, and a key the
    schema lacks stops the run (Hydra's `+key=...` would add it, and nothing would read it)."""
    try:
        sys.argv[1:] = rewrite_argv(sys.argv[1:])
    except ConfigError as e:
        sys.exit(f"config error: {e}")


if __name__ == "__main__":
    stop_on_signals()
    check_overrides()
    pick_scale()
    main()
