"""What a training run tells the researcher at its start and at its end (ragen/train.py).

The banner says where everything goes and whether the run resumes; the summary, after the last step or a
Ctrl-C, what was saved and how to go on. Both read the config and the files on disk, never the workers.
"""

import time
from pathlib import Path

import torch

from ragen.config import RagenConfig
from verl.utils import checkpoint
from verl.utils.model import cpu_has_fast_bf16, resolve_dtype
from verl.utils.tracking import duration, read_jsonl


def print_banner(cfg: RagenConfig, use_critic: bool) -> None:
    """Printed once the config and any checkpoint to resume from were checked, before a model loads."""
    trainer, run_dir = cfg.trainer, Path(cfg.trainer.default_local_dir)
    resume_from = checkpoint.resume_path(trainer)
    done = checkpoint.read_trainer_state(resume_from)["step"] if resume_from is not None else 0
    model = cfg.actor_rollout_ref.model.path  # resolved: a local folder, or a hub id
    lines = {"experiment": f"{trainer.experiment_name}, in {run_dir}/",
             "model": model if Path(model).is_dir() else f"{model} (a hub id: downloaded into the Hugging Face "
                                                           "cache unless there; trainer.verbose=true shows progress)"}
    if resume_from is None:
        lines["start"] = "from scratch" if trainer.resume_mode == "disable" else \
            "from scratch (no checkpoint to resume from)"
    else:
        lines["start"] = (f"resuming from {resume_from} (step {done}); to start over instead: "
                          "another trainer.experiment_name, or trainer.overwrite=true (moves this run aside)")
    if use_critic:
        lines["critic"] = "restored from the checkpoint" if resume_from is not None else \
            "the model's weights with a new value head, trained from scratch"
    lines["steps"] = (f"{max(trainer.total_training_steps - done, 0)} to go of {trainer.total_training_steps}; "
                      "time per step: estimated after the first one")
    lines["checkpoints"] = f"{run_dir}/global_step_<N>/, {saved_when(trainer.save_freq)}"
    lines |= destinations(cfg)
    lines["compute"] = compute_line(cfg)
    print("\n".join(f"[ragen] {key:<12} {value}" for key, value in lines.items()), flush=True)


