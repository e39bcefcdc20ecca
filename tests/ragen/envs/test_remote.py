"""Environments on env servers behind the in-process interface (ragen/envs/remote.py), through the env-state
manager: the same trajectories as in-process, concurrent stepping, faults that end only their own trajectories,
and spawned servers that never outlive the run."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ragen.config import CustomEnvConfig, EnvGroupsConfig, EnvServerConfig, EsManagerConfig
from ragen.env_state_manager import EnvStateManager
from ragen.envs import remote

FROZEN_LAKE = {"size": 4, "is_slippery": True}


@pytest.fixture(autouse=True)
def stop_servers():
    yield
    remote.stop_servers()


def manager(tags: dict[str, CustomEnvConfig], groups: int = 3, group_size: int = 2, **limits) -> EnvStateManager:
    config = EnvGroupsConfig(env_groups=groups, group_size=group_size)
    config.env_configs.tags, config.env_configs.n_groups = list(tags), []
    return EnvStateManager(config, tags, seed=1234, limits=EsManagerConfig(**limits))


def play(envs: EnvStateManager, turns: int = 4) -> list[tuple]:
    """Every env's observations, rewards and flags over a few turns of fixed actions."""
    moves = ["Up", "Left", "Down", "Right"]
    seen = [(s.tag, s.seed, s.obs) for s in envs.reset(0)]
    for turn in range(turns):
        active = [s for s in envs.states if not s.done]
        records = envs.step_all([(s.env_id, [moves[(turn + s.env_id) % 4], moves[turn % 4]]) for s in active])
        seen += [(s.env_id, s.obs, r.reward, r.valid, r.effective, s.done, s.success, s.error)
                 for s, r in zip(active, records)]
    return seen


def spawned(env_type: str, env_config: dict, max_actions: int = 8, **server) -> CustomEnvConfig:
    return CustomEnvConfig(env_type=env_type, max_actions_per_traj=max_actions, env_config=env_config,
                           server=EnvServerConfig(spawn=True, **server))


def test_served_envs_play_exactly_as_in_process():
    """Sokoban and slippery FrozenLake (its slips come from each env's own random stream, which the server must
    set as the manager does), two servers: the same observations, rewards and outcomes."""
    local = {"SimpleSokoban": CustomEnvConfig(env_type="sokoban", max_actions_per_traj=8,
                                              env_config={"dim_x": 6, "dim_y": 6, "num_boxes": 1}),
             "FrozenLake": CustomEnvConfig(env_type="frozen_lake", max_actions_per_traj=8, env_config=FROZEN_LAKE)}
    served = {"SimpleSokoban": spawned("sokoban", {"dim_x": 6, "dim_y": 6, "num_boxes": 1}, workers=2),
              "FrozenLake": spawned("frozen_lake", FROZEN_LAKE)}
    in_process, over_http = manager(local, groups=4), manager(served, groups=4)
    assert type(over_http.states[0].env) is remote.RemoteEnv
    assert over_http.env_per_tag()["FrozenLake"].instructions == in_process.env_per_tag()["FrozenLake"].instructions
    assert play(over_http) == play(in_process)
    assert play(over_http) == play(in_process)  # a second rollout opens new sessions on the same servers


def test_envs_step_concurrently_with_the_outcome_of_stepping_one_after_another(monkeypatch):
    from ragen.envs import ENV_REGISTRY, SokobanEnv

    running, most = [0], [0]
    lock = threading.Lock()

    class SlowSokoban(SokobanEnv):
        def step(self, action):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
            return super().step(action)

    monkeypatch.setitem(ENV_REGISTRY, "slow_sokoban", (SlowSokoban, ENV_REGISTRY["sokoban"][1]))
    slow = manager({"S": CustomEnvConfig(env_type="slow_sokoban", max_actions_per_traj=8)}, groups=4)
    plain = manager({"S": CustomEnvConfig(env_type="sokoban", max_actions_per_traj=8)}, groups=4)
    assert play(slow) == play(plain)
    assert most[0] > 1  # several envs were inside step() at once


def server_pids() -> list[int]:
    return [server.process.pid for pool in remote._POOLS.values() for server in pool.servers]


def test_a_killed_server_ends_only_its_trajectories_and_is_restarted():
    envs = manager({"SimpleSokoban": spawned("sokoban", {}, workers=2, retries=1)}, groups=4, group_size=1,
                   max_env_failure_share=1.0)
    envs.reset(0)
    pool = next(iter(remote._POOLS.values()))
    victim = pool.servers[0]
    on_victim = [s for s in envs.states if s.env.connection.index == 0]  # a failed env is replaced: ask now
    others = [s for s in envs.states if s.env.connection.index == 1]
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait()
    envs.step_all([(s.env_id, ["Up"]) for s in envs.states])
    assert on_victim and others
    assert all(s.error and "RemoteEnvError" in s.error and s.done for s in on_victim)
    assert all(s.error is None and len(s.turns) == 1 for s in others)
    assert victim.alive()  # restarted, and the next rollout plays on it
    envs.reset(1)
    envs.step_all([(s.env_id, ["Up"]) for s in envs.states])
    assert all(s.error is None for s in envs.states)
    assert sessions_on(pool) == len(envs.states)  # failed envs were replaced, their sessions ended, none leak

    os.kill(pool.servers[1].process.pid, signal.SIGKILL)  # killed between rollouts, its envs holding sessions
    pool.servers[1].process.wait()
    envs.reset(2)  # ending the lost sessions fails quietly, the server is restarted, every env starts
    assert all(s.error is None for s in envs.states) and pool.servers[1].alive()


