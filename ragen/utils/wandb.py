"""RAGEN's `from ragen.utils.wandb import download_wandb; download_wandb("RUN_ID")`, offline.

RAGEN's version fetched a run's files from wandb.ai. Nothing here downloads: this one finds the run's local
folder, which wandb writes online and offline alike (`trainer.logger=[wandb]`, `WANDB_MODE=offline`:
`<trainer.default_local_dir>/wandb/offline-run-<time>-<id>/`), reads the logged history out of its
`run-<id>.wandb` file into a `metrics.jsonl` as the `jsonl` logger writes it, copies the run's files (media,
config) and draws the learning curves (ragen/plot.py).

`run-<id>.wandb` is a LevelDB-style log: a 7-byte file header, then 32 KiB blocks of chunks, each with a
7-byte header (CRC32, length, type: FULL, or FIRST / MIDDLE / LAST of a record split over blocks); a record
is a serialised `wandb_internal_pb2.Record`, history rows among them.
"""

import json
import shutil
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path

FILE_HEADER, CHUNK_HEADER, BLOCK = 7, 7, 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[bytes]:
    """The serialised records of a `.wandb` file, in the order they were written."""
    data, records, parts, pos = path.read_bytes(), [], [], FILE_HEADER
    if not data.startswith(b":W&B"):
        raise ValueError(f"{path} is not a wandb run file (it does not start with ':W&B')")
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        chunk, pos = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length], pos + CHUNK_HEADER + length
        if kind in (FULL, FIRST):
            parts = [chunk]
        elif kind in (MIDDLE, LAST) and parts:
            parts.append(chunk)
        if kind in (FULL, LAST) and parts:
            records.append(b"".join(parts))
            parts = []
    return records


def read_history(path: Path, wait_s: float = 30.0) -> list[dict]:
    """The rows logged with `wandb.log`, as `{"step": N, metric: value, ...}` (wandb's own `_` keys dropped).
    wandb's service process writes the file on its own: after `run.finish()` returns, the last records can
    still be on their way. The run's exit record comes after them, so the file is read again until it holds
    one, for at most `wait_s` seconds; a run without one (still running, or killed) gives the rows so far,
    with a warning."""
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + wait_s
    while True:
        records = []
        for data in read_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        if time.monotonic() >= deadline:
            print(f"[ragen] warning: {path} has no exit record (the run is still running, or was killed): "
                  "its rows so far", file=sys.stderr, flush=True)
            break
        time.sleep(0.2)
    rows = []
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        step = record.history.step.num if record.history.HasField("step") else row["_step"]
        rows.append({"step": step, **{k: v for k, v in row.items() if not k.startswith("_")}})
    return rows


def find_run(run_id: str, roots: Sequence[str | Path]) -> Path:
    for root in map(Path, roots):
        found = sorted(root.glob(f"wandb/*run-*-{run_id}")) + sorted(root.glob(f"**/wandb/*run-*-{run_id}"))
        if found:
            return found[0]
    raise FileNotFoundError(
        f"no local wandb run {run_id!r} under {', '.join(map(str, roots))}: nothing is downloaded here. Pass "
        "roots= the folder that holds its wandb/ folder (trainer.default_local_dir). A run's metrics are also in "
        "<trainer.default_local_dir>/metrics.jsonl (python -m ragen.plot <that folder>) and its trajectory pages "
        "under logging.log_image_dir (<trainer.default_local_dir>/pages)")


def download_wandb(run_id: str, out_dir: str | Path = "./log", roots: Sequence[str | Path] = ("checkpoints",)):
    """Write `<out_dir>/<run_id>/`: metrics.jsonl, the run's files under files/, and plots/. Returns that folder."""
    from ragen.plot import plot_run
    from verl.utils.tracking import write_jsonl

    run_dir, out = find_run(run_id, roots), Path(out_dir) / run_id
    run_files = sorted(run_dir.glob("run-*.wandb"))
    if len(run_files) != 1:
        raise FileNotFoundError(f"{run_dir} holds {len(run_files)} run-*.wandb files, not one: read it with "
                                "ragen.utils.wandb.read_history(<that file>)")
    (run_file,) = run_files
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "metrics.jsonl", read_history(run_file))
    if (run_dir / "files").is_dir():
        shutil.copytree(run_dir / "files", out / "files", dirs_exist_ok=True)
    plots = plot_run(out)
    print(f"{run_id}: {run_dir} -> {out}/metrics.jsonl, files/, {len(plots)} plots", flush=True)
    return out
