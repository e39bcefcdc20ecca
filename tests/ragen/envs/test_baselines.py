import pytest

from ragen.envs import ENV_REGISTRY, make_env
from ragen.envs.baselines import (
    AGENTS,
    RECORDED_SUCCESS,
    ConstantAgent,
    OracleAgent,
    RandomAgent,
    best_constant,
    evaluate,
    main,
    resolve_env,
)
from tests.ragen.envs.test_checker import Walk, WalkConfig


def test_oracle_solves_every_6x6_sokoban_level_of_200_seeds():
    env = make_env("sokoban", {"dim_x": 6, "dim_y": 6, "num_boxes": 1})
    result = evaluate(env, OracleAgent(), range(200), max_actions=100)
    assert result.success_rate == 1.0
    # Every episode ends on the +10 solve after at least one push onto the target.
    assert result.mean_return == pytest.approx(11.0 - 0.1 * result.mean_actions)


@pytest.mark.parametrize(
    "env_type, env_config, seeds",
    [
        ("frozen_lake", {"is_slippery": False, "size": 4}, 100),
        ("frozen_lake", {"is_slippery": False, "size": 8, "p": 0.6}, 50),
        ("bandit", {}, 100),
        ("countdown", {}, 100),
        ("countdown", {"num_numbers": 4}, 30),
    ],
)
def test_oracle_always_succeeds_where_the_task_allows_it(env_type, env_config, seeds):
    result = evaluate(make_env(env_type, env_config), OracleAgent(), range(seeds), max_actions=100)
    assert result.success_rate == 1.0


@pytest.mark.parametrize("env_type", ["sokoban", "frozen_lake", "bandit", "countdown"])
def test_oracle_beats_random(env_type):
    env = make_env(env_type)
    oracle = evaluate(env, OracleAgent(), range(100), max_actions=20)
    random = evaluate(env, RandomAgent(), range(100), max_actions=20)
    assert oracle.success_rate > random.success_rate
    assert oracle.mean_return > random.mean_return


def test_random_agent_is_reproducible():
    env = make_env("frozen_lake")
    first = evaluate(env, RandomAgent(seed=5), range(30), max_actions=10)
    assert evaluate(env, RandomAgent(seed=5), range(30), max_actions=10) == first


def test_cli_prints_a_row_per_env_and_agent(capsys):
    main(["SimpleSokoban", "bandit", "--seeds", "5"])
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0].split() == ["env", "agent", "episodes", "success", "return", "actions"]
    # the constant row names its best word; the bandit has no move set, so no constant row
    assert [row.split()[:2] for row in rows[1:]] == [
        ["SimpleSokoban", "random"], ["SimpleSokoban", "constant"], ["SimpleSokoban", "oracle"],
        ["bandit", "random"], ["bandit", "oracle"],
    ]
    assert rows[2].split()[2] in ("Up", "Down", "Left", "Right") and rows[2].split()[3] == "5"
    assert float(rows[3].split()[3]) == 1.0 and float(rows[5].split()[3]) == 1.0


def test_cli_rejects_unknown_env():
    with pytest.raises(SystemExit, match="unknown env 'Nope'"):
        main(["Nope"])


def test_best_constant_move_is_a_real_yardstick_on_slippery_frozen_lake():
    env = make_env("frozen_lake")
    seeds = range(300)
    word, constant = best_constant(env, seeds, max_actions=20)
    assert word in ("Down", "Right")  # the goal is bottom right; a slide never goes backwards
    random = evaluate(env, RandomAgent(), seeds, max_actions=20)
    oracle = evaluate(env, OracleAgent(), seeds, max_actions=20)
    assert random.success_rate + 0.08 < constant.success_rate < oracle.success_rate - 0.1
    left = evaluate(env, ConstantAgent("Left"), seeds, max_actions=20)
    assert left.success_rate == 0.0  # Left slides up or down, never right: it cannot reach the right column


def test_no_constant_baseline_without_a_move_set():
    assert best_constant(make_env("bandit"), range(5), max_actions=1) is None


@pytest.mark.parametrize("env_type", sorted(ENV_REGISTRY))
def test_cli_runs_the_random_agent_on_every_registered_env(env_type, capsys):
    main([env_type, "--seeds", "2", "--agents", "random"])
    (row,) = capsys.readouterr().out.strip().splitlines()[1:]
    assert row.split()[:3] == [env_type, "random", "2"]


def test_an_env_without_an_oracle_gets_the_random_agent_and_a_note(monkeypatch, capsys):
    monkeypatch.setitem(ENV_REGISTRY, "walk", (Walk, WalkConfig))  # registered as the README's guide says
    main(["walk", "--seeds", "5"])
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert [row.split()[:2] for row in rows] == [["walk", "random"], ["walk", "oracle"]]  # no move set: no constant
    assert rows[0].split()[2] == "5"
    assert "not available" in rows[1] and "Walk" in rows[1] and "ORACLE_PLANS" in rows[1]


@pytest.mark.parametrize("tag", sorted(RECORDED_SUCCESS))
def test_the_recorded_success_rates_are_what_the_agents_score(tag):
    """The plots' baseline lines (and the README's table) are these agents' scores on the tag's settings."""
    episodes, rates = RECORDED_SUCCESS[tag]
    env, budget = resolve_env(tag)
    for agent, rate in rates.items():
        assert evaluate(env, AGENTS[agent](0), range(episodes), budget).success_rate == pytest.approx(rate, abs=5e-4)
