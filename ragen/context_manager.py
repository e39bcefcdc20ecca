"""ContextManager: turns environment states into prompt token ids and model replies into actions.

Token-exactness: a trajectory is built incrementally from token ids. The chat-template text of each new
environment message is tokenized once and appended; the model's generated ids are appended verbatim.
Nothing is ever decoded and re-encoded, so the sequence trained on is exactly the one the model saw and
produced, and `loss_mask` is 1 on exactly the generated ids.

The template pieces come from the tokenizer's own chat template, by rendering a probe conversation with
and without the new message and taking the difference; this works for ChatML (SmolLM2, Qwen2.5) and
header-style (Llama-3) templates alike.

Two rules bound what a prompt holds:
- `agent_proxy.max_context_window = k` shows the model the system message and only the last k turns
  (the current state counts as one); -1 shows every turn. A trajectory stays one row of the update, but
  each token is scored in the context the engine saw it in: `to_batch` gives every token its position in
  the prompt of its own turn (`position_ids`) and the first token whose prompt no longer holds it
  (`hidden_from`), from which the trainer builds its attention mask (verl/utils/model.py). A turn here
  runs from its state message to the template's end of its reply: what a prompt shows or drops whole.
  With k = 1 this is exact. With k >= 2 the first k turns are exact; a later turn sees the earlier turns
  of its window with the positions and hidden states they had in their own window, not as its prompt
  showed them (one row cannot hold both), a gap `actor/rollout_kl` shows. -1 builds no mask.
- A trajectory never outgrows the model: when the next state plus a reply of `response_length` tokens
  would exceed `max_model_len`, the trajectory ends after the turn it has played (`context_truncated`);
  no exception. Only a first prompt that cannot fit is an error (a config problem).

Pictures (image environments, VAGEN's convention): a state's text holds `<image>` where each of its pictures
stands; for a vision-language model (its `processor`; verl/utils/vlm.image_prompt_text) each placeholder
becomes exactly the image tokens the processor writes for that picture, and the trajectory keeps the pictures
with the turn that showed them, so `prompt_images` gives the pictures of `prompt_ids`, in order, for the
engine's pixel input (a test feeds both to the model). A text model, or a placeholder without its picture, is
an error. The rollout loop hands the pictures to the engine (torch, hf or vLLM), and `to_batch` gives
the trainer every picture of each row as the processor's pixel inputs.

Each generated token also gets its kind of text (`reply_kinds`: think, observation, prediction, answer or
format, by the first character of its text), from which the trainer builds TRICO's selective masks
(`algorithm.loss_spans`, `algorithm.adv_spans`; verl/trainer/core_algos.py).

`agent_proxy.reply_format` picks what the prompts ask for: `plain`, `<think>…</think><answer>…</answer>`, or
`world_model` (SPA, arXiv 2510.15047), whose thought first copies the current state into
`<observation>…</observation>` and ends with the state the actions will lead to in
`<prediction>…</prediction>`. Both parse the same way: the actions come from `<answer>`, and the state tags
inside the thought are text like any other (ragen/sft/world_model.py fills them with the true states).
"""

import hashlib
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ragen.config import AgentProxyConfig, ConfigError
from ragen.envs.utils import IMAGE_PLACEHOLDER
from verl.protocol import DataProto
from verl.trainer.config import REPLY_KINDS
from verl.trainer.core_algos import normalize_scores
from verl.utils.vlm import image_prompt_text, pixel_inputs

