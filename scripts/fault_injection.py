"""Fault injection: SIGKILL a training run again and again and resume it each time with the same command; it
must end with exactly the weights, metrics and trajectory records of a run that was never interrupted.

    python scripts/fault_injection.py [--kills 12] [--steps 4] [--seed 0] [--corrupt 2] [--model PATH]

Each kill waits for a stage, chosen at random, of the step in progress or the next one: its rollout, its
update (its trajectories are on disk, its checkpoint is not), its checkpoint write (the staging folder
exists), or a random moment of the run; where the run really was when killed is read from its folder. The
runs are the trainer's own command (`train.sh`, backend local, a checkpoint every step, a critic and the
variance filter so that their states resume too) on a tiny random model unless `--model` names another. Printed: kills, what each interrupted, the steps each one cost
(steps whose work was lost: the step in progress, less the checkpoint it resumes from), and whether the
final weights, metrics and records equal the uninterrupted run's. With `--corrupt N`, after the first N kills
that leave two checkpoints the newest one is also damaged (its weights or its optimizer state cut short or bit-flipped, in
turn): the next start must resume from the checkpoint before it (verl/utils/checkpoint.py verifies each
against its manifest), losing that step too and nothing else. `tests/test_fault_injection.py` runs a short
campaign of it.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.conftest's tiny model

from verl.trainer.config import TrainerConfig  # noqa: E402
from verl.utils.checkpoint import read_step, resume_path  # noqa: E402

STAGES = ("rollout", "update", "checkpoint", "random")  # what a kill waits for
# metrics that measure the machine, not the training: they differ between any two runs
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1"}  # nothing reaches a hub
MACHINE_METRICS = ("timing_s/", "perf/rollout_tokens_per_s", "perf/peak_memory_gib")


def train_command(model_path: str, run_dir: Path, steps: int) -> list[str]:
    return ["bash", str(REPO / "train.sh"), "sokoban", f"model_path={model_path}",
            f"trainer.default_local_dir={run_dir}", f"hydra.run.dir={run_dir / 'hydra'}",
            f"logging.log_image_dir={run_dir / 'log'}",
            "actor_rollout_ref.rollout.response_length=16", "algorithm.skip_zero_variance_batches=false",
            "algo=starpo_s", "actor_rollout_ref.actor.ppo_mini_batch_size=4", f"trainer.total_training_steps={steps}",
            "trainer.save_freq=1", "trainer.backend=local", "agent_proxy.max_turn=2", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "actor_rollout_ref.actor.optim.lr=1e-4",
            "actor_rollout_ref.actor.optim.lr_scheduler=cosine"]


@dataclass
class Kill:
    planned: str  # the stage the kill waited for (random: a moment)
    stage: str  # where the run was when killed: rollout (or start-up), update, checkpoint, done (after its last step)
    step: int  # the step the run was in: the one after its newest checkpoint
    resumed_from: int  # the newest complete checkpoint after the kill (0: none)
    killed: bool  # False: the run had finished before the moment came
    damaged: str = ""  # the checkpoint file damaged after the kill, and how ("" if none)

    @property
    def steps_lost(self) -> int:
        """Steps to do again: the one in progress, and any the kill or the damage cost a checkpoint of."""
        return self.step - self.resumed_from if self.killed and (self.stage != "done" or self.damaged) else 0


def checkpointed(run_dir: Path) -> int:
    """The step of the checkpoint a resume would start from (0: none): the newest that verifies."""
    path = resume_path(TrainerConfig(default_local_dir=str(run_dir)))
    return 0 if path is None else read_step(path)


DAMAGES = (("actor/model.safetensors", "cut short"), ("actor/train_state_rank0.pt", "bit-flipped"),
           ("actor/train_state_rank0.pt", "cut short"), ("actor/model.safetensors", "bit-flipped"))


def damage_newest(run_dir: Path, which: int) -> str:
    """Damage a file of the newest checkpoint (the `which`-th of DAMAGES); returns what was done."""
    name, how = DAMAGES[which % len(DAMAGES)]
    path = run_dir / f"global_step_{checkpointed(run_dir)}" / name
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2] if how == "cut short" else data[:-9] + bytes([data[-9] ^ 0x10]) + data[-8:])
    return f"{path.relative_to(run_dir)} {how}"


def fresh(path: Path, since: float) -> bool:
    """Whether `path` was written by this attempt (a killed attempt leaves its files behind)."""
    try:
        return path.stat().st_mtime >= since
    except FileNotFoundError:
        return False


def observed_stage(run_dir: Path, last_step: int, since: float) -> tuple[str, int]:
    """(stage, step) the run is in, read from what it wrote since `since`: rollout (or start-up), update,
    checkpoint, or done (after its last step)."""
    step = checkpointed(run_dir) + 1
    if step > last_step:
        return "done", last_step
    if fresh(run_dir / f"global_step_{step}.tmp", since):
        return "checkpoint", step
    if fresh(run_dir / "rollouts" / "train" / f"step_{step}.jsonl", since):
        return "update", step
    return "rollout", step


def run_until_killed(command: list[str], run_dir: Path, stage: str, step: int, last_step: int, delay: float,
                     timeout: float) -> Kill:
    """Start `command`; SIGKILL its process group when it reaches `stage` of `step` or has passed that step
    (polled every 2 ms), or after `delay` seconds for a random moment."""
    since = time.time()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                               env=OFFLINE)
    started = time.monotonic()
    while process.poll() is None and time.monotonic() - started < timeout:
        if stage == "random":
            if time.monotonic() - started >= delay:
                break
        elif checkpointed(run_dir) >= step or observed_stage(run_dir, last_step, since) == (stage, step):
            break
        time.sleep(0.002)
    killed = process.poll() is None
    where, in_progress = observed_stage(run_dir, last_step, since)
    if killed:
        os.killpg(process.pid, signal.SIGKILL)
    _, stderr = process.communicate()
    if not killed and process.returncode != 0:
        raise RuntimeError(f"the run failed by itself (exit {process.returncode}):\n{stderr.decode()[-3000:]}")
    return Kill(stage, where, in_progress, checkpointed(run_dir), killed)


def comparable(run_dir: Path, steps: int) -> tuple[list[dict], list[str]]:
    """What must equal the uninterrupted run's besides the weights: the metrics (machine timings aside) and
    every step's trajectory records."""
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    records = [(run_dir / "rollouts" / "train" / f"step_{s}.jsonl").read_text(encoding="utf-8")
               for s in range(1, steps + 1)]
    return [{k: v for k, v in m.items() if not k.startswith(MACHINE_METRICS)} for m in metrics], records


