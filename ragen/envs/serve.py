"""Serve RAGEN's environments over HTTP, one session per episode (the protocol: `ragen/envs/protocol.py`).

    python -m ragen.envs.serve sokoban frozen_lake --port 8000
    python -m ragen.envs.serve SimpleSokoban --port 0     # a custom_envs tag serves its env type

Each `<env>` is an env type of `ragen.envs.ENV_REGISTRY` or a `custom_envs` tag of config/base.yaml (which
names its env type; the client sends the tag's env_config with each new session). Only those env types can
be created. Once listening it prints `[ragen.envs.serve] listening on http://HOST:PORT`, so a parent
process started with `--port 0` learns the port.

The server is a thin shell: `Sessions` holds the live episodes and answers in protocol models or raises
`ApiError`, which `make_app` maps to a status and `{"detail": message}` in one place. Environments never
know they are served. Safety: it binds 127.0.0.1 unless told otherwise, another host needs a token
(`--token` or $RAGEN_ENV_SERVER_TOKEN) that every request must then carry, bodies are capped, and only
JSON is parsed, never evaluated.

Imports stay light (fastapi, uvicorn, numpy, gymnasium, ragen.envs) so the server runs in a small
virtualenv beside an environment's own dependencies; Hydra is imported only to resolve a custom_envs tag.
"""

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import hmac
import ipaddress
import logging
import math
import os
import secrets
import signal
import socket
import threading
import time
import typing
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium
import numpy as np
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers

from ragen.envs import ENV_REGISTRY, make_env
from ragen.envs.protocol import (
    PARENT_PID_VAR,
    TOKEN_ENV_VAR,
    BatchItem,
    BatchReply,
    BatchReset,
    BatchStep,
    CreateSession,
    EnvsReply,
    EnvType,
    Health,
    SessionCreated,
    StepReply,
    StepRequest,
)
from ragen.envs.utils import start_episode

logger = logging.getLogger("ragen.envs.serve")

# A training batch holds at most a few hundred episodes; the cap bounds the memory a stuck client can pin.
MAX_SESSIONS = 1024
# A batch step of every session with a long answer as its action stays well below this.
MAX_BODY_BYTES = 4 * 2**20
# Between two turns of an episode the trainer generates a whole batch of answers (minutes on a small GPU),
# and a validation pass or a checkpoint save can come in between: idle means abandoned only after long.
IDLE_TIMEOUT_S = 1800.0
EPISODE_TIMEOUT_S = 6 * 3600.0
GRACEFUL_SHUTDOWN_S = 5.0  # on SIGTERM/SIGINT, how long requests in flight (and a session's step) may finish
REMEMBERED_ENDS = 10_000  # closed sessions whose 404 can still say why they ended


class ApiError(Exception):
    """A request that cannot be served: its HTTP status and a one-line message. `env_error` marks a failure
    of the environment's own code (status 500), as opposed to the client's mistake (4xx) or a full server."""

    def __init__(self, status: int, detail: str, env_error: bool = False) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.env_error = env_error

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail, "env_error": True} if self.env_error else {"detail": self.detail}


class EnvOutputError(Exception):
    """The env returned what JSON cannot carry (a NaN reward, an object in `info`)."""


