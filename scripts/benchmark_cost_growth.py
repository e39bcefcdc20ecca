"""How a training step's time grows with the turns of a trajectory and with the batch, on one recipe:

    python scripts/benchmark_cost_growth.py [--recipe sokoban] [--turns 1 2 3 4 5] [--batch 8 16 24 32]
                                            [--fixed-turns 3] [--fixed-batch 8] [--out public/cost_growth.png]

Each point is one `python -m ragen.train` run of 2 steps (step 1 warms up; step 2 is reported) at
`agent_proxy.max_turn=<turns>` and `es_manager.train.env_groups=<batch / 4>` (groups of 4), every other key
the recipe's. Episodes run their full turns (the action budget is lifted, successes are rare) and every
step updates (the zero-variance skip is off), so that the points differ only in size. Printed per run: the
step's wall time and its stages, the tokens generated and the tokens updated (saved beside the figure as
JSON; `--replot` draws the figure again from them). The figure's top row is seconds per stage against
turns and against batch; its bottom row the cost per token of each stage, generation per generated token
and update per trained token: flat where a stage grows linearly, rising where it grows faster (a prefill
over the whole history every turn would make generation's rise with the turns).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

GROUP = 4


def run_step(recipe: str, turns: int, batch: int, overrides: list[str]) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"growth_{turns}x{batch}_"))
    command = [sys.executable, "-m", "ragen.train", "--config-name", recipe, "trainer.total_training_steps=2",
               f"agent_proxy.max_turn={turns}", f"es_manager.train.env_groups={batch // GROUP}",
               f"es_manager.train.group_size={GROUP}", "custom_envs.SimpleSokoban.max_actions_per_traj=1000",
               "algorithm.skip_zero_variance_batches=false", "trainer.val_before_train=false", "trainer.test_freq=-1",
               "trainer.save_freq=-1", "trainer.logger=[jsonl]", "logging.log_images=false",
               f"trainer.default_local_dir={run_dir}", f"hydra.run.dir={run_dir}/hydra", *overrides]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    m = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()][-1]
    update = sum(v for k, v in m.items() if k in ("timing_s/old_log_prob", "timing_s/update_actor",
                                                   "timing_s/ref", "timing_s/values", "timing_s/update_critic"))
    row = {"turns": turns, "batch": batch, "step_s": m["timing_s/step"], "gen_s": m["timing_s/gen"],
           "update_s": update, "generated_tokens": m["perf/generated_tokens"], "update_tokens": m["perf/update_tokens"]}
    print(json.dumps(row), flush=True)
    return row


def plot(turn_rows: list[dict], batch_rows: list[dict], out: str, title: str) -> None:
    """Top: seconds per stage against turns and against batch. Bottom: the cost per token of each stage
    (generation per generated token, update per trained token): flat where the growth is linear."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [("step_s", "step", "black"), ("gen_s", "generation", "tab:blue"),
              ("update_s", "update (old log-probs + actor)", "tab:orange")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex="col")
    for column, rows, key in [(0, turn_rows, "turns"), (1, batch_rows, "batch")]:
        x = [r[key] for r in rows]
        for stage, name, color in stages:
            axes[0, column].plot(x, [r[stage] for r in rows], "o-", color=color, label=name)
        axes[1, column].plot(x, [1000 * r["gen_s"] / r["generated_tokens"] for r in rows], "o-", color="tab:blue",
                             label="generation, ms per generated token")
        axes[1, column].plot(x, [1000 * r["update_s"] / r["update_tokens"] for r in rows], "o-", color="tab:orange",
                             label="update, ms per trained token (prompts included)")
        axes[0, column].set_ylabel("seconds per step")
        axes[1, column].set_ylabel("ms per token")
        axes[1, column].set_ylim(bottom=0)
        axes[1, column].set_xlabel("turns per trajectory" if key == "turns" else "trajectories per step")
        axes[1, column].set_xticks(x)
        for ax in axes[:, column]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="upper left")
    axes[0, 0].set_title("turns sweep")
    axes[0, 1].set_title("batch sweep")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="sokoban")
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 16, 24, 32])
    parser.add_argument("--fixed-turns", type=int, default=3, help="turns during the batch sweep")
    parser.add_argument("--fixed-batch", type=int, default=8, help="trajectories during the turns sweep")
    parser.add_argument("--out", default="public/cost_growth.png", help="the figure; its rows go beside it (.json)")
    parser.add_argument("--replot", action="store_true", help="draw the figure again from the saved rows")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_intermixed_args()
    if any(b % GROUP for b in [*args.batch, args.fixed_batch]):
        parser.error(f"batch sizes must be multiples of the group size {GROUP}")

    rows_path = Path(args.out).with_suffix(".json")
    if args.replot:
        rows = json.loads(rows_path.read_text(encoding="utf-8"))
    else:
        rows = {"turns": [run_step(args.recipe, t, args.fixed_batch, args.overrides) for t in args.turns],
                "batch": [run_step(args.recipe, args.fixed_turns, b, args.overrides) for b in args.batch]}
        rows_path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    plot(rows["turns"], rows["batch"], args.out, f"{args.recipe} on 2 CPU cores: one training step "
         f"(turns sweep at {args.fixed_batch} trajectories, batch sweep at {args.fixed_turns} turns)")


if __name__ == "__main__":
    main()
