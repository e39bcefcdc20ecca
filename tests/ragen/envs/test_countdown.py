import itertools
import re
from fractions import Fraction

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from ragen.envs.countdown import (
    MAX_ANSWER_LENGTH,
    CountdownConfig,
    CountdownEnv,
    evaluate,
    format_expression,
    leaves,
    parse_equation,
    solve,
)

INVALID = {"action_is_valid": False, "action_is_effective": False, "success": False}


def reachable_values(numbers: tuple[int, ...]) -> set[Fraction]:
    """Every value of every equation over all the numbers: each order, each tree shape, each operator.

    The reference for the solver, written from the rules alone: it enumerates trees directly instead of
    combining pairs, and shares no code with the environment.
    """

    def trees(values: tuple[Fraction, ...]) -> set[Fraction]:
        if len(values) == 1:
            return {values[0]}
        results = set()
        for split in range(1, len(values)):
            for a in trees(values[:split]):
                for b in trees(values[split:]):
                    results |= {a + b, a - b, a * b}
                    if b != 0:
                        results.add(a / b)
        return results

    return set().union(*(trees(tuple(map(Fraction, order))) for order in itertools.permutations(numbers)))


def puzzle_env(numbers: list[int], target: int, **config) -> tuple[CountdownEnv, str]:
    env = CountdownEnv(CountdownConfig(**config))
    obs, _ = env.reset(seed=0, options={"numbers": numbers, "target": target})
    return env, obs


def read_puzzle(obs: str) -> tuple[list[int], int]:
    match = re.fullmatch(r"Target: (\d+)\nNumbers: (\d+(?:, \d+)*)", obs)
    assert match, f"unexpected state text {obs!r}"
    return [int(n) for n in match.group(2).split(", ")], int(match.group(1))


@pytest.mark.parametrize("config", [CountdownConfig(), CountdownConfig(num_numbers=5, max_number=20)])
def test_passes_gymnasium_check_env(config):
    check_env(CountdownEnv(config))


def test_state_text_and_attributes():
    env, obs = puzzle_env([2, 3, 4], 14)
    assert obs == env.render() == "Target: 14\nNumbers: 2, 3, 4"
    assert env.numbers == [2, 3, 4] and env.target == 14
    assert parse_equation(env.example_actions[0]) is not None
    assert "exactly once" in env.instructions and "+ - * /" in env.instructions


def test_same_seed_same_puzzle_and_puzzles_vary():
    env = CountdownEnv(CountdownConfig())
    starts = [env.reset(seed=seed)[0] for seed in range(30)]
    assert starts == [env.reset(seed=seed)[0] for seed in range(30)]
    puzzles = [read_puzzle(obs) for obs in starts]
    assert len(set(starts)) == 30
    assert len({target for _, target in puzzles}) >= 15
    assert len({number for numbers, _ in puzzles for number in numbers}) >= 40


@pytest.mark.parametrize(
    "config, seeds",
    [
        (CountdownConfig(), 300),
        (CountdownConfig(num_numbers=2, min_number=5, max_number=9, max_target=10), 50),
        (CountdownConfig(num_numbers=4, max_number=50, max_target=30), 100),
        (CountdownConfig(num_numbers=5, min_number=10, max_number=30, max_target=500), 10),
        (CountdownConfig(num_numbers=6, max_number=10), 5),
    ],
)
def test_every_generated_puzzle_is_in_range_and_the_solver_answer_scores_one(config, seeds):
    env = CountdownEnv(config)
    for seed in range(seeds):
        obs, _ = env.reset(seed=seed)
        numbers, target = read_puzzle(obs)
        assert (numbers, target) == (env.numbers, env.target)
        assert len(numbers) == config.num_numbers
        assert all(config.min_number <= n <= config.max_number for n in numbers)
        assert 1 <= target <= config.max_target
        answer = solve(numbers, target)
        assert answer is not None, f"seed {seed}: no solution for {numbers} -> {target}"
        next_obs, reward, terminated, truncated, info = env.step(answer)
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info == {"action_is_valid": True, "action_is_effective": True, "success": True}
        assert next_obs.endswith(": correct.") and next_obs in env.observation_space


