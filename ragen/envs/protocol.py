"""The HTTP protocol between an environment server (`python -m ragen.envs.serve`) and its client
(`ragen.envs.remote.RemoteEnv`): paths and request/reply bodies, as pydantic models both sides validate.

The trainer owns the turns and the tokens; a server owns only environments, one session per episode:

    GET    /health                        -> Health
    GET    /v1/envs                       -> EnvsReply: what it serves, each env type's config fields
    POST   /v1/sessions                   CreateSession -> SessionCreated (made and reset in one round trip)
    POST   /v1/sessions/{id}/step         StepRequest -> StepReply
    DELETE /v1/sessions/{id}              -> 204
    POST   /v1/batch/reset                BatchReset -> BatchReply (one item per request item, in order)
    POST   /v1/batch/step                 BatchStep -> BatchReply

A step carries its `step_index` (0 for the episode's first action): a retried step whose index the session
has already taken gets the stored reply, so a lost reply never steps an environment twice. Errors are
`{"detail": message}` with a 4xx status (400 bad value, 401 token, 404 unknown session, 409 step out of
order, 413 body too large, 422 malformed body) or 503 (the server is full); a batch answers 200 with an
`error` per failed item. Only JSON is accepted; nothing received is evaluated.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

API_VERSION = "v1"
TOKEN_HEADER = "Authorization"  # "Bearer <token>"
TOKEN_ENV_VAR = "RAGEN_ENV_SERVER_TOKEN"
PARENT_PID_VAR = "RAGEN_ENV_SERVER_PARENT"  # set by a trainer that spawns the server: it dies with that process


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not ignored


class CreateSession(Message):
    env: str = Field(description="an env type of ragen.envs.ENV_REGISTRY")
    env_config: dict[str, Any] = Field(default_factory=dict, description="fields of the env's config dataclass")
    seed: int = Field(ge=0, description="env.reset(seed=...): the start state")
    # entropy of the episode's random stream after the reset (the env-state manager's [seed, EPISODE_STREAM, place]);
    # None keeps the stream reset(seed) made
    stream: list[int] | None = None


class SessionCreated(Message):
    session_id: str
    observation: str
    info: dict[str, Any]
    # what the context manager needs of an env: its instructions, example actions and the moves its state
    # messages list (`action_choices`, "" when it lists none)
    instructions: str
    example_actions: list[str]
    action_choices: str = ""


class StepRequest(Message):
    action: str
    step_index: int = Field(ge=0, description="the episode's action count before this one")


class StepReply(Message):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class BatchReset(Message):
    items: list[CreateSession]


class BatchStepItem(StepRequest):
    session_id: str


class BatchStep(Message):
    items: list[BatchStepItem]


class BatchItem(Message):
    """One item's outcome: `result` (a SessionCreated or StepReply as a dict), or `error` with its status."""

    result: dict[str, Any] | None = None
    error: str | None = None
    status: int = 200


class BatchReply(Message):
    items: list[BatchItem]


class EnvType(Message):
    env: str
    config_fields: dict[str, str]  # name -> type
    max_steps: int | None = None


class EnvsReply(Message):
    api_version: str = API_VERSION
    envs: list[EnvType]


class Health(Message):
    status: str = "ok"
    api_version: str = API_VERSION
    sessions: int
    max_sessions: int
