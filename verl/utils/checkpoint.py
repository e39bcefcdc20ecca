"""Checkpoints that resume exactly, written so that a crash never leaves one that looks complete.

Layout under `trainer.default_local_dir`:

    global_step_N/
        actor/                  Hugging Face folder (safetensors, config, tokenizer): from_pretrained loads it
        actor/train_state_rank{r}.pt   optimizer, LR scheduler and RNG state of rank r
        critic/                 the same for the critic, when there is one
        config.yaml             the run's resolved config: a resume reports and checks what changed since
        manifest.json           size and SHA-256 of every file above: a resume verifies them first
        trainer_state.json      the step, the number of ranks, KL controller, driver RNG; written last, so
                                its presence marks the checkpoint complete
    latest_checkpointed_iteration.txt   N of the checkpoint written last

A checkpoint is written into `global_step_N.tmp/`, fsynced, and renamed to `global_step_N/` only once every
worker has finished (a rename is atomic); only then does the `latest` file move to it. A checkpoint saved
again (a resumed run redoing a step) replaces the old one without a moment where a half-deleted folder
carries its name (`replace_folder`).

A resumed run keeps the state in the checkpoint (weights, optimizer moments, the schedule's position, RNG)
and takes its settings from its own config: a new learning rate or schedule applies from the first step.
Settings the checkpoint cannot continue under (`FIXED_ON_RESUME`, the number of ranks) are refused at
start-up, before any model loads (`check_resume`).

Every checkpoint carries `manifest.json`, the size and SHA-256 of each of its files, written before the
completeness marker. A checkpoint is verified against it before it is resumed from or rolled back to
(`verify`; once per process and checkpoint): a truncated or bit-flipped file is named, and `auto` resume and
rollback fall back to the newest checkpoint that verifies, saying so. Retention keeps the newest checkpoint
that verifies besides the one just written, with its optimizer state (`commit`).
"""

import hashlib
import json
import os
import random
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed.tensor  # noqa: F401  registers DTensor (FSDP2 optimizer state) with weights_only loads
import yaml

from verl.trainer.config import TrainerConfig

LATEST = "latest_checkpointed_iteration.txt"
TRAINER_STATE = "trainer_state.json"
RUN_CONFIG = "config.yaml"
MANIFEST = "manifest.json"  # {file path in the checkpoint: [bytes, sha256]}, written before TRAINER_STATE
WEIGHTS_ONLY = "weights_only"  # a checkpoint whose optimizer state was dropped (`drop_train_state`)

# Keys of the run's root config (ragen/config.py) that a resume may not change, with everything under them:
# the checkpoint's tensors would not fit (model, LoRA shape, a critic that appears or vanishes), or the steps
# after the resume would train on other start states and batches than the steps before it.
# `trainer.resume_force=true` resumes anyway.
FIXED_ON_RESUME = ("model_path", "actor_rollout_ref.model.path", "critic.model.path", "lora.rank", "lora.alpha",
                   "lora.target_modules", "algorithm.adv_estimator", "es_manager.train", "custom_envs", "trainer.seed")


class ResumeError(ValueError):
    """A checkpoint this run cannot resume from; the message says why and what to do instead."""


class SaveError(OSError):
    """A checkpoint that could not be written (full disk, read-only folder, quota); nothing of it is left."""


def save_failure(root: str | Path, step: int, error: BaseException) -> SaveError:
    """The error to stop with when saving checkpoint `step` under `root` failed with `error`: one line with the
    folder and the cause, read from the folder itself where the error's text hides it (torch's "unexpected
    pos", a worker's traceback). Call it before the staging folder is removed: a full disk is still full."""
    text = f"{error}"
    if isinstance(error, OSError) and error.strerror:
        text = error.strerror
    root = Path(root)
    try:
        stats = os.statvfs(root)
        read_only = bool(stats.f_flag & os.ST_RDONLY)
        full = stats.f_bavail * stats.f_frsize < 2**20
    except OSError:
        read_only = full = False
    if read_only or "Read-only file system" in text:
        cause = "the file system is read-only"
    elif full or "No space left" in text or "unexpected pos" in text:
        cause = "the disk is full"
    elif "quota" in text.lower():
        cause = "the disk quota is used up"
    elif not os.access(root, os.W_OK) or "Permission denied" in text:
        cause = "the folder is not writable"
    else:
        cause = text.strip().splitlines()[-1] if text.strip() else type(error).__name__
    return SaveError(f"could not save checkpoint {step} in {root}: {cause}. Nothing of it was kept, and the "
                     "checkpoints before it are untouched; free space or fix the folder, then run the same command "
                     "to resume from the latest one")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def staging_path(root: str | Path, step: int) -> Path:
    """Where checkpoint `step` is written before it is renamed into place."""
    return step_dir(root, step).with_suffix(".tmp")