def to_json(value: Any, where: str) -> Any:
    """`value` in JSON's own types: numpy scalars and arrays become numbers and lists, tuples and sets lists,
    dict keys strings. A non-finite float or an arbitrary object is refused (`EnvOutputError`) rather than
    sent as something the client cannot parse or would read differently."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EnvOutputError(f"returned a non-finite {where} = {value}, which JSON cannot carry")
        return value
    if isinstance(value, dict):
        return {str(key): to_json(item, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise EnvOutputError(f"returned {where} = {type(value).__name__} {value!r:.80}, which JSON cannot carry")


def text_observation(observation: Any) -> str:
    if not isinstance(observation, str):
        raise EnvOutputError(f"returned a {type(observation).__name__} observation; a text env's is a str")
    return observation


def step_reply(observation: Any, reward: Any, terminated: Any, truncated: Any, info: dict) -> StepReply:
    """An env's step 5-tuple as the protocol's reply."""
    reward = float(reward)  # a numpy float too
    if not math.isfinite(reward):
        raise EnvOutputError(f"returned a non-finite reward {reward}, which JSON cannot carry")
    return StepReply(observation=text_observation(observation), reward=reward, terminated=bool(terminated),
                     truncated=bool(truncated), info=to_json(info, "info"))


@contextlib.contextmanager
def env_code(call: str, cleanup: Callable[[], None]) -> Iterator[None]:
    """Around the environment's own code: whatever it raises becomes a 500 marked `env_error` (its traceback
    goes to the server's log, not the client), after `cleanup` has dropped the env, which may be half-updated."""
    try:
        yield
    except Exception as error:
        logger.exception("%s failed", call)
        cleanup()
        what = str(error) if isinstance(error, EnvOutputError) else f"raised {type(error).__name__}: {error}"
        raise ApiError(500, f"{call} {what}", env_error=True) from None


def close_env(env: gymnasium.Env) -> None:
    try:
        env.close()
    except Exception:  # the session is gone either way; its env's cleanup failing is the env's to fix
        logger.exception("env.close failed")


@dataclasses.dataclass(eq=False)
class Session:
    id: str
    env: gymnasium.Env
    created: float  # time.monotonic()
    last_used: float
    taken: int = 0  # actions stepped so far: the step_index the next step must carry
    last_reply: StepReply | None = None  # answered again to a retry of the last step
    closed: bool = False
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # one request at a time steps it


class Sessions:
    """The live episodes. Thread-safe: route functions run in Starlette's thread pool and a batch fans out
    over another, so `lock` guards the table and each session's own lock its env. A session ends by
    `drop` alone, which records why, so that a later request for it gets a 404 that says so."""

    def __init__(self, env_types: Sequence[str], max_sessions: int, idle_timeout_s: float,
                 episode_timeout_s: float) -> None:
        self.env_types = list(env_types)
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.episode_timeout_s = episode_timeout_s
        self.lock = threading.Lock()
        self.live: dict[str, Session] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()  # session id -> why it ended, the latest few
        self.slots = threading.BoundedSemaphore(max_sessions)  # taken from creation until the drop

    def create(self, request: CreateSession) -> SessionCreated:
        if request.env not in self.env_types:
            raise ApiError(400, f"env {request.env!r} is not served here; this server serves {self.env_types}")
        if not self.slots.acquire(blocking=False):
            raise ApiError(503, f"the server is full: {self.max_sessions} sessions are open (--max-sessions); "
                                "delete finished sessions or retry later")
        try:
            session, created = self.start(request)
        except BaseException:
            self.slots.release()
            raise
        with self.lock:
            self.live[session.id] = session
        return created

    def start(self, request: CreateSession) -> tuple[Session, SessionCreated]:
        try:
            env = make_env(request.env, request.env_config)
        except ValueError as error:  # an unknown config key, a wrong type or value: make_env's message names it
            raise ApiError(400, str(error)) from None
        now = time.monotonic()
        session = Session(id=secrets.token_hex(16), env=env, created=now, last_used=now)
        with env_code("env.reset", cleanup=lambda: close_env(env)):
            observation, info = start_episode(env, request.seed, request.stream)
            created = SessionCreated(session_id=session.id, observation=text_observation(observation),
                                     info=to_json(info, "info"), instructions=env.instructions,
                                     example_actions=list(env.example_actions),
                                     action_choices=getattr(env, "action_choices", ""))
        return session, created

    def step(self, session_id: str, request: StepRequest) -> StepReply:
        session = self.get(session_id)
        with session.lock:
            if session.closed:  # dropped while this request waited for the lock
                raise self.unknown(session_id)
            session.last_used = time.monotonic()
            if request.step_index == session.taken - 1:  # a retry whose reply was lost: answer it again
                return session.last_reply
            if request.step_index != session.taken:
                raise ApiError(409, f"step_index out of order: expected {session.taken} (the actions this session "
                                    f"has taken), got {request.step_index}")
            with env_code("env.step", cleanup=lambda: self.drop(session, "closed after its env failed")):
                reply = step_reply(*session.env.step(request.action))
            session.taken += 1
            session.last_reply = reply
            session.last_used = time.monotonic()
            return reply

    def delete(self, session_id: str) -> None:
        session = self.get(session_id)
        with session.lock:  # waits for a step in flight
            self.drop(session, "deleted by its client")

    def get(self, session_id: str) -> Session:
        with self.lock:
            if session_id in self.live:
                return self.live[session_id]
        raise self.unknown(session_id)

    def unknown(self, session_id: str) -> ApiError:
        with self.lock:
            why = self.ended.get(session_id)
        return ApiError(404, f"session {session_id!r} was {why}" if why else f"unknown session {session_id!r}")

    def drop(self, session: Session, why: str) -> None:
        """End a session (the caller holds its lock): out of the table, its slot freed, its env closed."""
        with self.lock:
            if self.live.pop(session.id, None) is None:
                return  # already ended by another path
            self.ended[session.id] = why
            if len(self.ended) > REMEMBERED_ENDS:
                self.ended.popitem(last=False)
        self.slots.release()
        session.closed = True
        close_env(session.env)

    def reap(self) -> None:
        """Drop the sessions idle longer than idle_timeout_s or older than episode_timeout_s: their clients
        are gone (a crashed trainer never deletes them), and each holds a slot and an env."""
        now = time.monotonic()
        with self.lock:
            sessions = list(self.live.values())
        for session in sessions:
            if now - session.created > self.episode_timeout_s:
                why = f"reaped for age: older than {self.episode_timeout_s:g} s (--episode-timeout-s)"
            elif now - session.last_used > self.idle_timeout_s:
                why = f"reaped for idleness: idle over {self.idle_timeout_s:g} s (--idle-timeout-s)"
            else:
                continue
            if session.lock.acquire(blocking=False):  # one being stepped is not idle; an old one waits a round
                try:
                    self.drop(session, why)
                finally:
                    session.lock.release()

    def close_all(self) -> int:
        with self.lock:
            sessions = list(self.live.values())
        for session in sessions:
            # one stuck in a hung step is left to the process's exit: waiting for it would hang the shutdown
            if session.lock.acquire(timeout=GRACEFUL_SHUTDOWN_S):
                try:
                    self.drop(session, "closed at server shutdown")
                finally:
                    session.lock.release()
        return len(sessions)


