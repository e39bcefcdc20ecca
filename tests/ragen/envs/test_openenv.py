"""RAGEN environments served with OpenEnv's own server (ragen/envs/openenv.py) and played with OpenEnv's own
client (`openenv.GenericEnvClient`, over its WebSocket session): every observation, reward and end flag as
the same env gives in-process for the same seed, stream and actions."""

import json
import subprocess
import sys
import threading

import httpx
import pytest

pytest.importorskip("openenv.core", reason="needs the openenv-core package (the test extra)")
from openenv import GenericEnvClient  # noqa: E402

from ragen.envs import make_env  # noqa: E402
from ragen.envs.openenv import main, make_app  # noqa: E402
from ragen.envs.utils import start_episode  # noqa: E402

# max_steps is small so that episodes end by truncation as well as by success or a hole
SOKOBAN = {"dim_x": 6, "dim_y": 6, "num_boxes": 1, "max_steps": 4}
FROZEN_LAKE = {"size": 4, "is_slippery": True, "max_steps": 6}
ACTIONS = ["Up", "Left", "Down", "Right", "jump", "Down", "Left", "Up", "Right"]  # "jump" is invalid


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """`python -m ragen.envs.openenv` for Sokoban and for slippery FrozenLake, started side by side."""
    logs = tmp_path_factory.mktemp("openenv")
    processes = {}
    for env_type, config in [("sokoban", SOKOBAN), ("frozen_lake", FROZEN_LAKE)]:
        command = [sys.executable, "-m", "ragen.envs.openenv", env_type, "--env-config", json.dumps(config),
                   "--port", "0"]
        stderr = open(logs / f"{env_type}.log", "w")
        processes[env_type] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        urls = {}
        for env_type, process in processes.items():
            timer = threading.Timer(60, process.kill)  # a server that never says it listens fails the test
            timer.start()
            line = process.stdout.readline()
            timer.cancel()
            assert line.startswith("[ragen.envs.openenv] listening on "), (
                f"{env_type} server did not start: {line!r} {(logs / f'{env_type}.log').read_text()}")
            urls[env_type] = line.split()[-1]
        yield urls
    finally:
        for process in processes.values():
            process.terminate()
            process.wait(timeout=30)


