"""Environments on an environment server (`python -m ragen.envs.serve`), behind the in-process interface.

`RemoteEnv` is a gymnasium.Env whose reset and step are HTTP calls (ragen/envs/protocol.py): the env-state
manager, the context manager and the agent proxy use it as any other env. A tag runs remotely when its
`custom_envs.<tag>.server` says so (ragen/config.py, EnvServerConfig):

    custom_envs.SimpleSokoban.server.url=http://127.0.0.1:8000       # a server someone started
    custom_envs.SimpleSokoban.server.spawn=true                       # servers started for this run
    custom_envs.SimpleSokoban.server.python=/opt/envs/sokoban/bin/python custom_envs.SimpleSokoban.server.workers=4

Spawned servers (`ServerPool`) are started once per process for each distinct server config, checked with
/health and /v1/envs before the first rollout, restarted when one has died, and stopped when the run ends, on
Ctrl-C and on a crash: they are told to die with their parent (Linux PR_SET_PDEATHSIG), so not even a
SIGKILLed trainer leaves one behind.

What can go wrong, and what happens:
- a connection error, 429 or 503 is retried `server.retries` times (0.5 s, then doubling); a step carries its
  index, so a retry whose first try did step the env gets the stored reply, never a second step;
- anything else (a 4xx, the env raising on the server, a server that died and lost the session, garbage in
  a reply) raises `RemoteEnvError`: the env-state manager ends that trajectory as an env failure
  (`env_error`, `rollout/env_failures`, es_manager.max_env_failure_share), and the other trajectories go on;
- a spawned server found dead is restarted before the next request; its sessions are lost with it.
"""

import atexit
import collections
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

import gymnasium
import httpx
from pydantic import BaseModel, ValidationError

from ragen.envs.protocol import (API_VERSION, PARENT_PID_VAR, TOKEN_ENV_VAR, TOKEN_HEADER, CreateSession,
                                 EnvsReply, Health, SessionCreated, StepReply, StepRequest)

RETRY_STATUS = (429, 503)
# connection errors: refused, reset, closed by the server (a kept-alive socket it had dropped), half-sent
RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
                httpx.WriteError)
RETRY_FIRST_WAIT_S = 0.5
DELETE_TIMEOUT_S = 2.0
LISTENING = re.compile(r"\[ragen\.envs\.serve\] listening on (http://\S+)")
START_TIMEOUT_S = 60.0


class RemoteEnvError(RuntimeError):
    """An env server could not do what was asked; the trajectory that asked ends as an env failure."""


class ServerClient:
    """One server's HTTP client: JSON in and out, the token, retries of what may succeed on a second try."""

    def __init__(self, url: str, *, timeout_s: float, retries: int):
        self.url, self.retries = url.rstrip("/"), retries
        # from the environment only: a token in the config would be saved with every checkpoint and logged
        token = os.environ.get(TOKEN_ENV_VAR)
        headers = {TOKEN_HEADER: f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)

    def call(self, method: str, path: str, body: BaseModel | None = None, reply: type[BaseModel] | None = None):
        payload = None if body is None else body.model_dump()
        wait = RETRY_FIRST_WAIT_S
        for attempt in range(self.retries + 1):
            try:
                response = self.http.request(method, path, json=payload)
            except RETRY_ERRORS as e:  # refused or dropped: the server was not there, or went away
                problem = f"{type(e).__name__}: {e}"
            except httpx.TransportError as e:  # a timeout: a hung env is not retried (it would hang again)
                raise RemoteEnvError(f"{method} {self.url}{path}: {type(e).__name__} (server.timeout_s="
                                     f"{self.http.timeout.read:g}): {e}") from None
            else:
                if response.status_code not in RETRY_STATUS:
                    return self._read(response, method, path, reply)
                problem = f"HTTP {response.status_code}: {_detail(response)}"
            if attempt < self.retries:
                time.sleep(wait)
                wait *= 2
        raise RemoteEnvError(f"{method} {self.url}{path} failed {self.retries + 1} time(s), the last: {problem}")

    def _read(self, response: httpx.Response, method: str, path: str, reply: type[BaseModel] | None):
        if response.status_code >= 400:
            raise RemoteEnvError(f"{method} {self.url}{path}: HTTP {response.status_code}: {_detail(response)}")
        if reply is None:
            return None
        try:
            return reply.model_validate_json(response.content)
        except ValidationError as e:
            raise RemoteEnvError(f"{method} {self.url}{path} answered what is not a {reply.__name__}: "
                                 f"{_first_error(e)}") from None

    def delete(self, path: str) -> None:
        """Best effort, briefly: ending a session the server may have lost, or reaps anyway."""
        try:
            self.http.delete(path, timeout=DELETE_TIMEOUT_S)
        except Exception:  # refused, timed out, or this client closed by a restart: nothing to undo
            pass

    def close(self) -> None:
        self.http.close()


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json()["detail"])[:500]
    except (ValueError, KeyError, TypeError):
        return response.text[:200] or "(empty body)"


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    return f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}"