def env_types_reply(env_types: Sequence[str]) -> EnvsReply:
    envs = []
    for env_type in env_types:
        config_cls = ENV_REGISTRY[env_type][1]
        hints = typing.get_type_hints(config_cls)
        fields = {name: hint.__name__ if isinstance(hint, type) else str(hint) for name, hint in hints.items()}
        # a dataclass field's default is its class attribute; an env without a step limit has none
        envs.append(EnvType(env=env_type, config_fields=fields, max_steps=getattr(config_cls, "max_steps", None)))
    return EnvsReply(envs=envs)


def validation_message(errors: Sequence[dict]) -> str:
    """Pydantic's errors as one readable line: `items.0.seed: Input should be ... ; foo: Extra inputs ...`."""
    parts = []
    for error in errors:
        where = ".".join(str(part) for part in error["loc"][1:])  # loc[0] is "body"
        if error["type"] == "json_invalid":
            parts.append(f"malformed JSON at character {where}: {error['ctx']['error']}")
        else:
            parts.append(f"{where or 'body (a JSON object, Content-Type: application/json)'}: {error['msg']}")
    return "invalid request body: " + "; ".join(parts)


class Guard:
    """ASGI middleware that refuses a request before the app reads it: without the bearer token (when one
    is set) 401; with a body over `max_body_bytes` 413. The body is counted as it arrives, not only by its
    Content-Length, so a chunked upload cannot get past the cap; it is then handed to the app whole."""

    def __init__(self, app: Any, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token is not None else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":  # lifespan
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        if self.expected is not None:
            given = headers.get("authorization", "").encode("latin-1")
            if not hmac.compare_digest(given, self.expected):
                refusal = JSONResponse({"detail": "missing or wrong token: send 'Authorization: Bearer <token>'"},
                                       401, headers={"WWW-Authenticate": "Bearer"})
                return await refusal(scope, receive, send)
        too_large = JSONResponse({"detail": f"request body over {self.max_body_bytes} bytes (--max-body-bytes)"}, 413)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return await too_large(scope, receive, send)
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                return await too_large(scope, receive, send)
            if not message.get("more_body", False):
                break

        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:  # after the body, the app only listens for a disconnect
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


def make_app(env_types: Sequence[str], *, token: str | None = None, max_sessions: int = MAX_SESSIONS,
             max_body_bytes: int = MAX_BODY_BYTES, idle_timeout_s: float = IDLE_TIMEOUT_S,
             episode_timeout_s: float = EPISODE_TIMEOUT_S) -> FastAPI:
    """The server as an ASGI app serving `env_types` (keys of ENV_REGISTRY); `token` None means no token.
    Idle sessions are reaped, and the open ones closed at the end, by its lifespan: a TestClient must be
    entered (`with TestClient(app) as client`) for either to happen."""
    unknown = [env_type for env_type in env_types if env_type not in ENV_REGISTRY]
    if unknown:
        raise ValueError(f"unknown env types {unknown}; registered types are {sorted(ENV_REGISTRY)}")
    sessions = Sessions(env_types, max_sessions, idle_timeout_s, episode_timeout_s)
    batch_pool = ThreadPoolExecutor(thread_name_prefix="ragen-batch")
    reap_every_s = min(idle_timeout_s, episode_timeout_s, 40.0) / 4

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def reap_forever() -> None:
            while True:
                await asyncio.sleep(reap_every_s)
                await asyncio.to_thread(sessions.reap)

        reaper = asyncio.create_task(reap_forever())
        try:
            yield
        finally:
            reaper.cancel()
            closed = sessions.close_all()
            batch_pool.shutdown()
            logger.info("stopped; sessions closed at shutdown: %d", closed)

    app = FastAPI(title="RAGEN environment server", lifespan=lifespan)
    app.add_middleware(Guard, token=token, max_body_bytes=max_body_bytes)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_message(error.errors())}, 422)

    def run_batch(call: Callable[[Any], Any], items: Sequence[Any]) -> BatchReply:
        """Each item on the pool, concurrently; a failed item is its own error, never the batch's."""
        def outcome(item: Any) -> BatchItem:
            try:
                return BatchItem(result=call(item).model_dump())
            except ApiError as error:
                return BatchItem(error=error.detail, status=error.status)

        return BatchReply(items=list(batch_pool.map(outcome, items)))

    @app.get("/health")
    def health() -> Health:
        return Health(sessions=len(sessions.live), max_sessions=max_sessions)

    @app.get("/v1/envs")
    def envs() -> EnvsReply:
        return env_types_reply(env_types)

    @app.post("/v1/sessions")
    def create_session(request: CreateSession) -> SessionCreated:
        return sessions.create(request)

    @app.post("/v1/sessions/{session_id}/step")
    def step(session_id: str, request: StepRequest) -> StepReply:
        return sessions.step(session_id, request)

    @app.delete("/v1/sessions/{session_id}", status_code=204)
    def delete_session(session_id: str) -> Response:
        sessions.delete(session_id)
        return Response(status_code=204)

    @app.post("/v1/batch/reset")
    def batch_reset(request: BatchReset) -> BatchReply:
        return run_batch(sessions.create, request.items)

    @app.post("/v1/batch/step")
    def batch_step(request: BatchStep) -> BatchReply:
        return run_batch(lambda item: sessions.step(item.session_id, item), request.items)

    return app