def identical_weights(a: Path, b: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    for part in ("actor", "critic"):
        x, y = load_file(a / part / "model.safetensors"), load_file(b / part / "model.safetensors")
        if x.keys() != y.keys() or not all(torch.equal(x[k], y[k]) for k in x):
            return False
    return True


def campaign(model_path: str, work: Path, kills: int, steps: int, seed: int, log=print, corrupt: int = 0) -> dict:
    """Run the uninterrupted reference, then the killed run, damaging the newest checkpoint after `corrupt` of
    the kills; return the figures and the comparison."""
    rng = random.Random(seed)
    whole, killed = work / "whole", work / "killed"
    started = time.monotonic()
    subprocess.run(train_command(model_path, whole, steps), check=True, capture_output=True, env=OFFLINE)
    duration = time.monotonic() - started
    log(f"uninterrupted run: {steps} steps in {duration:.0f} s")
    history = []
    command = train_command(model_path, killed, steps)
    while sum(k.killed for k in history) < kills and checkpointed(killed) < steps:
        # the step in progress or the next one: about every other kill lets the run move on by a step
        stage, step = rng.choice(STAGES), min(steps, checkpointed(killed) + rng.randint(1, 2))
        kill = run_until_killed(command, killed, stage, step, steps, rng.uniform(0, duration / 2), 4 * duration)
        damaged = sum(bool(k.damaged) for k in history)
        if kill.killed and damaged < corrupt and checkpointed(killed) >= 2:
            before = checkpointed(killed)
            kill.damaged = damage_newest(killed, damaged)
            kill.resumed_from = checkpointed(killed)  # where the next start resumes: the checkpoint before
            kill.step = max(kill.step, before + 1)
            if kill.resumed_from != before - 1:
                raise RuntimeError(f"after damaging {kill.damaged} the run would resume from step "
                                   f"{kill.resumed_from}, not {before - 1}")
        history.append(kill)
        log(f"kill {len(history)} (waited for: {stage}): "
            + ("the run had finished" if not kill.killed
               else "after the last step, nothing lost" if kill.stage == "done" and not kill.damaged
               else f"in the {kill.stage} of step {kill.step}"
                    + (f", then {kill.damaged}" if kill.damaged else "")
                    + f", resumes from step {kill.resumed_from}, {kill.steps_lost} step(s) lost"))
    if checkpointed(killed) < steps:
        subprocess.run(command, check=True, capture_output=True, env=OFFLINE)
    (metrics_a, records_a), (metrics_b, records_b) = comparable(whole, steps), comparable(killed, steps)
    return {"kills": sum(k.killed for k in history), "history": history,
            "weights_equal": identical_weights(whole / f"global_step_{steps}", killed / f"global_step_{steps}"),
            "metrics_equal": metrics_a == metrics_b, "records_equal": records_a == records_b}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corrupt", type=int, default=0, help="kills after which the newest checkpoint is damaged")
    parser.add_argument("--model", help="an HF model folder; default: a tiny random Llama with the bundled tokenizer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        model = args.model
        if model is None:
            from tests.conftest import save_tiny_llama
            from verl.utils.model import load_tokenizer, resolve_model_path

            model = save_tiny_llama(work / "tiny", load_tokenizer(resolve_model_path("bundled:SmolLM2-135M-Instruct")))
        result = campaign(model, work, args.kills, args.steps, args.seed, corrupt=args.corrupt)
    history = [k for k in result["history"] if k.killed]
    by_stage = {s: sum(k.stage == s for k in history) for s in ("rollout", "update", "checkpoint", "done")}
    lost = [k.steps_lost for k in history]
    print(f"kills survived: {result['kills']} ({', '.join(f'{n} in {s}' for s, n in by_stage.items())}; "
          f"{sum(bool(k.damaged) for k in history)} followed by a damaged newest checkpoint); "
          f"steps lost per kill: max {max(lost, default=0)}, mean {sum(lost) / max(len(lost), 1):.2f}; "
          f"final weights equal: {result['weights_equal']}, metrics equal: {result['metrics_equal']}, "
          f"records equal: {result['records_equal']}")
    if not (result["weights_equal"] and result["metrics_equal"] and result["records_equal"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