class Connection:
    """A running server someone else started: its client, and nothing to restart."""

    def __init__(self, client: ServerClient):
        self._client = client

    def client(self) -> ServerClient:
        return self._client

    def revive(self) -> None:
        pass


class RemoteEnv(gymnasium.Env):
    """An env of type `env_type` with `env_config`, on a server. One session per episode: reset opens one
    (and closes the last), step advances it, close ends it."""

    starts_remotely = True  # ragen.envs.utils.start_episode hands it the seed and the random stream

    def __init__(self, connection: "Connection | PoolSlot", env_type: str, env_config: dict[str, Any]):
        self.connection, self.env_type, self.env_config = connection, env_type, dict(env_config)
        self.session_id: str | None = None
        self.step_index = 0
        self.instructions, self.example_actions, self.action_choices = describe(connection.client(), env_type,
                                                                                self.env_config)
        _LIVE.add(self)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        if seed is None:
            raise ValueError("a remote env starts from a seed: reset(seed=...)")
        self.close()
        self.connection.revive()  # a spawned server found dead is restarted; the episode goes to the new one
        request = CreateSession(env=self.env_type, env_config=self.env_config, seed=seed,
                                stream=(options or {}).get("stream"))
        created = self._call("POST", f"/{API_VERSION}/sessions", request, SessionCreated)
        self.session_id, self.step_index = created.session_id, 0
        return created.observation, created.info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.session_id is None:
            raise RemoteEnvError("step before reset: the env has no session")
        reply = self._call("POST", f"/{API_VERSION}/sessions/{self.session_id}/step",
                           StepRequest(action=action, step_index=self.step_index), StepReply)
        self.step_index += 1
        return reply.observation, reply.reward, reply.terminated, reply.truncated, reply.info

    def close(self) -> None:
        """End the session, if any (best effort: a server that died has lost it, and reaps idle ones anyway)."""
        session, self.session_id = self.session_id, None
        if session is not None:
            self.connection.client().delete(f"/{API_VERSION}/sessions/{session}")

    def _call(self, method: str, path: str, body: BaseModel, reply: type[BaseModel]):
        # The connection's client now, not one kept: a restarted server has a new client (the old one is closed).
        # A session creation retried after a lost reply may leave an orphan session: the server reaps it.
        try:
            return self.connection.client().call(method, path, body, reply)
        except RemoteEnvError:
            self.connection.revive()  # so that a dead spawned server is back for the next episode
            raise


_LIVE: "weakref.WeakSet[RemoteEnv]" = weakref.WeakSet()  # closed (their sessions ended) by stop_servers
_DESCRIPTIONS: dict[tuple[str, str, str], tuple[str, tuple[str, ...], str]] = {}
_DESCRIPTIONS_LOCK = threading.Lock()


def describe(client: ServerClient, env_type: str, env_config: dict) -> tuple[str, tuple[str, ...], str]:
    """(instructions, example actions, action choices) of an env type and config on a server: what the context
    manager needs before any episode. Asked once per server, type and config (one session, opened and closed)."""
    key = (client.url, env_type, json.dumps(env_config, sort_keys=True))
    with _DESCRIPTIONS_LOCK:
        if key not in _DESCRIPTIONS:
            created = client.call("POST", f"/{API_VERSION}/sessions",
                                  CreateSession(env=env_type, env_config=env_config, seed=0), SessionCreated)
            client.delete(f"/{API_VERSION}/sessions/{created.session_id}")
            _DESCRIPTIONS[key] = created.instructions, tuple(created.example_actions), created.action_choices
        return _DESCRIPTIONS[key]


def check_server(client: ServerClient, env_type: str) -> None:
    """Before the first rollout: the server answers /health and serves `env_type`, else one clear error."""
    try:
        client.call("GET", "/health", reply=Health)
        served = [env.env for env in client.call("GET", f"/{API_VERSION}/envs", reply=EnvsReply).envs]
    except RemoteEnvError as e:
        raise RemoteEnvError(f"the env server at {client.url} is not usable: {e}") from None
    if env_type not in served:
        raise RemoteEnvError(f"the env server at {client.url} does not serve env_type {env_type!r} (it serves "
                             f"{served}): start it with `python -m ragen.envs.serve {env_type}`")


