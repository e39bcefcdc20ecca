"""The learning-curve plots, read back from matplotlib's axes: whole-number steps, a visible range for a
flat curve, the recorded random and oracle agents as horizontal lines, the collapse panel, the watchdog's
event markers, and the command line's help."""

import json

import subprocess
import sys
from pathlib import Path

import pytest

from ragen.envs.baselines import RECORDED_SUCCESS
from ragen.plot import panel, plot_run

REPO = Path(__file__).resolve().parents[2]


def axes_of(rows: list[dict], name: str, events: list[dict] = ()):
    return all_axes_of(rows, name, events)[0]


def all_axes_of(rows: list[dict], name: str, events: list[dict] = ()):
    tags = sorted({key.split("/")[1] for row in rows for key in row if key.startswith(("train/", "val-env/"))})
    figure = panel(rows, tags, name, events)
    figure.draw_without_rendering()  # lays out the ticks and their labels
    return figure.axes


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


@pytest.mark.parametrize("name", ["success", "collapse"])
def test_no_legend_covers_a_line(name):
    """Legends sit beside their plot: the oracle line runs along the top, where a legend inside went."""
    rows = [{"step": s, "train/Bandit/success": 0.9, "val-env/Bandit/success": 1.0, "collapse/mi": -0.05,
             "collapse/mi_ceiling": 0.69} for s in (1, 2, 3)]
    for axes in all_axes_of(rows, name):
        legend, area = axes.get_legend(), axes.get_window_extent()
        if legend is not None:
            assert legend.get_window_extent().x0 >= area.x1  # entirely to the right of the plotting area
    if name == "collapse":  # a negative estimate is explained where it is drawn
        assert "< 0: none, within noise" in all_axes_of(rows, name)[0].get_title()


def test_plot_run_writes_the_five_pngs(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/Bandit/success": 0.5, "actor/entropy": 1.0}\n')
    assert sorted(p.name for p in plot_run(tmp_path)) == ["collapse.png", "entropy.png", "reward.png",
                                                          "reward_std.png", "success.png"]


def curves(axes) -> dict[str, list[float]]:
    return {line.get_label(): list(line.get_ydata()) for line in axes.lines}


def test_collapse_panel_shows_the_mi_and_retrieval_beside_the_echo_trap_signals():
    rows = [{"step": step, "collapse/mi": mi, "collapse/mi_ceiling": 0.693, "collapse/retrieval_acc": acc,
             "collapse/retrieval_chance": 0.5, "actor/entropy": 1.2, "rollout/response_repetition": 0.3,
             "rollout/in_group_std": 0.1} for step, mi, acc in [(1, 0.6, 1.0), (2, 0.2, 0.75), (3, 0.01, 0.5)]]
    mi, retrieval, entropy, echo = all_axes_of(rows, "collapse")
    assert curves(mi) == {"collapse/mi": [0.6, 0.2, 0.01], "collapse/mi_ceiling": [0.693] * 3}
    assert curves(retrieval) == {"collapse/retrieval_acc": [1.0, 0.75, 0.5], "collapse/retrieval_chance": [0.5] * 3}
    assert curves(entropy) == {"actor/entropy": [1.2] * 3}
    assert curves(echo) == {"rollout/response_repetition": [0.3] * 3, "rollout/in_group_std": [0.1] * 3}
    assert [line.get_linestyle() for line in mi.lines] == ["-", "--"]  # the ceiling is a reference, dashed


EVENTS = [{"step": 2, "rule": "entropy_floor", "action": "warn", "metric": "actor/entropy", "value": 0.01,
           "message": "actor/entropy < 0.05 for 3 steps"},
          {"step": 4, "rule": "entropy_floor", "action": "warn", "metric": "actor/entropy", "value": 0.01,
           "message": "again"},
          {"step": 3, "rule": "nonfinite_loss", "action": "rollback", "metric": "actor/pg_loss", "value": None,
           "message": "actor/pg_loss not finite"}]


@pytest.mark.parametrize("name", ["success", "entropy", "collapse"])
def test_every_panel_marks_each_watchdog_event_at_its_step(name):
    rows = [{"step": step, "train/Bandit/success": 0.5, "actor/entropy": 1.0, "collapse/mi": 0.3}
            for step in range(1, 6)]
    for axes in all_axes_of(rows, name, EVENTS):
        markers = [line for line in axes.lines if line.get_label().lstrip("_") in ("entropy_floor: warn",
                                                                                   "nonfinite_loss: rollback")]
        assert [tuple(line.get_xdata()) for line in markers] == [(2, 2), (4, 4), (3, 3)]  # vertical lines
        legend = [text.get_text() for text in axes.get_legend().get_texts()]
        assert legend.count("entropy_floor: warn") == 1 and legend.count("nonfinite_loss: rollback") == 1
    assert not [line for line in axes_of(rows, name).lines if ":" in line.get_label()]  # no events, no markers


def test_plot_run_reads_the_watchdog_events_and_does_without_them(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "actor/entropy": 1.0}\n{"step": 2, "actor/entropy": 0.9}\n')
    seen = []
    monkeypatch.setattr("ragen.plot.panel", lambda rows, tags, name, events, undone: seen.append(events) or panel(
        rows, tags, name, events, undone))
    plot_run(tmp_path)  # no watchdog.jsonl
    (tmp_path / "watchdog.jsonl").write_text("".join(json.dumps(event) + "\n" for event in EVENTS))
    plot_run(tmp_path)
    assert seen == [[]] * 5 + [EVENTS] * 5


def test_steps_a_rollback_undid_are_drawn_faintly_beside_their_replacements(tmp_path):
    rows = [{"step": step, "actor/entropy": 1.0} for step in (1, 2, 3)]
    undone = [{"step": step, "actor/entropy": 0.01, "rolled_back": "try 0, undone at step 3"} for step in (2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "metrics.rolled_back.jsonl").write_text("".join(json.dumps(row) + "\n" for row in undone))
    axes = panel(rows, [], "entropy", undone=undone).axes[0]
    lines = {line.get_label(): (tuple(line.get_xdata()), tuple(line.get_ydata())) for line in axes.lines}
    assert lines == {"actor/entropy": ((1, 2, 3), (1.0, 1.0, 1.0)),
                     "actor/entropy, try 0, undone at step 3": ((2, 3), (0.01, 0.01))}
    plot_run(tmp_path)  # reads the file


def test_command_line_help_and_errors(tmp_path):
    def plot(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ragen.plot", *args], cwd=REPO, capture_output=True,
                              text=True)

    done = plot("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m ragen.plot") and "run_dir" in done.stdout
    assert plot().returncode == 2
    missing = plot(str(tmp_path))
    assert missing.returncode == 1 and "metrics.jsonl" in missing.stderr
