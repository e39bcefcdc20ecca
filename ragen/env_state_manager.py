"""EnvStateManager: the batch of environments of one rollout, their seeds, step budgets and records.

A batch is `env_groups` groups of `group_size` environments. All environments of a group are reset with
the same seed, so they start from the same state and their trajectories can be compared (GRPO). After the
reset each environment's random stream is re-seeded with its place in the group, so that what happens next
(a bandit's payout, a slip on the ice) is drawn independently per trajectory: with one shared draw the
whole group sees the same outcome, a group comparison then measures luck rather than the policy (a bandit
group whose risky pulls all pay 0 teaches "safe" to every risky pull at once), and a step's gradient points
the wrong way far more often. The opposite holds when a group's samples mostly agree, as a near-greedy policy's
do: then their outcomes differ by luck alone, and each advantage credits the dice. `shared_randomness: true` gives
a group one stream (common random numbers): equal moves meet equal luck and score alike, and only where samples
differ does the comparison see a difference. Each environment has a step budget (`max_actions_per_traj`) over all
of its turns.

With a curriculum (`es_manager.train.curriculum`, ragen/curriculum.py) each group's start state is generated at
the level the curriculum picks for it (a value of one env-config field, e.g. Sokoban's `search_depth`): an
environment whose level changes gets a fresh instance built with that value, so a group still shares its seed,
its level and so its start state. The level is kept on the state, and `end_rollout` feeds the outcomes back.

An invalid action (an answer the environment does not understand: `info["action_is_valid"]` False) changes
nothing, by the environment contract, and is not charged to the budget; it is recorded, and the agent
proxy adds `es_manager.format_penalty` to the turn (RAGEN's rule), so that nonsense never beats play.

An environment whose `reset()` or `step()` raises, returns a non-finite reward, or runs longer than
`es_manager.env_step_timeout_s` (an env server: longer than its `server.timeout_s`) ends only its own
trajectory: the state keeps the error (`EnvState.error`), counts as unsuccessful, and gets a fresh env instance
for the next rollout; the trainer leaves its whole group out of the update (a group baseline over the survivors
would be biased). One broken seed should not cost a long run, but a broken environment should not train on
quietly either: when more than `es_manager.max_env_failure_share` of a rollout's trajectories have failed, the
rollout stops with `EnvFailureError`.
"""

import concurrent.futures
import math
import threading
from dataclasses import dataclass, field

import gymnasium as gym

from ragen.config import CustomEnvConfig, EnvGroupsConfig, EsManagerConfig
from ragen.curriculum import curriculum_metrics, make_curriculum
from ragen.envs import make_env
from ragen.envs.remote import make_remote_env
from ragen.envs.utils import start_episode

# The entropy word of an episode's own random stream, [seed, EPISODE_STREAM, place in group]. Not [seed, place]:
# numpy pads entropy with zeros, so [seed, 0] is seed alone, the stream env.reset(seed) drew the start state from,
# and the episode would replay it (the bandit's payout drew the number that had ordered its arms).
EPISODE_STREAM = 0x73747265616D  # "stream"


# environments stepped at once (step_all, reset): enough for RAGEN's 8 x 16 batch in two waves; threads mostly
# wait (on a server's reply, a sandbox), so more of them than cores is the point
MAX_STEP_THREADS = 64


@dataclass
class TurnRecord:
    actions: list[str]  # actions given this turn (after the budget cut), invalid ones included
    reward: float  # environment reward of the turn (format penalty not included)
    valid: list[bool]  # per executed action: info["action_is_valid"]
    effective: list[bool]  # per executed action: info["action_is_effective"]


@dataclass
class EnvState:
    env_id: int
    group_id: int
    tag: str  # key of custom_envs
    seed: int
    env: gym.Env
    max_actions: int
    level: int | None = None  # the curriculum's value of its key for this start state; None without a curriculum
    obs: str = ""
    images: tuple = ()  # the pictures of `obs` (info["images"] of an image env), one per <image> placeholder
    actions_taken: int = 0
    done: bool = False
    success: bool = False
    context_truncated: bool = False  # ended because another turn would not fit the model's context
    error: str | None = None  # "<ExceptionType>: <message>" when env.step failed (raised, timed out, bad reward/info)
    turns: list[TurnRecord] = field(default_factory=list)

    @property
    def actions_left(self) -> int:
        """Valid actions the budget still allows."""
        return self.max_actions - self.actions_taken


class EnvFailureError(RuntimeError):
    """More of a rollout's trajectories failed in env.step than `es_manager.max_env_failure_share` allows."""


