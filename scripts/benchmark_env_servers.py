"""What environment servers cost and what concurrent stepping saves: one turn (one action each) of 32 Sokoban
environments whose step takes an extra 0, 50 or 200 ms (a stand-in for a web page, a sandbox, a search call).

    HF_HUB_OFFLINE=1 python scripts/benchmark_env_servers.py [--envs 32] [--latencies-ms 0 50 200] [--turns 5]

For each latency it prints the seconds a turn takes
- in this process, one env after another (what the env-state manager did before it stepped concurrently);
- in this process, all at once (EnvStateManager.step_all: one thread per env);
- on a local env server (`python -m ragen.envs.serve`, spawned as a run spawns it), all at once;
and, at 0 ms, the overhead of a server per env step: one env stepped alone in a loop, in-process against over
HTTP (a round trip on localhost: request, JSON, the server's thread pool, reply). The median over `--turns` turns.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragen.config import CustomEnvConfig, EnvGroupsConfig, EnvMixConfig, EnvServerConfig  # noqa: E402
from ragen.env_state_manager import EnvStateManager  # noqa: E402
from ragen.envs import ENV_REGISTRY, SokobanConfig, SokobanEnv  # noqa: E402
from ragen.envs import remote  # noqa: E402

MOVES = ["Up", "Right", "Down", "Left"]


class SlowSokoban(SokobanEnv):
    """Sokoban whose step first waits `latency_ms` (time.sleep releases the GIL, as network I/O does)."""

    latency_ms = 0.0

    def step(self, action):
        time.sleep(self.latency_ms / 1000)
        return super().step(action)


def slow_type(latency_ms: float) -> str:
    """Register (here and, by the server's bootstrap, there) an env type with that latency."""
    name = f"sokoban_{latency_ms:g}ms"
    ENV_REGISTRY[name] = (type(name, (SlowSokoban,), {"latency_ms": latency_ms}), SokobanConfig)
    return name


def spawn_python(env_types: list[str]) -> str:
    """A `server.python` that registers the slow env types before serving them: a small launcher script."""
    launcher = Path("/tmp") / "ragen_benchmark_env_server.py"
    latencies = [float(name.split("_")[1].removesuffix("ms")) for name in env_types]
    launcher.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "import benchmark_env_servers as bench\n"
        f"for latency in {latencies!r}:\n"
        "    bench.slow_type(latency)\n"
        "from ragen.envs.serve import main\n"
        "main(sys.argv[sys.argv.index('ragen.envs.serve') + 1:])\n")
    wrapper = Path("/tmp") / "ragen_benchmark_python"
    wrapper.write_text(f"#!/bin/sh\n# drop `-m ragen.envs.serve`'s -m: run the launcher instead\n"
                       f"shift; exec {sys.executable} {launcher} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def manager(env_type: str, n_envs: int, server: EnvServerConfig | None = None) -> EnvStateManager:
    spec = CustomEnvConfig(env_type=env_type, max_actions_per_traj=10_000, server=server or EnvServerConfig())
    groups = EnvGroupsConfig(env_groups=n_envs, group_size=1, env_configs=EnvMixConfig(["B"], [n_envs]))
    return EnvStateManager(groups, {"B": spec}, seed=0)


def turn_seconds(envs: EnvStateManager, turns: int, one_by_one: bool) -> float:
    envs.reset(0)
    times = []
    for turn in range(turns):
        if any(s.done for s in envs.states):
            envs.reset(turn + 1)
        start = time.perf_counter()
        if one_by_one:
            for state in envs.states:
                envs.step(state.env_id, [MOVES[turn % 4]])
        else:
            envs.step_all([(state.env_id, [MOVES[turn % 4]]) for state in envs.states])
        times.append(time.perf_counter() - start)
    assert not any(s.error for s in envs.states), [s.error for s in envs.states if s.error]
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--latencies-ms", type=float, nargs="+", default=[0, 50, 200])
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()

    types = [slow_type(latency) for latency in args.latencies_ms]
    python = spawn_python(types)
    print(f"one turn of {args.envs} Sokoban envs, one action each; median of {args.turns} turns, seconds")
    print(f"{'step latency':>13} {'one by one':>11} {'concurrent':>11} {'server':>8}")
    for latency, env_type in zip(args.latencies_ms, types):
        sequential = turn_seconds(manager(env_type, args.envs), args.turns, one_by_one=True)
        concurrent = turn_seconds(manager(env_type, args.envs), args.turns, one_by_one=False)
        served = turn_seconds(manager(env_type, args.envs, EnvServerConfig(spawn=True, python=python)),
                              args.turns, one_by_one=False)
        print(f"{latency:>10g} ms {sequential:>11.3f} {concurrent:>11.3f} {served:>8.3f}", flush=True)
    remote.stop_servers()

    steps = 200
    print(f"\noverhead of a local server per env step (one env, {steps} steps, no added latency):")
    for label, server in (("in-process", None), ("server", EnvServerConfig(spawn=True))):
        envs = manager("sokoban", 1, server)
        envs.reset(0)
        start = time.perf_counter()
        for step in range(steps):
            if envs.states[0].done:
                envs.reset(step)
            envs.step(0, [MOVES[step % 4]])
        print(f"  {label:>10}: {1000 * (time.perf_counter() - start) / steps:.2f} ms a step")
    remote.stop_servers()


if __name__ == "__main__":
    main()
