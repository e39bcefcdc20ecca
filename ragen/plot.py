"""Learning curves of a run as PNG files, from its metrics.jsonl alone: `python -m ragen.plot <run_dir>`.

Written to `<run_dir>/plots/` (the trainer also calls this after its last step):
- `success.png`, `reward.png`: per environment tag, training (`train/<tag>/...`, solid) and validation
  (`val-env/<tag>/...`, dashed, markers) against the step; `success.png` also has the tag's random
  (dotted) and oracle (dash-dot) agents as horizontal lines where they are recorded
  (`ragen.envs.baselines.RECORDED_SUCCESS`: measured once, so plotting plays no episode);
- `entropy.png`: `actor/entropy`;
- `reward_std.png`: `rollout/reward_std` and `rollout/in_group_std`, the spread the StarPO-S filter needs
  (its collapse is the echo trap's first sign);
- `collapse.png`: template collapse (RAGEN-2, verl/trainer/collapse.py): how much the first replies depend on
  their inputs (`collapse/mi` under its ceiling log M, `collapse/retrieval_acc` above chance 1 / M), beside the
  echo-trap signals (`actor/entropy`, `rollout/response_repetition`, `rollout/in_group_std`): replies can stop
  depending on the input while their entropy holds.

Every panel marks each watchdog event (`<run_dir>/watchdog.jsonl`, verl/trainer/watchdog.py) with a vertical
line at its step, in its action's colour, named "rule: action" in the legend; the steps a rollback undid
(`metrics.rolled_back.jsonl`) are drawn faintly, dotted, beside the ones that replaced them.

Steps are whole numbers on the x axis. A flat curve gets a visible y range (at least `MIN_Y_SPAN`)
instead of matplotlib's stretch of float noise over the whole height (0.3 and 0.3 + 1e-9 drawn as a
cliff, labelled with an offset).
"""

import argparse
import math
import sys
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ragen.envs.baselines import RECORDED_SUCCESS
from verl.trainer.watchdog import read_events
from verl.utils.tracking import ROLLED_BACK_FILE, read_jsonl

# file -> its subplots, each (title, y label, metric name under train/<tag>/ and val-env/<tag>/, or whole keys)
PANELS = {
    "success": [("Success rate", "success", "success")],
    "reward": [("Trajectory reward", "reward", "reward")],
    "entropy": [("Policy entropy", "entropy (nats)", ["actor/entropy"])],
    "reward_std": [("Reward spread", "std", ["rollout/reward_std", "rollout/in_group_std"])],
    # the cross-scoring estimate of I(X; Z) scatters around its value: below 0 means no dependence, within noise
    "collapse": [("Input dependence I(X; Z) (estimate; < 0: none, within noise)", "nats",
                  ["collapse/mi", "collapse/mi_ceiling"]),
                 ("Reply-to-input retrieval", "accuracy", ["collapse/retrieval_acc", "collapse/retrieval_chance"]),
                 ("Policy entropy", "entropy (nats)", ["actor/entropy"]),
                 ("Echo-trap signals", "rate / std", ["rollout/response_repetition", "rollout/in_group_std"])],
}
REFERENCE_KEYS = {"collapse/mi_ceiling", "collapse/retrieval_chance"}  # bounds, drawn grey and dashed
BASELINE_STYLES = {"random": ":", "oracle": "-."}  # agent -> line style of its success rate
EVENT_COLORS = {"warn": "goldenrod", "stop": "red", "rollback": "purple"}  # watchdog action -> marker
MIN_Y_SPAN = 0.1  # a y range narrower than this (or 10 % of the values' size, if more) is widened


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
        axes.plot(*points, **({"marker": "o"} if len(points[0]) == 1 else {}) | style)  # one point: no line


def widen_flat(axes) -> None:
    """Widen a y range narrower than MIN_Y_SPAN (or 10 % of the values' size) to that span, centred on the values."""
    values = [float(y) for line in axes.lines for y in line.get_ydata() if math.isfinite(y)]
    if not values:
        return
    low, high = min(values), max(values)
    span = max(MIN_Y_SPAN, 0.1 * max(abs(low), abs(high)))
    if high - low < span:
        middle = (low + high) / 2
        axes.set_ylim(middle - span / 2, middle + span / 2)


