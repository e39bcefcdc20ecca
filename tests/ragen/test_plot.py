"""The learning-curve plots, read back from matplotlib's axes: whole-number steps, a visible range for a
flat curve, the recorded random and oracle agents as horizontal lines, and the command line's help."""

import subprocess
import sys
from pathlib import Path

import pytest

from ragen.envs.baselines import RECORDED_SUCCESS
from ragen.plot import panel, plot_run

REPO = Path(__file__).resolve().parents[2]


def axes_of(rows: list[dict], name: str):
    tags = sorted({key.split("/")[1] for row in rows for key in row if key.startswith(("train/", "val-env/"))})
    figure = panel(rows, tags, name)
    figure.draw_without_rendering()  # lays out the ticks and their labels
    return figure.axes[0]


def test_steps_are_whole_numbers():
    rows = [{"step": 0, "val-env/Bandit/success": 0.5}, {"step": 1, "train/Bandit/success": 0.25},
            {"step": 2, "train/Bandit/success": 0.5, "val-env/Bandit/success": 0.75}]
    axes = axes_of(rows, "success")
    low, high = axes.get_xlim()
    shown = [(tick, label.get_text()) for tick, label in zip(axes.get_xticks(), axes.get_xticklabels())
             if low <= tick <= high]
    assert shown == [(0, "0"), (1, "1"), (2, "2")]


@pytest.mark.parametrize("values", [[0.3, 0.3 + 1e-9, 0.3], [1.5, 1.5, 1.5], [0.0, 0.0]])
def test_a_flat_curve_gets_a_visible_range_without_an_offset(values):
    rows = [{"step": step, "actor/entropy": value} for step, value in enumerate(values, start=1)]
    axes = axes_of(rows, "entropy")
    low, high = axes.get_ylim()
    assert high - low == pytest.approx(max(0.1, 0.1 * max(values))) and low < min(values) <= max(values) < high
    assert axes.yaxis.get_offset_text().get_text() == ""
    assert len({label.get_text() for label in axes.get_yticklabels()}) > 1


def test_a_curve_that_moves_keeps_matplotlibs_range():
    rows = [{"step": 1, "actor/entropy": 0.2}, {"step": 2, "actor/entropy": 1.4}]
    low, high = axes_of(rows, "entropy").get_ylim()
    assert low < 0.2 and 1.4 < high < 1.6


def test_recorded_random_and_oracle_agents_are_horizontal_lines():
    assert "NoBaselines" not in RECORDED_SUCCESS
    rows = [{"step": 1, "train/Bandit/success": 0.5, "train/NoBaselines/success": 0.0},
            {"step": 2, "train/Bandit/success": 0.75, "train/NoBaselines/success": 0.1}]
    axes = axes_of(rows, "success")
    baselines = {line.get_label(): tuple(line.get_ydata()) for line in axes.lines if "agent" in line.get_label()}
    rates = RECORDED_SUCCESS["Bandit"][1]
    assert baselines == {"Bandit random agent": (rates["random"],) * 2, "Bandit oracle agent": (rates["oracle"],) * 2}
    assert {text.get_text() for text in axes.get_legend().get_texts()} >= set(baselines)  # NoBaselines: none recorded
    assert not [line for line in axes_of(rows, "reward").lines if "agent" in line.get_label()]


def test_plot_run_writes_the_four_pngs(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/Bandit/success": 0.5, "actor/entropy": 1.0}\n')
    assert sorted(p.name for p in plot_run(tmp_path)) == ["entropy.png", "reward.png", "reward_std.png",
                                                          "success.png"]


def test_command_line_help_and_errors(tmp_path):
    def plot(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ragen.plot", *args], cwd=REPO, capture_output=True,
                              text=True)

    done = plot("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m ragen.plot") and "run_dir" in done.stdout
    assert plot().returncode == 2
    missing = plot(str(tmp_path))
    assert missing.returncode == 1 and "metrics.jsonl" in missing.stderr
