"""Peak memory of a training run, all its processes together (the driver, Ray's services and workers):

    python scripts/benchmark_memory.py <recipe> [--steps 2] [--interval 0.5] [key=value ...]

Runs `bash train.sh <recipe> trainer.total_training_steps=<steps>` plus the overrides, and every `--interval`
seconds sums the memory of the process tree. Printed: the peak of the summed RSS (counts pages that several
processes share once per process, so it overstates) and of the summed PSS (each shared page split among its
sharers: the memory the run really holds), the process count and the five largest processes at the PSS
peak, and the run's wall time.
Validation is off unless an override turns it on (trainer.val_before_train, trainer.test_freq), so that the
figure is a training step's.
"""

import argparse
import subprocess
import tempfile
import time

import psutil


def tree_memory(root: psutil.Process) -> tuple[int, int, list[tuple[int, str]]]:
    """(RSS sum, PSS sum, [(PSS, name)] per process) over `root` and all its descendants; vanished processes
    count 0."""
    rss = pss = 0
    processes = []
    for process in [root, *root.children(recursive=True)]:
        try:
            info, name = process.memory_full_info(), " ".join(process.cmdline())[:60] or process.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss = rss + info.rss, pss + info.pss
        processes.append((info.pss, name))
    return rss, pss, processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="bandit | sokoban | frozen_lake | countdown")
    parser.add_argument("--steps", type=int, default=2, help="training steps to run")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides passed to train.sh")
    args = parser.parse_intermixed_args()

    run_dir = tempfile.mkdtemp(prefix=f"memory_{args.recipe}_")
    command = ["bash", "train.sh", args.recipe, f"trainer.total_training_steps={args.steps}",
               "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
               f"trainer.default_local_dir={run_dir}", "trainer.logger=[jsonl]", "logging.log_images=false",
               *args.overrides]
    print(" ".join(command), flush=True)
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, encoding="utf-8")
    root = psutil.Process(child.pid)
    peak_rss, peak_pss, processes = 0, 0, []
    while child.poll() is None:
        rss, pss, per_process = tree_memory(root)
        peak_rss = max(peak_rss, rss)
        if pss > peak_pss:
            peak_pss, processes = pss, per_process
        time.sleep(args.interval)
    stderr = child.stderr.read()
    if child.returncode != 0:
        raise SystemExit(f"train.sh exited with {child.returncode}:\n{stderr[-3000:]}")
    gib = 1024**3
    print(f"{args.recipe}: peak over all processes: PSS {peak_pss / gib:.2f} GiB ({len(processes)} processes), "
          f"RSS {peak_rss / gib:.2f} GiB; {args.steps} steps in {time.perf_counter() - start:.0f} s", flush=True)
    for pss, name in sorted(processes, reverse=True)[:5]:
        print(f"  {pss / gib:5.2f} GiB  {name}")


if __name__ == "__main__":
    main()