def mark_events(axes, events: list[dict]) -> None:
    """A vertical line at each watchdog event's step; one legend entry per rule and action."""
    named = set()
    for event in events:
        label = f"{event['rule']}: {event['action']}"
        axes.axvline(event["step"], color=EVENT_COLORS[event["action"]], linestyle="--", linewidth=1,
                     label=label if label not in named else f"_{label}")  # a leading "_" keeps it out of the legend
        named.add(label)


def subplot(axes, rows: list[dict], tags: list[str], title: str, ylabel: str, metric: str | list[str],
            events: list[dict], undone: list[dict]) -> None:
    if isinstance(metric, str):  # one curve per env tag, train and val
        for i, tag in enumerate(tags):
            curve(axes, series(rows, f"train/{tag}/{metric}"), color=f"C{i}", label=f"{tag} (train)")
            curve(axes, series(rows, f"val-env/{tag}/{metric}"), color=f"C{i}", linestyle="--", marker="o",
                  label=f"{tag} (val)")
            if metric == "success" and tag in RECORDED_SUCCESS:
                for agent, rate in RECORDED_SUCCESS[tag][1].items():
                    axes.axhline(rate, color=f"C{i}", linestyle=BASELINE_STYLES[agent], linewidth=1, alpha=0.7,
                                 label=f"{tag} {agent} agent")
    else:
        for i, key in enumerate(metric):
            style = {"color": "grey", "linestyle": "--"} if key in REFERENCE_KEYS else {"color": f"C{i}"}
            curve(axes, series(rows, key), label=key, **style)
            if key in REFERENCE_KEYS:
                continue
            for attempt in dict.fromkeys(row["rolled_back"] for row in undone):  # the steps a rollback undid
                curve(axes, series([r for r in undone if r["rolled_back"] == attempt], key), alpha=0.4,
                      linestyle=":", label=f"{key}, {attempt}", **style)
    axes.set(title=title, xlabel="training step", ylabel=ylabel)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.ticklabel_format(axis="y", useOffset=False)
    widen_flat(axes)  # before the event markers, whose y data are axes fractions
    mark_events(axes, events)
    if axes.lines:  # beside the plot, where it covers no line (the baselines run along the top)
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    axes.grid(alpha=0.3)


def panel(rows: list[dict], tags: list[str], name: str, events: list[dict] = (), undone: list[dict] = ()) -> Figure:
    """The figure of one of PANELS, its subplots on a grid of two columns, each marking the watchdog `events`
    and drawing faintly the `undone` rows (steps a watchdog rollback undid, `metrics.rolled_back.jsonl`) of
    whole-key metrics; no pyplot, so no display and no global figure state."""
    specs = PANELS[name]
    columns = min(2, len(specs))
    figure = Figure(figsize=(9.5 * columns, 4 * math.ceil(len(specs) / columns)))  # room for the legends
    grid = figure.subplots(math.ceil(len(specs) / columns), columns, squeeze=False)
    for axes, spec in zip(grid.flat, specs):
        subplot(axes, rows, tags, *spec, events, undone)
    figure.tight_layout()
    return figure


def plot_run(run_dir: str | Path) -> list[Path]:
    run_dir = Path(run_dir)
    rows, events = read_metrics(run_dir), read_events(run_dir)
    undone = read_jsonl(run_dir / ROLLED_BACK_FILE) if (run_dir / ROLLED_BACK_FILE).is_file() else []
    tags = sorted({key.split("/")[1] for row in rows for key in row if key.startswith(("train/", "val-env/"))})
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    written = []
    for name in PANELS:
        panel(rows, tags, name, events, undone).savefig(out / f"{name}.png", dpi=100)
        written.append(out / f"{name}.png")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ragen.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run folder holding metrics.jsonl (trainer.default_local_dir)")
    args = parser.parse_args(argv)
    try:
        paths = plot_run(args.run_dir)
    except FileNotFoundError as e:
        sys.exit(str(e))
    print("\n".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
