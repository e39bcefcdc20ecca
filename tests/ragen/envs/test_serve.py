"""The environment server (ragen/envs/serve.py): an episode over HTTP is the same episode in-process, retries
never step twice, every mistake gets its status and a one-line message, and the real command starts, serves
and stops."""

import dataclasses
import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium
import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from ragen.envs import ENV_REGISTRY, make_env
from ragen.envs.serve import make_app, resolve_env_types
from ragen.envs.utils import start_episode

SOKOBAN_ACTIONS = ["Up", "Left", "Down", "Right", "Down", "Left", "Up", "Up", "Right", "Left"]
FROZEN_LAKE_ACTIONS = ["Right", "Down"] * 10


def play_in_process(env_type, env_config, seed, stream, actions):
    """The episode as the trainer plays it without a server: start_episode, then env.step per action."""
    env = make_env(env_type, env_config)
    observation, info = start_episode(env, seed, stream)
    steps = []
    for action in actions:
        observation_, reward, terminated, truncated, info_ = env.step(action)
        steps.append({"observation": observation_, "reward": reward, "terminated": terminated,
                      "truncated": truncated, "info": info_})
        if terminated or truncated:
            break
    return (observation, info, env.instructions, list(env.example_actions)), steps


def play_over_http(client, env_type, env_config, seed, stream, actions):
    reply = client.post("/v1/sessions", json={"env": env_type, "env_config": env_config, "seed": seed,
                                              "stream": stream})
    assert reply.status_code == 200, reply.text
    created = reply.json()
    steps = []
    for step_index, action in enumerate(actions):
        reply = client.post(f"/v1/sessions/{created['session_id']}/step",
                            json={"action": action, "step_index": step_index})
        assert reply.status_code == 200, reply.text
        steps.append(reply.json())
        if steps[-1]["terminated"] or steps[-1]["truncated"]:
            break
    start = (created["observation"], created["info"], created["instructions"], created["example_actions"])
    return start, steps, created["session_id"]


@pytest.fixture
def client():
    with TestClient(make_app(["sokoban", "frozen_lake"])) as client:
        yield client


@pytest.mark.parametrize("env_type, env_config, seed, stream, actions", [
    ("sokoban", {}, 5, None, SOKOBAN_ACTIONS),
    ("sokoban", {"dim_x": 7, "dim_y": 7, "observation_format": "grid_coord"}, 11, [11, 2], SOKOBAN_ACTIONS),
    ("frozen_lake", {"is_slippery": True}, 3, [3, 1], FROZEN_LAKE_ACTIONS),
])
def test_an_episode_over_http_is_the_episode_in_process(client, env_type, env_config, seed, stream, actions):
    assert play_over_http(client, env_type, env_config, seed, stream, actions)[:2] == play_in_process(
        env_type, env_config, seed, stream, actions)


def test_the_stream_is_applied_to_a_stochastic_env(client):
    # Slippery FrozenLake from one start state: the slips follow the stream, so each stream its own episode.
    episodes = [play_over_http(client, "frozen_lake", {}, 3, stream, FROZEN_LAKE_ACTIONS)[:2]
                for stream in ([3, 0], [3, 1], None)]
    assert episodes[0][0] == episodes[1][0]  # the same start state
    assert episodes[0] != episodes[1]
    assert episodes[1] == play_in_process("frozen_lake", {}, 3, [3, 1], FROZEN_LAKE_ACTIONS)
    assert episodes[2] == play_in_process("frozen_lake", {}, 3, None, FROZEN_LAKE_ACTIONS)