def sessions_on(pool) -> int:
    import httpx

    return sum(httpx.get(f"{server.url}/health").json()["sessions"] for server in pool.servers)


def test_an_env_that_fails_to_start_ends_only_its_trajectory(monkeypatch):
    from ragen.envs import ENV_REGISTRY, SokobanEnv

    class BadSeed(SokobanEnv):
        def reset(self, *, seed=None, options=None):
            if seed == 1235:
                raise RuntimeError("no level for this seed")
            return super().reset(seed=seed, options=options)

    monkeypatch.setitem(ENV_REGISTRY, "bad_seed", (BadSeed, ENV_REGISTRY["sokoban"][1]))
    envs = manager({"S": CustomEnvConfig(env_type="bad_seed")}, groups=3, group_size=1, max_env_failure_share=1.0)
    envs.reset(0)
    assert [s.error for s in envs.states] == [None, "RuntimeError: no level for this seed", None]
    assert envs.states[1].done and not envs.states[0].done


def test_a_hung_step_times_out_and_ends_only_its_trajectory(monkeypatch):
    """A server whose env hangs on one action: that trajectory fails after server.timeout_s (no retry: it
    would hang again), the others go on."""
    from ragen.envs import ENV_REGISTRY, SokobanEnv
    from ragen.envs.serve import make_app
    import uvicorn

    class HangingSokoban(SokobanEnv):
        def step(self, action):
            if action == "Hang":
                time.sleep(5)
            return super().step(action)

    monkeypatch.setitem(ENV_REGISTRY, "hanging", (HangingSokoban, ENV_REGISTRY["sokoban"][1]))
    server = uvicorn.Server(uvicorn.Config(make_app(["hanging"]), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    tag = CustomEnvConfig(env_type="hanging", max_actions_per_traj=8,
                          server=EnvServerConfig(url=f"http://127.0.0.1:{port}", timeout_s=1.0, retries=2))
    envs = manager({"H": tag}, groups=3, group_size=1, max_env_failure_share=1.0)
    envs.reset(0)
    start = time.monotonic()
    envs.step_all([(0, ["Hang"]), (1, ["Up"]), (2, ["Left"])])
    assert time.monotonic() - start < 4  # one timeout, not three
    assert "ReadTimeout" in envs.states[0].error and envs.states[0].done
    assert envs.states[1].error is None and envs.states[2].error is None
    server.should_exit = True
    thread.join(timeout=10)


def test_spawned_servers_die_with_the_run_even_when_it_is_killed(tmp_path):
    """A normal exit, an exception and Ctrl-C stop them (atexit); SIGKILL leaves no atexit to run: the servers go
    because the kernel tells them (PR_SET_PDEATHSIG)."""
    script = textwrap.dedent("""
        import json, signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even where started with SIGINT ignored
        from ragen.config import EnvServerConfig
        from ragen.envs import remote
        env = remote.make_remote_env(EnvServerConfig(spawn=True, workers=2), "sokoban", {})
        print(json.dumps([s.process.pid for pool in remote._POOLS.values() for s in pool.servers]), flush=True)
        if sys.argv[1] == "exit":
            raise SystemExit(0)
        if sys.argv[1] == "crash":
            raise RuntimeError("a bug in the trainer")
        time.sleep(600)
    """)
    for how in ("exit", "crash", "ctrl-c", "kill"):
        run = subprocess.Popen([sys.executable, "-c", script, how], stdout=subprocess.PIPE, text=True,
                               stderr=subprocess.DEVNULL)
        pids = json.loads(run.stdout.readline())
        if how in ("ctrl-c", "kill"):
            run.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
        run.wait(timeout=60)
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in pids), how


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (exited, not yet reaped by init) counts as gone
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_server_that_does_not_serve_the_env_type_is_a_clear_error():
    tag = spawned("sokoban", {})
    manager({"S": tag}, groups=1, group_size=1)
    url = next(iter(remote._POOLS.values())).servers[0].url
    with pytest.raises(remote.RemoteEnvError, match="does not serve env_type 'frozen_lake'"):
        manager({"F": CustomEnvConfig(env_type="frozen_lake", server=EnvServerConfig(url=url))}, groups=1,
                group_size=1)
    with pytest.raises(remote.RemoteEnvError, match="not usable"):
        manager({"F": CustomEnvConfig(env_type="sokoban", server=EnvServerConfig(url="http://127.0.0.1:9",
                                                                                 retries=0))}, groups=1, group_size=1)


def test_a_rollout_over_servers_is_the_rollout_in_process(tokenizer):
    """The agent proxy's whole rollout (records, token batch, metrics) with the envs served equals it in-process:
    greedy replies in place of a policy, Sokoban and slippery FrozenLake in one batch."""
    import torch

    from ragen.agent_proxy import AgentProxy
    from ragen.config import AgentProxyConfig
    from ragen.context_manager import ContextManager
    from tests.ragen.test_agent_proxy import ScriptedPolicy
    from verl.workers.rollout import SamplingParams

    def rollout(tags):
        config = AgentProxyConfig(max_turn=3, max_actions_per_turn=2)
        envs = manager(tags, groups=4, group_size=2)
        context = ContextManager.for_envs(tokenizer, config, envs.env_per_tag(), [tokenizer.eos_token_id],
                                          max_model_len=1 << 30)
        policy = ScriptedPolicy(tokenizer, "hmm</think><answer>Right || Down</answer>")
        return AgentProxy(config, SamplingParams(max_new_tokens=64), -0.1, 0, policy, envs, context).rollout(step=2)

    local = {"S": CustomEnvConfig(env_type="sokoban", max_actions_per_traj=6),
             "F": CustomEnvConfig(env_type="frozen_lake", max_actions_per_traj=6, env_config=FROZEN_LAKE)}
    served = {"S": spawned("sokoban", {}, max_actions=6), "F": spawned("frozen_lake", FROZEN_LAKE, max_actions=6)}
    in_process, over_http = rollout(local), rollout(served)
    assert over_http.records == in_process.records
    assert any(turn["action_effective"] for record in in_process.records for turn in record["turns"])
    assert over_http.metrics == in_process.metrics
    for key, value in in_process.batch.batch.items():
        assert torch.equal(over_http.batch.batch[key], value), key


def test_a_server_answering_garbage_ends_only_that_trajectory(monkeypatch):
    """A proxy in front of a real server that garbles every step reply of one session: that trajectory fails
    with a message saying what was wrong, the others play on."""
    import http.server

    import httpx

    envs_served = manager({"S": spawned("sokoban", {})}, groups=1, group_size=1)  # starts a real server
    upstream = next(iter(remote._POOLS.values())).servers[0].url
    garbled = set()

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            answer = httpx.post(upstream + self.path, content=body, headers={"Content-Type": "application/json"})
            content = answer.content
            if self.path.endswith("/step") and self.path.split("/")[3] in garbled:
                content = b'{"observation": 3, "reward": "lots"'
            self.send_response(answer.status_code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_DELETE = lambda self: self._forward()

        def _forward(self):
            answer = httpx.request(self.command, upstream + self.path)
            self.send_response(answer.status_code)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        def log_message(self, *args):
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    tag = CustomEnvConfig(env_type="sokoban", server=EnvServerConfig(url=f"http://127.0.0.1:{proxy.server_port}"))
    envs = manager({"S": tag}, groups=3, group_size=1, max_env_failure_share=1.0)
    envs.reset(0)
    garbled.add(envs.states[1].env.session_id)
    envs.step_all([(s.env_id, ["Up", "Left"]) for s in envs.states])
    assert "is not a StepReply" in envs.states[1].error and envs.states[1].done
    assert envs.states[0].error is None and envs.states[2].error is None
    assert len(envs.states[0].turns[0].actions) == 2
    proxy.shutdown()
    del envs_served


def test_training_on_spawned_servers_plays_what_training_in_process_plays(tiny_model_path, tmp_path):
    """`bash train.sh sokoban` with its tag served: the same rollouts, training and validation, as in-process,
    and no server left afterwards."""
    from tests.test_train_e2e import run_processes, train

    common = ["trainer.total_training_steps=1", "trainer.backend=local", "agent_proxy.max_turn=2",
              "es_manager.val.env_groups=4"]
    train("sokoban", tiny_model_path, tmp_path / "local", *common)
    result = train("sokoban", tiny_model_path, tmp_path / "served", *common,
                   "custom_envs.CoordSokoban.server.spawn=true", "custom_envs.CoordSokoban.server.workers=2")
    for split, step in (("train", 1), ("val", 0)):
        local, served = ((tmp_path / run / "rollouts" / split / f"step_{step}.jsonl").read_text()
                         for run in ("local", "served"))
        assert served == local and local, split
    assert "HTTP Request" not in result.stdout + result.stderr  # httpx's per-request log stays quiet
    leftover = run_processes("ragen.envs.serve CoordSokoban|ragen.envs.serve sokoban", tmp_path / "served")
    assert not [line for line in leftover if alive(int(line.split()[0]))]
