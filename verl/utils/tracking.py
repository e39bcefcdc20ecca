"""Metric loggers behind one call: `tracker.log(metrics, step)`.

- `console` prints one summary line per step;
- `jsonl` writes every metric of every step to `<run_dir>/metrics.jsonl`, one JSON object per line, so a
  run can be read back (and plotted, `python -m ragen.plot`) without any service. A run starts the file
  anew with its first row; a resumed one (`truncate`) keeps the rows up to its checkpoint and appends;
- `wandb` logs to Weights & Biases: online with an account, or with `WANDB_MODE=offline` into
  `<run_dir>/wandb/` with none (`wandb sync` uploads it later);
- `tensorboard` writes event files to `<run_dir>/tensorboard/` (`tensorboard --logdir <run_dir>`).

Metrics and rollout records are written as JSON by `to_json`: a NaN or infinite number becomes null, where
`json.dumps` would write a bare `NaN` that JSON.parse in the browser (and every strict parser) rejects.
Text files are UTF-8 whatever the locale: model output is any Unicode.
"""

import json
import math
import sys
from pathlib import Path

CONSOLE_KEYS = ["rollout/reward_mean", "rollout/success_rate", "rollout/response_length", "rollout/in_group_std",
                "actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss", "val/reward_mean",
                "val/success_rate", "sft/loss", "val/loss", "val/format_accuracy",
                "val/action_accuracy", "timing_s/gen", "timing_s/update_actor", "timing_s/val", "timing_s/step"]


ROLLED_BACK_FILE = "metrics.rolled_back.jsonl"  # the steps a watchdog rollback undid


class Tracking:
    SUPPORTED = ("console", "jsonl", "wandb", "tensorboard")

    def __init__(self, loggers: list[str], run_dir: str, project: str = "ragen", experiment: str = "run",
                 config: dict | None = None):
        unknown = set(loggers) - set(self.SUPPORTED)
        if unknown:
            raise ValueError(f"trainer.logger: unknown logger(s) {sorted(unknown)}; supported: {list(self.SUPPORTED)}")
        self.loggers = loggers
        self.jsonl_path = Path(run_dir) / "metrics.jsonl"
        self.jsonl_mode = "w"  # an old run's rows in a reused folder must not mix with ours; `truncate` appends
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
            # validation over several environments (a trained one and a held-out one): each apart, not averaged
            val_tags = sorted({k.split("/")[1] for k in metrics if k.startswith("val-env/") and k.endswith("/success")})
            apart = len(val_tags) > 1
            shown = [f"{_label(k)}={_fmt(metrics[k])}" for k in CONSOLE_KEYS
                     if k in metrics and not (apart and k == "val/success_rate")]
            shown += [f"val_{tag}_success={_fmt(metrics[f'val-env/{tag}/success'])}" for tag in val_tags if apart]
            print(f"step {step}: " + " ".join(shown), flush=True)
        if "jsonl" in self.loggers:
            with self.jsonl_path.open(self.jsonl_mode, encoding="utf-8") as f:
                f.write(to_json({"step": step, **metrics}) + "\n")
            self.jsonl_mode = "a"
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

    def truncate(self, after_step: int, set_aside_as: str | None = None) -> None:
        """Continue a resumed run's log: keep the rows of steps up to `after_step` (later ones are logged
        again), drop a line torn by the crash, and append from here on. `set_aside_as`: a watchdog rollback,
        whose undone steps are not dropped but appended to `metrics.rolled_back.jsonl`, each row with
        `"rolled_back": set_aside_as`."""
        if "jsonl" in self.loggers and self.jsonl_path.is_file():
            rows = read_jsonl(self.jsonl_path)
            if set_aside_as is not None:
                with self.jsonl_path.with_name(ROLLED_BACK_FILE).open("a", encoding="utf-8") as f:
                    f.writelines(to_json(row | {"rolled_back": set_aside_as}) + "\n"
                                 for row in rows if row["step"] > after_step)
            write_jsonl(self.jsonl_path, [row for row in rows if row["step"] <= after_step])
        self.jsonl_mode = "a"


def reduce_metrics(values: dict[str, list[float]]) -> dict[str, float]:
    """One number per metric from several (micro-batches, ranks), by its name: `*_max` their maximum, `*_min`
    their minimum, any other the mean. The one rule for every metric reduced anywhere (workers, ranks)."""
    def reduce(key: str, v: list[float]) -> float:
        return max(v) if key.endswith("_max") else min(v) if key.endswith("_min") else sum(v) / len(v)

    return {k: float(reduce(k, v)) for k, v in values.items()}


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Rows as JSON lines, written whole: a staging file renamed into place, so no reader sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    with staging.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(to_json(row) + "\n")
    staging.replace(path)


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL file, skipping any line that is not a whole JSON value: the last line of a run
    killed mid-write is cut short (possibly mid-character)."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def to_json(value, indent: int | None = None) -> str:
    """`value` as strict JSON, non-finite numbers (at any depth) as null, non-ASCII text as it is."""
    return json.dumps(_finite_or_null(value), ensure_ascii=False, allow_nan=False, indent=indent)


def _finite_or_null(value):
    if isinstance(value, float):  # numpy's float64 too
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_null(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


def _label(key: str) -> str:
    namespace, name = key.split("/", 1)
    return f"val_{name}" if namespace == "val" else name


def _fmt(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def duration(seconds: float) -> str:
    """`seconds` for a person: 42 s, 3 min 5 s, 2 h 10 min."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def progress(iterable, **kwargs):
    """A progress bar on a terminal; nothing in logs, CI or Ray workers (stderr not a terminal)."""
    from tqdm import tqdm

    return tqdm(iterable, disable=not sys.stderr.isatty(), dynamic_ncols=True, **kwargs)


def quiet_libraries() -> None:
    """Silence what libraries print that says nothing about the run (`trainer.verbose=false`): transformers'
    "Loading weights" and "Writing model shards" bars at every load and save, Hugging Face download bars,
    Ray's token-authentication notice, and httpx's line per env-server request. Each process does its own: the driver and every worker (a Ray actor
    does not inherit the driver's settings). Other warnings, and errors, still show."""
    import logging

    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    disable_progress_bars()
    transformers_logging.disable_progress_bar()
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per env-server request (ragen/envs/remote.py)