class SpawnedServer:
    """One `python -m ragen.envs.serve` child on a free local port. It is told this process's pid
    (PARENT_PID_VAR) and has the kernel SIGKILL it when this process dies (ragen.envs.serve.die_with_parent),
    so not even a SIGKILLed trainer, nor a server stuck in a hung step, leaves one behind."""

    def __init__(self, python: str, env_type: str):
        self.python, self.env_type = python, env_type
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.output: collections.deque[str] = collections.deque(maxlen=40)  # its last lines, shown if it dies
        self.start()

    def start(self) -> None:
        command = [self.python, "-m", "ragen.envs.serve", self.env_type, "--host", "127.0.0.1", "--port", "0"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=_child_env())
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.process, lines), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:  # exited before listening
                break
            if match := LISTENING.search(line):
                self.url = match.group(1)
                return
        self.stop()
        raise RemoteEnvError(f"the env server `{' '.join(command)}` did not start within {START_TIMEOUT_S:.0f} s; "
                             f"its last lines:\n{self.last_lines()}")

    def _read(self, process: subprocess.Popen, lines: queue.Queue) -> None:
        """Read the server's output for as long as it runs (a full pipe would block it): keep the last lines,
        pass every line on until it listens, and show its errors."""
        for line in process.stdout:
            self.output.append(line.rstrip())
            lines.put(line)
            if " ERROR " in line or line.startswith("Traceback"):
                print(f"[env server {self.url or self.env_type}] {line.rstrip()}", file=sys.stderr, flush=True)
        lines.put(None)

    def last_lines(self) -> str:
        return "\n".join(self.output) or "(nothing)"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # stuck in a hung step
                self.process.kill()
                self.process.wait()


def _child_env() -> dict[str, str]:
    """The server runs RAGEN's code from this checkout, whatever its interpreter has installed, and knows
    its parent."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env[PARENT_PID_VAR] = str(os.getpid())
    return env


class ServerPool:
    """`workers` spawned servers for one env type and interpreter, shared by every env that names them."""

    def __init__(self, python: str, env_type: str, workers: int, *, timeout_s: float, retries: int):
        self.lock = threading.Lock()
        self.options = {"timeout_s": timeout_s, "retries": retries}
        self.servers: list[SpawnedServer] = []
        self.clients: list[ServerClient] = []
        try:
            for _ in range(workers):
                self.servers.append(SpawnedServer(python, env_type))
                self.clients.append(ServerClient(self.servers[-1].url, **self.options))
                check_server(self.clients[-1], env_type)
        except BaseException:  # none of those started may outlive a pool that failed to start
            self.stop()
            raise
        self.next = 0

    def assign(self) -> int:
        """The server for a new env: round robin."""
        with self.lock:
            index, self.next = self.next, (self.next + 1) % len(self.servers)
            return index

    def revive(self, index: int) -> None:
        """Restart server `index` if it has died (its sessions are lost; the envs that had one fail once)."""
        with self.lock:
            server = self.servers[index]
            if server.alive():
                return
            print(f"[ragen] the env server {server.url} ({server.env_type}) died (exit {server.process.returncode}); "
                  f"its last lines:\n{server.last_lines()}\n[ragen] restarting it", flush=True)
            server.start()
            self.clients[index].close()
            self.clients[index] = ServerClient(server.url, **self.options)

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for server in self.servers:
            server.stop()


class PoolSlot:
    """A place on a pool's servers (round robin): its server's current client, restarted when dead."""

    def __init__(self, pool: ServerPool):
        self.pool, self.index = pool, pool.assign()

    def client(self) -> ServerClient:
        return self.pool.clients[self.index]

    def revive(self) -> None:
        self.pool.revive(self.index)


_POOLS: dict[tuple, ServerPool] = {}
_CLIENTS: dict[tuple, ServerClient] = {}
_CHECKED: set[tuple[str, str]] = set()  # (url, env type) that passed check_server
_POOLS_LOCK = threading.Lock()


def make_remote_env(server, env_type: str, env_config: dict[str, Any]) -> RemoteEnv:
    """A RemoteEnv on the server(s) an EnvServerConfig names: a running one (`url`) or spawned ones."""
    options = {"timeout_s": server.timeout_s, "retries": server.retries}
    with _POOLS_LOCK:
        if not server.spawn:
            key = (server.url, *options.values())
            if key not in _CLIENTS:
                _CLIENTS[key] = ServerClient(server.url, **options)
            if (server.url, env_type) not in _CHECKED:
                check_server(_CLIENTS[key], env_type)
                _CHECKED.add((server.url, env_type))
            return RemoteEnv(Connection(_CLIENTS[key]), env_type, env_config)
        key = (server.python or sys.executable, env_type, server.workers, *options.values())
        if key not in _POOLS:
            _POOLS[key] = ServerPool(key[0], env_type, server.workers, **options)
        slot = PoolSlot(_POOLS[key])
    return RemoteEnv(slot, env_type, env_config)


def stop_servers() -> None:
    """End every open session, stop every spawned server and close every client (the end of a run; also at
    exit)."""
    for env in list(_LIVE):
        env.close()
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.stop()
        for client in _CLIENTS.values():
            client.close()
        _POOLS.clear()
        _CLIENTS.clear()
        _CHECKED.clear()
        _DESCRIPTIONS.clear()


atexit.register(stop_servers)
