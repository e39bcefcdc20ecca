import pytest

from ragen.config import CustomEnvConfig, EnvGroupsConfig, EnvMixConfig
from ragen.env_state_manager import EnvStateManager

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


def test_an_environment_that_raises_names_itself():
    em = manager()
    em.reset(step=1)

    def broken_step(action):
        raise ValueError("boom")

    em.states[1].env.step = broken_step
    with pytest.raises(RuntimeError, match=r"Sokoban \(env 1, seed \d+\) raised on action 'Up': boom"):
        em.step(1, ["Up"])


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