class EnvStateManager:
    def __init__(self, config: EnvGroupsConfig, custom_envs: dict[str, CustomEnvConfig], seed: int,
                 limits: EsManagerConfig | None = None):
        """`limits`: the run's `es_manager`, whose `env_step_timeout_s` and `max_env_failure_share` apply
        (None: their defaults)."""
        limits = limits or EsManagerConfig()
        if config.seeds is not None and len(config.seeds) != config.env_groups:
            raise ValueError(f"{len(config.seeds)} seeds for {config.env_groups} env groups: give one seed a group")
        self.config, self.seed, self.custom_envs = config, seed, custom_envs
        self.env_step_timeout_s, self.max_env_failure_share = limits.env_step_timeout_s, limits.max_env_failure_share
        self.states: list[EnvState] = []
        self.curriculum = make_curriculum(config.curriculum)  # None without one
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=MAX_STEP_THREADS, thread_name_prefix="env")
        for group_id, tag in enumerate(config.env_configs.group_tags(config.env_groups)):
            for _ in range(config.group_size):
                self.states.append(EnvState(env_id=len(self.states), group_id=group_id, tag=tag, seed=-1,
                                            env=self._make_env(tag, None),
                                            max_actions=custom_envs[tag].max_actions_per_traj))

    def env_per_tag(self) -> dict[str, gym.Env]:
        """One environment of each tag, for what all of a tag share: instructions, example action."""
        return {state.tag: state.env for state in reversed(self.states)}

    def reset(self, step: int) -> list[EnvState]:
        """Fresh start states for training step `step`; seeds never repeat across steps. A list of seeds
        (`config.seeds`, validation) gives the same start states every time."""
        group_seeds = list(self.config.seeds) if self.config.seeds is not None else \
            [self.seed + step * self.config.env_groups + group for group in range(self.config.env_groups)]
        levels = self.curriculum.levels(step, group_seeds) if self.curriculum is not None else None
        for state in self.states:
            state.seed = group_seeds[state.group_id]
            state.actions_taken, state.done, state.success, state.turns = 0, False, False, []
            state.context_truncated, state.error = False, None

        def start(state: EnvState) -> tuple[tuple[str, dict], Exception | None]:
            try:
                level = levels[state.group_id] if levels is not None else None
                if level != state.level:
                    self._swap_env(state, self._make_env(state.tag, level), level)
                place = 0 if self.config.shared_randomness else state.env_id % self.config.group_size
                stream = [state.seed, EPISODE_STREAM, place]
                return start_episode(state.env, state.seed, stream), None
            except Exception as e:  # an env (or its server) that fails to start ends only its own trajectory
                return ("", {}), e

        outcomes = list(self.executor.map(start, self.states))  # concurrently, as step_all
        for state, ((obs, info), error) in zip(self.states, outcomes, strict=True):
            state.obs, state.images = obs, tuple(info.get("images", ()))
            if error is not None:
                self._fail(state, None, error)
        return self.states

    def end_rollout(self) -> dict[str, float]:
        """Feed the rollout's outcomes (each trajectory's level and success) to the curriculum and return its
        metrics (`curriculum/level_mean`, `curriculum/success@<value>`); nothing without a curriculum."""
        if self.curriculum is None:
            return {}
        levels, successes = [s.level for s in self.states], [s.success for s in self.states]
        self.curriculum.observe(levels, successes)
        return curriculum_metrics(levels, successes)

    def _make_env(self, tag: str, level: int | None) -> gym.Env:
        """An env of `tag`, with the curriculum's key set to `level` (None: the tag's own env_config)."""
        spec = self.custom_envs[tag]
        env_config = dict(spec.env_config)
        if level is not None:
            env_config[self.config.curriculum.key] = level
        if spec.served:
            return make_remote_env(spec.server, spec.env_type, env_config)
        return make_env(spec.env_type, env_config)

    def step(self, env_id: int, actions: list[str]) -> TurnRecord:
        """One env's turn: `step_all` for one."""
        return self.step_all([(env_id, actions)])[0]

    def step_all(self, turns: list[tuple[int, list[str]]]) -> list[TurnRecord]:
        """Each env's turn, `(env_id, actions)`, run at once: the environments step concurrently, one thread
        each, so that slow steps (an env server's round trips, a sandbox) overlap instead of adding up. Each
        env plays only its own actions with its own random stream, and failures are dealt with afterwards in
        env order, so the outcome is exactly that of stepping them one after another."""
        outcomes = list(self.executor.map(lambda turn: self._play(*turn), turns))
        for (env_id, _), (_, failure) in zip(turns, outcomes, strict=True):  # never a silently shorter batch
            if failure is not None:
                self._fail(self.states[env_id], *failure)
        return [record for record, _ in outcomes]

    def _play(self, env_id: int, actions: list[str]) -> tuple[TurnRecord, tuple[str, Exception] | None]:
        """Run one turn's actions in order until the episode ends, the step budget is spent or the env fails;
        returns the turn and the failure (the action and its exception), if any."""
        state = self.states[env_id]
        assert not state.done, f"env {env_id} is already done"
        record, failure = TurnRecord(actions=[], reward=0.0, valid=[], effective=[]), None
        for action in actions:
            if state.actions_left <= 0:
                break
            try:
                state.obs, reward, terminated, truncated, info = call_with_timeout(
                    state.env.step, action, self.env_step_timeout_s)
                state.images = tuple(info.get("images", ()))
                reward = float(reward)
                if not math.isfinite(reward):  # it would turn its whole group's advantages into NaN
                    raise ValueError(f"env.step returned a non-finite reward ({reward})")
                valid, effective, success = (bool(info[key]) for key in
                                             ("action_is_valid", "action_is_effective", "success"))
            except Exception as e:
                failure = action, e
                break
            state.actions_taken += valid  # an invalid action changed nothing: it costs no budget
            record.actions.append(action)
            record.reward += reward
            record.valid.append(valid)
            record.effective.append(effective)
            state.success = state.success or success
            if terminated or truncated:
                state.done = True
                break
        if state.actions_left <= 0:
            state.done = True
        state.turns.append(record)
        return record, failure

    def _fail(self, state: EnvState, action: str | None, error: Exception) -> None:
        """End the trajectory whose env failed in reset (`action` None) or step (raised, hung, bad reward or info)
        and give it a fresh env for the next episode; stop the rollout if too many have failed."""
        state.error = f"{type(error).__name__}: {error}"
        state.done, state.success = True, False
        where = "at reset" if action is None else f"on action {action!r}"
        print(f"[ragen] env {state.env_id} ({state.tag!r}, seed {state.seed}) failed {where} and ends its "
              f"trajectory: {state.error}", flush=True)
        # An exception may leave the instance half-updated, and a hung step's thread still holds it
        try:
            self._swap_env(state, self._make_env(state.tag, state.level), state.level)
        except Exception as e:  # its server is down too: keep the old instance, whose next reset tries again
            print(f"[ragen] env {state.env_id} keeps its instance: a fresh one could not be made ({e})", flush=True)
        failed = [s for s in self.states if s.error is not None]
        if len(failed) > self.max_env_failure_share * len(self.states):
            first = failed[0]
            raise EnvFailureError(
                f"{len(failed)} of {len(self.states)} trajectories failed in their env, more than "
                f"es_manager.max_env_failure_share={self.max_env_failure_share}; the first: env tag {first.tag!r}, "
                f"seed {first.seed}: {first.error}; the last: env tag {state.tag!r}, seed {state.seed}, {where}: "
                f"{state.error}. Fix the environment, or raise es_manager.max_env_failure_share "
                "(or es_manager.env_step_timeout_s, if its steps are merely slow)") from error

    @staticmethod
    def _swap_env(state: EnvState, env: gym.Env, level: int | None) -> None:
        """Give the state `env` and close the one it had (a served env ends its session, which would otherwise
        hold a place on its server until reaped)."""
        old, state.env, state.level = state.env, env, level
        try:
            old.close()
        except Exception:  # a half-updated or hung instance: it is dropped either way
            pass


def call_with_timeout(fn, arg, timeout_s: float | None):
    """`fn(arg)`, raising TimeoutError when it has not returned after `timeout_s` seconds (None: no limit,
    and the call runs in this thread).

    With a limit the call runs in a daemon thread. Python cannot kill a thread, so a call that hangs is
    abandoned rather than stopped: it keeps its env instance (the caller replaces that instance), and a
    pure-Python loop keeps competing for the GIL, slowing the rollout, until the process ends (being a
    daemon it does not keep the process alive at exit). An env that uses `signal` needs the main thread:
    leave the timeout off for it."""
    if timeout_s is None:
        return fn(arg)
    outcome = {}

    def run():
        try:
            outcome["value"] = fn(arg)
        except BaseException as e:  # re-raised in the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name="env-step", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"env.step({arg!r}) did not return within es_manager.env_step_timeout_s={timeout_s} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
