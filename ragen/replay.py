"""Replay training steps from their saved batches: `python -m ragen.replay <run_dir> --step N [--save DIR]`.

Every training step saves the batch it updated on (`trainer.save_batches`: `<rollout_data_dir>/train/
step_N.batch.safetensors`, the kept trajectories after the filter). This rebuilds the run's workers from a
checkpoint's config (same backend and rank count), loads the newest checkpoint before step N that keeps its
optimizer state (step C, as a resume would), and feeds the saved batches of steps C+1..N through
`PPOTrainer.train_on`, the code that trained them; no rollout runs. Then:
- when checkpoint N exists, its weights are compared with the replayed ones tensor by tensor: bit-identical
  means the update did exactly what the saved data says; a difference points at the data (a tampered or
  mixed-up batch), a setting changed on resume, or nondeterminism (other thread counts, machine or library);
- each replayed step's losses and gradient norms are printed beside the ones in metrics.jsonl;
- `--save DIR` writes the replayed actor (and critic) as checkpoint folders, to evaluate or inspect.

Exit status: 0 when the weights are bit-identical or there is no checkpoint N to compare with; 1 when they
differ; 2 when the run cannot be replayed (the message says why).
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf
from safetensors.torch import load_file

from ragen.config import ConfigError, RagenConfig, validate
from ragen.train import make_trainer, worker_backend, world_size
from verl.utils import batch_file, checkpoint
from verl.utils.model import ModelNotFoundError, resolve_model_path
from verl.utils.tracking import Tracking, quiet_libraries, read_jsonl


class ReplayError(ValueError):
    """A run that cannot be replayed as asked; the message says why and what to do instead."""


def replay(run_dir: str | Path, step: int, save: str | Path | None = None) -> bool:
    """Replay steps C+1..`step` of the run in `run_dir`; print the weight comparison and the metrics. Returns
    False when checkpoint `step` exists and the replayed weights differ from it."""
    run_dir = Path(run_dir)
    start = start_checkpoint(run_dir, step)
    cfg, saved = run_config(run_dir, start)
    first = checkpoint.read_trainer_state(start)["step"] + 1
    try:
        batches = [batch_file.read_batch(path) for path in batch_paths(cfg, saved, range(first, step + 1))]
    except batch_file.BatchFileError as e:
        raise ReplayError(f"{e}: this step cannot be replayed") from e
    for replay_step, (batch, _) in zip(range(first, step + 1), batches):
        if len(batch) > 0 and "reply_kinds" not in batch.batch:  # the update reads it since TRICO's masks
            raise ReplayError(f"the saved batch of step {replay_step} has no reply_kinds: it was written by an "
                              "older version of the trainer; replay it with the code that trained it")
    ranks = world_size(cfg)
    check_ranks(start, ranks)
    validate(cfg, ranks)
    if not cfg.trainer.verbose:
        quiet_libraries()
    cfg.actor_rollout_ref.model.path = resolve_model_path(cfg.actor_rollout_ref.model.path)
    cfg.critic.model.path = resolve_model_path(cfg.critic.model.path)
    print(f"[ragen] replaying steps {first}..{step} of {run_dir} from {start} ({cfg.trainer.backend} backend, "
          f"{ranks} rank(s))", flush=True)
    replayed: dict[int, dict[str, float]] = {}
    with worker_backend(cfg), tempfile.TemporaryDirectory() as scratch:
        trainer = make_trainer(cfg, ranks, Tracking([], scratch), saved)  # logs nothing into the run's files
        trainer.resume()  # checkpoint C: weights, optimizer, RNG, KL controller
        for replay_step, (batch, info) in zip(range(first, step + 1), batches):
            match_threads(info)
            replayed[replay_step] = {}
            if len(batch) > 0:  # empty: the filter kept no group, and `fit` made no update either
                trainer.train_on(batch, replay_step, replayed[replay_step])
        out = Path(save) if save is not None else Path(scratch) / "replayed"
        groups = {"actor": trainer.actor_rollout_wg, "critic": trainer.critic_wg}
        parts = [part for part, group in groups.items() if group is not None]
        for part in parts:
            groups[part].save_checkpoint(str(out / part))
        recorded = run_dir / "metrics.jsonl"
        print(metrics_table(read_jsonl(recorded) if recorded.is_file() else [], replayed))
        identical = compare_checkpoint(checkpoint.step_dir(run_dir, step), out, parts)
    if save is not None:
        print(f"[ragen] replayed weights saved in {out}", flush=True)
    return identical


def start_checkpoint(run_dir: Path, step: int) -> Path:
    """The newest complete checkpoint before `step` that keeps its optimizer state."""
    path = checkpoint.newest_resumable_checkpoint(run_dir, before_step=step)
    if path is not None:
        return path
    raise ReplayError(f"{run_dir} has no checkpoint with optimizer state before step {step}: a replay starts from "
                      "one. Train with trainer.save_freq=1 and trainer.resumable_checkpoints=null to keep one for "
                      "every step (older checkpoints keep only their weights by default), or replay a later step")


def run_config(run_dir: Path, start: Path) -> tuple[RagenConfig, dict]:
    """The config the run wrote into checkpoint `start`, as the schema object and as saved. Its folders are
    this run folder's (it may have moved since: a rollout_data_dir inside the old run folder moves with it),
    and the run resumes from `start`."""
    saved = yaml.safe_load((start / checkpoint.RUN_CONFIG).read_text(encoding="utf-8"))
    config = OmegaConf.merge(OmegaConf.structured(RagenConfig), saved)
    old_dir, records = Path(saved["trainer"]["default_local_dir"]), saved["trainer"]["rollout_data_dir"]
    if records is not None and Path(records).is_relative_to(old_dir):
        config.trainer.rollout_data_dir = str(run_dir / Path(records).relative_to(old_dir))
    config.trainer.default_local_dir, config.trainer.resume_mode = str(run_dir), str(start)
    config.logging.log_image_dir = str(run_dir / "pages")  # a replay writes none; an older run's may lie outside
    return OmegaConf.to_object(config), saved


def batch_paths(cfg: RagenConfig, saved: dict, steps: range) -> list[Path]:
    """The saved batch of each of `steps`, all of which must exist."""
    # a config written before trainer.save_batches existed has no such key: its run saved none
    if not saved["trainer"].get("save_batches", False) or cfg.trainer.rollout_data_dir is None:
        raise ReplayError("the run was saved without batches (trainer.save_batches=false or trainer.rollout_data_dir="
                          "null, or it predates them): nothing to replay. Train with trainer.save_batches=true")
    paths = [batch_file.batch_path(cfg.trainer.rollout_data_dir, s) for s in steps]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise ReplayError(f"missing batch file(s) {', '.join(missing)}: those steps' batches were deleted or never "
                          "written (a run killed mid-step writes its batch again when it resumes)")
    return paths


def check_ranks(start: Path, ranks: int) -> None:
    saved_ranks = checkpoint.read_trainer_state(start)["world_size"]
    if saved_ranks != ranks:
        raise ReplayError(f"{start} was saved by {saved_ranks} rank(s) and this machine runs {ranks} with the run's "
                          "config (trainer.n_gpus_per_node with a GPU, n_cpu_ranks_per_node without): replay on a "
                          "machine like the run's, since each rank holds its own optimizer shard")


def match_threads(info: dict) -> None:
    """Sum floats in the order the run did: the driver takes the run's torch thread count. The workers take
    their share of the cores they may use (verl/single_controller/base.py), the run's only on as many cores."""
    torch.set_num_threads(info["torch_threads"])
    if len(os.sched_getaffinity(0)) != info["cpus"]:
        print(f"[ragen] warning: step {info['step']} ran on {info['cpus']} cores and this replay has "
              f"{len(os.sched_getaffinity(0))}: the workers run other thread counts, so the last bits may differ "
              f"(`taskset -c 0-{info['cpus'] - 1} python -m ragen.replay ...` gives it as many)", flush=True)