@pytest.mark.parametrize(
    "numbers, target, answer",
    [
        ([2, 3, 4], 14, "2 + 3 * 4"),
        ([2, 3, 4], 14, "  ((2)) + (3*4)\n"),
        ([2, 3, 4], 20, "(2 + 3) × 4"),
        ([3, 3, 8, 8], 24, "8 / (3 - 8 / 3)"),  # a fraction in between
        ([1, 5, 5, 5], 24, "5 * (5 - 1 ÷ 5)"),
        ([9, 3, 4], 24, "(9 − 3) * 4"),  # the unicode minus sign
        ([7, 7], 1, "7/7"),
    ],
)
def test_correct_equation_pays_one_and_ends_the_episode(numbers, target, answer):
    env, obs = puzzle_env(numbers, target)
    next_obs, reward, terminated, truncated, info = env.step(answer)
    assert reward == 1.0 and type(reward) is float
    assert terminated is True and truncated is False
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": True}
    assert next_obs == env.render() and next_obs.startswith(obs + "\nYour answer ")
    assert next_obs.endswith(f" = {target}: correct.")


@pytest.mark.parametrize(
    "answer, reward, verdict",
    [
        ("(2 + 3) * 4", 0.1, "Your answer (2 + 3) * 4 = 20, not 14: incorrect."),
        ("2 / 3 + 4", 0.1, "Your answer 2 / 3 + 4 = 14/3, not 14: incorrect."),
        ("2 - 3 * 4", 0.1, "Your answer 2 - 3 * 4 = -10, not 14: incorrect."),
    ],
)
def test_a_miss_pays_the_format_score_and_ends_the_episode(answer, reward, verdict):
    env, obs = puzzle_env([2, 3, 4], 14)
    next_obs, got, terminated, truncated, info = env.step(answer)
    assert got == reward and type(got) is float
    assert terminated is True and truncated is False
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": False}
    assert next_obs == f"{obs}\n{verdict}"


@pytest.mark.parametrize("answer", ["2 / (4 - 4) + 3", "4 / (3 - 3)", "2 * 7",  # right value, other numbers
                                    "2 + 3 * 3", "3 * 4", "2 + 3 * 4 + 0", "14", "(1 + 2) * 3"])  # reused, missing,
def test_an_equation_over_other_numbers_is_an_invalid_action(answer):  # extra, none, the prompt's example
    env, obs = puzzle_env([2, 3, 4], 14)
    next_obs, got, terminated, truncated, info = env.step(answer)
    assert (next_obs, got, terminated, truncated) == (obs, 0.0, False, False)  # nothing changes: answer again
    assert info == {"action_is_valid": False, "action_is_effective": False, "success": False}
    assert env.step("2 + 3 * 4")[1] == 1.0


def test_division_by_zero_over_the_right_numbers_pays_format_score():
    env, obs = puzzle_env([3, 3, 4], 24, format_score=0.25)
    next_obs, reward, terminated, _, info = env.step("4 / (3 - 3)")
    assert reward == 0.25 and terminated and not info["success"]
    assert next_obs == f"{obs}\nYour answer 4 / (3 - 3) divides by zero: incorrect."


def test_format_score_is_configurable_and_duplicates_count():
    env, _ = puzzle_env([3, 3, 4], 24, format_score=0.0)
    assert env.step("3 * 4 + 3")[1] == 0.0
    env, _ = puzzle_env([3, 3, 4], 24, format_score=0.5)
    env, _ = puzzle_env([3, 3, 4], 24, format_score=0.5)
    assert not env.step("3 * 4")[4]["action_is_valid"], "one 3 missing"
    assert env.step("3 * 4 + 3")[1] == 0.5, "both 3s used: a miss, not wrong numbers"
    env, _ = puzzle_env([3, 3, 4], 24, format_score=0.5)
    assert env.step("(3 + 3) * 4")[1] == 1.0


