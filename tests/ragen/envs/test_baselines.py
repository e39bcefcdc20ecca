import pytest

from ragen.envs import make_env
from ragen.envs.baselines import OracleAgent, RandomAgent, evaluate, main


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
    assert [row.split()[:3] for row in rows[1:]] == [
        ["SimpleSokoban", "random", "5"], ["SimpleSokoban", "oracle", "5"], ["bandit", "random", "5"],
        ["bandit", "oracle", "5"],
    ]
    assert float(rows[2].split()[3]) == 1.0 and float(rows[4].split()[3]) == 1.0


def test_cli_rejects_unknown_env():
    with pytest.raises(SystemExit, match="unknown env 'Nope'"):
        main(["Nope"])
