"""End to end: `train.sh` on a tiny random model with the bundled tokenizer, through the real stack."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from verl.utils import checkpoint

REPO = Path(__file__).parents[1]
# what the libraries print unless trainer.verbose=true: per-worker model load/save bars, the critic's load
# report (its value head is new), Ray's token-authentication notice
LIBRARY_NOISE = ("Loading weights", "Writing model shards", "LOAD REPORT", "Token authentication")


# plumbing runs at the sizes they were written for: the sokoban recipe's 8 groups (what the CPU recipe measured)
# cut to 4, which keeps the suite's time; and RLOO, since the recipe's filter (gigpo's) keeps no group of a random
# model, whose rewards never differ. A test's own overrides come after (a later algo= wins)
TEST_SIZES = {"sokoban": ["es_manager.train.env_groups=4", "algo=rloo"]}


def train_command(recipe: str, model_path: str, run_dir: Path, *overrides: str) -> list[str]:
    return ["bash", str(REPO / "train.sh"), recipe, f"model_path={model_path}",
            f"trainer.default_local_dir={run_dir}", f"hydra.run.dir={run_dir / 'hydra'}",
            f"logging.log_image_dir={run_dir / 'log'}", "actor_rollout_ref.rollout.response_length=16",
            # a random model's replies are all malformed, so every reward is equal: update anyway (plumbing)
            "algorithm.skip_zero_variance_batches=false", *TEST_SIZES.get(recipe, []), *overrides]


def train(recipe: str, model_path: str, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = train_command(recipe, model_path, run_dir, *overrides)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=run_env(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def run_env(run_dir: Path) -> dict[str, str]:
    """A run's environment: offline, and marked with its folder, which every process the run starts inherits (Ray's
    GCS, raylet and workers, spawned env servers), so that `run_processes` tells them from other runs' processes."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "RAGEN_TEST_RUN": str(run_dir)}


def changed_tensors(before_dir: str, after_dir: Path) -> list[str]:
    before, after = load_file(Path(before_dir) / "model.safetensors"), load_file(after_dir / "model.safetensors")
    assert before.keys() == after.keys()
    return [k for k in before if not torch.equal(before[k], after[k])]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_processes(pattern: str, run_dir: Path) -> list[str]:
    """Command lines of the running processes (zombies are not running) matching `pattern` (pgrep -f) of the run in
    `run_dir` (`run_env`); another run on this machine, a researcher's or another test process's (`pytest -n 2`),
    is not this run's."""
    listing = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
    mark = f"RAGEN_TEST_RUN={run_dir}".encode()
    ours = []
    for line in listing.splitlines():
        try:
            environment = Path(f"/proc/{line.split()[0]}/environ").read_bytes().split(b"\0")
        except OSError:  # it has exited
            continue
        if "<defunct>" not in line and mark in environment:
            ours.append(line)
    return ours


def left_behind(run_dir: Path, grace_s: float = 30.0) -> list[str]:
    """The run's Ray processes still running once those that `ray.shutdown()` has told to exit have had `grace_s`
    seconds to do so (they exit asynchronously: on a loaded machine a worker can still be running right after the
    run returned; 10 s was once too short, with the suite beside two other torch processes)."""
    deadline = time.monotonic() + grace_s
    while True:
        remaining = run_processes("raylet|gcs_server|ray::", run_dir)
        if not remaining or time.monotonic() > deadline:
            return remaining
        time.sleep(0.2)


def library_noise(result: subprocess.CompletedProcess) -> list[str]:
    return [noise for noise in LIBRARY_NOISE if noise in result.stdout + result.stderr]