def staging_dir(root: str | Path, step: int) -> Path:
    """An empty folder to write checkpoint `step` into (a leftover of a crashed save is removed)."""
    staging = staging_path(root, step)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def commit(staging: Path, step: int, trainer_state: dict, run_config: dict, keep: int | None,
           resumable: int | None = None) -> Path:
    """Finish a checkpoint: the run's config, the manifest, the trainer state (the completeness marker, written
    last), the swap into place, the `latest` pointer, then pruning: `keep` checkpoints in all, the newest
    `resumable` of them with their optimizer state (None: all of them). Older checkpoints neither pruned nor
    stripped whatever those numbers: the newest saved while no watchdog rule that stops or rolls back was
    tripping (`healthy`), where a rollback goes (verl/trainer/watchdog.py), and, unless `keep` or `resumable`
    is 1, the newest one that verifies, where a resume falls back to if the new one is damaged later."""
    (staging / RUN_CONFIG).write_text(yaml.safe_dump(run_config, sort_keys=False), encoding="utf-8")
    write_manifest(staging)
    (staging / TRAINER_STATE).write_text(json.dumps({**trainer_state, "rng": driver_rng_state()}), encoding="utf-8")
    final = step_dir(staging.parent, step)
    replace_folder(staging, final)  # the same step saved again (a resumed run redoing it): the new one wins
    _verified[_files_key(final)] = None  # its manifest was just computed from these files: not hashed again
    _write_atomic(staging.parent / LATEST, str(step))
    protected = {newest_resumable_checkpoint(staging.parent, before_step=step + 1, healthy_only=True, verified=True)}
    if keep != 1 and resumable != 1:
        protected.add(newest_resumable_checkpoint(staging.parent, before_step=step, verified=True))
    if keep is not None:
        prune(staging.parent, step, keep, protected)
    if resumable is not None:
        older = sorted(s for s in _complete_steps(staging.parent) if s < step)
        for old in older[:max(0, len(older) - (resumable - 1))]:
            if step_dir(staging.parent, old) not in protected:
                drop_train_state(step_dir(staging.parent, old))
    return final


