"""A run folder (`trainer.default_local_dir`) holds one run's lineage, and a run touches nothing outside it.

Decided at start-up, before any model loads (`claim`):

- Resuming from one of the folder's own checkpoints (`trainer.resume_mode=auto`, or a `global_step_N` inside
  it) goes on in the folder: the run's own lineage, whose checkpoints after the one resumed from are its
  abandoned future (verl/utils/checkpoint.py prunes them). Its own leftovers of a save that crashed
  (`global_step_N.tmp/`, a `.global_step_N.old/` renamed aside) are removed.
- Starting afresh (`resume_mode=disable`, or `auto` with no checkpoint) or branching from a checkpoint in
  another folder needs an empty folder, or one that holds only this same run (the same settings, `run.json`)
  stopped before its first checkpoint: a run interrupted in its first step starts again with the same command.
  Where anything lives, the start is refused with one line that says what is there and the two ways on:
  another `trainer.experiment_name`, or `trainer.overwrite=true`, which renames the folder to
  `<folder>.old-<time>` first. Nothing of another run is ever deleted or rewritten.
- The folder must take a file (`check_writable`) and have room for a checkpoint, so that a full disk or a
  read-only folder is found before a model loads, not at the first save.

Names are names (`check_name`): `trainer.project_name` and `experiment_name` become folder names, so they hold
no separator, no `..`, no control character, at most `MAX_NAME_LENGTH` characters. The run folder itself may be
anywhere but `/`, a system folder, the home folder or the current folder (`check_run_dir`); the rollout records
and trajectory pages of a run live inside its folder (`check_inside`), so two runs never share them.
"""

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from verl.trainer.config import TrainerConfig
from verl.utils import checkpoint

MAX_NAME_LENGTH = 100
RUN_FILE = "run.json"  # the settings of the run that started afresh in the folder
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@,-]*")  # a file name on every system, and no `..`
SYSTEM_FOLDERS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr",
                  "/var")  # and everything below them; `/`, the home folder and the current folder themselves


class RunFolderError(ValueError):
    """A run folder this run may not use as asked; the message says what is there and what to do instead."""


def check_name(key: str, name: str) -> str | None:
    """Why `name` (the value of `key`) cannot name a folder, or None."""
    if not name or not NAME.fullmatch(name) or ".." in name:
        return (f"{key}={name!r} must be a name: letters, digits and _ . + = @ , - (starting with a letter, digit "
                "or _; no / or .., no spaces or control characters), since it names the run's folder")
    if len(name) > MAX_NAME_LENGTH:
        return f"{key} has {len(name)} characters: at most {MAX_NAME_LENGTH}, since it names the run's folder"
    return None


def check_run_dir(path: str) -> str | None:
    """Why `path` cannot be a run folder (`/`, a system folder, the home or the current folder), or None."""
    folder = Path(path).expanduser().resolve()
    system = folder == Path("/") or any(folder.is_relative_to(f) for f in SYSTEM_FOLDERS)
    if system or folder in (Path.home().resolve(), Path.cwd().resolve()):
        return (f"trainer.default_local_dir={path!r} is {folder}: a run writes, moves and prunes inside its folder, "
                "so it must be a folder of its own (the default is checkpoints/<project_name>/<experiment_name>)")
    return None


def check_inside(key: str, path: str, run_dir: str) -> str | None:
    """Why `path` (the value of `key`) is not inside the run folder, or None."""
    if Path(path).expanduser().resolve().is_relative_to(Path(run_dir).expanduser().resolve()):
        return None
    return (f"{key}={path!r} is outside the run folder {run_dir}: a run's files live inside its own folder, so "
            "that two runs never share them; leave it at its default")


def claim(config: TrainerConfig, run_config: dict, own: Path | None = None) -> None:
    """Make sure this run may use `default_local_dir` as configured (see the module docstring); with
    `trainer.overwrite` move whatever is there aside first. `run_config`: the whole run's settings, recorded in
    the folder (RUN_FILE) when a run starts there afresh, so that the same run stopped before its first
    checkpoint can start again. `own`: a folder this very run has already made (Hydra's output folder,
    `hydra.run.dir`), which does not count as another run's. Raises RunFolderError."""
    run_dir = Path(config.default_local_dir)
    if config.overwrite and holds_something(run_dir, own):
        aside = set_aside(run_dir, own)
        print(f"[ragen] trainer.overwrite=true: the folder's earlier contents were moved to {aside}", flush=True)
    start = checkpoint.resume_path(config)
    if start is not None and start.resolve().parent == run_dir.resolve():
        remove_staging_leftovers(run_dir)
        return
    if start is None and holds_something(run_dir, own) and same_run_before_a_checkpoint(run_dir, run_config):
        clear(run_dir, own)
        print(f"[ragen] {run_dir} holds this same run, stopped before its first checkpoint: starting it again",
              flush=True)
    if holds_something(run_dir, own):
        doing = f"branching from {start}" if start is not None else "starting afresh"
        raise RunFolderError(f"{run_dir} already holds {contents(run_dir)}, and {doing} there would rewrite or delete "
                             "it: use another trainer.experiment_name, or trainer.overwrite=true to move it to "
                             f"{run_dir}.old-<time> first")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_FILE).write_text(json.dumps(run_config, sort_keys=True, default=str), encoding="utf-8")