def test_bandit_two_steps_on_ray(tiny_model_path, tmp_path):
    result = train("bandit", tiny_model_path, tmp_path, "trainer.total_training_steps=2",
                   "logging.log_image_step_size=2", "logging.log_n_image_per_batch=4")
    validation, *metrics = read_metrics(tmp_path)
    assert validation["step"] == 0 and "val-env/Bandit/success" in validation  # the untrained baseline
    assert [m["step"] for m in metrics] == [1, 2]
    assert "val-env/Bandit/pass@1" in metrics[1] and "val-env/Bandit/pass@1" not in metrics[0]  # test_freq 10: last
    for m in metrics:
        for key in ("rollout/reward_mean", "rollout/success_rate", "rollout/response_length", "train/Bandit/success",
                    "actor/pg_loss", "actor/entropy", "actor/grad_norm", "timing_s/gen", "timing_s/update_actor",
                    "actor/pg_clipfrac", "actor/ppo_kl", "actor/zero_variance_skip", "critic/advantages_mean",
                    "rollout/in_group_std", "rollout/chosen_in_group_std",
                    "rollout/filter_kept_ratio", "rollout/response_repetition"):
            assert key in m, key
        assert m["actor/grad_norm"] > 0 and "critic/vf_loss" not in m  # the bandit recipe is RLOO: no critic
        assert m["perf/generated_tokens"] > 0 and m["perf/update_tokens"] > 0
        assert m["perf/rollout_tokens_per_s"] == pytest.approx(m["perf/generated_tokens"] / m["timing_s/gen"])
        assert m["perf/peak_memory_gib"] > 0.2  # the actor worker's peak RSS: torch and a model take more
    assert "step 2:" in result.stdout
    banner = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("[ragen] ")]
    assert banner[:9] == ["experiment", "model", "start", "steps", "checkpoints", "metrics", "plots", "records",
                          "pages"]
    assert "[ragen] start        from scratch" in result.stdout
    assert "[ragen] the first step took" in result.stdout  # the time the rest takes, after step 1
    assert "[ragen] finished step 2 of 2" in result.stdout
    assert f"[ragen] checkpoint   {tmp_path / 'global_step_2'}: the trained policy" in result.stdout
    assert library_noise(result) == []
    assert [p.name for p in (tmp_path / "hydra").iterdir()] == [".hydra"]  # the resolved config; no empty train.log
    changed = changed_tensors(tiny_model_path, tmp_path / "global_step_2" / "actor")
    assert any("layers.0.self_attn.q_proj" in k for k in changed) and any("layers.1.mlp" in k for k in changed)
    assert left_behind(tmp_path) == [], "the run left Ray processes behind"
    rollouts = tmp_path / "rollouts"
    assert sorted(p.relative_to(rollouts).as_posix() for p in rollouts.rglob("*.jsonl")) == [
        "train/step_1.jsonl", "train/step_2.jsonl", "val/step_0.jsonl", "val/step_2.jsonl"]
    train_records = [json.loads(line) for line in (rollouts / "train" / "step_1.jsonl").read_text().splitlines()]
    assert len(train_records) == 32 and all(r["tag"] == "Bandit" and len(r["turns"]) == 1 for r in train_records)
    val_records = [json.loads(line) for line in (rollouts / "val" / "step_0.jsonl").read_text().splitlines()]
    assert len(val_records) == 8  # the CPU scale's validation set: 8 start states x 1, split over two tags
    assert sorted({r["tag"] for r in val_records}) == ["Bandit", "BanditTest"]
    assert all("advantage" in turn for r in train_records for turn in r["turns"])
    assert {p.name for p in (tmp_path / "plots").glob("*.png")} == {"success.png", "reward.png", "entropy.png",
                                                                   "reward_std.png", "collapse.png"}
    pages = tmp_path / "log"  # the trajectory browser: the first and last steps and both validations
    assert sorted(p.parent.name for p in pages.rglob("trajectory_data_*.html")) == \
        ["step_1"] * 4 + ["step_2"] * 4 + ["val_step_0"] * 4 + ["val_step_2"] * 4
    assert (pages / "index.html").is_file()


def test_sokoban_multi_turn_on_local_backend(tiny_model_path, tmp_path):
    """Also VAGEN's pieces through the real stack (plumbing: a random model writes no state span and rarely a tag,
    so its credits are 0; the credits and the narrowing are tested in test_world_model_reward.py and
    test_ppo_trainer.py): the world-model reply format and reward, TRICO's masks."""
    train("sokoban", tiny_model_path, tmp_path, "trainer.total_training_steps=1", "trainer.backend=local",
          "agent_proxy.max_turn=2", "agent_proxy.enable_think=true", "agent_proxy.reply_format=world_model",
          "agent_proxy.world_model_reward.observation=0.5", "agent_proxy.world_model_reward.prediction=0.5",
          "algorithm.loss_spans=[think,answer]", "algorithm.adv_spans=[think,answer,format]")
    validation, metrics = read_metrics(tmp_path)
    assert validation["step"] == 0 and validation["val/num_turns"] == 2  # greedy validation of the untrained model
    assert metrics["rollout/num_turns"] == 2  # a random model never solves it, so both turns run
    assert metrics["train/CoordSokoban/success"] == 0.0
    assert {"val/world_model/observation_credit", "val/task_reward_mean"} <= validation.keys()
    assert {"rollout/world_model/reward_mean", "rollout/task_reward_mean"} <= metrics.keys()
    records = [json.loads(line) for line in (tmp_path / "rollouts" / "train" / "step_1.jsonl").read_text().splitlines()]
    assert all(turn["world_model"]["reward"] == 0.5 * (turn["world_model"]["observation"] +
                                                       turn["world_model"]["prediction"])
               for record in records for turn in record["turns"])
    assert changed_tensors(tiny_model_path, tmp_path / "global_step_1" / "actor")


