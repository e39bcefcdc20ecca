"""AgentProxy: the multi-turn loop that plays a batch of environments with the policy.

Each turn: the context manager builds a prompt per unfinished environment, the rollout workers generate
replies, the replies are parsed into actions, and the environments step. The loop ends after
`agent_proxy.max_turn` turns or as soon as every environment is done. The same loop serves training
(`split="train"`, the training sampling and fresh start states every step) and validation (`split="val"`,
the validation sampling and the same start states every time).

A trajectory whose environment failed (env.step raised, timed out or returned a non-finite reward; see
ragen/env_state_manager.py) ends there; its record carries `env_error`, and the batch's `env_failed` flag
tells the trainer to leave its group out of the update. In validation it simply counts as unsuccessful.
"""

from dataclasses import dataclass, replace

import numpy as np

from ragen.config import AgentProxyConfig
from ragen.context_manager import ContextManager, Trajectory, changed_nothing, reply_spans, token_pieces
from ragen.env_state_manager import EnvState, EnvStateManager
from ragen.envs.utils import png_uri
from ragen.world_model_reward import turn_credits
from verl.protocol import DataProto
from verl.utils.tracking import progress
from verl.workers.rollout import SamplingParams


@dataclass
class Rollout:
    batch: DataProto  # the trajectories as token tensors, for the update
    metrics: dict[str, float]
    records: list[dict]  # one per trajectory, turn by turn in text: what the JSONL files and the viewer show


class AgentProxy:
    def __init__(self, config: AgentProxyConfig, sampling: SamplingParams, format_penalty: float, seed: int,
                 actor_rollout_wg, env_manager: EnvStateManager, context: ContextManager, split: str = "train"):
        self.config, self.sampling, self.format_penalty, self.seed = config, sampling, format_penalty, seed
        self.actor_rollout_wg, self.env_manager, self.context, self.split = actor_rollout_wg, env_manager, context, split
        self.initial_seed = seed

    def reseed(self, offset: int) -> None:
        """Shift the seeds of the start states and of the sampling of every later rollout by `offset` (a
        watchdog rollback: the steps after the checkpoint are played again on other start states)."""
        self.seed = self.env_manager.seed = self.initial_seed + offset

    def rollout(self, step: int) -> Rollout:
        states = self.env_manager.reset(step)
        trajectories = [self.context.start(s.tag, s.obs, s.actions_left, s.images) for s in states]
        records = [trajectory_record(s, step, self.split) for s in states]
        self._check_first_prompts(states, trajectories)
        world = self.config.world_model_reward
        scored = world.observation != 0 or world.prediction != 0  # VAGEN's reward for the written states
        for turn in progress(range(self.config.max_turn), desc=f"{self.split} rollout turns", leave=False):
            active = [s for s in states if not s.done]
            if not active:
                break
            sampling = replace(self.sampling, seed=self.seed + 1000 * step + turn)
            prompt_ids = [self.context.prompt_ids(trajectories[s.env_id]) for s in active]
            prompts = DataProto(non_tensor_batch={"prompt_ids": prompt_ids}, meta_info={"sampling": sampling})
            if any(trajectories[s.env_id].images for s in active):  # image envs: each prompt's pictures, in order
                pictures = np.empty(len(active), dtype=object)  # a list per row (numpy would stack equal sizes)
                pictures[:] = [self.context.prompt_images(trajectories[s.env_id]) for s in active]
                prompts.non_tensor_batch["prompt_images"] = pictures
            generated = self.actor_rollout_wg.generate_sequences(prompts).non_tensor_batch
            if len(generated["response_ids"]) != len(active):  # never train on a silently smaller batch
                raise RuntimeError(f"the rollout engine answered {len(generated['response_ids'])} of "
                                   f"{len(active)} prompts")
            answered = [state.obs for state in active]  # the states the replies answer
            answered_images = [state.images for state in active]  # and their pictures (image envs)
            replies = [self.context.add_response(trajectories[state.env_id], list(response_ids), list(log_probs))
                       for state, response_ids, log_probs in zip(active, generated["response_ids"],
                                                                 generated["response_log_probs"], strict=True)]
            parsed_replies = [self.context.parse(reply) for reply in replies]
            turn_records = self.env_manager.step_all([(state.env_id, parsed.actions)  # all envs at once
                                                      for state, parsed in zip(active, parsed_replies)])
            for state, shown, shown_images, reply, parsed, record in zip(active, answered, answered_images, replies,
                                                                         parsed_replies, turn_records, strict=True):
                trajectory = trajectories[state.env_id]
                penalised = not parsed.format_ok or not all(record.valid)  # malformed, or an invalid action
                reward = task_reward = record.reward + (self.format_penalty if penalised else 0.0)
                world_model = {}
                if scored:  # state.obs is now the state after the turn's actions
                    world_model = turn_credits(reply, shown, state.obs, world.credit)
                    bonus = world.observation * world_model["observation"] + world.prediction * world_model["prediction"]
                    reward += bonus
                    world_model = {"world_model": world_model | {"reward": bonus}}
                trajectory.turn_rewards.append(reward)
                trajectory.turn_states.append(shown)
                trajectory.format_ok.append(parsed.format_ok)
                records[state.env_id]["turns"].append({
                    "state": shown, "response": reply, "format_ok": parsed.format_ok, "actions": record.actions,
                    "action_valid": record.valid, "action_effective": record.effective, "reward": reward,
                    "done": state.done} | world_model | pictures_record("images", shown_images))
                if not state.done and turn + 1 < self.config.max_turn and not self.context.add_observation(
                        trajectory, state.obs, task_reward, state.actions_left, self.sampling.max_new_tokens,
                        state.images, changed_nothing(record.actions, record.effective)):
                    state.done = state.context_truncated = True
        for state, record in zip(states, records):
            record |= {"success": state.success, "reward": sum(trajectories[state.env_id].turn_rewards),
                       "context_truncated": state.context_truncated, "final_state": state.obs,
                       "env_error": state.error} | pictures_record("final_images", state.images)
        if self.split == "train":  # the text of every token, for the browser's heat map of what was trained on
            pieces = token_pieces(self.context.tokenizer, [t.input_ids for t in trajectories])
            for record, trajectory_pieces in zip(records, pieces):
                record["token_pieces"] = trajectory_pieces
        batch = self.context.to_batch(trajectories, [s.group_id for s in states], [s.tag for s in states])
        batch = batch.union(DataProto(non_tensor_batch={"env_failed": np.array([s.error is not None for s in states])}))
        metrics = rollout_metrics(states, trajectories, batch, self.split) | self.env_manager.end_rollout()
        if scored:
            metrics |= world_model_metrics(records, batch, self.split)
        return Rollout(batch, metrics, records)

    def _check_first_prompts(self, states: list[EnvState], trajectories: list[Trajectory]) -> None:
        for state in states:
            trajectory = trajectories[state.env_id]
            if not self.context.fits(trajectory, self.sampling.max_new_tokens):
                raise ValueError(
                    f"the first prompt of env {state.tag!r} is {len(trajectory.input_ids)} tokens; with "
                    f"actor_rollout_ref.rollout.response_length={self.sampling.max_new_tokens} it exceeds the "
                    f"model's context of {self.context.max_model_len} tokens: lower response_length or shorten "
                    "the environment's instructions")


