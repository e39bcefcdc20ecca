import threading

import numpy as np
import pytest

from ragen.config import CurriculumConfig, CustomEnvConfig, EnvGroupsConfig, EnvMixConfig, EsManagerConfig
from ragen.env_state_manager import EnvFailureError, EnvStateManager, call_with_timeout

SOKOBAN = CustomEnvConfig(env_type="sokoban", max_actions_per_traj=3, env_config={"dim_x": 6, "dim_y": 6})
BANDIT = CustomEnvConfig(env_type="bandit", max_actions_per_traj=1)


def manager(groups=3, size=2) -> EnvStateManager:
    mix = EnvMixConfig(tags=["Sokoban", "Bandit"], n_groups=[groups - 1, 1])
    return EnvStateManager(EnvGroupsConfig(env_groups=groups, group_size=size, env_configs=mix),
                           {"Sokoban": SOKOBAN, "Bandit": BANDIT}, seed=100)


def test_groups_share_a_seed_and_start_state_and_steps_use_new_seeds():
    em = manager()
    states = em.reset(step=1)
    assert [s.tag for s in states] == ["Sokoban"] * 4 + ["Bandit"] * 2
    assert [s.group_id for s in states] == [0, 0, 1, 1, 2, 2]
    for a, b in zip(states[::2], states[1::2]):
        assert a.seed == b.seed and a.obs == b.obs
    seeds_step1 = {s.seed for s in states}
    assert seeds_step1.isdisjoint({s.seed for s in em.reset(step=2)})


def test_a_list_of_seeds_gives_each_group_its_seed_at_every_reset():
    mix = EnvMixConfig(tags=["Sokoban", "Bandit"], n_groups=[2, 1])
    em = EnvStateManager(EnvGroupsConfig(env_groups=3, group_size=2, env_configs=mix, seeds=[907, 13, 500]),
                         {"Sokoban": SOKOBAN, "Bandit": BANDIT}, seed=100)
    for step in (0, 3):
        states = em.reset(step=step)
        assert [s.seed for s in states] == [907, 907, 13, 13, 500, 500]
    assert states[0].obs == manager().env_per_tag()["Sokoban"].reset(seed=907)[0]
    with pytest.raises(ValueError, match="one seed a group"):
        EnvStateManager(EnvGroupsConfig(env_groups=3, group_size=2, env_configs=mix, seeds=[907, 13]),
                        {"Sokoban": SOKOBAN, "Bandit": BANDIT}, seed=100)


def test_step_budget_cuts_actions_and_ends_the_trajectory():
    em = manager()
    em.reset(step=1)
    record = em.step(0, ["Up", "Left", "Down", "Right", "Up"])
    state = em.states[0]
    assert len(record.actions) <= 3 and state.actions_taken == len(record.actions)
    assert state.done  # the budget of 3 is spent, or the puzzle was solved on the way
    with pytest.raises(AssertionError):
        em.step(0, ["Up"])


def test_invalid_actions_cost_no_budget_change_nothing_and_are_recorded():
    em = manager()
    em.reset(step=1)
    record = em.step(4, ["fly"])  # a bandit env: the pull has not happened
    state = em.states[4]
    assert record.valid == [False] and record.reward == 0.0 and not state.done and state.actions_taken == 0
    record = em.step(0, ["fly", "jump", "Up", "nonsense", "Left"])  # Sokoban, budget 3
    assert record.valid == [False, False, True, False, True] and em.states[0].actions_taken == 2
    assert em.states[0].actions_left == 1


def raise_on_step(action):
    raise ValueError("boom")


def test_an_environment_that_raises_ends_only_its_own_trajectory():
    em = manager()  # 6 trajectories; the default share 0.25 tolerates one failure
    em.reset(step=1)
    broken = em.states[1].env
    broken.step = raise_on_step
    record = em.step(1, ["Up", "Left"])
    state = em.states[1]
    assert state.done and not state.success and state.error == "ValueError: boom"
    assert record.actions == [] and state.turns == [record]
    assert state.env is not broken  # a fresh instance: the broken one may be half-updated
    assert em.step(0, ["Up"]).valid == [True] and em.states[0].error is None  # the others play on
    em.reset(step=2)
    assert state.error is None and not state.done
    assert em.step(1, ["Up"]).valid == [True]