def test_a_retried_step_gets_the_same_reply_without_stepping_again(client):
    config = {"max_steps": 3}  # a third valid action would truncate: a double step would show
    session_id = client.post("/v1/sessions", json={"env": "sokoban", "env_config": config, "seed": 5}).json()[
        "session_id"]
    url = f"/v1/sessions/{session_id}/step"
    first = client.post(url, json={"action": "Up", "step_index": 0})
    retried = client.post(url, json={"action": "Up", "step_index": 0})
    assert retried.status_code == 200 and retried.json() == first.json()
    second = client.post(url, json={"action": "Left", "step_index": 1}).json()
    expected = play_in_process("sokoban", config, 5, None, ["Up", "Left"])[1]
    assert [first.json(), second] == expected and not second["truncated"]
    assert client.post(url, json={"action": "Left", "step_index": 1}).json() == second

    skipped = client.post(url, json={"action": "Up", "step_index": 5})
    assert skipped.status_code == 409
    assert "expected 2" in skipped.json()["detail"] and "got 5" in skipped.json()["detail"]
    assert client.post(url, json={"action": "Up", "step_index": 0}).status_code == 409  # too old to replay


@pytest.mark.parametrize("body, status, named", [
    ({"env": "nope", "seed": 0}, 400, "'nope'"),
    ({"env": "bandit", "seed": 0}, 400, "not served"),  # registered, but not among this server's envs
    ({"env": "sokoban", "seed": 0, "env_config": {"dimx": 6}}, 400, "'dimx'"),
    ({"env": "sokoban", "seed": 0, "env_config": {"dim_x": "6"}}, 400, "'dim_x'"),
    ({"env": "sokoban", "seed": 0, "typo": 1}, 422, "typo"),
    ({"env": "sokoban", "seed": -1}, 422, "seed"),
    ({"env": "sokoban"}, 422, "seed"),
])
def test_a_bad_create_gets_its_status_and_a_one_line_message(client, body, status, named):
    reply = client.post("/v1/sessions", json=body)
    assert reply.status_code == status and named in reply.json()["detail"]
    assert "\n" not in reply.json()["detail"] and "Traceback" not in reply.text


@pytest.mark.parametrize("content, named", [(b'{"env": "sokoban", "seed": ', "malformed JSON"),
                                             (b"[1, 2]", "JSON object")])
def test_a_malformed_body_is_422(client, content, named):
    reply = client.post("/v1/sessions", content=content, headers={"Content-Type": "application/json"})
    assert reply.status_code == 422 and named in reply.json()["detail"] and "\n" not in reply.json()["detail"]


def test_an_unknown_session_is_404(client):
    assert client.post("/v1/sessions/nope/step", json={"action": "Up", "step_index": 0}).status_code == 404
    assert client.delete("/v1/sessions/nope").json() == {"detail": "unknown session 'nope'"}
    session_id = client.post("/v1/sessions", json={"env": "sokoban", "seed": 0}).json()["session_id"]
    assert client.delete(f"/v1/sessions/{session_id}").status_code == 204
    gone = client.post(f"/v1/sessions/{session_id}/step", json={"action": "Up", "step_index": 0})
    assert gone.status_code == 404 and "deleted" in gone.json()["detail"]


def test_a_full_server_is_503_until_a_session_ends():
    with TestClient(make_app(["sokoban"], max_sessions=2)) as client:
        ids = [client.post("/v1/sessions", json={"env": "sokoban", "seed": seed}).json()["session_id"]
               for seed in range(2)]
        full = client.post("/v1/sessions", json={"env": "sokoban", "seed": 2})
        assert full.status_code == 503 and "full" in full.json()["detail"]
        assert client.get("/health").json()["sessions"] == 2
        client.delete(f"/v1/sessions/{ids[0]}")
        assert client.post("/v1/sessions", json={"env": "sokoban", "seed": 2}).status_code == 200


def test_a_failed_create_frees_its_slot():
    with TestClient(make_app(["sokoban"], max_sessions=1)) as client:
        bad_config = {"env": "sokoban", "seed": 0, "env_config": {"x": 1}}
        assert client.post("/v1/sessions", json=bad_config).status_code == 400
        assert client.post("/v1/sessions", json={"env": "sokoban", "seed": 0}).status_code == 200


