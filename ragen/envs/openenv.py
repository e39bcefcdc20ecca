"""Serve a RAGEN environment as an OpenEnv environment (the `openenv-core` package, tested with 0.3.0), so that
OpenEnv's own clients play it:

    python -m ragen.envs.openenv sokoban --port 8000
    python -m ragen.envs.openenv frozen_lake --env-config '{"size": 4, "is_slippery": true}' --port 0

    from openenv import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=3)                  # result.observation["text"], ["instructions"], ...
        result = env.step({"action": "Up"})         # .observation["text"], .reward, .done

The server is OpenEnv's own (`openenv.core.env_server.http_server.create_app`); this module only supplies
the `Environment` it serves: `RagenEnvironment`, one RAGEN env of one type and config per session. OpenEnv
keeps an episode's environment for the life of a WebSocket connection (`/ws`, what `EnvClient` speaks); its
HTTP `/reset` and `/step` build a fresh environment for every request, so only `/reset` is of use over plain
HTTP here, and an HTTP `/step` fails as a step before a reset.

How a RAGEN step maps onto OpenEnv's observation, which has only `done`, `reward` and its own fields:
`done` is `terminated or truncated`, and the observation carries `text`, `terminated`, `truncated` and `info`
(action_is_valid, action_is_effective, success). The reset observation also carries the env's `instructions`
and `example_actions`, and has reward None. `reset` takes `seed` and, as RAGEN's own server does, an optional
`stream` (ragen.envs.utils.start_episode): the entropy a group member's random stream restarts from.

Not carried over from RAGEN's own server (ragen/envs/serve.py): a bearer token (OpenEnv has no authentication,
so bind another host than 127.0.0.1 only on a network you trust), step indices that make a retried step
harmless, batch calls and idle timeouts. A custom_envs tag is not resolved: give its env type and env_config.
"""

import argparse
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from pydantic import Field

try:
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
except ImportError as error:  # only this module needs it: `pip install -e ".[test]"` brings it
    raise ImportError(f"ragen.envs.openenv needs the openenv-core package: pip install openenv-core==0.3.0 "
                      f"({error})") from error

from ragen.envs import ENV_REGISTRY, build_env_config, make_env
from ragen.envs.serve import listen_and_serve, to_json  # an info in JSON's own types, or a clear error
from ragen.envs.utils import start_episode

# One session is one WebSocket connection with its own env; a training batch holds a few hundred episodes.
MAX_SESSIONS = 1024


class TextAction(Action):
    action: str = Field(description="the agent's action as text, e.g. 'Up'")


class TextObservation(Observation):
    text: str = Field(description="what the agent sees")
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict, description="the RAGEN env's info dict")
    # set on the reset observation only
    instructions: str | None = None
    example_actions: list[str] | None = None


class RagenEnvironment(Environment):
    """A RAGEN env (`ragen.envs.make_env(env_type, env_config)`) behind OpenEnv's `Environment` interface."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session makes its own env; they share nothing

    def __init__(self, env_type: str, env_config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.env_type = env_type
        self.env = make_env(env_type, env_config)
        self._state = State()
        self._started = False

    def reset(self, seed: int | None = None, episode_id: str | None = None, stream: list[int] | None = None,
              **kwargs: Any) -> TextObservation:
        if kwargs:
            raise ValueError(f"unknown reset arguments {sorted(kwargs)}; reset takes seed, episode_id and stream")
        if seed is None:  # start_episode's seed is the group's start state and always given; OpenEnv's is optional
            if stream is not None:
                raise ValueError("reset: a stream needs a seed")
            text, info = self.env.reset()
        else:
            text, info = start_episode(self.env, seed, stream)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self._started = True
        return TextObservation(text=text, info=to_json(info, "info"), instructions=self.env.instructions,
                               example_actions=list(self.env.example_actions))

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        if not self._started:
            raise RuntimeError(f"step before reset: reset the {self.env_type} env first (OpenEnv's HTTP /step makes "
                               "a new env for every request; play an episode over its WebSocket client)")
        text, reward, terminated, truncated, info = self.env.step(action.action)
        self._state.step_count += 1
        return TextObservation(text=text, reward=float(reward), done=bool(terminated or truncated),
                               terminated=bool(terminated), truncated=bool(truncated), info=to_json(info, "info"))

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=f"ragen/{self.env_type}", description=self.env.instructions)

    def close(self) -> None:
        self.env.close()


def make_app(env_type: str, env_config: Mapping[str, Any] | None = None, max_sessions: int = MAX_SESSIONS) -> FastAPI:
    """OpenEnv's FastAPI app serving `env_type` with `env_config`, checked here so a bad one fails at start."""
    build_env_config(env_type, env_config)  # raises ValueError naming the env type and key
    env_config = dict(env_config or {})

    # A function rather than a functools.partial: OpenEnv's web UI (ENABLE_WEB_INTERFACE=true) calls only a
    # class or a function to make its env.
    def new_environment() -> RagenEnvironment:
        return RagenEnvironment(env_type, env_config)

    return create_app(new_environment, TextAction, TextObservation, env_name=env_type,
                      max_concurrent_envs=max_sessions)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ragen.envs.openenv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_type", choices=sorted(ENV_REGISTRY))
    parser.add_argument("--env-config", default="{}", help="the env's config as a JSON object (default: {})")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only; "
                                                            "OpenEnv has no authentication)")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (default 8000)")
    parser.add_argument("--max-sessions", type=int, default=MAX_SESSIONS,
                        help=f"WebSocket sessions open at once (default {MAX_SESSIONS})")
    args = parser.parse_args(argv)
    try:
        env_config = json.loads(args.env_config)
        if not isinstance(env_config, dict):
            raise ValueError(f"a JSON object is needed, got {args.env_config!r}")
        app = make_app(args.env_type, env_config, args.max_sessions)
    except ValueError as error:  # json.JSONDecodeError is one too
        raise SystemExit(f"ragen.envs.openenv: bad --env-config: {error}") from None

    listen_and_serve(app, args.host, args.port, "ragen.envs.openenv", log_level="warning")


if __name__ == "__main__":
    main()