def test_a_context_window_costs_no_rollout_gap(tiny_model_path, tmp_path):
    """The recipe shows one turn a prompt (max_context_window 1): the update scores each reply in that prompt, so
    with an fp32 engine its log-probs are the engine's (scored as one sequence they were off by up to 0.05)."""
    train("sokoban", tiny_model_path, tmp_path, "trainer.total_training_steps=1", "trainer.backend=local",
          "agent_proxy.max_turn=3", "trainer.val_before_train=false", "trainer.test_freq=-1",
          "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.model.dtype=float32")
    (metrics,) = read_metrics(tmp_path)
    assert metrics["rollout/num_turns"] == 3
    assert metrics["actor/rollout_logprob_diff_max"] < 1e-4 and abs(metrics["actor/rollout_kl"]) < 1e-8


@pytest.mark.parametrize("algo, expected, absent", [
    ("starpo", ["actor/kl_loss", "critic/vf_loss"], []),  # KL loss to a reference policy, a critic
    ("grpo", ["actor/pg_loss"], ["critic/vf_loss", "actor/kl_loss"]),  # neither critic nor reference
    ("brpo", ["actor/pg_loss"], ["critic/vf_loss"]),
    ("bi_level_gae", ["critic/vf_loss", "critic/returns_mean"], []),
    ("gigpo", ["actor/pg_loss"], ["critic/vf_loss", "actor/kl_loss"]),  # the sokoban recipe's own
])
def test_each_algorithm_recipe_trains(tiny_model_path, tmp_path, algo, expected, absent):
    # mini-batches of 4: the variance filter of grpo, brpo and bi_level_gae keeps 4 of the 16 trajectories (the
    # recipe's 8 groups cut to 4 by TEST_SIZES); gigpo's top_p filter would keep none of a random model's tied
    # groups, so it keeps all here
    keep_all = [f"actor_rollout_ref.rollout.rollout_filter_{key}" for key in ("strategy=top_k", "value=1",
                                                                              "include_zero=true")]
    train("sokoban", tiny_model_path, tmp_path, f"algo={algo}", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
          *(keep_all if algo == "gigpo" else []),
          "trainer.total_training_steps=1", "trainer.backend=local", "agent_proxy.max_turn=2", "trainer.val_before_train=false", "trainer.test_freq=-1")
    (metrics,) = read_metrics(tmp_path)
    assert all(key in metrics for key in expected) and not any(key in metrics for key in absent)
    assert changed_tensors(tiny_model_path, tmp_path / "global_step_1" / "actor")


def test_two_data_parallel_ranks_with_a_critic_on_ray(tiny_model_path, tmp_path):
    # the filter keeps 1 of 4 groups = one mini-batch of 4, split 2 + 2 over the ranks of actor and critic
    result = train("sokoban", tiny_model_path, tmp_path, "algo=starpo_s",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "trainer.total_training_steps=2",
                   "trainer.n_cpu_ranks_per_node=2", "agent_proxy.max_turn=2", "trainer.val_before_train=false",
                   "trainer.test_freq=-1")
    assert library_noise(result) == [] and "a new value head" in result.stdout  # said once, by the driver
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["rollout/filter_kept_ratio"] == 0.25 and "critic/vf_loss" in m for m in metrics)
    assert changed_tensors(tiny_model_path, tmp_path / "global_step_2" / "actor")
    assert left_behind(tmp_path) == [], "the run left Ray processes behind"