def test_an_oversized_body_is_413_declared_or_chunked():
    with TestClient(make_app(["sokoban"], max_body_bytes=200)) as client:
        small = {"env": "sokoban", "seed": 0}
        assert client.post("/v1/sessions", json=small).status_code == 200
        large = {"env": "sokoban", "seed": 0, "env_config": {"symbols": "x" * 300}}
        assert client.post("/v1/sessions", json=large).status_code == 413

        def chunks():  # no Content-Length: the server must count what it reads
            yield b'{"env": "sokoban", "seed": 0, "stream": ['
            for _ in range(100):
                yield b"1, "
            yield b"1]}"

        reply = client.post("/v1/sessions", content=chunks(), headers={"Content-Type": "application/json"})
        assert reply.status_code == 413 and "200 bytes" in reply.json()["detail"]


def test_with_a_token_every_request_must_carry_it():
    with TestClient(make_app(["sokoban"], token="s3cret")) as client:
        assert client.get("/health").status_code == 401
        assert client.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/health", headers={"Authorization": "s3cret"}).status_code == 401
        refused = client.post("/v1/sessions", json={"env": "sokoban", "seed": 0})
        assert refused.status_code == 401 and "token" in refused.json()["detail"]
        right = {"Authorization": "Bearer s3cret"}
        assert client.get("/health", headers=right).json()["sessions"] == 0
        assert client.post("/v1/sessions", json={"env": "sokoban", "seed": 0}, headers=right).status_code == 200


def test_envs_lists_each_served_env_type_and_its_config_fields(client):
    reply = client.get("/v1/envs").json()
    assert [env["env"] for env in reply["envs"]] == ["sokoban", "frozen_lake"]
    sokoban = reply["envs"][0]
    assert sokoban["config_fields"]["dim_x"] == "int" and sokoban["config_fields"]["symbols"] == "str"
    assert sokoban["max_steps"] == 100
    assert client.get("/health").json() == {"status": "ok", "api_version": "v1", "sessions": 0,
                                            "max_sessions": 1024}


def test_a_batch_answers_each_item_in_order(client):
    reset = client.post("/v1/batch/reset", json={"items": [
        {"env": "sokoban", "seed": 1},
        {"env": "nope", "seed": 1},
        {"env": "sokoban", "seed": 1, "env_config": {"dimx": 6}},
        {"env": "frozen_lake", "seed": 2, "stream": [2, 5]},
    ]})
    assert reset.status_code == 200
    items = reset.json()["items"]
    assert [item["status"] for item in items] == [200, 400, 400, 200]
    assert items[1]["result"] is None and "'nope'" in items[1]["error"] and "'dimx'" in items[2]["error"]
    sokoban, frozen_lake = items[0]["result"], items[3]["result"]
    assert sokoban["observation"] == play_in_process("sokoban", {}, 1, None, [])[0][0]
    assert frozen_lake["observation"] == play_in_process("frozen_lake", {}, 2, [2, 5], [])[0][0]

    step = client.post("/v1/batch/step", json={"items": [
        {"session_id": sokoban["session_id"], "action": "Up", "step_index": 0},
        {"session_id": "nope", "action": "Up", "step_index": 0},
        {"session_id": frozen_lake["session_id"], "action": "Down", "step_index": 3},
        {"session_id": frozen_lake["session_id"], "action": "Down", "step_index": 0},
    ]}).json()["items"]
    assert [item["status"] for item in step] == [200, 404, 409, 200]
    assert [step[0]["result"]] == play_in_process("sokoban", {}, 1, None, ["Up"])[1]
    assert [step[3]["result"]] == play_in_process("frozen_lake", {}, 2, [2, 5], ["Down"])[1]


@dataclasses.dataclass
class ScriptedConfig:
    fail: str = ""  # "reset" or "step": that call raises; "nan": step returns a NaN reward
    wait: bool = False  # step waits at ScriptedEnv.barrier for as many other steps to run at the same time


