"""Reference agents that every learning curve is judged against: a random agent, a constant one and an oracle.

The random agent plays `env.sample_action` (a uniformly random well-formed action). The constant agent
repeats one action word every step, and is scored with the best word of the env's move set (Sokoban,
FrozenLake): a policy that never reads the state, which a text policy can learn without understanding the
board (on slippery 4x4 FrozenLake, "Right" on every step reaches the goal about 19 % of the time). The
oracle reads the environment's true state (it is privileged, not a text agent) and plays the best known
policy: a BFS shortest solution for Sokoban, value iteration for FrozenLake (a shortest path when the ice
is not slippery), the arm with the higher expected value for Bandit, an exhaustive solver for Countdown.

    python -m ragen.envs.baselines SimpleSokoban FrozenLake --seeds 200

takes `custom_envs` tags from config/base.yaml (with their step budget `max_actions_per_traj`, as in
training) or registered env types (with the env's own `max_steps`), and prints success rates. An env without
an oracle (one you added, before its planner is in ORACLE_PLANS) gets the random agent and an "oracle: not
available" row.
"""

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium
import numpy as np

from ragen.envs import ENV_REGISTRY, make_env
from ragen.envs.bandit import BanditEnv
from ragen.envs.countdown import CountdownEnv
from ragen.envs.countdown import solve as solve_countdown
from ragen.envs.frozen_lake import ACTION_WORDS as FROZEN_LAKE_ACTIONS
from ragen.envs.frozen_lake import FrozenLakeEnv
from ragen.envs.frozen_lake import oracle_action as frozen_lake_action
from ragen.envs.sokoban import ACTIONS as SOKOBAN_ACTIONS
from ragen.envs.sokoban import SokobanEnv, solve_env

MAX_EPISODE_ACTIONS = 10_000  # bound for envs run without a step budget; every registered env truncates sooner


def _sokoban_plan(env: SokobanEnv) -> list[str]:
    return solve_env(env) or []


def _countdown_plan(env: CountdownEnv) -> list[str]:
    equation = solve_countdown(env.numbers, env.target)
    return [equation] if equation else []


# Per env class: the oracle's plan from the current state. Stochastic envs plan one action at a time.
ORACLE_PLANS: dict[type[gymnasium.Env], Callable[[gymnasium.Env], list[str]]] = {
    SokobanEnv: _sokoban_plan,
    FrozenLakeEnv: lambda env: [frozen_lake_action(env)],
    BanditEnv: lambda env: [env.config.risky_arm_name],
    CountdownEnv: _countdown_plan,
}


# Per env class: the action words a constant agent may repeat (envs whose actions are moves on a board).
MOVE_WORDS: dict[type[gymnasium.Env], list[str]] = {SokobanEnv: list(SOKOBAN_ACTIONS),
                                                   FrozenLakeEnv: FROZEN_LAKE_ACTIONS}


class RandomAgent:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng([seed, 1])  # default_rng(seed) would replay env.reset(seed)'s stream

    def reset(self) -> None:
        pass

    def act(self, env: gymnasium.Env) -> str:
        return env.unwrapped.sample_action(self.rng)


class OracleAgent:
    """Follows the oracle's plan; plays a random action in the rare state it has no plan for."""

    def __init__(self, seed: int = 0):
        self.fallback = RandomAgent(seed)
        self.plan: list[str] = []

    def reset(self) -> None:
        self.plan = []

    def act(self, env: gymnasium.Env) -> str:
        env = env.unwrapped
        if not has_oracle(env):
            raise ValueError(f"no oracle for {type(env).__name__}; add its planner to ORACLE_PLANS")
        if not self.plan:
            self.plan = ORACLE_PLANS[type(env)](env)
        return self.plan.pop(0) if self.plan else self.fallback.act(env)


class ConstantAgent:
    """Plays the same action word on every step."""

    def __init__(self, action: str):
        self.action = action

    def reset(self) -> None:
        pass

    def act(self, env: gymnasium.Env) -> str:
        return self.action


AGENTS = {"random": RandomAgent, "oracle": OracleAgent}  # built from a seed; the constant agent from a word
AGENT_NAMES = ["random", "constant", "oracle"]  # the CLI's rows, in order