def resolve_env_types(names: Sequence[str]) -> list[str]:
    """Env types for env types and custom_envs tags, in order, once each."""
    if all(name in ENV_REGISTRY for name in names):
        return list(dict.fromkeys(names))
    from ragen.overrides import load_config  # Hydra: heavy, and only a tag needs it

    custom_envs = load_config("base").custom_envs
    env_types = []
    for name in names:
        if name in ENV_REGISTRY:
            env_types.append(name)
        elif name in custom_envs:
            env_types.append(custom_envs[name].env_type)
        else:
            raise SystemExit(f"ragen.envs.serve: unknown env {name!r}: env types are {sorted(ENV_REGISTRY)}, "
                             f"custom_envs tags are {sorted(custom_envs)}")
    return list(dict.fromkeys(env_types))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ragen.envs.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("envs", nargs="+", help="env types (e.g. sokoban) or custom_envs tags (e.g. SimpleSokoban)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine "
                                                            "only); any other needs a token")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (default 8000)")
    parser.add_argument("--token", help=f"bearer token every request must carry (default: ${TOKEN_ENV_VAR})")
    parser.add_argument("--max-sessions", type=int, default=MAX_SESSIONS, help="open sessions at most; beyond, "
                        f"503 (default {MAX_SESSIONS})")
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES,
                        help=f"larger request bodies get 413 (default {MAX_BODY_BYTES})")
    parser.add_argument("--idle-timeout-s", type=float, default=IDLE_TIMEOUT_S,
                        help=f"a session unused this long is closed (default {IDLE_TIMEOUT_S:g})")
    parser.add_argument("--episode-timeout-s", type=float, default=EPISODE_TIMEOUT_S,
                        help=f"a session older than this is closed (default {EPISODE_TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[ragen.envs.serve] %(levelname)s %(message)s")
    die_with_parent()

    token = args.token or os.environ.get(TOKEN_ENV_VAR) or None
    if token is None and not is_loopback(args.host):
        raise SystemExit(f"ragen.envs.serve: --host {args.host} would let other machines in: set a token with "
                         f"--token or ${TOKEN_ENV_VAR}, or bind 127.0.0.1")
    env_types = resolve_env_types(args.envs)
    app = make_app(env_types, token=token, max_sessions=args.max_sessions, max_body_bytes=args.max_body_bytes,
                   idle_timeout_s=args.idle_timeout_s, episode_timeout_s=args.episode_timeout_s)

    listen_and_serve(app, args.host, args.port, "ragen.envs.serve", log_level="info")