SYSTEM_PROMPT = "You are a helpful assistant that solves tasks step by step."
ANSWER_CLOSE = "</answer>"  # the rollout's stop string
REPLY_FORMATS = ("plain", "world_model")  # agent_proxy.reply_format
# the world-model spans inside <think> (SPA): the state the turn answers, the state after its actions
OBSERVATION_OPEN, OBSERVATION_CLOSE = "<observation>", "</observation>"
PREDICTION_OPEN, PREDICTION_CLOSE = "<prediction>", "</prediction>"
_PROBE = "RAGEN_PROBE_MESSAGE"
# Text between tags may not contain another think/answer tag, so "<think>a</think>b</think>" is malformed.
_NO_TAG = r"((?:(?!</?think>|</?answer>).)*)"
_THINK_ANSWER = re.compile(rf"\s*<think>{_NO_TAG}</think>\s*<answer>{_NO_TAG}</answer>\s*", re.DOTALL)
_ANSWER_ONLY = re.compile(rf"\s*<answer>{_NO_TAG}</answer>\s*", re.DOTALL)
# the text inside each pair of tags, up to the closing tag or the reply's end: later pairs overrule earlier ones
# (the state spans sit inside <think>)
_KIND_SPANS = [(kind, re.compile(f"{re.escape(opening)}(.*?)(?:{re.escape(closing)}|\\Z)", re.DOTALL))
               for kind, opening, closing in (("think", "<think>", "</think>"),
                                              ("observation", OBSERVATION_OPEN, OBSERVATION_CLOSE),
                                              ("prediction", PREDICTION_OPEN, PREDICTION_CLOSE),
                                              ("answer", "<answer>", ANSWER_CLOSE))]
_TAG = re.compile("</?(?:think|observation|prediction|answer)>")


@dataclass
class ParsedReply:
    actions: list[str]
    format_ok: bool


def parse_reply(text: str, enable_think: bool, action_sep: str, max_actions: int) -> ParsedReply:
    """`<think>…</think><answer>a || b</answer>` -> actions [a, b]. Anything else is malformed; never raises."""
    match = (_THINK_ANSWER if enable_think else _ANSWER_ONLY).fullmatch(text)
    if match is None:
        return ParsedReply(actions=[], format_ok=False)
    actions = [a.strip() for a in match.groups()[-1].split(action_sep) if a.strip()]
    return ParsedReply(actions=actions[:max_actions], format_ok=bool(actions))


def reply_opening(enable_think: bool) -> str:
    """The tag every prompt ends with, so that each reply starts inside the format: `<think>`, or `<answer>`
    when the model answers without thinking (the 135M model rarely opens the tag by itself)."""
    return "<think>" if enable_think else "<answer>"


def reply_text(tokenizer, response_ids: list[int], reply_open: str) -> str:
    """A reply's text as the parser reads it: the forced opening, the generated ids decoded, cut after
    `</answer>` (generation stops there, but its last token may carry a few more characters)."""
    reply = reply_open + tokenizer.decode(response_ids, skip_special_tokens=True)
    if ANSWER_CLOSE in reply:
        reply = reply[: reply.index(ANSWER_CLOSE) + len(ANSWER_CLOSE)]
    return reply


def reply_kinds(reply_open: str, pieces: list[str]) -> list[int]:
    """The kind of text of each generated token, as 1 + its index in REPLY_KINDS: that of the token's first
    character in the reply (the forced opening, then the tokens' `pieces`); `format` for the tags themselves,
    text outside every pair of tags and the end-of-turn token. An unclosed span runs to the reply's end."""
    text = reply_open + "".join(pieces)
    kinds = np.full(len(text) + 1, REPLY_KINDS.index("format") + 1)
    for kind, span in _KIND_SPANS:
        for match in span.finditer(text):
            kinds[match.start(1):match.end(1)] = REPLY_KINDS.index(kind) + 1
    for tag in _TAG.finditer(text):  # the state spans' tags sit inside <think>: a tag is format wherever it is
        kinds[tag.start():tag.end()] = REPLY_KINDS.index("format") + 1
    starts = len(reply_open) + np.cumsum([0] + [len(piece) for piece in pieces])[:-1]
    return kinds[starts].tolist()


