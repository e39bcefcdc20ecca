"""Fault injection (marker `faults`): a training run SIGKILLed again and again, in its rollouts, its updates
and its checkpoint writes, resumed each time with the same command, ends with exactly the weights, metrics
and trajectory records of a run never interrupted (a short campaign of `scripts/fault_injection.py`); a
worker process killed mid-step stops the run with a message, not a hang, and the run resumes."""

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_train_e2e import read_metrics, train, train_command

REPO = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("fault_injection", REPO / "scripts" / "fault_injection.py")
fault_injection = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fault_injection)

pytestmark = pytest.mark.faults


def test_killed_again_and_again_the_run_ends_as_if_never_interrupted(tiny_model_path, tmp_path):
    """One kill is followed by damage to the newest checkpoint: the run resumes from the one before it."""
    result = fault_injection.campaign(tiny_model_path, tmp_path, kills=5, steps=4, seed=0, corrupt=1)
    kills = [k for k in result["history"] if k.killed]
    assert len(kills) >= 3, f"too few kills landed before the run finished: {result['history']}"
    (damaged,) = [k for k in kills if k.damaged]
    assert damaged.steps_lost <= 2, result["history"]  # the step in progress and the damaged checkpoint's
    # a checkpoint a step: only the current step
    assert all(k.steps_lost <= 1 for k in kills if not k.damaged), result["history"]
    assert result["weights_equal"] and result["metrics_equal"] and result["records_equal"], result


def session_processes(session: int, name: str) -> list[int]:
    """Pids of the processes of session `session` whose command line contains `name`."""
    listing = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
    return [int(pid) for pid, sid, args in (line.split(None, 2) for line in listing.splitlines())
            if int(sid) == session and name in args]


def test_a_worker_killed_mid_step_stops_the_run_with_a_message_and_it_resumes(tiny_model_path, tmp_path):
    """A Ray worker process SIGKILLed in step 2 (after step 1's checkpoint): the driver must stop promptly,
    say which worker died and where to resume from, and the same command must then finish the run."""
    args = ["trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "logging.log_images=false"]
    command = train_command("bandit", tiny_model_path, tmp_path, *args)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "global_step_1" / "trainer_state.json").is_file():
            assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.05)
        workers = session_processes(process.pid, "ray::ActorRolloutRefWorker")
        assert workers, "no actor worker process found"
        os.kill(workers[0], signal.SIGKILL)
        output, _ = process.communicate(timeout=120)  # a hang fails here
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode != 0
    assert "ActorRolloutRefWorker rank 0 (a Ray actor process) died" in output, output[-3000:]
    assert "The last checkpoint is" in output and "trainer.resume_mode=auto" in output, output[-3000:]
    result = train("bandit", tiny_model_path, tmp_path, *args)
    assert "resumed from" in result.stdout
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2, 3]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "3"