class ScriptedEnv(gymnasium.Env):
    """An env whose step returns numpy values, or which fails as its config says."""

    instructions = "Say anything."
    example_actions = ("hello",)
    barrier: threading.Barrier | None = None
    closed: list["ScriptedEnv"] = []

    def __init__(self, config: ScriptedConfig) -> None:
        self.config = config

    def close(self):
        self.closed.append(self)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.config.fail == "reset":
            raise RuntimeError("no start state")
        return "start", {"level": np.int64(3)}

    def step(self, action):
        if self.config.wait:
            self.barrier.wait(timeout=10)
        if self.config.fail == "step":
            raise RuntimeError("boom")
        reward = np.float64("nan") if self.config.fail == "nan" else np.float64(0.5)
        info = {"score": np.float32(0.25), "cells": np.arange(3), "pair": (1, np.bool_(True)), 7: "seven"}
        return action, reward, np.bool_(False), False, info


@pytest.fixture
def scripted_client(monkeypatch):
    monkeypatch.setitem(ENV_REGISTRY, "scripted", (ScriptedEnv, ScriptedConfig))
    monkeypatch.setattr(ScriptedEnv, "closed", [])
    with TestClient(make_app(["scripted"])) as client:
        yield client


def test_numpy_values_and_tuples_in_a_reply_become_json(scripted_client):
    created = scripted_client.post("/v1/sessions", json={"env": "scripted", "seed": 0}).json()
    assert created["info"] == {"level": 3} and created["example_actions"] == ["hello"]
    reply = scripted_client.post(f"/v1/sessions/{created['session_id']}/step",
                                 json={"action": "hi", "step_index": 0})
    assert reply.json() == {"observation": "hi", "reward": 0.5, "terminated": False, "truncated": False,
                            "info": {"score": 0.25, "cells": [0, 1, 2], "pair": [1, True], "7": "seven"}}


@pytest.mark.parametrize("fail, detail", [("step", "env.step raised RuntimeError: boom"),
                                          ("nan", "env.step returned a non-finite reward nan")])
def test_a_failing_env_step_is_a_500_env_error_and_ends_the_session(scripted_client, fail, detail):
    session_id = scripted_client.post("/v1/sessions", json={"env": "scripted", "seed": 0,
                                                            "env_config": {"fail": fail}}).json()["session_id"]
    reply = scripted_client.post(f"/v1/sessions/{session_id}/step", json={"action": "hi", "step_index": 0})
    assert reply.status_code == 500 and "Traceback" not in reply.text
    assert reply.json()["env_error"] is True and reply.json()["detail"].startswith(detail)
    assert scripted_client.get("/health").json()["sessions"] == 0
    again = scripted_client.post(f"/v1/sessions/{session_id}/step", json={"action": "hi", "step_index": 1})
    assert again.status_code == 404 and "env failed" in again.json()["detail"]


def test_a_failing_env_reset_is_a_500_env_error_and_leaves_no_session(scripted_client):
    reply = scripted_client.post("/v1/sessions", json={"env": "scripted", "seed": 0, "env_config": {"fail": "reset"}})
    assert reply.status_code == 500
    assert reply.json() == {"detail": "env.reset raised RuntimeError: no start state", "env_error": True}
    assert scripted_client.get("/health").json()["sessions"] == 0
    batch = scripted_client.post("/v1/batch/reset", json={"items": [
        {"env": "scripted", "seed": 0, "env_config": {"fail": "reset"}}, {"env": "scripted", "seed": 0}]}).json()
    assert [item["status"] for item in batch["items"]] == [500, 200]


def test_different_sessions_step_at_the_same_time(scripted_client, monkeypatch):
    # Each step waits until the other session's step has started too: run one after the other, both would
    # time out at the barrier and fail.
    create = {"items": [{"env": "scripted", "seed": 0, "env_config": {"wait": True}}] * 2}
    created = scripted_client.post("/v1/batch/reset", json=create).json()["items"]
    ids = [item["result"]["session_id"] for item in created]
    monkeypatch.setattr(ScriptedEnv, "barrier", threading.Barrier(2))
    steps = {"items": [{"session_id": session_id, "action": "hi", "step_index": 0} for session_id in ids]}
    assert [item["status"] for item in scripted_client.post("/v1/batch/step", json=steps).json()["items"]] == [200] * 2

    monkeypatch.setattr(ScriptedEnv, "barrier", threading.Barrier(2))
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda session_id: scripted_client.post(
            f"/v1/sessions/{session_id}/step", json={"action": "hi", "step_index": 1}), ids))
    assert [reply.status_code for reply in replies] == [200] * 2