def pictures_record(key: str, pictures: tuple[np.ndarray, ...]) -> dict:
    """{key: the pictures as PNG data URIs} for a state shown as pictures (the trajectory pages show them as the
    model saw them), {} for a text state."""
    return {key: [png_uri(picture) for picture in pictures]} if pictures else {}


def trajectory_record(state: EnvState, step: int, split: str) -> dict:
    return {"step": step, "split": split, "env_id": state.env_id, "group_id": state.group_id, "tag": state.tag,
            "seed": state.seed, "curriculum_level": state.level, "turns": []}


def rollout_metrics(states: list[EnvState], trajectories: list[Trajectory], batch: DataProto,
                    split: str) -> dict[str, float]:
    """Batch-wide metrics (`rollout/...` in training, `val/...` in validation) and per env tag
    (`train/<tag>/...`, `val-env/<tag>/...`, RAGEN's names), including pass@k over each group."""
    batch_prefix, tag_prefix = ("rollout", "train") if split == "train" else ("val", "val-env")
    loss_mask = batch.batch["loss_mask"]
    rewards = batch.batch["trajectory_rewards"].numpy()  # raw: before any reward normalisation
    metrics = {
        f"{batch_prefix}/reward_mean": float(rewards.mean()),
        f"{batch_prefix}/reward_std": float(rewards.std()),
        f"{batch_prefix}/success_rate": float(np.mean([s.success for s in states])),
        f"{batch_prefix}/response_length": float(loss_mask.sum(-1).mean()),  # generated tokens per trajectory
        f"{batch_prefix}/sequence_length": float(batch.batch["attention_mask"].sum(-1).float().mean()),
        f"{batch_prefix}/num_turns": float(np.mean([len(s.turns) for s in states])),
        f"{batch_prefix}/format_ok_rate": float(np.mean([ok for t in trajectories for ok in t.format_ok])),
        f"{batch_prefix}/context_truncated_rate": float(np.mean([s.context_truncated for s in states])),
        f"{batch_prefix}/env_failures": float(sum(s.error is not None for s in states)),  # trajectories
        f"{batch_prefix}/env_failure_rate": float(np.mean([s.error is not None for s in states])),
        f"{batch_prefix}/response_repetition": repetition_rate([r for t in trajectories for r in replies(t)]),
    }
    for tag in sorted({s.tag for s in states}):
        group = [(s, r) for s, r in zip(states, rewards) if s.tag == tag]
        actions = [ok for s, _ in group for turn in s.turns for ok in turn.valid]
        effective = [ok for s, _ in group for turn in s.turns for ok in turn.effective]
        metrics |= {
            f"{tag_prefix}/{tag}/success": float(np.mean([s.success for s, _ in group])),
            f"{tag_prefix}/{tag}/reward": float(np.mean([r for _, r in group])),
            f"{tag_prefix}/{tag}/num_turns": float(np.mean([len(s.turns) for s, _ in group])),
            f"{tag_prefix}/{tag}/num_actions": float(np.mean([s.actions_taken for s, _ in group])),
            f"{tag_prefix}/{tag}/valid_action_rate": float(np.mean(actions)) if actions else 0.0,
            f"{tag_prefix}/{tag}/effective_action_rate": float(np.mean(effective)) if effective else 0.0,
        }
        metrics |= {f"{tag_prefix}/{tag}/{k}": v for k, v in pass_at_k([s for s, _ in group]).items()}
    return metrics


