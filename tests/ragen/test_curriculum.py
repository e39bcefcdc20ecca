"""Curricula (ragen/curriculum.py): the schedule's numbers, determinism, the adaptive rule, its state across a
resume, the config checks, and the metrics and records of a rollout with one."""

import json

import numpy as np
import pytest

from ragen.config import ConfigError, CurriculumConfig, validate
from ragen.overrides import load_config
from ragen.curriculum import AdaptiveCurriculum, ScheduleCurriculum, curriculum_metrics, gaussian_level_probs
from tests.test_train_e2e import read_metrics, train
from tests.verl.test_ppo_trainer import RecordingWorkers, Rollout, rollout_batch
from verl.trainer.config import AlgorithmConfig, RolloutConfig, TrainerConfig
from verl.trainer.ppo_trainer import PPOTrainer
from verl.utils import checkpoint
from verl.utils.tracking import Tracking


@pytest.mark.parametrize("step, total, mu_exp, sigma, expected", [
    # mu = 0: p ∝ exp(-2 i^2) = [1, e^-2, e^-8, e^-18] / 1.135670
    (0, 100, 0.5, 0.5, [0.880536, 0.119168, 0.000295, 0.0]),
    # mu = (25/100)^0.5 * 3 = 1.5: p ∝ [e^-4.5, e^-0.5, e^-0.5, e^-4.5] / 1.235279
    (25, 100, 0.5, 0.5, [0.008993, 0.491007, 0.491007, 0.008993]),
    (100, 100, 0.5, 0.5, [0.0, 0.000295, 0.119168, 0.880536]),  # mu = 3: the mirror image of mu = 0
    (300, 100, 0.5, 0.5, [0.0, 0.000295, 0.119168, 0.880536]),  # past T: stays at the hardest
    # mu_exp 1, halfway, 3 levels: mu = 1, sigma 1: p ∝ [e^-0.5, 1, e^-0.5] / 2.213061
    (50, 100, 1.0, 1.0, [0.274068, 0.451863, 0.274068]),
])
def test_the_gaussian_schedule_by_hand(step, total, mu_exp, sigma, expected):
    probs = gaussian_level_probs(step, total, len(expected), mu_exp, sigma)
    assert probs == pytest.approx(expected, abs=1e-6)


def draws(step: int, seeds=range(1000, 1400), **knobs) -> list[int]:
    config = CurriculumConfig(type="schedule", levels=[5, 10, 20, 30], steps=100, **knobs)
    return ScheduleCurriculum(config).levels(step, list(seeds))


def test_the_schedule_moves_from_easy_to_hard_and_fades_the_easy_levels_out():
    # step 1: mu = 0.3, p = [0.688, 0.309, 0.003, 0]; step 50: mu = 2.12, p = [0, 0.073, 0.727, 0.200]
    share = {step: {level: draws(step).count(level) / 400 for level in (5, 10, 20, 30)} for step in (1, 50, 100)}
    assert share[1][5] == pytest.approx(0.688, abs=0.07) and share[1][30] == 0
    assert share[50][5] == 0 and share[50][20] == pytest.approx(0.727, abs=0.07)
    assert share[100][5] == share[100][10] == 0 and share[100][30] == pytest.approx(0.881, abs=0.05)
    means = [np.mean(draws(step)) for step in (1, 10, 25, 50, 75, 100)]
    assert means == sorted(means) and means[0] < 8 and means[-1] > 28


def test_schedule_levels_are_a_function_of_the_seeds_and_the_step():
    assert draws(30) == draws(30)  # a new instance, as after a resume
    assert draws(30) != draws(30, seeds=range(2000, 2400))  # other groups (a rollback's shifted seeds)
    assert len(set(draws(30, seeds=[7] * 5))) == 1  # the seed alone decides


def adaptive(levels=(5, 10, 20), window=2, high=0.6, low=0.2) -> AdaptiveCurriculum:
    return AdaptiveCurriculum(CurriculumConfig(type="adaptive", levels=list(levels), window=window,
                                               target_success_high=high, target_success_low=low))


def play(curriculum: AdaptiveCurriculum, success_rate: float, n: int = 4) -> int:
    """One step: every group at the curriculum's level, `success_rate` of the n trajectories succeed."""
    level = curriculum.levels(step=0, group_seeds=[0])[0]
    wins = round(success_rate * n)
    curriculum.observe([level] * n, [True] * wins + [False] * (n - wins))
    return curriculum.levels(step=0, group_seeds=[0])[0]