@pytest.mark.parametrize(
    "answer, reward",
    [
        ("2 + 3 * 4 = 14", 1.0),
        ("2 + 3 * 4 = 20", 1.0),  # only the left side is evaluated
        ("(2 + 3) * 4 = 14", 0.1),
        ("(2 + 3) * 4 =20", 0.1),
        ("2 / 3 + 4 = 14/3", 0.1),
        ("2 / 3 + 4 = 4.67", 0.1),
        ("2 - 3 * 4 = -10", 0.1),
    ],
)
def test_right_hand_side_is_accepted_and_ignored(answer, reward):
    env, _ = puzzle_env([2, 3, 4], 14)
    _, got, terminated, _, info = env.step(answer)
    assert got == reward and terminated and info["action_is_valid"]
    env, _ = puzzle_env([2, 3, 4], 14)
    assert not env.step("2 * 7 = 14")[4]["action_is_valid"]  # the right value over other numbers


@pytest.mark.parametrize(
    "action",
    [
        "",
        "   ",
        "hello",
        "2 + 3 * 4 = x",
        "2 + 3 * 4 = 14 = 14",
        "2 + 3 * 4 =",
        "= 14",
        "2**10",
        "2 ** 3 + 4 + 3",
        "7 // 2 + 4",
        "4 % 3 + 2",
        "2 ^ 3 + 4",
        "__import__('os').system('echo hacked')",
        "1e5",
        "2.0 + 3 * 4",
        "-3 + 5 + 2 + 4",
        "2 + -3 * 4",
        "+2 + 3 * 4",
        "3 5",
        "2 + 3 * ",
        "(2 + 3 * 4",
        "()",
        "(2)(3)",
        "2 x 3 x 4",
        "[2, 3, 4]",
        "2, 3, 4",
        "1_0 + 4",
        "0x10",
        "3j",
        "True + 2",
        "007 + 7",
        "2 + 3 *\n4",
        "٢ + ٣ * ٤",  # Arabic-Indic digits
        "2 + 3 * 4 🙂",
        "\x00",
        "2 + 3 * 4" + " + 2" * 10_000,
        "1" + "+1" * 128,  # 257 characters: longer than MAX_ANSWER_LENGTH
    ],
)
def test_invalid_action_leaves_state_unchanged(action):
    env, obs = puzzle_env([2, 3, 4], 14)
    next_obs, reward, terminated, truncated, info = env.step(action)
    assert next_obs == obs == env.render()
    assert reward == 0.0 and terminated is False and truncated is False
    assert info == INVALID
    # The episode is still open: a valid answer afterwards ends it.
    assert env.step("2 + 3 * 4")[1:3] == (1.0, True)


def test_answer_length_cap():
    assert len("1" + "+1" * 127) == MAX_ANSWER_LENGTH - 1
    env = CountdownEnv(CountdownConfig(num_numbers=6))
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("1" + "+1" * 127)
    assert not info["action_is_valid"] and not terminated and reward == 0.0  # parsed, but not the puzzle's numbers
    assert obs in env.observation_space
    assert parse_equation("(" * 127 + "1" + ")" * 127) == 1


def test_longest_states_fit_the_observation_space():
    env = CountdownEnv(CountdownConfig(num_numbers=6, max_number=99, max_target=100))
    answers = [
        "99 * 99 * 99 * 99 * 99 * 99",  # the largest value over the numbers
        "99 / (99 * 99 * 99 * 99 - 99)",  # a long fraction
        "1" + "+1" * 127,  # the longest answer (wrong numbers)
        "(" * 100 + "99" + ")" * 100,
    ]
    for answer in answers:
        env.reset(seed=0, options={"numbers": [99] * 6, "target": 100})
        obs, *_ = env.step(answer)
        assert obs in env.observation_space
    env.reset(seed=0, options={"numbers": [1, 2], "target": 3})
    assert env.observation_space.max_length < CountdownEnv(env.config).observation_space.max_length
    for seed in range(50):
        env.reset(seed=seed)  # back to the config's space after a small posed puzzle
        obs, *_ = env.step(env.sample_action(np.random.default_rng(seed)))
        assert obs in env.observation_space


def test_sample_action_is_a_well_formed_equation_over_the_numbers():
    env = CountdownEnv(CountdownConfig(num_numbers=4))
    env.reset(seed=7)
    state = env.np_random.bit_generator.state
    actions = [env.sample_action(np.random.default_rng(seed)) for seed in range(200)]
    assert env.np_random.bit_generator.state == state, "sample_action must not draw from np_random"
    assert actions[:20] == [env.sample_action(np.random.default_rng(seed)) for seed in range(20)]
    for action in actions:
        expr = parse_equation(action)
        assert expr is not None and sorted(leaves(expr)) == sorted(env.numbers)
    assert len(set(actions)) >= 150
    assert all(any(symbol in action for action in actions) for symbol in "+-*/(")
    assert len({tuple(leaves(parse_equation(action))) for action in actions}) >= 20, "orders vary"