def test_a_run_whose_filter_keeps_nothing_stops_after_the_empty_steps(tiny_model_path, tmp_path):
    # a random model's replies are all malformed, so every group's rewards are equal: with include_zero=false the
    # filter keeps no group, each step trains on nothing, and the second such step in a row stops the run
    filter_keys = ["strategy=top_p", "value=0.9", "include_zero=false", "empty_stop_steps=2"]
    command = train_command("bandit", tiny_model_path, tmp_path, "trainer.backend=local",
                            "trainer.total_training_steps=5", "trainer.save_freq=1", "trainer.val_before_train=false",
                            "trainer.test_freq=-1", "trainer.collapse_mi_inputs=0",
                            *[f"actor_rollout_ref.rollout.rollout_filter_{key}" for key in filter_keys])
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]  # the skipped steps still count
    assert all(m["rollout/in_group_std"] == 0 and m["rollout/empty_after_filter"] == 1 for m in metrics)
    assert [m["rollout/empty_after_filter_steps"] for m in metrics] == [1, 2]
    assert not any("actor/pg_loss" in m for m in metrics)  # no update
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "global_step_1"  # saved as usual before the stop
    assert ("[watchdog] step 2: rollout_filter_empty_stop_steps: the rollout filter kept no group for 2 steps in "
            "a row") in result.stdout
    assert "stopped: the watchdog stopped the run at step 2 (rollout_filter_empty_stop_steps)" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_verbose_shows_the_libraries_output(tiny_model_path, tmp_path):
    result = train("bandit", tiny_model_path, tmp_path, "trainer.verbose=true", "algorithm.adv_estimator=gae",
                   "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
                   "es_manager.train.env_groups=1", "es_manager.train.group_size=4",  # a critic, a small batch
                   "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    assert {"Loading weights", "Writing model shards", "LOAD REPORT"} <= set(library_noise(result))


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_ends_with_a_summary_and_a_resumable_checkpoint(tiny_model_path, tmp_path, how):
    command = train_command("bandit", tiny_model_path, tmp_path, "trainer.total_training_steps=100",
                            "trainer.save_freq=1", "trainer.val_before_train=false")
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, env=run_env(tmp_path))
    printed = []
    for line in run.stdout:  # until the first checkpoint is written
        printed.append(line)
        if line.startswith("saved checkpoint"):
            break
    assert printed[-1:] and printed[-1].startswith("saved checkpoint"), "".join(printed) + run.stderr.read()
    if how == "ctrl-c":
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C does: signal the terminal's foreground process group
    else:
        run.send_signal(signal.SIGTERM)  # `kill`, `timeout`: the trainer alone
    rest, errors = run.communicate(timeout=120)
    stdout = "".join(printed) + rest
    assert run.returncode == 130, stdout[-3000:] + errors[-3000:]
    assert "Traceback" not in stdout + errors and "KeyboardInterrupt" not in stdout + errors
    assert "[ragen] interrupted after step" in stdout
    last = checkpoint.latest_checkpoint(tmp_path)  # complete, with its optimizer state
    assert last is not None and f"[ragen] checkpoint   {last}: the same command resumes from it" in stdout
    assert left_behind(tmp_path) == [], "the run left Ray processes behind"