def test_a_hanging_step_is_abandoned_after_the_timeout():
    em = EnvStateManager(EnvGroupsConfig(env_groups=2, group_size=2, env_configs=EnvMixConfig(["Sokoban"], [2])),
                         {"Sokoban": SOKOBAN}, seed=100, limits=EsManagerConfig(env_step_timeout_s=0.2))
    em.reset(step=1)
    release = threading.Event()
    em.states[2].env.step = lambda action: release.wait()  # hangs until the test ends
    try:
        em.step(2, ["Up"])
        assert em.states[2].done and em.states[2].error.startswith("TimeoutError: env.step('Up') did not return")
        assert em.step(3, ["Up"]).valid == [True]  # the same group's other env, through the timed path
    finally:
        release.set()


def test_more_failures_than_the_allowed_share_stop_the_rollout():
    em = manager()  # 6 trajectories: 1 failure is within 0.25 of them, 2 are not
    em.reset(step=1)
    em.states[1].env.step = em.states[4].env.step = raise_on_step
    em.step(1, ["Up"])
    with pytest.raises(EnvFailureError, match=r"2 of 6 trajectories failed .*max_env_failure_share=0.25; the first: "
                                              r"env tag 'Sokoban', seed 103: ValueError: boom; the last: env tag "
                                              r"'Bandit', seed 105, on action 'dragon': ValueError: boom"):
        em.step(4, ["dragon"])
    strict = manager()
    strict.max_env_failure_share = 0.0  # any failure stops the run
    strict.reset(step=1)
    strict.states[0].env.step = raise_on_step
    with pytest.raises(EnvFailureError, match="1 of 6"):
        strict.step(0, ["Up"])


def test_call_with_timeout_returns_or_reraises_in_the_caller():
    assert call_with_timeout(lambda x: x + 1, 1, timeout_s=1.0) == 2
    assert call_with_timeout(lambda x: x + 1, 1, timeout_s=None) == 2
    with pytest.raises(ValueError, match="boom"):
        call_with_timeout(raise_on_step, "Up", timeout_s=1.0)


def test_a_group_shares_its_start_but_not_its_luck():
    """Same start state, independent outcomes: the bandit's payouts differ within a group (with one shared
    draw every risky pull of a group would pay the same), and the same step replays the same outcomes."""
    mix = EnvMixConfig(tags=["Bandit"], n_groups=[1])
    em = EnvStateManager(EnvGroupsConfig(env_groups=1, group_size=8, env_configs=mix), {"Bandit": BANDIT}, seed=7)

    def payouts(step):
        states = em.reset(step)
        assert len({s.obs for s in states}) == 1
        return [em.step(s.env_id, ["dragon"]).reward for s in states]

    draws = [payouts(step) for step in range(1, 41)]
    assert sum(len(set(d)) > 1 for d in draws) > 20  # P(8 equal draws) = 0.25^8 + 0.75^8 ~ 0.1
    assert draws == [payouts(step) for step in range(1, 41)]


@pytest.mark.parametrize("shared", [False, True])
def test_an_episode_does_not_replay_the_stream_its_start_was_drawn_from(shared):
    """The bandit draws its arms' order at reset and the payout at the pull. Were the episode's stream the reset's
    (numpy's [seed, 0] is seed alone), the risky arm listed first (draw >= 0.5) could never pay (it pays below
    0.25), and listed second would pay half the time: the order would tell the payout."""
    mix = EnvMixConfig(tags=["Bandit"], n_groups=[1])
    em = EnvStateManager(EnvGroupsConfig(env_groups=1, group_size=2, env_configs=mix, shared_randomness=shared),
                         {"Bandit": BANDIT}, seed=3)
    paid = {True: [], False: []}  # risky listed first -> did it pay (both places of the group)
    for step in range(200):
        for state in em.reset(step):
            paid[state.obs.startswith("Arms: dragon")].append(em.step(state.env_id, ["dragon"]).reward > 0)
    assert min(len(paid[True]), len(paid[False])) > 150
    for first in (True, False):  # 0.25 each; 3 standard errors of ~200 pulls is 0.1
        assert abs(np.mean(paid[first]) - 0.25) < 0.1, (first, np.mean(paid[first]))


