"""The watchdog: rule streaks, what each action does, and a rollback through the real training loop."""

import json
import math

import pytest

from tests.verl.test_ppo_trainer import RecordingWorkers, Rollout, rollout_batch
from verl.trainer.config import AlgorithmConfig, RolloutConfig, TrainerConfig, WatchdogConfig, WatchdogRule
from verl.trainer.ppo_trainer import PPOTrainer
from verl.trainer.watchdog import ROLLBACK_SEED_STRIDE, Watchdog, WatchdogStop, read_events, trips
from verl.utils import checkpoint
from verl.utils.tracking import Tracking, read_jsonl


def watchdog(tmp_path, action="warn", **rules) -> Watchdog:
    return Watchdog(WatchdogConfig(action=action, rules=rules), tmp_path)


@pytest.mark.parametrize("condition, threshold, value, tripped", [
    ("below", 0.1, 0.05, True), ("below", 0.1, 0.1, False), ("below", 0.1, math.nan, False),
    ("above", 0.9, 0.95, True), ("above", 0.9, 0.9, False), ("above", 0.0, math.inf, False),
    ("nonfinite", 0.0, math.nan, True), ("nonfinite", 0.0, -math.inf, True), ("nonfinite", 0.0, 1e30, False)])
def test_a_rule_trips_on_its_condition(condition, threshold, value, tripped):
    assert trips(WatchdogRule(metric="m", condition=condition, threshold=threshold), value) == tripped


def test_a_rule_fires_after_its_streak_and_again_every_streak(tmp_path):
    dog = watchdog(tmp_path, floor=WatchdogRule(metric="actor/entropy", threshold=0.1, steps=2))
    values = {1: 0.05, 2: 0.5, 3: 0.05, 4: 0.05, 5: 0.05, 6: 0.05}
    fired = [step for step, value in values.items() if dog.observe(step, {"actor/entropy": value})]
    assert fired == [4, 6]  # the streak restarts at step 3 (step 2 was fine); fires at 2 and 4 steps in a row
    events = read_events(tmp_path)
    assert [(e["step"], e["rule"], e["action"], e["metric"], e["value"]) for e in events] == [
        (4, "floor", "warn", "actor/entropy", 0.05), (6, "floor", "warn", "actor/entropy", 0.05)]
    assert "actor/entropy < 0.1 for 2 step(s) in a row" in events[0]["message"]


def test_a_step_without_the_metric_neither_counts_nor_breaks_the_streak(tmp_path):
    dog = watchdog(tmp_path, "rollback", floor=WatchdogRule(metric="actor/entropy", threshold=0.1, steps=2))
    assert not dog.observe(1, {"actor/entropy": 0.0})
    assert not dog.observe(2, {})  # a step without an actor update logs no entropy
    assert not dog.healthy()  # a rollback rule is tripping
    assert [e.step for e in dog.observe(3, {"actor/entropy": 0.0})] == [3]


def test_only_rules_that_stop_or_roll_back_make_a_checkpoint_unhealthy(tmp_path):
    dog = watchdog(tmp_path, "warn", w=WatchdogRule(metric="x", threshold=1.0, steps=3),
                   r=WatchdogRule(metric="y", threshold=1.0, steps=3, action="rollback"))
    dog.observe(1, {"x": 0.0, "y": 5.0})
    assert dog.healthy()  # only the warn rule trips
    dog.observe(2, {"x": 0.0, "y": 0.0})
    assert not dog.healthy()


def test_a_rule_on_a_metric_no_step_logs_is_reported_once(tmp_path, capsys):
    dog = watchdog(tmp_path, typo=WatchdogRule(metric="actor/entropi"), fine=WatchdogRule(metric="actor/entropy"))
    for step in range(1, 6):
        dog.observe(step, {"actor/entropy": 1.0})
    lines = [line for line in capsys.readouterr().out.splitlines() if "none of the first" in line]
    assert lines == ["[watchdog] rule typo watches 'actor/entropi', which none of the first 3 steps logged (did you "
                     "mean 'actor/entropy'?): check trainer.watchdog.rules.typo.metric"]


