"""scripts/reproduce.py's summary: before/after per tag over seeds, echo-trap signal means, and its figures."""

import argparse
import importlib.util
from pathlib import Path

REPO = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("reproduce", REPO / "scripts" / "reproduce.py")
reproduce = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduce)


def fake_rows(final_success: float, entropy_end: float) -> list[dict]:
    rows = [{"step": 0, "val-env/Bandit/success": 0.5}]
    for step in range(1, 11):
        rows.append({"step": step, "train/Bandit/success": 0.1 * step,
                     "actor/entropy": 1.0 if step <= 5 else entropy_end,
                     "rollout/in_group_std": 0.2, "rollout/response_repetition": 0.5})
    rows[-1]["val-env/Bandit/success"] = final_success
    return rows


def test_summary_table_signals_and_figures(tmp_path):
    runs = {}
    for seed, (final, entropy_end) in {1: (1.0, 0.2), 2: (0.0, 0.4)}.items():
        rows = fake_rows(final, entropy_end)
        runs[seed] = {"val": reproduce.success_curves(rows, "val-env"),
                      "train": reproduce.success_curves(rows, "train"), "wall_time_s": 60.0, "rows": rows}
    args = argparse.Namespace(val_seed=5_000_000, val_groups=64, overrides=[])
    summary = reproduce.summarise(runs, "bandit", args)

    row = summary["val_success"]["Bandit"]
    assert row["before"] == [0.5, 0.5] and row["after"] == [1.0, 0.0] and row["after_mean"] == 0.5
    assert abs(row["after_std"] - 2 ** 0.5 / 2) < 1e-12  # sample std of {1, 0}
    assert summary["signals"][1]["actor/entropy"] == (1.0, 0.2)
    assert summary["signals"][2]["actor/entropy"] == (1.0, 0.4)
    assert "rollout/reward_std" not in summary["signals"][1]  # never logged: no entry, no crash

    text = reproduce.markdown(summary)
    assert "| Bandit | 0.500 | 0.500 ± 0.707 | 1.000, 0.000 |" in text
    assert "| 1 | 1.00 -> 0.20 | - | 0.20 -> 0.20 | 0.50 -> 0.50 |" in text

    reproduce.plot(runs, tmp_path / "curve.png", "bandit")
    reproduce.plot_signals(runs, tmp_path / "signals.png", "bandit")
    assert (tmp_path / "curve.png").stat().st_size > 0 and (tmp_path / "signals.png").stat().st_size > 0