# tag -> (episodes, {agent: success rate}): `python -m ragen.envs.baselines <tag> --seeds <episodes>
# --agents random oracle` with config/base.yaml's settings, as in the README's Environments table. The
# learning-curve plots draw these (ragen/plot.py), so plotting never plays an episode;
# tests/ragen/envs/test_baselines.py replays every row. Add your env's tag here to get its lines.
RECORDED_SUCCESS: dict[str, tuple[int, dict[str, float]]] = {
    "SimpleSokoban": (200, {"random": 0.085, "oracle": 0.985}),
    "HardSokoban": (200, {"random": 0.155, "oracle": 1.0}),
    "LargerSokoban": (200, {"random": 0.020, "oracle": 1.0}),
    "SokobanDifferentGridVocab": (200, {"random": 0.085, "oracle": 0.985}),
    "FrozenLake": (500, {"random": 0.048, "oracle": 0.418}),
    "LargerFrozenLake": (500, {"random": 0.0, "oracle": 0.162}),
    "Bandit": (200, {"random": 0.495, "oracle": 1.0}),
    "BanditTest": (200, {"random": 0.495, "oracle": 1.0}),
    "Countdown": (200, {"random": 0.020, "oracle": 1.0}),
}


def has_oracle(env: gymnasium.Env) -> bool:
    return type(env.unwrapped) in ORACLE_PLANS


@dataclass
class BaselineResult:
    episodes: int
    success_rate: float
    mean_return: float
    mean_actions: float


def evaluate(env: gymnasium.Env, agent, seeds: Sequence[int], max_actions: int) -> BaselineResult:
    """Play one episode per seed with at most `max_actions` actions each; success as the env reports it."""
    successes, returns, lengths = [], [], []
    for seed in seeds:
        env.reset(seed=int(seed))
        agent.reset()
        success, total, actions = False, 0.0, 0
        while actions < max_actions:
            _, reward, terminated, truncated, info = env.step(agent.act(env))
            actions += 1
            total += reward
            success = success or info["success"]
            if terminated or truncated:
                break
        successes.append(success)
        returns.append(total)
        lengths.append(actions)
    return BaselineResult(len(seeds), float(np.mean(successes)), float(np.mean(returns)), float(np.mean(lengths)))


def best_constant(env: gymnasium.Env, seeds: Sequence[int], max_actions: int) -> tuple[str, BaselineResult] | None:
    """The move word whose constant repetition succeeds most often, with its result; None without a move set."""
    words = MOVE_WORDS.get(type(env.unwrapped))
    if words is None:
        return None
    results = {word: evaluate(env, ConstantAgent(word), seeds, max_actions) for word in words}
    word = max(results, key=lambda w: (results[w].success_rate, results[w].mean_return))
    return word, results[word]


def resolve_env(name: str, overrides: Sequence[str] = ()) -> tuple[gymnasium.Env, int]:
    """A `custom_envs` tag (with its step budget) or a registered env type (bounded by its own max_steps)."""
    from ragen.overrides import load_config  # Hydra; imported here so that `ragen.envs` stays light

    custom_envs = load_config("base", overrides).custom_envs
    if name in custom_envs:
        spec = custom_envs[name]
        return make_env(spec.env_type, dict(spec.env_config)), spec.max_actions_per_traj
    if name in ENV_REGISTRY:
        return make_env(name), MAX_EPISODE_ACTIONS
    raise SystemExit(f"unknown env {name!r}: custom_envs tags are {sorted(custom_envs)}, "
                     f"env types are {sorted(ENV_REGISTRY)}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("envs", nargs="+", help="custom_envs tags (e.g. SimpleSokoban) or env types (e.g. sokoban)")
    parser.add_argument("--seeds", type=int, default=100, help="episodes per env and agent (default 100)")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are first_seed, first_seed+1, ...")
    parser.add_argument("--max-actions", type=int, help="step budget per episode (default: the tag's own)")
    parser.add_argument("--agents", nargs="+", default=AGENT_NAMES, choices=AGENT_NAMES)
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides for config/base.yaml")
    args = parser.parse_args(argv)

    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"{'env':<26}{'agent':<16}{'episodes':>9}{'success':>9}{'return':>9}{'actions':>9}")
    for name in args.envs:
        env, budget = resolve_env(name, args.override)
        for agent_name in args.agents:
            if agent_name == "constant":
                best = best_constant(env, seeds, args.max_actions or budget)
                if best is None:  # no move set to repeat (Bandit, Countdown)
                    continue
                label, result = f"{agent_name} {best[0]}", best[1]
            elif agent_name == "oracle" and not has_oracle(env):
                print(f"{name:<26}{agent_name:<16}  not available: add a planner for {type(env.unwrapped).__name__} "
                      "to ORACLE_PLANS in ragen/envs/baselines.py")
                continue
            else:
                label, result = agent_name, evaluate(env, AGENTS[agent_name](args.first_seed), seeds,
                                                     args.max_actions or budget)
            print(f"{name:<26}{label:<16}{result.episodes:>9}{result.success_rate:>9.3f}"
                  f"{result.mean_return:>9.3f}{result.mean_actions:>9.2f}")


if __name__ == "__main__":
    main()