def test_bad_config_fails_before_loading_a_model(tmp_path):
    command = ["bash", str(REPO / "train.sh"), "sokoban", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
               "model_path=/nonexistent/model", f"hydra.run.dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "ppo_mini_batch_size" in result.stderr and "/nonexistent/model" not in result.stderr


def test_a_mix_of_frozen_lake_and_countdown_in_one_batch(tiny_model_path, tmp_path):
    train("frozen_lake", tiny_model_path, tmp_path, "trainer.total_training_steps=1", "trainer.backend=local",
          "agent_proxy.max_turn=2", "es_manager.train.env_configs.tags=[FrozenLake,Countdown]",
          "es_manager.train.env_configs.n_groups=[2,2]", "trainer.val_before_train=false", "trainer.test_freq=-1")
    (metrics,) = read_metrics(tmp_path)
    for tag in ("FrozenLake", "Countdown"):
        assert f"train/{tag}/success" in metrics and f"train/{tag}/valid_action_rate" in metrics
    assert changed_tensors(tiny_model_path, tmp_path / "global_step_1" / "actor")


def test_eval_cli_reports_per_env_metrics_and_pass_at_k(tiny_model_path, tmp_path):
    command = ["python", "-m", "ragen.eval", "--config-name", "sokoban", f"model_path={tiny_model_path}",
               f"hydra.run.dir={tmp_path}", "actor_rollout_ref.rollout.response_length=16", "agent_proxy.max_turn=2",
               "es_manager.val.env_groups=2", "es_manager.val.group_size=2", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
               "es_manager.val.seeds=[1000007,1000003]"]  # start states named one by one (boards no run saw)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    what, header, row = result.stdout.splitlines()[:3]
    assert what == (f"model {tiny_model_path}; 2 start states x 2 (es_manager.val), the 2 seeds of "
                    "es_manager.val.seeds; sampling at temperature 1.0")
    assert header.split()[:4] == ["env", "success", "pass@1", "pass@2"] and row.split()[0] == "CoordSokoban"
    usage = subprocess.run(["python", "-m", "ragen.eval", "--help"], capture_output=True, text=True, timeout=120,
                           cwd=REPO)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: python -m ragen.eval")
    assert len(usage.stdout.splitlines()) < 40  # not the whole config
    records = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {r["group_id"] for r in records} == {0, 1}
    assert [r["seed"] for r in records] == [1000007, 1000007, 1000003, 1000003]
    assert all(1 <= len(r["turns"]) <= 2 for r in records)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["val-env/CoordSokoban/num_turns"] == pytest.approx(sum(len(r["turns"]) for r in records) / 4)


def test_lora_run_then_eval_of_its_checkpoint(tiny_model_path, tmp_path):
    # KL loss to the reference = the same model with the adapter off; the merged export is what eval loads
    train("sokoban", tiny_model_path, tmp_path, "lora.rank=8", "lora.save_merged=true", "algo=starpo",
          "actor_rollout_ref.actor.ppo_mini_batch_size=4",
          "trainer.total_training_steps=1", "trainer.backend=local", "agent_proxy.max_turn=2",
          "trainer.val_before_train=false", "trainer.test_freq=-1", "actor_rollout_ref.actor.optim.lr=1e-3")
    (metrics,) = read_metrics(tmp_path)
    assert 0 < metrics["actor/kl_loss"] < 1e-2  # 0 at the first of 4 mini-batches, then the adapter moves
    checkpoint = tmp_path / "global_step_1"
    assert (checkpoint / "actor" / "adapter_model.safetensors").is_file()
    assert not (checkpoint / "actor" / "model.safetensors").exists()  # no full copy of the weights
    assert changed_tensors(tiny_model_path, checkpoint / "actor_merged")
    command = ["python", "-m", "ragen.eval", "--config-name", "sokoban", f"model_path={checkpoint}",
               f"hydra.run.dir={tmp_path / 'eval'}", "actor_rollout_ref.rollout.response_length=16",
               "agent_proxy.max_turn=2", "es_manager.val.env_groups=2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.splitlines()[2].split()[0] == "CoordSokoban"  # after the model line and the header


def test_a_run_never_rewrites_another_runs_folder(tiny_model_path, tmp_path):
    """The issue's cases through train.sh: branching from another folder's checkpoint, and starting afresh,
    where a run lives are refused before any model loads and touch nothing; trainer.overwrite=true moves
    the old run aside whole and trains in the emptied folder."""
    from tests.verl.test_run_folder import a_run, tree

    other, mine = a_run(tmp_path / "other", steps=(1,)), a_run(tmp_path / "mine")
    before = tree(mine)
    fast = ["trainer.backend=local", "trainer.total_training_steps=1", "trainer.val_before_train=false",
            "trainer.test_freq=-1", "logging.log_images=false"]
    for start in (f"trainer.resume_mode={other / 'global_step_1'}", "trainer.resume_mode=disable"):
        command = train_command("bandit", tiny_model_path, mine, start, *fast)
        command = [arg for arg in command if not arg.startswith(("hydra.run.dir", "logging.log_image_dir"))]
        result = subprocess.run(command + [f"hydra.run.dir={tmp_path / 'hydra'}"], capture_output=True, text=True,
                                timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert result.returncode != 0 and result.stderr.strip().splitlines()[-1].startswith(f"run folder: {mine}")
        assert "Loading weights" not in result.stdout + result.stderr and tree(mine) == before
    result = train("bandit", tiny_model_path, mine, "trainer.resume_mode=disable", "trainer.overwrite=true", *fast)
    (aside,) = tmp_path.glob("mine.old-*")
    assert tree(aside) == before and "moved to" in result.stdout
    assert [row["step"] for row in read_metrics(mine)] == [1] and (mine / "global_step_1" / "manifest.json").is_file()


def test_a_model_that_does_not_exist_is_named_before_a_resume_is_checked(tmp_path):
    """A folder with a checkpoint and a misspelt model_path: "model not found", not "trained with other values"."""
    from tests.verl.test_run_folder import a_run

    run_dir = a_run(tmp_path / "run", steps=(1,))
    result = subprocess.run(["bash", str(REPO / "train.sh"), "bandit", f"model_path={tmp_path / 'no_such_model'}",
                             f"trainer.default_local_dir={run_dir}", f"hydra.run.dir={tmp_path / 'hydra'}"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0 and result.stderr.strip().splitlines()[-1].startswith("model not found:")


@pytest.mark.parametrize("family, algo, engine", [("idefics3", "rloo", "torch"), ("qwen2_vl", "bi_level_gae", "hf")])
def test_a_vision_language_model_trains_on_pictures(family, algo, engine, tiny_model_path, tokenizer, tmp_path):
    """`train.sh sokoban` on pictures alone (image_observation=alone) with a tiny vision-language model of each
    kind (image tokens in a row: Idefics3, made here, with the torch engine; on a grid of positions: Qwen2-VL, with
    the hf engine): the engine samples from the pictures, the actor scores the same tokens with the same pictures (the log-prob gap stays at
    numerical noise) and the update reaches the vision tower too. With VAGEN's bi-level GAE (per-turn rewards)
    a critic made of the same model reads the pictures and is trained beside it."""
    from tests.conftest import save_tiny_qwen_vl
    from verl.utils.model import load_processor
    from verl.utils.vlm import build_vlm

    if family == "idefics3":
        vlm = build_vlm(tiny_model_path, tmp_path / "vlm", vision_width=32, vision_layers=1, vision_heads=2)
        tower, language = "vision_model", "text_model"
    else:
        vlm = save_tiny_qwen_vl(tmp_path / "vlm", tokenizer)
        tower, language = "visual", "model.layers"  # the names Qwen2-VL checkpoints keep
    run_dir = tmp_path / "run"
    train("sokoban", str(vlm), run_dir, "trainer.total_training_steps=1", "trainer.backend=local",
          "agent_proxy.max_turn=2", f"actor_rollout_ref.rollout.name={engine}", f"algo={algo}",
          "actor_rollout_ref.rollout.rollout_filter_value=1",
          "+custom_envs.CoordSokoban.env_config.image_observation=alone")
    validation, metrics = read_metrics(run_dir)
    assert validation["val/num_turns"] == 2 and metrics["rollout/num_turns"] == 2
    assert metrics["actor/rollout_kl"] < 1e-4
    changed = changed_tensors(str(vlm), run_dir / "global_step_1" / "actor")
    assert any(tower in key for key in changed) and any(language in key for key in changed)
    # the checkpoint is a whole model_path: its processor with it (ragen.eval, a later run)
    assert type(load_processor(str(run_dir / "global_step_1" / "actor"))) is type(load_processor(str(vlm)))
    if algo == "bi_level_gae":  # the critic: trained, and saved with its one-output head
        assert "critic/vf_loss" in metrics
        before, critic = load_file(Path(vlm) / "model.safetensors"), load_file(run_dir / "global_step_1" / "critic" /
                                                                           "model.safetensors")
        assert critic["lm_head.weight"].shape[0] == 1 and critic.keys() - before.keys() <= {"lm_head.weight",
                                                                                          "lm_head.bias"}
        changed = [key for key in before if not torch.equal(before[key], critic[key])]
        assert any(tower in key for key in changed) and any(language in key for key in changed)
    records = [json.loads(line) for line in (run_dir / "rollouts" / "val" / "step_0.jsonl").read_text().splitlines()]
    assert all(turn["state"] == "<image>" and len(turn["images"]) == 1 for r in records for turn in r["turns"])
    page = (run_dir / "log" / "val_step_0" / f"trajectory_data_{records[0]['env_id']}.html").read_text()
    assert records[0]["turns"][0]["images"][0] in page  # the page shows the picture the model was shown