def local_episode(env_type: str, config: dict, seed: int, stream: list[int] | None) -> list[tuple]:
    """The episode in-process: the reset's (text, info), then each step's (text, reward, terminated,
    truncated, info) until it ends."""
    env = make_env(env_type, config)
    text, info = start_episode(env, seed, stream)
    records = [(text, info)]
    for action in ACTIONS:
        text, reward, terminated, truncated, info = env.step(action)
        records.append((text, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return records


class ServedEpisode:
    """One episode through OpenEnv's client: its own WebSocket session on the server."""

    def __init__(self, url: str, seed: int, stream: list[int] | None):
        self.client = GenericEnvClient(base_url=url).sync()
        self.client.connect()
        self.reset_result = self.client.reset(seed=seed, stream=stream)
        observation = self.reset_result.observation
        self.records = [(observation["text"], observation["info"])]
        self.done = False

    def step(self, action: str) -> None:
        result = self.client.step({"action": action})
        observation = result.observation
        assert result.done == (observation["terminated"] or observation["truncated"])
        self.records.append((observation["text"], result.reward, observation["terminated"],
                             observation["truncated"], observation["info"]))
        self.done = result.done


def play_interleaved(url: str, starts: list[tuple[int, list[int] | None]]) -> list[list[tuple]]:
    """All episodes open at once on one server, stepped in turn, so that a session leaking into another shows."""
    episodes = [ServedEpisode(url, seed, stream) for seed, stream in starts]
    try:
        for action in ACTIONS:
            for episode in episodes:
                if not episode.done:
                    episode.step(action)
        return [episode.records for episode in episodes]
    finally:
        for episode in episodes:
            episode.client.close()


def test_sokoban_over_openenv_plays_exactly_as_in_process(servers):
    starts = [(seed, None) for seed in range(4)]
    expected = [local_episode("sokoban", SOKOBAN, seed, stream) for seed, stream in starts]
    assert any(episode[-1][3] for episode in expected)  # an episode truncated: the end flags are checked too
    assert play_interleaved(servers["sokoban"], starts) == expected


def test_slippery_frozen_lake_over_openenv_plays_exactly_as_in_process(servers):
    """A group's members share a seed and slip with their own stream, which the server must set as
    start_episode does: the streams chosen here do change the episodes."""
    starts = [(0, [0, 0]), (0, [0, 1]), (0, None), (1, [1, 0]), (1, [1, 1])]
    expected = [local_episode("frozen_lake", FROZEN_LAKE, seed, stream) for seed, stream in starts]
    assert expected[0] != expected[1] != expected[2] and expected[3] != expected[4]
    assert play_interleaved(servers["frozen_lake"], starts) == expected


def test_the_reset_observation_carries_what_the_prompt_needs(servers):
    env = make_env("frozen_lake", FROZEN_LAKE)
    episode = ServedEpisode(servers["frozen_lake"], seed=3, stream=None)
    try:
        result = episode.reset_result
        assert (result.reward, result.done) == (None, False)
        assert result.observation["instructions"] == env.instructions
        assert result.observation["example_actions"] == list(env.example_actions)
        episode.step("Down")
        assert episode.client.state()["step_count"] == 1
    finally:
        episode.client.close()


def test_http_endpoints_describe_the_env(servers):
    url = servers["sokoban"]
    assert httpx.get(f"{url}/health").json()["status"] == "healthy"
    metadata = httpx.get(f"{url}/metadata").json()
    assert metadata["name"] == "ragen/sokoban"
    assert metadata["description"] == make_env("sokoban", SOKOBAN).instructions
    schema = httpx.get(f"{url}/schema").json()
    assert schema["action"]["properties"]["action"]["type"] == "string"
    assert {"text", "terminated", "truncated", "info"} <= set(schema["observation"]["properties"])


def test_bad_requests_get_errors_and_leave_the_session_usable(servers):
    client = GenericEnvClient(base_url=servers["sokoban"]).sync()
    with client:
        with pytest.raises(RuntimeError, match="step before reset"):
            client.step({"action": "Up"})
        with pytest.raises(RuntimeError, match="unknown reset arguments"):
            client.reset(seed=1, steam=[1, 0])
        client.reset(seed=1)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"action": 3})
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"move": "Up"})
        assert client.step({"action": "Up"}).observation["text"] == local_episode("sokoban", SOKOBAN, 1, None)[1][0]


def test_a_bad_env_config_fails_at_start():
    with pytest.raises(ValueError, match="unknown sokoban config key 'dimx'"):
        make_app("sokoban", {"dimx": 6})
    with pytest.raises(SystemExit, match="bad --env-config"):
        main(["sokoban", "--env-config", "{not json"])
    with pytest.raises(SystemExit, match="bad --env-config.*num_boxes"):
        main(["sokoban", "--env-config", '{"num_boxes": 0}'])


def test_openenv_web_ui_plays_the_env(monkeypatch):
    """OpenEnv's optional Gradio UI makes its own env from the factory, and plays it over /web/reset, /web/step."""
    from fastapi.testclient import TestClient

    monkeypatch.setenv("ENABLE_WEB_INTERFACE", "true")
    expected = local_episode("sokoban", SOKOBAN, 1, None)
    with TestClient(make_app("sokoban", SOKOBAN)) as client:
        assert client.post("/web/reset", json={"seed": 1}).json()["observation"]["text"] == expected[0][0]
        reply = client.post("/web/step", json={"action": {"action": "Up"}}).json()
    assert (reply["observation"]["text"], reply["reward"]) == expected[1][:2]
