"""Learning curves of a run as PNG files, from its metrics.jsonl alone: `python -m ragen.plot <run_dir>`.

Written to `<run_dir>/plots/` (the trainer also calls this after its last step):
- `success.png`, `reward.png`: per environment tag, training (`train/<tag>/...`, solid) and validation
  (`val-env/<tag>/...`, dashed, markers) against the step;
- `entropy.png`: `actor/entropy`;
- `reward_std.png`: `rollout/reward_std` and `rollout/in_group_std`, the spread the StarPO-S filter needs
  (its collapse is the echo trap's first sign).
"""

import sys
from pathlib import Path

from verl.utils.tracking import read_jsonl

PANELS = {  # file -> (title, y label, metric name under train/<tag>/ and val-env/<tag>/, or whole keys)
    "success": ("Success rate", "success", "success"),
    "reward": ("Trajectory reward", "reward", "reward"),
    "entropy": ("Policy entropy", "entropy (nats)", ["actor/entropy"]),
    "reward_std": ("Reward spread", "std", ["rollout/reward_std", "rollout/in_group_std"]),
}


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: plot a run folder (trainer.default_local_dir) whose "
                                "trainer.logger includes jsonl")
    return read_jsonl(path)  # a run killed mid-write leaves a torn last line, skipped


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """The steps that logged `key` and its values; a non-finite value (null in the JSONL) is NaN, a gap."""
    points = [(row["step"], float("nan") if row[key] is None else row[key]) for row in rows if key in row]
    return [s for s, _ in points], [v for _, v in points]


def curve(axes, points: tuple[list[int], list[float]], **style) -> None:
    if points[0]:  # a metric the run never logged gets no legend entry
        axes.plot(*points, **style)


def plot_run(run_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    tags = sorted({key.split("/")[1] for row in rows for key in row if key.startswith(("train/", "val-env/"))})
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    written = []
    for name, (title, ylabel, metric) in PANELS.items():
        figure, axes = plt.subplots(figsize=(7, 4))
        if isinstance(metric, str):  # one curve per env tag, train and val
            for i, tag in enumerate(tags):
                curve(axes, series(rows, f"train/{tag}/{metric}"), color=f"C{i}", label=f"{tag} (train)")
                curve(axes, series(rows, f"val-env/{tag}/{metric}"), color=f"C{i}", linestyle="--", marker="o",
                      label=f"{tag} (val)")
        else:
            for key in metric:
                curve(axes, series(rows, key), label=key)
        axes.set(title=title, xlabel="training step", ylabel=ylabel)
        if axes.lines:
            axes.legend(fontsize="small")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(out / f"{name}.png", dpi=100)
        plt.close(figure)
        written.append(out / f"{name}.png")
    return written


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m ragen.plot <run_dir>   (the folder holding metrics.jsonl)")
    try:
        paths = plot_run(sys.argv[1])
    except FileNotFoundError as e:
        sys.exit(str(e))
    print("\n".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
