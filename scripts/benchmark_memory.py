"""Peak memory of a training run, all its processes together (the driver, Ray's services and workers):

    python scripts/benchmark_memory.py <recipe> [--steps 2] [--interval 0.5] [key=value ...]

Runs `bash train.sh <recipe> trainer.total_training_steps=<steps>` plus the overrides, and every `--interval`
seconds sums the memory of the process tree. Printed: the peak of the summed RSS (counts pages that several
processes share once per process, so it overstates) and of the summed PSS (each shared page split among its
sharers: the memory the run really holds), the process count at the PSS peak, and the run's wall time.
Validation is off unless an override turns it on (trainer.val_before_train, trainer.test_freq), so that the
figure is a training step's.
"""

import argparse
import subprocess
import tempfile
import time

import psutil


def tree_memory(root: psutil.Process) -> tuple[int, int, int]:
    """(RSS sum, PSS sum, processes) over `root` and all its descendants; vanished processes count 0."""
    rss = pss = count = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss, count = rss + info.rss, pss + info.pss, count + 1
    return rss, pss, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="bandit | sokoban | frozen_lake | countdown")
    parser.add_argument("--steps", type=int, default=2, help="training steps to run")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides passed to train.sh")
    args = parser.parse_args()

    run_dir = tempfile.mkdtemp(prefix=f"memory_{args.recipe}_")
    command = ["bash", "train.sh", args.recipe, f"trainer.total_training_steps={args.steps}",
               "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
               f"trainer.default_local_dir={run_dir}", "trainer.logger=[jsonl]", "logging.log_images=false",
               *args.overrides]
    print(" ".join(command), flush=True)
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(child.pid)
    peak_rss, peak_pss, processes = 0, 0, 0
    while child.poll() is None:
        rss, pss, count = tree_memory(root)
        peak_rss = max(peak_rss, rss)
        if pss > peak_pss:
            peak_pss, processes = pss, count
        time.sleep(args.interval)
    stderr = child.stderr.read()
    if child.returncode != 0:
        raise SystemExit(f"train.sh exited with {child.returncode}:\n{stderr[-3000:]}")
    gib = 1024**3
    print(f"{args.recipe}: peak over all processes: PSS {peak_pss / gib:.2f} GiB ({processes} processes), "
          f"RSS {peak_rss / gib:.2f} GiB; {args.steps} steps in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