def die_with_parent() -> None:
    """A server spawned by a trainer (which sets PARENT_PID_VAR) asks the kernel for SIGKILL when that
    trainer dies, however it dies (Linux PR_SET_PDEATHSIG), and exits at once if it has died already. SIGKILL,
    not SIGTERM: a server stuck in a hung env step would not finish a graceful shutdown."""
    parent = os.environ.get(PARENT_PID_VAR)
    if parent is None:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the trainer's own cleanup (atexit, its finally) stops it
        pass
    if os.getppid() != int(parent):  # it died before the request took effect
        raise SystemExit(f"ragen.envs.serve: the process that started it ({parent}) is gone")


def listen_and_serve(app, host: str, port: int, name: str, log_level: str) -> None:
    """Bind `host:port` (0: a free port), print `[<name>] listening on http://HOST:PORT` (a parent that spawned
    the server reads its port there), and serve `app` with uvicorn until SIGINT/SIGTERM."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        # Bound here rather than by uvicorn so that the port (--port 0) is known and printed once listening;
        # connections made before the app has started wait in the socket's backlog.
        listener = socket.create_server((host, port), family=family)
    except OSError as error:
        raise SystemExit(f"{name}: cannot listen on {host}:{port}: {error}") from None
    # Replies go out at once: with Nagle's algorithm a reply written in two pieces waits for the client's
    # delayed ACK, 40 ms a request on Linux (measured: 45 ms a step, 1.5 ms with this); accepted sockets inherit it.
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    bound_host, bound_port = listener.getsockname()[:2]
    url_host = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
    print(f"[{name}] listening on http://{url_host}:{bound_port}", flush=True)
    # uvicorn closes the sessions through the app's lifespan on SIGINT/SIGTERM; the access log is off because a
    # training run makes thousands of steps.
    server = uvicorn.Server(uvicorn.Config(app, access_log=False, log_level=log_level,
                                           timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:  # uvicorn raises the Ctrl-C again once it has shut down cleanly
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