def same_run_before_a_checkpoint(run_dir: Path, run_config: dict) -> bool:
    """Whether `run_dir` holds only what this same run (the same settings, RUN_FILE) wrote before it was stopped
    short of its first checkpoint: its step-0 validation, records and pages, nothing worth keeping from it."""
    finished = [p for p in run_dir.glob("global_step_*") if p.name.removeprefix("global_step_").isdigit()]
    if finished or any(run_dir.glob(".global_step_*")):  # a first save cut short (global_step_N.tmp) saved nothing
        return False
    try:
        recorded = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return recorded == json.loads(json.dumps(run_config, sort_keys=True, default=str))


def clear(run_dir: Path, own: Path | None) -> None:
    """Remove what `run_dir` holds, except `own` and the folders leading to it."""
    own = own.resolve() if own is not None else None
    for entry in run_dir.iterdir():
        if own is not None and (entry.resolve() == own or (entry.is_dir() and own.is_relative_to(entry.resolve()))):
            if entry.resolve() != own:
                clear(entry, own)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def holds_something(run_dir: Path, own: Path | None = None) -> bool:
    """Whether `run_dir` holds anything besides `own` and the folders leading to it."""
    if not run_dir.is_dir():
        return False
    own = own.resolve() if own is not None else None
    for entry in run_dir.iterdir():
        if own is None or not (entry.resolve() == own or (entry.is_dir() and own.is_relative_to(entry.resolve()))):
            return True
        if entry.resolve() != own and holds_something(entry, own):
            return True
    return False


def contents(run_dir: Path) -> str:
    """What a run folder holds, in a few words: its checkpoints, metrics and the number of other entries."""
    steps = sorted(int(p.name.removeprefix("global_step_")) for p in run_dir.glob("global_step_*")
                   if p.name.removeprefix("global_step_").isdigit())
    parts = [f"checkpoints of steps {', '.join(map(str, steps))}"] if steps else []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        rows = sum(1 for line in metrics.open(encoding="utf-8", errors="replace") if line.strip())
        parts.append(f"metrics.jsonl with {rows} rows")
    others = [p for p in run_dir.iterdir() if not (p.name.startswith("global_step_") or p == metrics)]
    if others:
        parts.append(f"{len(others)} other entr{'y' if len(others) == 1 else 'ies'} ({', '.join(sorted(p.name for p in others)[:3])}"
                     f"{', ...' if len(others) > 3 else ''})")
    return "another run: " + "; ".join(parts)


def set_aside(run_dir: Path, own: Path | None = None) -> Path:
    """Rename `run_dir` to a free `<run_dir>.old-<time>[-n]` next to it, or, when `own` (this run's Hydra
    folder) lies inside it, move everything but the entry that leads to `own` there; return the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}")
    if own is None or not own.resolve().is_relative_to(run_dir.resolve()):
        os.rename(run_dir, aside)
        return aside
    aside.mkdir()
    for entry in run_dir.iterdir():
        if not own.resolve().is_relative_to(entry.resolve()):
            os.rename(entry, aside / entry.name)
    return aside


def remove_staging_leftovers(run_dir: Path) -> None:
    """This lineage's leftovers of a save that crashed: checkpoint staging folders and renamed-aside copies
    (verl/utils/checkpoint.py names them), and the `latest` pointer's staging file."""
    leftovers = [p for p in run_dir.glob("global_step_*.tmp") if p.is_dir()]
    leftovers += [p for p in run_dir.glob(".global_step_*.old") if p.is_dir()]
    for folder in leftovers:
        shutil.rmtree(folder, ignore_errors=True)
    (run_dir / (checkpoint.LATEST + ".tmp")).unlink(missing_ok=True)
    if leftovers:
        print(f"[ragen] removed {len(leftovers)} unfinished checkpoint folder(s) a crashed save of this run left: "
              f"{', '.join(p.name for p in leftovers)}", flush=True)


def check_writable(run_dir: str | Path, need_bytes: int) -> None:
    """Refuse a run folder that takes no file, or has less free space than `need_bytes` (one checkpoint)."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-check-") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise RunFolderError(f"cannot write in {run_dir}: {e.strerror or e}; free it, or choose another folder "
                             "(trainer.default_local_dir)") from e
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes:
        raise RunFolderError(f"{run_dir} has {free / 2**30:.2f} GiB free and a checkpoint of this run takes about "
                             f"{need_bytes / 2**30:.2f} GiB: free some space, or choose another folder "
                             "(trainer.default_local_dir)")