def metrics_table(recorded: list[dict], replayed: dict[int, dict[str, float]]) -> str:
    """Each replayed step's losses and gradient norms beside the ones metrics.jsonl recorded."""
    rows = {row["step"]: row for row in recorded}  # a resumed run's redone step: its last row
    lines = [f"{'step':>5}  {'metric':<28}{'run':>16}{'replay':>16}"]
    for step, metrics in replayed.items():
        for key in sorted(k for k in metrics if "loss" in k or "grad_norm" in k):
            run = rows.get(step, {}).get(key)
            same = "same" if run == metrics[key] else "differs"
            lines.append(f"{step:>5}  {key:<28}{_number(run):>16}{_number(metrics[key]):>16}  {same}")
        if not metrics:
            lines.append(f"{step:>5}  (no update: the filter kept no trajectory)")
    return "\n".join(lines)


def compare_checkpoint(expected: Path, replayed: Path, parts: list[str]) -> bool:
    """Print each part's tensors that differ from checkpoint `expected` with their max |diff|, or that all are
    bit-identical; True when all are (or when there is no such checkpoint)."""
    if not (expected / checkpoint.TRAINER_STATE).is_file():
        print(f"[ragen] no checkpoint {expected} to compare the replayed weights with")
        return True
    identical = True
    for part in parts:
        diffs = weight_differences(expected / part, replayed / part)
        differing = {name: diff for name, diff in diffs.items() if diff is not None}
        if not differing:
            print(f"[ragen] {part} vs {expected / part}: bit-identical: all {len(diffs)} tensors")
            continue
        identical = False
        print(f"[ragen] {part} vs {expected / part}: {len(differing)} of {len(diffs)} tensors differ (max |diff|):")
        for name, diff in sorted(differing.items(), key=lambda item: -item[1]):
            print(f"  {name:<60}{diff:.3e}")
    return identical


def weight_differences(expected: Path, replayed: Path) -> dict[str, float | None]:
    """{tensor name: max |diff|, None where bit-identical} over the safetensors files of two checkpoint parts
    (a full model, or a LoRA adapter)."""
    diffs = {}
    for file in sorted(expected.glob("*.safetensors")):
        want, got = load_file(file), load_file(replayed / file.name)
        for name, tensor in want.items():
            same = torch.equal(tensor, got[name])
            diffs[name] = None if same else (tensor.double() - got[name].double()).abs().max().item()
    return diffs


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.9g}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ragen.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's trainer.default_local_dir (its global_step_N checkpoints)")
    parser.add_argument("--step", type=int, required=True, help="replay up to and including this training step")
    parser.add_argument("--save", help="also save the replayed weights as checkpoint folders here")
    args = parser.parse_args()
    try:
        identical = replay(args.run_dir, args.step, args.save)
    except (ReplayError, ConfigError, ModelNotFoundError, checkpoint.ResumeError) as e:
        print(f"cannot replay: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if identical else 1)


if __name__ == "__main__":
    main()