def compute_line(cfg: RagenConfig, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The dtypes the actor and the rollout engine compute in on this machine (`auto`: bf16 on a GPU or a CPU with
    fast bf16, else fp32), and for bf16 chosen on another CPU, where bf16 matmuls ran at half fp32's speed
    (docs/engines-speed-memory.md), how to check and switch. No guess where the CPU's flags cannot be read
    (/proc/cpuinfo)."""
    given = (cfg.actor_rollout_ref.model.dtype, cfg.actor_rollout_ref.rollout.dtype)
    actor, engine = (resolve_dtype(dtype, cpuinfo) for dtype in given)
    line = f"actor in {actor}, rollout engine in {engine}"
    if "auto" in given:
        line += " (auto: bf16 on a GPU or a CPU with AMX or AMD's avx512_bf16, else fp32)"
    if "bfloat16" in (actor, engine) and not torch.cuda.is_available() and cpuinfo.is_file() \
            and not cpu_has_fast_bf16(cpuinfo):
        line += ("; bf16 on a CPU without AMX or AMD's avx512_bf16, where fp32 may be faster: "
                 "python scripts/benchmark_step.py prints both matmul peaks; actor_rollout_ref.model.dtype=auto "
                 "actor_rollout_ref.rollout.dtype=auto switch to fp32 here")
    return line


def destinations(cfg: RagenConfig) -> dict[str, str]:
    """Where the metrics, plots, rollout records and trajectory pages of the run go."""
    trainer, logging, run_dir = cfg.trainer, cfg.logging, Path(cfg.trainer.default_local_dir)
    metrics = {"console": "this console", "jsonl": f"{run_dir}/metrics.jsonl",
               "wandb": f"Weights & Biases project {trainer.project_name} (offline: {run_dir}/wandb/)",
               "tensorboard": f"{run_dir}/tensorboard/"}
    pages = Path(logging.log_image_dir)
    return {
        "metrics": ", ".join(metrics[name] for name in trainer.logger),
        "plots": f"{run_dir}/plots/ after the last step (any time: python -m ragen.plot {run_dir})"
                 if "jsonl" in trainer.logger else "none (they are drawn from the jsonl logger's metrics)",
        "records": f"{trainer.rollout_data_dir}/{{train,val}}/step_<N>.jsonl" if trainer.rollout_data_dir
                   else "not saved (trainer.rollout_data_dir=null)",
        "pages": f"{pages}/index.html (python -m http.server -d {pages})" if logging.log_images
                 else "none (logging.log_images=false)",
    }


def summary(cfg: RagenConfig, started: float, plots: list[Path] | None = None, watchdog_stop: bool = False) -> str:
    """What the run saved since `started` (time.time()) and how to go on; `plots` None: interrupted (by
    Ctrl-C, or with `watchdog_stop` by the watchdog)."""
    trainer, run_dir = cfg.trainer, Path(cfg.trainer.default_local_dir)
    metrics_file = run_dir / "metrics.jsonl"
    fresh = metrics_file.is_file() and metrics_file.stat().st_mtime >= started  # not an earlier run's
    steps = [row["step"] for row in read_jsonl(metrics_file)] if fresh else []
    last = checkpoint.latest_checkpoint(run_dir)
    if not steps and last is not None and (last / checkpoint.TRAINER_STATE).stat().st_mtime >= started:
        steps = [checkpoint.read_trainer_state(last)["step"]]  # no metrics.jsonl (jsonl not in trainer.logger)
    elapsed = duration(time.time() - started)
    if plots is not None:
        head = f"finished step {trainer.total_training_steps} of {trainer.total_training_steps}, {elapsed} in"
        went_on = "the trained policy, which model_path= takes (ragen.eval, a new run)"
    elif watchdog_stop:
        head = f"stopped by the watchdog at step {steps[-1] if steps else '?'}, {elapsed} in"
        went_on = "the last one saved, maybe after the trouble began: the watchdog's report names the newest " \
                  "healthy one (trainer.resume_mode=<its path>)"
    else:
        head = (f"interrupted after step {steps[-1]} of {trainer.total_training_steps}" if steps
                else "interrupted before the first step") + f", {elapsed} in"
        went_on = "the same command resumes from it (trainer.resume_mode=auto, the default)" \
            if trainer.resume_mode == "auto" else "trainer.resume_mode=auto resumes from it"
    lines = {"checkpoint": f"{last}: {went_on}" if last is not None else
             f"none written yet ({saved_when(trainer.save_freq)}: trainer.save_freq): to start over in this folder, "
             "add trainer.overwrite=true (moves what the run wrote aside)"}
    if fresh:
        lines["metrics"] = f"{metrics_file}, steps {steps[0]}-{steps[-1]}" if steps else f"{metrics_file}"
    where = destinations(cfg)
    if plots:
        lines["plots"] = " ".join(str(p) for p in plots)
    elif fresh and steps:
        lines["plots"] = f"python -m ragen.plot {run_dir}"
    if trainer.rollout_data_dir and Path(trainer.rollout_data_dir).is_dir():
        lines["records"] = where["records"]
    if cfg.logging.log_images and Path(cfg.logging.log_image_dir).is_dir():
        lines["pages"] = where["pages"]
    return "\n".join([f"[ragen] {head}"] + [f"[ragen] {key:<12} {value}" for key, value in lines.items()])


def saved_when(save_freq: int) -> str:
    every = "every step" if save_freq == 1 else f"every {save_freq} steps"
    return f"{every} and after the last" if save_freq > 0 else "after the last step"