def world_model_metrics(records: list[dict], batch: DataProto, split: str) -> dict[str, float]:
    """The world-model reward apart from the task's, from the turns' records: the mean credit of each span over
    the turns, the mean world-model reward of a trajectory, and the task reward (the environment's and the format
    penalty) alone."""
    prefix = "rollout" if split == "train" else "val"
    credits = [turn["world_model"] for record in records for turn in record["turns"]]
    world_rewards = np.array([sum(turn["world_model"]["reward"] for turn in record["turns"]) for record in records])
    total = batch.batch["trajectory_rewards"].numpy()
    return {f"{prefix}/world_model/{kind}_credit": float(np.mean([c[kind] for c in credits])) if credits else 0.0
            for kind in ("observation", "prediction")} | {
        f"{prefix}/world_model/reward_mean": float(world_rewards.mean()),
        f"{prefix}/task_reward_mean": float((total - world_rewards).mean())}


def replies(trajectory: Trajectory) -> list[list[int]]:
    """The generated token ids of each turn."""
    return [trajectory.input_ids[start:end] for start, end in reply_spans(trajectory.loss_mask)]


def repetition_rate(sequences: list[list[int]], n: int = 4) -> float:
    """1 - distinct / total token n-grams over all replies of the batch: 0 when no n-gram repeats, near 1
    when the replies repeat themselves or each other. A rising value is the echo trap's signature."""
    ngrams = [tuple(seq[i:i + n]) for seq in sequences for i in range(len(seq) - n + 1)]
    return 1.0 - len(set(ngrams)) / len(ngrams) if ngrams else 0.0


def pass_at_k(states: list[EnvState]) -> dict[str, float]:
    """pass@k per group of n trajectories from one start state, for k = 1 and k = n: the unbiased estimate
    1 - C(n - c, k) / C(n, k) with c successes (Chen et al., 2021), averaged over the groups."""
    groups: dict[int, list[bool]] = {}
    for state in states:
        groups.setdefault(state.group_id, []).append(state.success)
    n = min(len(g) for g in groups.values())
    result = {}
    for k in sorted({1, n}):
        estimates = []
        for successes in groups.values():
            failures = len(successes) - sum(successes)
            # C(failures, k) / C(n, k) as a product, exact and free of overflow
            miss = np.prod([(failures - i) / (len(successes) - i) for i in range(k)]) if failures >= k else 0.0
            estimates.append(1.0 - miss)
        result[f"pass@{k}"] = float(np.mean(estimates))
    return result