def test_random_agent_sometimes_succeeds_and_always_scores_at_least_format_score():
    env = CountdownEnv(CountdownConfig())
    rng = np.random.default_rng(0)
    rewards = []
    for seed in range(200):
        env.reset(seed=seed)
        _, reward, terminated, _, info = env.step(env.sample_action(rng))
        assert terminated and info["action_is_valid"]
        rewards.append(reward)
    assert set(rewards) == {0.1, 1.0}
    assert 0.02 < rewards.count(1.0) / len(rewards) < 0.5


@pytest.mark.parametrize(
    "expr, text",
    [
        (("*", ("+", 1, 2), 3), "(1 + 2) * 3"),
        (("+", 1, ("*", 2, 3)), "1 + 2 * 3"),
        (("-", 1, ("-", 2, 3)), "1 - (2 - 3)"),
        (("-", ("-", 1, 2), 3), "1 - 2 - 3"),
        (("+", 1, ("-", 2, 3)), "1 + 2 - 3"),
        (("/", 8, ("*", 2, 2)), "8 / (2 * 2)"),
        (("*", 8, ("/", 2, 2)), "8 * 2 / 2"),
        (("/", ("+", 1, 2), ("-", 3, 4)), "(1 + 2) / (3 - 4)"),
    ],
)
def test_format_expression_keeps_the_value_with_fewest_parentheses(expr, text):
    assert format_expression(expr) == text
    assert evaluate(parse_equation(text)) == evaluate(expr)


@pytest.mark.parametrize("seed", range(10))
def test_solver_agrees_with_brute_force(seed):
    rng = np.random.default_rng(seed)
    for size in (1, 2, 3, 4):
        numbers = tuple(int(n) for n in rng.integers(0, 10, size=size))
        reachable = reachable_values(numbers)
        for target in range(-10, 40):
            answer = solve(numbers, target)
            assert (answer is not None) == (target in reachable), (numbers, target, answer)
            if answer is not None:
                expr = parse_equation(answer)
                assert sorted(leaves(expr)) == sorted(numbers) and evaluate(expr) == target


def test_solver_known_cases():
    assert solve([3, 3, 8, 8], 24) is not None  # needs 8 / (3 - 8 / 3)
    assert solve([1, 5, 5, 5], 24) is not None  # needs 5 * (5 - 1 / 5)
    assert solve([1, 1, 1, 1], 24) is None
    assert solve([5], 5) == "5" and solve([5], 4) is None
    with pytest.raises(ValueError, match="numbers"):
        solve([], 3)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"num_numbers": 1}, "num_numbers"),
        ({"num_numbers": 7}, "num_numbers"),
        ({"min_number": 0}, "min_number"),
        ({"min_number": 10, "max_number": 9}, "max_number"),
        ({"max_target": 0}, "max_target"),
        ({"format_score": -0.1}, "format_score"),
        ({"format_score": 1.0}, "format_score"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CountdownConfig(**kwargs)


def test_impossible_generation_raises_runtime_error_naming_the_config():
    # Two numbers up to a billion almost never differ by at most one, the only way to reach target 1.
    env = CountdownEnv(CountdownConfig(num_numbers=2, max_number=10**9, max_target=1))
    with pytest.raises(RuntimeError, match="max_target"):
        env.reset(seed=0)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"numbers": [1, 2]}, "exactly 'numbers' and 'target'"),
        ({"numbers": [1, 2], "target": 3, "level": 1}, "exactly 'numbers' and 'target'"),
        ({"numbers": [3], "target": 3}, "numbers"),
        ({"numbers": [1, 0], "target": 1}, "numbers"),
        ({"numbers": [1, 2.5], "target": 1}, "numbers"),
        ({"numbers": [1, 2], "target": 0}, "target"),
        ({"numbers": [1, 2], "target": "3"}, "target"),
    ],
)
def test_bad_reset_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        CountdownEnv(CountdownConfig()).reset(options=options)