def test_shutdown_closes_the_open_sessions(monkeypatch):
    monkeypatch.setitem(ENV_REGISTRY, "scripted", (ScriptedEnv, ScriptedConfig))
    monkeypatch.setattr(ScriptedEnv, "closed", [])
    with TestClient(make_app(["scripted"])) as client:
        ids = [client.post("/v1/sessions", json={"env": "scripted", "seed": seed}).json()["session_id"]
               for seed in range(4)]
        client.delete(f"/v1/sessions/{ids[0]}")
        assert len(ScriptedEnv.closed) == 1
    assert len(set(map(id, ScriptedEnv.closed))) == 4  # the other three at shutdown


@pytest.mark.parametrize("timeouts, why", [({"idle_timeout_s": 0.2}, "reaped for idleness"),
                                           ({"episode_timeout_s": 0.2}, "reaped for age")])
def test_an_abandoned_session_is_reaped(timeouts, why):
    with TestClient(make_app(["sokoban"], **timeouts)) as client:
        session_id = client.post("/v1/sessions", json={"env": "sokoban", "seed": 0}).json()["session_id"]
        deadline = time.monotonic() + 10
        while client.get("/health").json()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.05)
        reply = client.post(f"/v1/sessions/{session_id}/step", json={"action": "Up", "step_index": 0})
        assert reply.status_code == 404 and why in reply.json()["detail"]


def test_a_busy_session_is_not_idle():
    with TestClient(make_app(["sokoban"], idle_timeout_s=0.5)) as client:
        session_id = client.post("/v1/sessions", json={"env": "sokoban", "seed": 0}).json()["session_id"]
        for step_index in range(8):  # 8 x 0.15 s: over twice the idle timeout, never idle that long
            time.sleep(0.15)
            reply = client.post(f"/v1/sessions/{session_id}/step", json={"action": "Up", "step_index": step_index})
            assert reply.status_code == 200, reply.text


def test_a_custom_envs_tag_serves_its_env_type():
    assert resolve_env_types(["SimpleSokoban", "sokoban", "FrozenLake"]) == ["sokoban", "frozen_lake"]
    with pytest.raises(SystemExit, match="'NoSuchTag'"):
        resolve_env_types(["NoSuchTag"])


def server_env():
    return {key: value for key, value in os.environ.items() if key != "RAGEN_ENV_SERVER_TOKEN"}


def test_the_server_module_imports_no_heavy_library():
    heavy = "import sys, ragen.envs.serve; print(sorted({'torch', 'transformers', 'hydra', 'ray'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", heavy], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_the_command_serves_an_episode_and_stops_on_sigterm():
    process = subprocess.Popen([sys.executable, "-m", "ragen.envs.serve", "sokoban", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=server_env())
    try:
        ready, _, _ = select.select([process.stdout], [], [], 120)
        assert ready, "the server printed no listening line within 120 s"
        line = process.stdout.readline()
        assert line.startswith("[ragen.envs.serve] listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"
        with httpx.Client(base_url=url, timeout=30) as http:
            start, steps, _ = play_over_http(http, "sokoban", {}, 9, [9, 0], SOKOBAN_ACTIONS[:4])
        assert (start, steps) == play_in_process("sokoban", {}, 9, [9, 0], SOKOBAN_ACTIONS[:4])
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    finally:
        process.kill()
        _, stderr = process.communicate()
    assert process.returncode in (0, -signal.SIGTERM), stderr
    assert "sessions closed at shutdown: 1" in stderr


def test_the_command_refuses_another_host_without_a_token():
    result = subprocess.run([sys.executable, "-m", "ragen.envs.serve", "sokoban", "--host", "0.0.0.0"],
                            capture_output=True, text=True, env=server_env(), timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "--token" in result.stderr and "0.0.0.0" in result.stderr