def test_adaptive_waits_for_a_full_window_then_moves_up_and_down_one_level():
    curriculum = adaptive()
    assert curriculum.levels(step=1, group_seeds=[1, 2, 3]) == [5, 5, 5]
    assert play(curriculum, 1.0) == 5  # one step of two in the window: no move yet
    assert play(curriculum, 0.5) == 10  # mean 0.75 > 0.6: harder, and the window starts over
    assert curriculum.window == []
    assert play(curriculum, 0.0) == 10
    assert play(curriculum, 0.25) == 5  # mean 0.125 < 0.2: easier
    assert play(curriculum, 0.0) == play(curriculum, 0.0) == 5  # the easiest is the floor


def test_adaptive_holds_inside_the_band_and_at_the_top():
    curriculum = adaptive(window=1)
    assert play(curriculum, 0.75) == 10 and play(curriculum, 0.75) == 20
    assert play(curriculum, 1.0) == 20  # the hardest is the ceiling
    assert play(curriculum, 0.5) == 20 and play(curriculum, 0.25) == 20  # inside [0.2, 0.6]
    assert play(adaptive(window=1, high=0.5), 0.5) == 5  # at the threshold is not above it


def test_adaptive_reads_only_the_outcomes_at_its_level():
    curriculum = adaptive(window=1)
    curriculum.observe([10, 10, 5, 5], [True, True, False, True])  # the level-5 half: 0.5, inside the band
    assert curriculum.level == 0 and curriculum.window == [0.5]


def test_adaptive_state_resumes_exactly():
    whole, first = adaptive(window=3), adaptive(window=3)
    rates = [1.0, 0.75, 1.0, 0.5, 0.25, 0.0, 0.0, 0.25, 1.0]
    for rate in rates[:4]:
        play(whole, rate), play(first, rate)
    resumed = adaptive(window=3)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as trainer_state.json keeps it
    assert [play(whole, r) for r in rates[4:]] == [play(resumed, r) for r in rates[4:]]
    assert whole.state_dict() == resumed.state_dict()
    with pytest.raises(ValueError, match="level 4 of a list that now has 3"):
        adaptive().load_state_dict({"level": 3, "window": []})
    with pytest.raises(ValueError, match="saved without an adaptive curriculum"):
        adaptive().load_state_dict({})  # a schedule's state, after a forced resume that changed the type


def test_metrics_per_level():
    assert curriculum_metrics([5, 5, 30, 30], [True, False, False, False]) == {
        "curriculum/level_mean": 17.5, "curriculum/success@5": 0.5, "curriculum/success@30": 0.0}


class CurriculumAgent:
    """Feeds each step a success rate from `rates` to its curriculum, as AgentProxy does after a rollout."""

    def __init__(self, curriculum, rates: dict[int, float]):
        self.curriculum, self.rates, self.played = curriculum, rates, []

    def reseed(self, offset):
        pass

    def rollout(self, step):
        self.played.append(self.curriculum.levels(step, [0])[0])
        play(self.curriculum, self.rates[step])
        return Rollout(rollout_batch([1.0, 0.0], group_size=2), {}, [{"tag": "S", "seed": i, "turns": []}
                                                                     for i in range(2)])


def curriculum_trainer(tmp_path, steps: int) -> tuple[PPOTrainer, CurriculumAgent]:
    config = TrainerConfig(total_training_steps=steps, save_freq=1, default_local_dir=str(tmp_path),
                           rollout_data_dir=None, logger=["jsonl"])
    agent = CurriculumAgent(adaptive(window=1), {1: 1.0, 2: 1.0, 3: 0.0, 4: 1.0})
    trainer = PPOTrainer(config, AlgorithmConfig(adv_estimator="grpo"), RolloutConfig(),
                         RecordingWorkers([], "actor"), None, agent, Tracking(["jsonl"], str(tmp_path)),
                         run_config={"model_path": "tiny"}, curriculum=agent.curriculum)
    return trainer, agent


def test_the_trainer_checkpoints_the_curriculum_and_a_resume_continues_it(tmp_path):
    whole, whole_agent = curriculum_trainer(tmp_path / "whole", steps=4)
    whole.fit()
    first, _ = curriculum_trainer(tmp_path / "split", steps=2)
    first.fit()
    assert checkpoint.read_trainer_state(tmp_path / "split" / "global_step_2")["curriculum"] == {"level": 2,
                                                                                                 "window": []}
    resumed, resumed_agent = curriculum_trainer(tmp_path / "split", steps=4)
    resumed.fit()
    assert whole_agent.played == [5, 10, 20, 10] and resumed_agent.played == [20, 10]
    assert resumed.curriculum.state_dict() == whole.curriculum.state_dict()


