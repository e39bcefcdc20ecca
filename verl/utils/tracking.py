"""Metric loggers behind one call: `tracker.log(metrics, step)`.

- `console` prints one summary line per step;
- `jsonl` appends every metric of every step to `<run_dir>/metrics.jsonl`, one JSON object per line, so a
  run can be read back (and plotted, `python -m ragen.plot`) without any service;
- `wandb` logs to Weights & Biases: online with an account, or with `WANDB_MODE=offline` into
  `<run_dir>/wandb/` with none (`wandb sync` uploads it later);
- `tensorboard` writes event files to `<run_dir>/tensorboard/` (`tensorboard --logdir <run_dir>`).
"""

import json
import math
import sys
from pathlib import Path

CONSOLE_KEYS = ["rollout/reward_mean", "rollout/success_rate", "rollout/response_length", "rollout/in_group_std",
                "actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss", "val/reward_mean",
                "val/success_rate", "sft/loss", "val/loss", "val/format_accuracy",
                "val/action_accuracy", "timing_s/gen", "timing_s/update_actor", "timing_s/val", "timing_s/step"]


class Tracking:
    SUPPORTED = ("console", "jsonl", "wandb", "tensorboard")

    def __init__(self, loggers: list[str], run_dir: str, project: str = "ragen", experiment: str = "run",
                 config: dict | None = None):
        unknown = set(loggers) - set(self.SUPPORTED)
        if unknown:
            raise ValueError(f"trainer.logger: unknown logger(s) {sorted(unknown)}; supported: {list(self.SUPPORTED)}")
        self.loggers = loggers
        self.jsonl_path = Path(run_dir) / "metrics.jsonl"
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self.wandb = self.tensorboard = None
        if "wandb" in loggers:
            import wandb

            self.wandb = wandb.init(project=project, name=experiment, dir=run_dir, config=config)
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        if "console" in self.loggers:
            shown = [f"{_label(k)}={_fmt(metrics[k])}" for k in CONSOLE_KEYS if k in metrics]
            print(f"step {step}: " + " ".join(shown), flush=True)
        if "jsonl" in self.loggers:
            with self.jsonl_path.open("a") as f:
                f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.tensorboard is not None:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()

    def finish(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()

    def truncate(self, after_step: int) -> None:
        """Drop the logged rows of steps after `after_step` (a resumed run logs them again)."""
        if "jsonl" in self.loggers and self.jsonl_path.is_file():
            rows = []
            for line in self.jsonl_path.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # the torn last line of a killed run
                    continue
            write_jsonl(self.jsonl_path, [row for row in rows if row["step"] <= after_step])


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Rows as JSON lines, written whole: a staging file renamed into place, so no reader sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    with staging.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    staging.replace(path)


def _label(key: str) -> str:
    namespace, name = key.split("/", 1)
    return f"val_{name}" if namespace == "val" else name


def _fmt(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def progress(iterable, **kwargs):
    """A progress bar on a terminal; nothing in logs, CI or Ray workers (stderr not a terminal)."""
    from tqdm import tqdm

    return tqdm(iterable, disable=not sys.stderr.isatty(), dynamic_ncols=True, **kwargs)
