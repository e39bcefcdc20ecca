"""Checkpoints that resume exactly, written so that a crash never leaves one that looks complete.

Layout under `trainer.default_local_dir`:

    global_step_N/
        actor/                  Hugging Face folder (safetensors, config, tokenizer): from_pretrained loads it
        actor/train_state_rank{r}.pt   optimizer, LR scheduler and RNG state of rank r
        critic/                 the same for the critic, when there is one
        trainer_state.json      the step (environment seeds derive from it), KL controller, driver RNG
    latest_checkpointed_iteration.txt   N of the newest complete checkpoint

A checkpoint is written into `global_step_N.tmp/` and renamed to `global_step_N/` only once every
worker has finished (a rename is atomic), and only then does the `latest` file move to it.
"""

import json
import os
import random
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

LATEST = "latest_checkpointed_iteration.txt"
TRAINER_STATE = "trainer_state.json"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def staging_dir(root: str | Path, step: int) -> Path:
    """An empty folder to write checkpoint `step` into (a leftover of a crashed save is removed)."""
    staging = step_dir(root, step).with_suffix(".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def commit(staging: Path, step: int, trainer_state: dict, keep: int | None) -> Path:
    """Finish a checkpoint: its trainer state, the atomic rename, the `latest` pointer, then pruning."""
    (staging / TRAINER_STATE).write_text(json.dumps({**trainer_state, "rng": driver_rng_state()}))
    final = step_dir(staging.parent, step)
    replace_folder(staging, final)  # the same step saved again (a resumed run redoing it): the new one wins
    _write_atomic(staging.parent / LATEST, str(step))
    if keep is not None:
        for old in sorted(_complete_steps(staging.parent))[:-keep]:
            shutil.rmtree(step_dir(staging.parent, old))
    return final


def replace_folder(staging: Path, target: Path) -> None:
    """Move the finished `staging` folder to `target`, replacing whatever was there (the rename is atomic)."""
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)


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
    """The newest complete checkpoint under `root`, or None."""
    pointer = Path(root) / LATEST
    if pointer.is_file():
        path = step_dir(root, int(pointer.read_text().strip()))
        if (path / TRAINER_STATE).is_file():
            return path
    steps = _complete_steps(Path(root))  # the pointer is missing or stale: fall back to what is there
    return step_dir(root, max(steps)) if steps else None


def read_trainer_state(path: str | Path) -> dict:
    """The trainer state of a checkpoint folder; restores the driver's random streams."""
    state_file = Path(path) / TRAINER_STATE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {TRAINER_STATE}): pass a "
                                "global_step_N folder to trainer.resume_mode, or use auto")
    state = json.loads(state_file.read_text())
    set_driver_rng_state(state.pop("rng"))
    return state


def save_train_state(path: str | Path, rank: int, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """One rank's optimizer, LR scheduler and random streams."""
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    Path(path).mkdir(parents=True, exist_ok=True)  # ranks other than 0 may get here before rank 0's weights
    torch.save(state, Path(path) / f"train_state_rank{rank}.pt")


def load_train_state(path: str | Path, rank: int, optimizer: torch.optim.Optimizer, scheduler) -> None:
    file = Path(path) / f"train_state_rank{rank}.pt"
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: the checkpoint was written by a run with fewer ranks; "
                                "resume with the same number of ranks")
    state = torch.load(file, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
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
    return [int(p.name.removeprefix("global_step_")) for p in root.glob("global_step_*")
            if p.is_dir() and p.suffix != ".tmp" and (p / TRAINER_STATE).is_file()]


def _write_atomic(path: Path, text: str) -> None:
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(text)
    os.replace(staging, path)