def test_shared_randomness_gives_equal_moves_equal_luck():
    """FrozenLake's slips: with its own stream each env of a group slips differently under the same moves; with
    `shared_randomness` the group's envs walk the same cells, and other seeds still see other luck."""
    lake = CustomEnvConfig(env_type="frozen_lake", max_actions_per_traj=20, env_config={"is_slippery": True})
    mix = EnvMixConfig(tags=["Lake"], n_groups=[1])

    def walks(shared: bool) -> list[list[tuple[str, ...]]]:
        em = EnvStateManager(EnvGroupsConfig(env_groups=1, group_size=4, env_configs=mix, shared_randomness=shared),
                             {"Lake": lake}, seed=11)
        per_step = []
        for step in range(1, 6):
            states = em.reset(step)
            seen = {state.env_id: [state.obs] for state in states}
            for _ in range(6):  # the same moves for every env
                for state in states:
                    if not state.done:
                        em.step(state.env_id, ["Down"])
                        seen[state.env_id].append(state.obs)
            per_step.append([tuple(walk) for walk in seen.values()])
        return per_step

    own, shared = walks(False), walks(True)
    assert all(len(set(group)) == 1 for group in shared)
    assert len({group[0] for group in shared}) > 1  # luck still differs between start states
    assert any(len(set(group)) > 1 for group in own)


def curriculum_manager(curriculum: CurriculumConfig, groups=4, size=2, seed=100) -> EnvStateManager:
    mix = EnvMixConfig(tags=["Sokoban"], n_groups=[groups])
    return EnvStateManager(EnvGroupsConfig(env_groups=groups, group_size=size, env_configs=mix,
                                           curriculum=curriculum), {"Sokoban": SOKOBAN}, seed=seed)


def test_a_curriculum_level_sets_the_env_config_for_the_reset_and_is_recorded():
    shallow = curriculum_manager(CurriculumConfig(type="adaptive", levels=[5, 30])).reset(step=1)
    deep = curriculum_manager(CurriculumConfig(type="adaptive", levels=[30, 5])).reset(step=1)
    plain = curriculum_manager(CurriculumConfig()).reset(step=1)  # none: SokobanConfig's own search_depth, 30
    assert [s.level for s in shallow] == [5] * 8 and [s.level for s in deep] == [30] * 8
    assert {s.env.unwrapped.config.search_depth for s in shallow} == {5}
    assert {s.env.unwrapped.config.search_depth for s in deep} == {30}
    assert [s.seed for s in shallow] == [s.seed for s in deep]
    assert [s.obs for s in shallow] != [s.obs for s in deep]  # same seeds, other depth: other levels
    assert [s.obs for s in deep] == [s.obs for s in plain] and plain[0].level is None


def test_schedule_levels_are_shared_by_a_group_and_replayed_by_a_new_manager():
    config = CurriculumConfig(type="schedule", levels=[3, 5, 10, 30], steps=10, sigma=1.0)
    em = curriculum_manager(config, groups=8)
    states = em.reset(step=5)
    levels = [s.level for s in states]
    assert len(set(levels)) > 1  # sigma 1 over 4 levels at mid-run: a mix
    for a, b in zip(states[::2], states[1::2]):
        assert a.level == b.level and a.obs == b.obs and a.env.unwrapped.config.search_depth == a.level
    again = curriculum_manager(config, groups=8).reset(step=5)
    assert [s.level for s in again] == levels and [s.obs for s in again] == [s.obs for s in states]


def test_an_env_is_rebuilt_only_when_its_level_changes_and_a_failure_keeps_the_level():
    em = curriculum_manager(CurriculumConfig(type="adaptive", levels=[5, 10], window=1))
    env = em.reset(step=1)[0].env
    assert em.reset(step=2)[0].env is env  # same level: the same instance
    for state in em.states:
        state.success = True
    assert em.end_rollout() == {"curriculum/level_mean": 5.0, "curriculum/success@5": 1.0}
    state = em.reset(step=3)[0]
    assert state.level == 10 and state.env is not env and state.env.unwrapped.config.search_depth == 10
    state.env.step = raise_on_step
    em.step(0, ["Up"])
    assert state.error and state.env.unwrapped.config.search_depth == 10


def test_end_rollout_without_a_curriculum_reports_nothing():
    em = manager()
    em.reset(step=1)
    assert em.end_rollout() == {} and em.curriculum is None


def test_an_image_env_state_carries_the_pictures_of_its_observation():
    pictured = CustomEnvConfig(env_type="sokoban", max_actions_per_traj=3,
                               env_config={"image_observation": "with_text"})
    em = EnvStateManager(EnvGroupsConfig(env_groups=1, group_size=2, env_configs=EnvMixConfig(tags=["Pictured"], n_groups=[1])),
                         {"Pictured": pictured}, seed=100)
    state = em.reset(step=1)[0]
    assert state.obs.startswith("<image>\n") and len(state.images) == 1 and state.images[0].shape == (96, 96, 3)
    first = state.images[0]
    em.step(0, ["Left", "Up"])
    assert len(state.images) == 1 and state.images[0] is not first  # the picture of the new state
    assert all(s.images == () for s in manager().reset(step=1))  # text envs: none
