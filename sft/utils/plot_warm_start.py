"""One figure of a warm start: the SFT run's curves and the success rate before SFT, after SFT and after RL.

    python sft/utils/plot_warm_start.py --sft_run checkpoints/sft/sokoban \
        --evals "base model=outputs/eval_base" "after SFT=outputs/eval_sft" "SFT + RL=outputs/eval_rl" \
        --output public/sft_warm_start.png

`--sft_run` is finetune_lora.sh's <save_path> (its metrics.jsonl); each `--evals` entry is `label=folder` with
the metrics.json that `python -m ragen.eval` wrote there.
"""

import argparse
import json
import sys
from pathlib import Path

from ragen.plot import read_metrics, series


def success_rates(evals: list[str]) -> list[tuple[str, float, int]]:
    """(label, success, episodes) per `label=folder`, averaged over the env tags of the eval."""
    rates = []
    for entry in evals:
        label, sep, folder = entry.partition("=")
        path = Path(folder) / "metrics.json"
        if not sep or not path.is_file():
            raise FileNotFoundError(f"--evals {entry!r}: give label=folder, the folder holding the metrics.json "
                                    "of python -m ragen.eval")
        metrics = json.loads(path.read_text(encoding="utf-8"))
        tags = sorted({key.split("/")[1] for key in metrics if key.startswith("val-env/")})
        episodes = len((Path(folder) / "trajectories.jsonl").read_text(encoding="utf-8").splitlines())
        rates.append((label, sum(metrics[f"val-env/{t}/success"] for t in tags) / len(tags), episodes))
    return rates


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft_run", required=True, help="finetune_lora.sh's <save_path>")
    parser.add_argument("--evals", nargs="+", required=True, help="label=folder of a ragen.eval run, in order")
    parser.add_argument("--output", default="public/sft_warm_start.png")
    args = parser.parse_args(argv)
    try:
        rows, rates = read_metrics(Path(args.sft_run)), success_rates(args.evals)
    except FileNotFoundError as e:
        sys.exit(str(e))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4))
    curves.plot(*series(rows, "sft/loss"), label="train loss (reply tokens)")
    curves.plot(*series(rows, "val/loss"), marker="o", linestyle="--", label="test loss")
    curves.set(title="LoRA SFT on expert conversations", xlabel="optimizer step", ylabel="loss (nats / token)")
    accuracy = curves.twinx()
    accuracy.plot(*series(rows, "val/action_accuracy"), color="C2", marker="s", label="test: expert's actions")
    accuracy.plot(*series(rows, "val/format_accuracy"), color="C3", marker="^", label="test: well-formed")
    accuracy.set(ylabel="share of test replies (greedy)", ylim=(0, 1.05))
    lines = curves.get_lines() + accuracy.get_lines()
    curves.legend(lines, [line.get_label() for line in lines], fontsize="small", loc="center right")
    curves.grid(alpha=0.3)

    labels, values = [r[0] for r in rates], [r[1] for r in rates]
    drawn = bars.bar(labels, values, color=[f"C{i}" for i in range(len(rates))])
    bars.bar_label(drawn, labels=[f"{v:.1%}\n(n={n})" for _, v, n in rates], fontsize="small")
    bars.set(title="Success rate (greedy, unseen start states)", ylabel="success", ylim=(0, 1.1))
    bars.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.output, dpi=100)
    print(args.output)


if __name__ == "__main__":
    main()