def sokoban(*overrides: str):
    return load_config("sokoban", ["es_manager.train.curriculum.type=schedule",
                                   "es_manager.train.curriculum.levels=[5,10,20,30]", *overrides])


def test_a_curriculum_config_validates_and_takes_the_run_length_by_default():
    cfg = sokoban("trainer.total_training_steps=40")
    validate(cfg, world_size=1)
    assert cfg.es_manager.train.curriculum.steps == 40 and cfg.es_manager.val.curriculum.type == "none"
    validate(sokoban("es_manager.train.curriculum.type=adaptive"), world_size=1)


@pytest.mark.parametrize("override, message", [
    ("es_manager.train.curriculum.type=linear", r"curriculum.type='linear': choose one of \['none', 'schedule'"),
    ("es_manager.train.curriculum.levels=[]", r"curriculum.levels is empty: give the values of .*'search_depth'"),
    ("es_manager.train.curriculum.levels=[2,10]", r"levels: search_depth=2 is not valid for training tag "
                                                  r"'CoordSokoban': search_depth=2 must be >= 3"),
    ("es_manager.train.curriculum.levels=[5,5]", r"levels=\[5, 5\]: each value may appear once"),
    ("es_manager.train.curriculum.key=symbols", r"key='symbols' is not an int field of the sokoban config of "
                                                r"training tag 'CoordSokoban': choose one of \['dim_x'"),
    ("es_manager.train.curriculum.key=depth", r"key='depth' is not an int field"),
    ("es_manager.train.curriculum.sigma=0", r"curriculum.sigma must be finite and > 0"),
    ("es_manager.train.curriculum.mu_exp=-1", r"curriculum.mu_exp must be finite and > 0"),
    ("es_manager.train.curriculum.steps=0", r"curriculum.steps must be >= 1"),
    ("es_manager.val.curriculum.type=schedule", r"es_manager.val.curriculum.type must be none: validation"),
])
def test_bad_curriculum_values_fail_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(sokoban(override), world_size=1)


@pytest.mark.parametrize("overrides, message", [
    (["es_manager.train.curriculum.window=0"], r"curriculum.window must be >= 1"),
    (["es_manager.train.curriculum.target_success_low=0.7"], r"target_success_low < target_success_high <= 1, "
                                                             r"got 0.7 and 0.6"),
])
def test_bad_adaptive_values_fail_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(sokoban("es_manager.train.curriculum.type=adaptive", *overrides), world_size=1)


def test_a_curriculum_key_must_exist_in_every_training_env():
    cfg = sokoban("es_manager.train.env_configs.tags=[SimpleSokoban,FrozenLake]", "es_manager.train.env_groups=2",
                  "es_manager.train.env_configs.n_groups=[1,1]")
    with pytest.raises(ConfigError, match="not an int field of the frozen_lake config of training tag 'FrozenLake'"):
        validate(cfg, world_size=1)


def test_a_training_run_with_a_curriculum_logs_its_levels_and_checkpoints_its_state(tiny_model_path, tmp_path):
    train("sokoban", tiny_model_path, tmp_path, "trainer.total_training_steps=2", "trainer.save_freq=1",
          "trainer.backend=local", "trainer.test_freq=-1", "trainer.val_before_train=false",
          "logging.log_images=false", "es_manager.train.curriculum.type=adaptive",
          "es_manager.train.curriculum.levels=[4,30]", "es_manager.train.curriculum.window=1",
          "es_manager.train.curriculum.target_success_low=0.0")
    metrics = read_metrics(tmp_path)
    assert [(m["step"], m["curriculum/level_mean"]) for m in metrics] == [(1, 4.0), (2, 4.0)]  # a random model fails
    assert all("curriculum/success@4" in m for m in metrics)
    state = checkpoint.read_trainer_state(tmp_path / "global_step_2")
    assert state["curriculum"] == {"level": 0, "window": [metrics[1]["curriculum/success@4"]]}
    records = [json.loads(line) for line in (tmp_path / "rollouts" / "train" / "step_2.jsonl").read_text().splitlines()]
    assert {r["curriculum_level"] for r in records} == {4}