def test_the_most_severe_action_wins_and_off_rules_are_ignored(tmp_path):
    dog = watchdog(tmp_path, "warn", a=WatchdogRule(metric="x", threshold=1.0),
                   b=WatchdogRule(metric="x", threshold=1.0, action="rollback"),
                   c=WatchdogRule(metric="x", threshold=1.0, action="off"))
    events = dog.observe(1, {"x": 0.0})
    assert sorted(e.rule for e in events) == ["a", "b"]
    assert Watchdog.decision(events) == "rollback"
    assert dog.metrics(events) == {"watchdog/fired": 2.0, "watchdog/a": 1.0, "watchdog/b": 1.0}
    assert Watchdog.decision([]) == "none"


class SeededAgent:
    """Its metric `test/signal` collapses to 0 at `bad_step` unless the seeds were shifted (a rollback)."""

    def __init__(self, bad_step: int):
        self.bad_step, self.offset, self.played = bad_step, 0, []

    def reseed(self, offset: int) -> None:
        self.offset = offset

    def rollout(self, step):
        self.played.append((step, self.offset))
        batch = rollout_batch([1.0, 0.0], group_size=2)
        signal = 0.0 if step >= self.bad_step and self.offset == 0 else 1.0
        records = [{"tag": "Bandit", "seed": i, "turns": [{"reward": 0.0}]} for i in range(2)]
        return Rollout(batch, {"test/signal": signal}, records)


def watched_trainer(tmp_path, action: str, bad_step=3, steps=5, max_rollbacks=3, keep=None, resumable=None):
    config = TrainerConfig(total_training_steps=steps, save_freq=1, default_local_dir=str(tmp_path),
                           rollout_data_dir=None, logger=["jsonl"], resumable_checkpoints=resumable,
                           max_actor_ckpt_to_keep=keep,
                           watchdog=WatchdogConfig(action=action, max_rollbacks=max_rollbacks, rules={
                               "signal_floor": WatchdogRule(metric="test/signal", threshold=0.5, steps=1)}))
    agent = SeededAgent(bad_step)
    trainer = PPOTrainer(config, AlgorithmConfig(adv_estimator="grpo"), RolloutConfig(rollout_filter_value=1.0),
                         RecordingWorkers([], "actor"), None, agent, Tracking(["jsonl"], str(tmp_path)),
                         run_config={"model_path": "tiny"})
    return trainer, agent


def logged_steps(tmp_path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["test/signal"]) for row in rows]


def test_rollback_returns_to_the_last_healthy_checkpoint_with_other_seeds(tmp_path):
    trainer, agent = watched_trainer(tmp_path, "rollback")
    trainer.fit()
    assert agent.played == [(1, 0), (2, 0), (3, 0), (3, ROLLBACK_SEED_STRIDE), (4, ROLLBACK_SEED_STRIDE),
                            (5, ROLLBACK_SEED_STRIDE)]
    assert logged_steps(tmp_path) == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 1.0)]  # step 3's first try undone
    assert [(e["step"], e["attempt"], e["action"]) for e in read_events(tmp_path)] == [(3, 0, "rollback")]
    undone = read_jsonl(tmp_path / "metrics.rolled_back.jsonl")  # nothing lost: the first try of step 3
    assert [(row["step"], row["test/signal"], row["rolled_back"]) for row in undone] == [
        (3, 0.0, "try 0, undone at step 3")]
    # the failed try of step 3 was never saved; the step 3 saved later is the second try's
    assert checkpoint.read_trainer_state(tmp_path / "global_step_3")["rollbacks"] == 1
    assert checkpoint.read_trainer_state(tmp_path / "global_step_5")["rollbacks"] == 1


def test_a_resume_after_a_rollback_keeps_the_shifted_seeds(tmp_path):
    trainer, _ = watched_trainer(tmp_path, "rollback", steps=4)
    trainer.fit()
    resumed, agent = watched_trainer(tmp_path, "rollback", steps=5)
    resumed.fit()
    assert agent.played == [(5, ROLLBACK_SEED_STRIDE)]