def reply_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of every run of generated tokens in a trajectory: one per assistant turn."""
    spans, start = [], None
    for t, generated in enumerate(list(loss_mask) + [0]):
        if generated and start is None:
            start = t
        elif not generated and start is not None:
            spans, start = spans + [(start, t)], None
    return spans


def window_layout(turn_starts: list[int], length: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each of a trajectory's `length` tokens stood in the prompts of a `window`-turn context window:
    its position in the prompt of its own turn, and `hidden_from`, the index of the first token whose prompt
    no longer holds it (`length`: none). Turn j spans [turn_starts[j], turn_starts[j + 1]): its state message,
    its reply and the template's end of that reply, which the next prompts show or drop together; the system
    message before turn_starts[0] is in every prompt. Both (length,) long."""
    positions = torch.arange(length)
    hidden_from = torch.full((length,), length)
    ends = turn_starts[1:] + [length]
    for j, (start, end) in enumerate(zip(turn_starts, ends)):
        first_shown = turn_starts[max(0, j - window + 1)]
        positions[start:end] -= first_shown - turn_starts[0]  # the turns before the window are not in the prompt
        if j + window < len(turn_starts):
            hidden_from[start:end] = turn_starts[j + window]  # where turn j + window begins, turn j is dropped
    return positions, hidden_from


def token_pieces(tokenizer, sequences: list[list[int]]) -> list[list[str]]:
    """The text of every token of each sequence: what the page's heat map of the trained tokens shows. Each
    distinct id is decoded once. A byte-level tokenizer splits some characters over several tokens ("√" is
    two), each of which decodes alone to U+FFFD: a run of such tokens shows the run's text on its last token
    and "" on the others, so that a sequence's pieces join to its decoded text."""
    distinct = sorted({i for ids in sequences for i in ids})
    text_of = dict(zip(distinct, tokenizer.batch_decode([[i] for i in distinct], clean_up_tokenization_spaces=False)))
    result = []
    for ids in sequences:
        pieces = [text_of[i] for i in ids]
        start = 0
        while start < len(pieces):  # each maximal run pieces[start:end] holding U+FFFD
            end = start
            while end < len(pieces) and "\ufffd" in pieces[end]:
                end += 1
            if end - start > 1:
                joined = tokenizer.decode(ids[start:end], clean_up_tokenization_spaces=False)
                pieces[start:end] = [""] * (end - start - 1) + [joined]
            start = end + 1  # pieces[end] is whole
        result.append(pieces)
    return result


@dataclass
class Trajectory:
    """One environment's dialogue as token ids, with a mask over the generated ids."""

    tag: str = ""  # the environment's tag (custom_envs key)
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 on model-generated tokens
    # the rollout engine's log-prob of each generated token, given the tokens before it as the engine saw them
    # (a context window shows it fewer); 0 on every other token
    rollout_log_probs: list[float] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)  # turn each token belongs to
    reply_kinds: list[int] = field(default_factory=list)  # kind of each generated token (`reply_kinds`), 0 elsewhere
    turn_starts: list[int] = field(default_factory=list)  # index where each turn's user message begins
    turn_ends: list[int] = field(default_factory=list)  # index of each turn's last generated token
    turn_rewards: list[float] = field(default_factory=list)  # env reward + format penalty (+ world-model reward)
    turn_states: list[str] = field(default_factory=list)  # the state each turn answered
    format_ok: list[bool] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)  # the pictures of the states, in order (image envs)
    image_turns: list[int] = field(default_factory=list)  # the turn whose state message shows each picture

    def extend(self, ids: list[int], turn: int, log_probs: list[float] | None = None,
               kinds: list[int] | None = None) -> None:
        """Append `ids`: generated by the model with these `log_probs` and `kinds` of text, or, without them,
        environment text."""
        generated = log_probs is not None
        assert not generated or len(log_probs) == len(kinds) == len(ids), "one log-prob and kind per generated id"
        self.input_ids += ids
        self.loss_mask += [int(generated)] * len(ids)
        self.rollout_log_probs += list(log_probs) if generated else [0.0] * len(ids)
        self.reply_kinds += list(kinds) if generated else [0] * len(ids)
        self.turn_ids += [turn] * len(ids)


def changed_nothing(actions: Sequence[str], effective: Sequence[bool]) -> list[str]:
    """The actions of a turn whose `info["action_is_effective"]` was false (`no_effect_feedback` names them)."""
    return [action for action, moved in zip(actions, effective, strict=True) if not moved]