def write_manifest(folder: Path) -> None:
    """The size and SHA-256 of every file under `folder`, as `folder/manifest.json`."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST, TRAINER_STATE))
    manifest = {str(p.relative_to(folder)): [p.stat().st_size, _sha256(p)] for p in files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


_verified: dict[tuple, str | None] = {}  # (folder, (file, size, mtime) of each file) -> verify's answer


def verify(folder: str | Path) -> str | None:
    """What is wrong with checkpoint `folder` against its manifest (a missing file, a size or checksum that
    differs, an unreadable marker), or None when it is whole. A checkpoint without a manifest (written by an
    earlier RAGEN) has nothing to check against and passes. A checkpoint is read again only once a file of it
    changed (size or modification time)."""
    folder = Path(folder)
    if not (folder / TRAINER_STATE).is_file():
        return f"{folder / TRAINER_STATE} is missing: the checkpoint is incomplete"
    try:
        key = _files_key(folder)
    except FileNotFoundError as e:  # replaced while being listed (a save of the same step): not cached
        return f"{e.filename} vanished while it was read"
    if key not in _verified:
        _verified[key] = _problem(folder)
    return _verified[key]


def _files_key(folder: Path) -> tuple:
    """The folder and the size and modification time of each of its files: what `verify` caches its answer by."""
    return (str(folder.resolve()), tuple(sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                                                for p in folder.rglob("*") if p.is_file())))


def _problem(folder: Path) -> str | None:
    try:
        json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"{folder / TRAINER_STATE} is unreadable ({e})"
    if not (folder / MANIFEST).is_file():
        return None
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"{folder / MANIFEST} is unreadable ({e})"
    weights_only = (folder / WEIGHTS_ONLY).exists()
    for name, (size, digest) in manifest.items():
        path = folder / name
        if weights_only and path.name.startswith("train_state_rank"):
            continue  # dropped on purpose (`drop_train_state`)
        try:
            if path.stat().st_size != size:
                return f"{path} has {path.stat().st_size} bytes, {size} when saved (cut short or overwritten)"
            if _sha256(path) != digest:
                return f"{path} has other contents than when saved (checksum differs: the file is damaged)"
        except OSError as e:
            return f"{path} is missing" if isinstance(e, FileNotFoundError) else f"{path} is unreadable ({e})"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def abandon_after(root: str | Path, step: int) -> None:
    """A watchdog rollback to checkpoint `step`: the checkpoints after it hold the steps it undid. The
    `latest` pointer moves to `step` first (a crash now resumes where the run went back to), then they go."""
    _write_atomic(Path(root) / LATEST, str(step))
    for later in _complete_steps(Path(root)):
        if later > step:
            remove(step_dir(root, later))


def drop_train_state(folder: Path) -> None:
    """Keep a checkpoint's weights but not its optimizer state: it can still be evaluated or start a new run
    (`model_path=`), not be resumed. Marked first, so that a crash midway leaves it marked."""
    (folder / WEIGHTS_ONLY).touch()
    for file in folder.glob("*/train_state_rank*.pt"):
        file.unlink()


def prune(root: Path, step: int, keep: int, protected: set[Path | None] = frozenset()) -> None:
    """Keep the `keep` newest checkpoints of the run that has just written `step`: `step` itself, which
    always stays, and those before it, and the `protected` ones besides. Checkpoints after `step` were written
    by this run's lineage before it resumed from an earlier point, an abandoned future: they go first, so
    that what this run writes survives (ragen/run_folder.py lets a run resume only from its own folder)."""
    steps = _complete_steps(root)
    earlier = sorted(s for s in steps if s < step)
    abandoned = [s for s in steps if s > step]
    for old in abandoned + earlier[:max(0, len(earlier) - (keep - 1))]:
        if step_dir(root, old) not in protected:
            remove(step_dir(root, old))


def replace_folder(staging: Path, target: Path) -> None:
    """Move the finished `staging` folder to `target`, replacing whatever was there. A crash at any point
    leaves under `target` the old folder whole, the new one whole, or nothing; never half of one.

    The files are fsynced first, so that the rename cannot reach the disk before their contents do. The old
    folder is renamed aside, under a hidden name no reader looks at, before the new one moves in, and is
    deleted only then (deleting it in place left half-deleted checkpoints that looked complete)."""
    _fsync_tree(staging)
    aside = target.with_name(f".{target.name}.old")
    remove(aside)  # left by a crash between the two renames
    if target.exists():
        os.replace(target, aside)
    os.replace(staging, target)
    _fsync(target.parent)
    remove(aside)


def remove(folder: Path) -> None:
    """Delete a checkpoint folder, its completeness marker first: a crash mid-delete leaves an incomplete one."""
    (folder / TRAINER_STATE).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def written_whole(target: str | Path) -> Iterator[Path]:
    """A fresh staging folder next to `target` that replaces it when the block ends without error, so no
    reader ever sees a half-written `target`; after an error the staging folder is removed.

        with written_whole("models/merged") as folder:
            model.save_pretrained(folder)
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
        replace_folder(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The checkpoint written last under `root` (the `latest` pointer), or None. Only if the pointer is
    missing or names no complete checkpoint (a crash between a commit's steps): the complete one of the
    highest step that still has its optimizer state."""
    pointer = Path(root) / LATEST
    pointer_step = pointer.read_text(encoding="utf-8", errors="replace").strip() if pointer.is_file() else ""
    if pointer_step.isdigit() and (step_dir(root, int(pointer_step)) / TRAINER_STATE).is_file():
        return step_dir(root, int(pointer_step))
    steps = [s for s in _complete_steps(Path(root)) if not (step_dir(root, s) / WEIGHTS_ONLY).exists()]
    return step_dir(root, max(steps)) if steps else None


def newest_resumable_checkpoint(root: str | Path, before_step: int, healthy_only: bool = False,
                                verified: bool = False) -> Path | None:
    """The complete checkpoint of the highest step below `before_step` that still has its optimizer state:
    where a replay starts (ragen/replay.py). With `healthy_only`, also saved while no watchdog rule that
    stops or rolls back was tripping (`healthy` in its trainer state): where a rollback goes. With `verified`,
    also whole (`verify`); one that is not is passed over with a notice."""
    for step in sorted(_complete_steps(Path(root)), reverse=True):
        path = step_dir(root, step)
        if step >= before_step or (path / WEIGHTS_ONLY).exists():
            continue
        if verified and (problem := verify(path)) is not None:
            _announce(f"[ragen] passing over checkpoint {path}: {problem}")
            continue
        if not healthy_only or read_trainer_state(path)["healthy"]:
            return path
    return None


_announced: set[str] = set()


def _announce(line: str) -> None:
    """Print `line` once per process (a damaged checkpoint is passed over at every save otherwise)."""
    if line not in _announced:
        _announced.add(line)
        print(line, flush=True)


def resume_path(config: TrainerConfig) -> Path | None:
    """The checkpoint `trainer.resume_mode` names: auto, the latest one in `default_local_dir` that verifies
    (None when there is none; one that does not is passed over, saying so); disable, None; otherwise the given
    folder (`check_resume` refuses it if it does not verify)."""
    if config.resume_mode == "disable":
        return None
    if config.resume_mode != "auto":
        return Path(config.resume_mode)
    latest = latest_checkpoint(config.default_local_dir)
    if latest is None or (problem := verify(latest)) is None:
        return latest
    _announce(f"[ragen] the latest checkpoint fails verification: {problem}")
    fallback = newest_resumable_checkpoint(config.default_local_dir, before_step=read_step(latest), verified=True)
    if fallback is None:
        raise ResumeError(f"the latest checkpoint {latest} is damaged ({problem}) and no earlier one with its "
                          "optimizer state verifies: start a new run (another trainer.experiment_name), or load "
                          "an older checkpoint's weights with model_path=<its folder>")
    _announce(f"[ragen] resuming from {fallback} instead, the newest checkpoint that verifies: the steps after it "
              "are trained again")
    return fallback


def read_step(path: Path) -> int:
    """The step of a `global_step_N` folder; for a folder named otherwise, one above every step."""
    name = path.name.removeprefix("global_step_")
    return int(name) if name.isdigit() else 2**62


def check_resume(config: TrainerConfig, world_size: int, run_config: dict) -> dict[str, tuple[Any, Any]]:
    """Refuse, before any model loads, to resume from a checkpoint of another number of ranks or with other
    values of `FIXED_ON_RESUME`; print the other settings that changed since it was written (they apply from
    the first resumed step). Returns the changes: {dotted key: (checkpoint's value, this run's)}."""
    path = resume_path(config)
    if path is None:
        return {}
    if (problem := verify(path)) is not None:
        newest = newest_resumable_checkpoint(path.parent, before_step=read_step(path), verified=True)
        raise ResumeError(f"{path} is damaged: {problem}. "
                          + (f"The newest earlier checkpoint that verifies is {newest} (trainer.resume_mode={newest})"
                             if newest is not None else "No earlier checkpoint in its folder verifies"))
    state = read_trainer_state(path)
    if (path / WEIGHTS_ONLY).exists():
        raise ResumeError(f"{path} keeps only its weights (its optimizer state was dropped when newer checkpoints "
                          "were saved; trainer.resumable_checkpoints sets how many keep it): resume from the latest "
                          f"checkpoint, or start a new run from these weights with model_path={path}")
    if "world_size" not in state or not (path / RUN_CONFIG).is_file():
        raise ResumeError(f"{path} was written by an earlier RAGEN, without the rank count and config a resume "
                          "checks: start over (another trainer.experiment_name, or trainer.overwrite=true to move this run aside), "
                          "or load its weights as a model (model_path=<that folder>)")
    saved_ranks = state["world_size"]
    if saved_ranks != world_size:
        raise ResumeError(f"{path} was saved by {saved_ranks} rank(s) and this run has {world_size}: each rank "
                          f"resumes its own optimizer shard, so run {saved_ranks} rank(s) (trainer.nnodes x "
                          "trainer.n_gpus_per_node, or trainer.n_cpu_ranks_per_node without a GPU), or start "
                          "over (another trainer.experiment_name)")
    changes = config_changes(yaml.safe_load((path / RUN_CONFIG).read_text(encoding="utf-8")), run_config)
    fixed = fixed_changes(changes, FIXED_ON_RESUME)
    if fixed and not config.resume_force:
        raise ResumeError(f"{path} was trained with other values of settings a resume cannot change:\n"
                          + listed_changes(fixed) + "\nstart over (another "
                          "trainer.experiment_name), or set trainer.resume_force=true to resume anyway")
    if changes:
        print(f"resuming {path} with settings changed since it was written (they apply from here on):\n"
              + listed_changes(changes), flush=True)
    return changes


def config_changes(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old value, new value)} of every leaf that differs; "<absent>" where a key is missing."""
    old, new = _flat(old), _flat(new)
    return {key: (old.get(key, "<absent>"), new.get(key, "<absent>")) for key in sorted(old.keys() | new.keys())
            if old.get(key, "<absent>") != new.get(key, "<absent>")}


def fixed_changes(changes: dict[str, tuple[Any, Any]], fixed: tuple[str, ...]) -> dict[str, tuple[Any, Any]]:
    """The `changes` of keys named in `fixed` or lying under one of them."""
    return {key: change for key, change in changes.items()
            if any(key == name or key.startswith(name + ".") for name in fixed)}


# Trainer-state fields added after the first checkpoints, with the value that stands for "not recorded": the
# one place an older checkpoint is brought up to date, so its readers index every field plainly.
LATER_STATE_FIELDS = {"healthy": True, "rollbacks": 0, "watchdog_streaks": {}, "empty_filter_steps": 0,
                      "empty_filter_streak": 0}


def read_trainer_state(path: str | Path) -> dict:
    """The trainer state of a checkpoint folder (`rng`: the driver's, for `set_driver_rng_state`); fields an
    older checkpoint lacks get their LATER_STATE_FIELDS value."""
    state_file = Path(path) / TRAINER_STATE
    if not state_file.is_file():
        raise ResumeError(f"{path} is not a complete checkpoint (no {TRAINER_STATE}): pass a global_step_N "
                          "folder to trainer.resume_mode, or use auto")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ResumeError(f"{state_file} is unreadable ({e}): the checkpoint is damaged") from e
    return LATER_STATE_FIELDS | state


def save_train_state(path: str | Path, rank: int, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """One rank's optimizer, LR scheduler and random streams."""
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    Path(path).mkdir(parents=True, exist_ok=True)  # ranks other than 0 may get here before rank 0's weights
    torch.save(state, Path(path) / f"train_state_rank{rank}.pt")


def load_train_state(path: str | Path, rank: int, optimizer: torch.optim.Optimizer,
                     scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Restore one rank's optimizer state (moments, step counts), the schedule's position and the random
    streams. The settings stay those `optimizer` and `scheduler` were built with, this run's config: the
    saved state dicts carry the old lr, betas and weight decay, which would silently win over a new config.
    Loaded with `weights_only`: tensors and plain containers only, so a checkpoint cannot run code."""
    file = Path(path) / f"train_state_rank{rank}.pt"
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: the checkpoint was written by a run with fewer ranks; "
                                "resume with the same number of ranks")
    state = torch.load(file, weights_only=True)
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    updates_done = state["scheduler"]["last_epoch"]
    lrs = [base_lr * factor(updates_done) for base_lr, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"] | {"base_lrs": scheduler.base_lrs, "_last_lr": lrs})
    for group, setting, lr in zip(optimizer.param_groups, settings, lrs):
        group.update(setting, lr=lr)
    torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng"])


def driver_rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
            "torch": torch.get_rng_state().tolist()}


def set_driver_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def _complete_steps(root: Path) -> list[int]:
    """Steps of the complete checkpoints under `root` (not staging folders, not ones renamed aside)."""
    return [int(p.name.removeprefix("global_step_")) for p in root.glob("global_step_*")
            if p.name.removeprefix("global_step_").isdigit() and (p / TRAINER_STATE).is_file()]


def _flat(config: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def listed_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    return "\n".join(f"  {key}: {old!r} -> {new!r}" for key, (old, new) in changes.items())


def _write_atomic(path: Path, text: str) -> None:
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(text, encoding="utf-8")
    _fsync(staging)
    os.replace(staging, path)
    _fsync(path.parent)


def _fsync_tree(folder: Path) -> None:
    """Flush every file and folder under `folder` to the disk (the workers wrote them; any descriptor will do)."""
    for directory, _, files in os.walk(folder):
        for name in files:
            _fsync(Path(directory) / name)
        _fsync(Path(directory))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