def test_a_resumed_run_keeps_the_streaks_and_fires_where_the_whole_run_would(tmp_path):
    rules = {"slow": WatchdogRule(metric="test/signal", threshold=0.5, steps=2, action="warn")}
    first, _ = watched_trainer(tmp_path, "warn", bad_step=2, steps=2)  # trips at step 2, checkpoint 2
    first.watchdog = Watchdog(WatchdogConfig(action="warn", rules=rules), tmp_path)
    first.fit()
    resumed, _ = watched_trainer(tmp_path, "warn", bad_step=2, steps=3)
    resumed.watchdog = Watchdog(WatchdogConfig(action="warn", rules=rules), tmp_path)
    resumed.fit()
    assert [(e["step"], e["rule"]) for e in read_events(tmp_path)] == [(3, "slow")]  # 2 steps in a row: 2 and 3


@pytest.mark.parametrize("keep, resumable", [(None, None), (2, 1)])  # (2, 1): the default retention
def test_an_unhealthy_checkpoint_is_not_a_rollback_target(tmp_path, keep, resumable):
    # the rollback rule trips at steps 3 and 4 (saved unhealthy) and fires at 5: back to step 2, the last
    # healthy checkpoint, which pruning kept whole with its optimizer state (the newest two are 3 and 4)
    rules = {"rollback_late": WatchdogRule(metric="test/signal", threshold=0.5, steps=3, action="rollback"),
             "warn_early": WatchdogRule(metric="test/signal", threshold=0.5, steps=1, action="warn")}
    trainer, agent = watched_trainer(tmp_path, "warn", bad_step=3, steps=6, keep=keep, resumable=resumable)
    trainer.watchdog = Watchdog(WatchdogConfig(action="warn", rules=rules), tmp_path)
    trainer.fit()
    assert agent.played[:5] == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0)]
    assert agent.played[5:] == [(s, ROLLBACK_SEED_STRIDE) for s in (3, 4, 5, 6)]  # went back to step 2


def test_a_rollback_moves_the_latest_checkpoint_back_before_anything_else(tmp_path, monkeypatch):
    trainer, agent = watched_trainer(tmp_path, "rollback")
    seen = []  # what a crash right after the rollback would resume from
    monkeypatch.setattr(trainer.watchdog, "reset", lambda attempt: seen.append(
        (checkpoint.latest_checkpoint(tmp_path).name, sorted(p.name for p in tmp_path.glob("global_step_*")))))
    trainer.fit()
    assert seen == [("global_step_2", ["global_step_1", "global_step_2"])]  # step 3's first try is gone


def test_stop_writes_a_report_and_ends_the_run(tmp_path):
    trainer, agent = watched_trainer(tmp_path, "stop")
    with pytest.raises(WatchdogStop, match="signal_floor"):
        trainer.fit()
    assert [step for step, _ in agent.played] == [1, 2, 3]
    report = (tmp_path / "watchdog_report.md").read_text()
    assert "stopped this run at step 3" in report and "test/signal < 0.5" in report
    assert "| 3 | 0 |" in report  # the watched metric's last values
    assert not (tmp_path / "global_step_3").exists()  # the step that went wrong is not saved


def test_rollbacks_are_bounded(tmp_path):
    trainer, agent = watched_trainer(tmp_path, "rollback", max_rollbacks=0)
    with pytest.raises(WatchdogStop, match="step 3"):
        trainer.fit()
    assert "after 0 rollbacks" in (tmp_path / "watchdog_report.md").read_text()


def test_a_fresh_run_starts_a_fresh_event_log(tmp_path):
    (tmp_path / "watchdog.jsonl").write_text('{"step": 9, "rule": "old"}\n')
    trainer, _ = watched_trainer(tmp_path, "warn", bad_step=99, steps=1)
    trainer.fit()
    assert read_events(tmp_path) == []