def state_key(text: str, trajectory: Trajectory, turn: int) -> tuple:
    """What identifies the state that `turn` of `trajectory` answered: its text and the pixels of the pictures
    shown with it (a picture-only state's text is `<image>` whatever the board)."""
    pictures = [image for image, shown in zip(trajectory.images, trajectory.image_turns) if shown == turn]
    return text, *(hashlib.sha1(np.ascontiguousarray(p)).hexdigest() + str(p.shape) for p in pictures)


class ContextManager:
    def __init__(self, tokenizer, config: AgentProxyConfig, instructions: dict[str, str],
                 example_actions: dict[str, tuple[str, ...]], eos_ids: list[int], max_model_len: int = 1 << 30,
                 action_choices: dict[str, str] | None = None, processor=None):
        self.tokenizer, self.config = tokenizer, config
        # a vision-language model's processor, which writes each picture's image tokens; None: text only
        self.processor = processor
        self.instructions, self.example_actions = instructions, example_actions  # per env tag
        self.action_choices = action_choices or {}  # per env tag, where the env lists its moves every turn
        self.eos_ids, self.max_model_len = eos_ids, max_model_len
        if config.reply_format not in REPLY_FORMATS:
            raise ConfigError(f"agent_proxy.reply_format={config.reply_format!r}: choose one of {list(REPLY_FORMATS)}")
        if config.reply_format == "world_model" and not config.enable_think:
            raise ConfigError("agent_proxy.reply_format=world_model writes the states inside <think>: it needs "
                              "agent_proxy.enable_think=true")
        self.reply_open = reply_opening(config.enable_think)
        probe = self._render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                              {"role": "assistant", "content": _PROBE}], add_generation_prompt=False)
        self._probe_prefix = probe
        self._assistant_close = probe[probe.rindex(_PROBE) + len(_PROBE):]  # e.g. "<|im_end|>\n"

    @classmethod
    def for_envs(cls, tokenizer, config: AgentProxyConfig, envs: dict, eos_ids: list[int],
                 max_model_len: int = 1 << 30, processor=None) -> "ContextManager":
        """The context manager for environments by tag, with each one's instructions, format example and moves
        (and a vision-language model's `processor`, for environments that show pictures)."""
        choices = {tag: getattr(env, "action_choices", "") for tag, env in envs.items()}  # an optional attribute
        return cls(tokenizer, config, instructions={tag: env.instructions for tag, env in envs.items()},
                   example_actions={tag: env.example_actions for tag, env in envs.items()}, eos_ids=eos_ids,
                   max_model_len=max_model_len, action_choices={tag: text for tag, text in choices.items() if text},
                   processor=processor)

    # ---- prompts -------------------------------------------------------------------------------------
    def start(self, tag: str, obs: str, actions_left: int, images: tuple[np.ndarray, ...] = ()) -> Trajectory:
        """The first prompt: system prompt, task instructions, first state (with its `images`, one per
        IMAGE_PLACEHOLDER in `obs`), and the reply opening."""
        system = [{"role": "system", "content": self._system_prompt(tag)}]
        user = {"role": "user", "content": self._state_message(tag, obs, 1, actions_left, reward=None)}
        system_text = self._render(system, add_generation_prompt=False)
        text = self._render(system + [user], add_generation_prompt=True) + self.reply_open
        assert text.startswith(system_text), "chat template renders the system message differently with a user turn"
        trajectory = Trajectory(tag=tag)
        trajectory.extend(self._encode(system_text), turn=0)
        trajectory.turn_starts.append(len(trajectory.input_ids))
        trajectory.extend(self._encode(text[len(system_text):], images), turn=0)
        trajectory.images += images
        trajectory.image_turns += [0] * len(images)
        return trajectory

    def prompt_ids(self, trajectory: Trajectory) -> list[int]:
        """What the model sees for its next reply: the system message and the last `max_context_window` turns."""
        window = self.config.max_context_window
        if window < 0 or window >= len(trajectory.turn_starts):
            return trajectory.input_ids
        system_end, first_shown = trajectory.turn_starts[0], trajectory.turn_starts[-window]
        return trajectory.input_ids[:system_end] + trajectory.input_ids[first_shown:]

    def prompt_images(self, trajectory: Trajectory) -> list[np.ndarray]:
        """The pictures `prompt_ids` shows, in the order of their image tokens there."""
        window = self.config.max_context_window
        first_turn = 0 if window < 0 else max(len(trajectory.turn_starts) - window, 0)
        return [image for image, turn in zip(trajectory.images, trajectory.image_turns) if turn >= first_turn]

    def fits(self, trajectory: Trajectory, response_length: int, added: int = 0) -> bool:
        """Whether `added` more prompt tokens and a reply of `response_length` keep it within `max_model_len`."""
        return len(trajectory.input_ids) + added + response_length <= self.max_model_len

    def add_response(self, trajectory: Trajectory, response_ids: list[int], log_probs: list[float]) -> str:
        """Append the generated ids verbatim, with the rollout engine's log-prob of each; return the reply text
        to parse (with the forced opening)."""
        turn = len(trajectory.turn_ends)
        kinds = reply_kinds(self.reply_open, token_pieces(self.tokenizer, [response_ids])[0])
        if response_ids and response_ids[-1] in self.eos_ids:  # the end of the turn, even inside an unclosed span
            kinds[-1] = REPLY_KINDS.index("format") + 1
        trajectory.extend(response_ids, turn=turn, log_probs=log_probs, kinds=kinds)
        trajectory.turn_ends.append(len(trajectory.input_ids) - 1)
        return reply_text(self.tokenizer, response_ids, self.reply_open)

    def add_observation(self, trajectory: Trajectory, obs: str, reward: float, actions_left: int,
                        response_length: int, images: tuple[np.ndarray, ...] = (),
                        no_effect: Sequence[str] = ()) -> bool:
        """Close the assistant turn the way the template does, then add the next state (with its `images`) as
        a user turn; `no_effect`: the turn's actions that changed nothing (named with `no_effect_feedback`).

        Returns False, adding nothing, when the next state and a reply of `response_length` tokens would
        not fit in `max_model_len`: the trajectory ends with the turns it has.
        """
        turn = len(trajectory.turn_ends)
        ended_with_eos = trajectory.input_ids[-1] in self.eos_ids
        eos_text = self.tokenizer.decode([trajectory.input_ids[-1]]) if ended_with_eos else ""
        close = self._assistant_close
        if eos_text and close.startswith(eos_text):  # the model already wrote the template's end-of-turn token
            close = close[len(eos_text):]
        user = self._render_user_turn(self._state_message(trajectory.tag, obs, turn + 1, actions_left, reward,
                                                          no_effect))
        close_ids, user_ids = self._encode(close), self._encode(user + self.reply_open, images)
        if not self.fits(trajectory, response_length, added=len(close_ids) + len(user_ids)):
            return False
        trajectory.extend(close_ids, turn=turn)
        trajectory.turn_starts.append(len(trajectory.input_ids))
        trajectory.extend(user_ids, turn=turn)
        trajectory.images += images
        trajectory.image_turns += [turn] * len(images)
        return True

    def parse(self, reply: str) -> ParsedReply:
        return parse_reply(reply, self.config.enable_think, self.config.action_sep, self.config.max_actions_per_turn)

    # ---- batch ---------------------------------------------------------------------------------------
    def to_batch(self, trajectories: list[Trajectory], group_ids: list[int], tags: list[str]) -> DataProto:
        """Right-padded tensors (B, T). Rewards: each turn's reward on its last generated token
        (`use_turn_scores`), or the trajectory's summed reward, normalised by `reward_normalization`, on its
        last generated token. `trajectory_rewards` keeps the raw sums (for the filter and the metrics);
        `state_ids` gives every token of a turn the id of the state that turn answered (same text, same id);
        `reply_kinds` each generated token's kind of text (`reply_kinds`), 0 elsewhere.
        `rollout_log_probs` is aligned as the actor's `old_log_probs`: column t holds the engine's
        log p(token t | tokens < t) where `loss_mask` is 1, and 0 elsewhere. With a context window,
        `position_ids` and `hidden_from` say where each token stood in the prompts (`window_layout`;
        padding: never hidden); without one there is no `hidden_from` and positions run 0, 1, ...
        Pictures (image envs): `pixel_values` and `pixel_attention_mask`, the processor's inputs for all of a
        row's pictures in the order of its image tokens (`verl.utils.vlm.pixel_inputs`), and `picture_turns`
        (B, most pictures), the turn that showed each (-1: padding). Two turns answered the same state (the same
        `state_ids`) when their state texts and their pictures are the same (`state_key`)."""
        batch_size, width = len(trajectories), max(len(t.input_ids) for t in trajectories)
        window = self.config.max_context_window
        input_ids = torch.full((batch_size, width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch_size, width), dtype=torch.long)
        position_ids = torch.zeros((batch_size, width), dtype=torch.long)
        loss_mask = torch.zeros((batch_size, width), dtype=torch.float32)
        rollout_log_probs = torch.zeros((batch_size, width), dtype=torch.float32)
        token_rewards = torch.zeros((batch_size, width), dtype=torch.float32)
        turn_ids = torch.full((batch_size, width), -1, dtype=torch.long)
        kinds = torch.zeros((batch_size, width), dtype=torch.long)
        state_ids = torch.full((batch_size, width), -1, dtype=torch.long)
        hidden_from = torch.full((batch_size, width), width, dtype=torch.long)
        scores = torch.tensor([sum(t.turn_rewards) for t in trajectories], dtype=torch.float32)
        norm = self.config.reward_normalization
        keys = {"state": group_ids, "batch": [0] * batch_size, "inductive": tags}[norm.grouping]
        normalized = normalize_scores(scores, np.asarray(keys), norm.method)
        state_index: dict[str, int] = {}
        for i, t in enumerate(trajectories):
            n = len(t.input_ids)
            input_ids[i, :n] = torch.tensor(t.input_ids)
            attention_mask[i, :n] = 1
            if window > 0:
                position_ids[i, :n], hidden_from[i, :n] = window_layout(t.turn_starts, n, window)
            else:
                position_ids[i, :n] = torch.arange(n)
            loss_mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
            rollout_log_probs[i, :n] = torch.tensor(t.rollout_log_probs, dtype=torch.float32)
            turn_ids[i, :n] = torch.tensor(t.turn_ids)
            kinds[i, :n] = torch.tensor(t.reply_kinds)
            turn_states = torch.tensor([state_index.setdefault(state_key(obs, t, turn), len(state_index))
                                        for turn, obs in enumerate(t.turn_states)])
            state_ids[i, :n] = turn_states[torch.tensor(t.turn_ids).clamp(max=len(turn_states) - 1)]
            if self.config.use_turn_scores:
                token_rewards[i, t.turn_ends] = torch.tensor(t.turn_rewards, dtype=torch.float32)
            else:
                token_rewards[i, t.turn_ends[-1]] = normalized[i]
        tensors = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                   "loss_mask": loss_mask, "rollout_log_probs": rollout_log_probs, "token_rewards": token_rewards,
                   "trajectory_rewards": scores, "turn_ids": turn_ids, "state_ids": state_ids, "reply_kinds": kinds}
        if window > 0:
            tensors["hidden_from"] = hidden_from
        if any(t.images for t in trajectories):  # every picture of each row, in the order of its image tokens
            tensors |= pixel_inputs(self.processor, [t.images for t in trajectories])
            tensors["picture_turns"] = torch.nn.utils.rnn.pad_sequence(
                [torch.tensor(t.image_turns, dtype=torch.long) for t in trajectories], batch_first=True, padding_value=-1)
        return DataProto(batch=tensors, non_tensor_batch={"group_ids": np.array(group_ids), "tags": tags})

    # ---- text ----------------------------------------------------------------------------------------
    def _system_prompt(self, tag: str) -> str:
        cfg = self.config
        # The example shows as many of the env's example actions as a turn may take: shown one, the bundled
        # model answers one action per turn (FrozenLake: 0 of 44 well-formed sampled replies named two)
        actions = self.example_actions[tag][:cfg.max_actions_per_turn]
        answer = f" {cfg.action_sep} ".join(actions)
        if cfg.reply_format == "world_model":  # the states in words: an example grid would be copied as the state
            fmt = ("Reply with your reasoning in <think></think> and then your action in <answer></answer>. Begin "
                   f"the reasoning by copying the current state into {OBSERVATION_OPEN}{OBSERVATION_CLOSE} and end "
                   f"it with the state your actions lead to in {PREDICTION_OPEN}{PREDICTION_CLOSE}, for example: "
                   f"<think>{OBSERVATION_OPEN}the current state{OBSERVATION_CLOSE}I think {' then '.join(actions)} "
                   f"is a good move.{PREDICTION_OPEN}the state after {' then '.join(actions)}{PREDICTION_CLOSE}"
                   f"</think><answer>{answer}</answer>")
        elif cfg.enable_think:  # a worked example, not a placeholder template: small models copy placeholders
            fmt = ("Reply with your reasoning in <think></think> and then your action in <answer></answer>, "
                   f"for example: <think>I think {' then '.join(actions)} is a good move.</think>"
                   f"<answer>{answer}</answer>")
        else:
            fmt = f"Reply with your action in <answer></answer>, for example: <answer>{answer}</answer>"
        if cfg.max_actions_per_turn > 1:
            fmt += f"\nYou may give up to {cfg.max_actions_per_turn} actions, separated by '{cfg.action_sep}'."
        return f"{SYSTEM_PROMPT}\n{self.instructions[tag]}\n{fmt}"

    def _state_message(self, tag: str, obs: str, turn: int, actions_left: int, reward: float | None,
                       no_effect: Sequence[str] = ()) -> str:
        cfg = self.config
        feedback = "" if reward is None else f"Reward: {reward:g}\n"
        if cfg.no_effect_feedback and no_effect:
            feedback += f"{', '.join(no_effect)} had no effect.\n"
        # The moves, beside the reply format: the bundled 135M model names a FrozenLake move in 18 % of its
        # first replies with this line and in 2 % without it (the list in the system prompt is too far back)
        choices = f"Choose from {self.action_choices[tag]}. " if tag in self.action_choices else ""
        reply = "<think>...</think><answer>...</answer>" if cfg.enable_think else "<answer>...</answer>"
        if cfg.reply_format == "world_model":
            reply = (f"<think>{OBSERVATION_OPEN}...{OBSERVATION_CLOSE}...{PREDICTION_OPEN}...{PREDICTION_CLOSE}"
                     "</think><answer>...</answer>")
        most = min(cfg.max_actions_per_turn, actions_left)
        limit = f", up to {most} actions separated by '{cfg.action_sep}'" if most > 1 else ""
        return (f"{feedback}Turn {turn}. State:\n{obs}\nYou have {actions_left} actions left. "
                f"{choices}Reply as {reply}{limit}.")

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _render_user_turn(self, content: str) -> str:
        """What the template adds after an assistant turn for a new user message, up to the reply opening."""
        probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                 {"role": "assistant", "content": _PROBE}, {"role": "user", "content": content}]
        full = self._render(probe, add_generation_prompt=True)
        assert full.startswith(self._probe_prefix), "chat template renders earlier turns differently later on"
        return full[len(self._probe_prefix):]

    def _encode(self, text: str, images: tuple[np.ndarray, ...] = ()) -> list[int]:
        """The ids of environment text; each IMAGE_PLACEHOLDER in it (one per picture in `images`) becomes the
        model's image tokens, as its processor writes them."""
        placeholders = text.count(IMAGE_PLACEHOLDER)
        if placeholders != len(images):
            raise ValueError(f"a state holds {placeholders} {IMAGE_PLACEHOLDER} placeholder(s) and comes with "
                             f"{len(images)} picture(s): one picture per placeholder")
        if images:
            if self.processor is None:
                raise ValueError("a state shows pictures, and this model reads text only: use a vision-language "
                                 "model, or the env's image_observation=none")
            pieces = text.split(IMAGE_PLACEHOLDER)
            text = pieces[0] + "".join(image_prompt_text(self.processor, picture) + piece
                                       for picture, piece in zip(images, pieces[1:], strict=True))
        return self.tokenizer.encode(text, add_special_tokens=False)

