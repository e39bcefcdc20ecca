r"""World-model warm start (SPA, arXiv 2510.15047): `bash sft/world_model.sh sokoban 1 checkpoints/sft/sokoban-wm`.

Before RL, the model learns what the environment does. It plays the recipe's training environments itself; each
turn's reply is rewritten in the world-model format (`agent_proxy.reply_format=world_model`),
`<think><observation>state</observation> thoughts <prediction>next state</prediction></think><answer>…</answer>`,
with the TRUE states in the two spans, and the model is fine-tuned on the rewritten replies, loss on the states
included (SPA's ablation that masks them gained nothing in PPO). RL then starts from the result like from any
other `model_path`, in the recipe's format: the Sokoban and FrozenLake recipes answer without thinking, where
SPA's PPO used `<think>…</think><answer>…</answer>` (`agent_proxy.enable_think=true` and a longer
`actor_rollout_ref.rollout.response_length`).

    python -m ragen.sft.world_model stage --env sokoban --nproc 1 --output checkpoints/sft/sokoban-wm

runs the four steps below; `data` and `score` run one each. A CPU-sized run (the bundled 135M model playing
in the recipe's format, see step 1; 15 min on 2 busy cores, a plumbing check: 12 training rows, 2 steps):

    python -m ragen.sft.world_model stage --env sokoban --nproc 1 --output /tmp/wm --play-format recipe \
        --train-episodes 16 --test-episodes 4 --epochs 2 --batch-size 8 --temperature 0.7 --score-turns 8 \
        --sft eval.max_turns=0

1. Self-play data. The model (`model_path`, by default the bundled SmolLM2-135M) plays through the RL rollout
   loop (`AgentProxy`) with a rollout engine in this process, at the recipe's rollout temperature or
   `--temperature`; failed episodes are kept. One episode per start state, like `ragen/sft/data.py`: train
   seeds `--seed` .. `--seed + --train-episodes`, the held-out (test) episodes' seeds after them.
   `--play-format world_model` (SPA): the model is asked for the world-model format, and each row's prompt is
   exactly what it was shown that turn, as the engine received it (the context manager's `prompt_ids`: the
   system prompt and the last `max_context_window` turns, its earlier replies as it wrote them).
   `--play-format recipe`: the model plays in the recipe's own format, and each row's prompt is what a
   world-model context manager shows at that turn, with the rewritten replies as the earlier turns
   (`replayed_prompts`; with `max_context_window=1` the system prompt and the state alone). For small models:
   asked for the world-model format, SmolLM2-135M named a valid move in 0 of 60 CoordSokoban turns (256-token
   replies, T 0.7; it rambles and never closes the thought), in the recipe's format (no thinking, one move a
   turn) in 12 of 80.
2. Ground truth, one row per turn (`rewrite_turns`, `turn_rows`). The reply becomes
       <observation>\nSTATE\n</observation>\nTHOUGHT\n<prediction>\nNEXT\n</prediction></think><answer>A || B</answer>
   - STATE: the observation the turn answered; NEXT: the observation after all the turn's actions (the next
     turn's state, or the episode's final state).
   - THOUGHT: the model's own text in `<think>` (up to `</think>`; without one, up to `<answer>`; without that,
     all of it), minus whatever it wrote in `<observation>`/`<prediction>` (an unclosed one: to the end of
     the thought) and minus any stray format tag, on one line (whitespace runs become one space); the line is
     left out when nothing remains (always, for a recipe without thinking). The 135M model rarely writes the
     tags at all, so every reply is rebuilt this one way, tags or not.
   - A || B: the turn's valid actions, as the environment executed them (an action past the episode's end is
     not executed). An invalid action leaves the state unchanged, so NEXT is also the state after the valid
     actions alone; it is dropped from the answer so as not to be taught (`invalid_actions_removed` counts
     those turns). A turn with no valid action, a malformed reply included, is dropped (`dropped_turns`):
     its answer would be empty. So are episodes whose env failed (`dropped_env_failures`) and, in recipe
     play, turns whose replayed prompt would outgrow the model's context (`dropped_context`).
   The response is the rewritten reply's tokens after the forced `<think>`; the loss mask is 1 on the
   response only. At most `--max-train-turns` training rows are kept (SPA: 6,400).
3. Fine-tuning: `ragen/sft/trainer.py` under torchrun, SPA's settings by default: full fine-tuning
   (`--lora-rank 0`), lr 1e-4, batch 16, 5 epochs, cosine with 10 % warm-up; `--sft key=value` passes any other
   trainer key. With a LoRA rank the adapter is merged (sft/utils/merge_lora.py) before scoring.
4. Held-out score (`score_model`, `score_replies`): greedy replies to the test turns' prompts, before and
   after fine-tuning, each `<observation>` compared with the true state and each `<prediction>` with the
   true next state: the whole text (outer whitespace ignored), the lines that are not coordinate lines (the
   grid), and the coordinate lines (`Targets: (r, c), …`; `Player`, `Boxes`, `Boxes on target`, `Player on
   target`, FrozenLake's `Start`, `Goal`, `Holes`) as sets of cells per label, per label and all at once.
   The true next state is that of the moves the self-play made, so the prediction is also scored over the
   turns whose reply answers those same moves (`same_moves`, `prediction_same_moves/*`), and beside it stands
   the prediction that copies the current state (`copy/prediction/*`: a wall bump changes nothing, and
   targets, FrozenLake's start, goal and holes never move, so copying scores well above zero). On slippery
   FrozenLake the next state is one draw of the slips: exact match has a ceiling below 1. The first
   `--score-turns` rows of the held-out file are scored (whole episodes in seed order). Held-out seeds are not
   held-out boards (small boards repeat across seeds), so every score is also given over the held-out turns
   whose state no training row shows (`unseen_states/*`, their number `unseen_states/turns`).
   Printed, and written to `<output>/score.json`.

Output folder: `data/{train,test}.parquet`, `data/stats.json` and `data/command.json` (the arguments that made
the data), `model/` (the trainer's folder: the full model, or the adapter), `model_merged/` (LoRA only),
`score_before.json`, `score.json`. The stage run again with the same arguments after an interruption reuses the
data and the score before, and the fine-tuning goes on from its last save (every epoch, or every N steps with
`--sft trainer.test_freq=N`).
"""

import argparse
import copy
import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragen.config import CONFIG_DIR, EnvGroupsConfig, EnvMixConfig, RagenConfig
from ragen.overrides import load_config
from ragen.context_manager import (ANSWER_CLOSE, OBSERVATION_CLOSE, OBSERVATION_OPEN, PREDICTION_CLOSE,
                                   PREDICTION_OPEN, ContextManager, changed_nothing, parse_reply, reply_opening,
                                   reply_text)
from ragen.create_data import write_parquet
from ragen.env_state_manager import EnvStateManager
from ragen.sft.data import tokenizer_fingerprint
from ragen.train import make_agent
from ragen.world_model_reward import SPANS, score_state, written_span
from verl.protocol import DataProto
from verl.trainer.config import RolloutConfig
from verl.utils.model import load_tokenizer, resolve_model_path
from verl.utils.tracking import quiet_libraries
from verl.workers.rollout import ROLLOUT_ENGINES, SamplingParams, load_engine

REPO = Path(__file__).resolve().parents[2]
THINK_OPEN, THINK_CLOSE, ANSWER_OPEN = "<think>", "</think>", "<answer>"
_FORMAT_TAG = re.compile(r"</?(?:think|answer|observation|prediction)>")
# one row per kept turn (`turn_rows`); `turns` is what the SFT trainer reads besides the ids and the mask
ROW_SCHEMA = pa.schema([("tag", pa.string()), ("seed", pa.int64()), ("turn", pa.int64()), ("reward", pa.float64()),
                        ("success", pa.bool_()), ("input_ids", pa.list_(pa.int64())),
                        ("loss_mask", pa.list_(pa.int64())),
                        ("prompt_length", pa.int64()), ("state", pa.string()), ("next_state", pa.string()),
                        ("actions", pa.list_(pa.string())), ("model_reply", pa.string()),
                        ("model_format_ok", pa.bool_()), ("turns", pa.string())])
COUNTS = ("episodes", "successes", "dropped_env_failures", "turns", "dropped_turns", "dropped_context",
          "invalid_actions_removed", "model_wrote_spans", "rows")
PLAY_FORMATS = ("world_model", "recipe")  # --play-format


# ---- 2. ground-truth substitution -----------------------------------------------------------------------
def model_thought(reply: str) -> str:
    """The model's free text in its thought, without the state spans or any format tag (module docstring)."""
    text = reply.removeprefix(THINK_OPEN)
    for end in (THINK_CLOSE, ANSWER_OPEN):  # the thought ends at </think>, or else where the answer begins
        if end in text:
            text = text[:text.index(end)]
            break
    for span in SPANS.values():
        text = span.sub(" ", text)
    for opening in (OBSERVATION_OPEN, PREDICTION_OPEN):  # an unclosed state span runs to the end
        if opening in text:
            text = text[:text.index(opening)]
    return " ".join(_FORMAT_TAG.sub(" ", text).split())


def world_model_response(thought: str, state: str, next_state: str, actions: list[str], action_sep: str) -> str:
    """The rewritten reply as the model writes it after the prompt's forced `<think>`."""
    thought_lines = [thought] if thought else []
    lines = [OBSERVATION_OPEN, state, OBSERVATION_CLOSE, *thought_lines, PREDICTION_OPEN, next_state]
    answer = f" {action_sep} ".join(actions)
    return "\n".join(lines) + f"\n{PREDICTION_CLOSE}{THINK_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


@dataclass
class Rewritten:
    """One turn's reply with the true states: its valid actions, the text after `<think>`, and its token ids."""

    actions: list[str]
    text: str
    ids: list[int]


def episode_states(record: dict) -> list[str]:
    """The state each turn answered, then the episode's final state: turn k's next state is entry k + 1."""
    return [turn["state"] for turn in record["turns"]] + [record["final_state"]]


def rewrite_turns(record: dict, tokenizer, action_sep: str) -> list[Rewritten]:
    """Every turn of an episode (`AgentProxy.rollout`'s record) rewritten as the module docstring says."""
    states, rewritten = episode_states(record), []
    for k, turn in enumerate(record["turns"]):
        actions = [action for action, valid in zip(turn["actions"], turn["action_valid"]) if valid]
        text = world_model_response(model_thought(turn["response"]), states[k], states[k + 1], actions, action_sep)
        rewritten.append(Rewritten(actions, text, tokenizer.encode(text, add_special_tokens=False)))
    return rewritten


def replayed_prompts(context: ContextManager, record: dict, replies: list[Rewritten],
                     max_actions: int) -> list[list[int]]:
    """The prompt of each turn as a world-model context manager shows the episode with the rewritten replies
    (`--play-format recipe`: the model played in the recipe's format). As in the rollout loop, a next state that
    would not fit the model's context with the reply to come ends the episode: then fewer prompts than turns."""
    states, turns = episode_states(record), record["turns"]
    trajectory = context.start(record["tag"], states[0], max_actions)
    # copies: without a window cut, prompt_ids is the trajectory's own list, which the next turns extend
    prompts, actions_left = [list(context.prompt_ids(trajectory))], max_actions
    for k in range(len(turns) - 1):
        context.add_response(trajectory, replies[k].ids, [0.0] * len(replies[k].ids))
        actions_left -= sum(turns[k]["action_valid"])  # an invalid action costs no budget (env_state_manager)
        if not context.add_observation(trajectory, states[k + 1], turns[k]["reward"], actions_left,
                                       len(replies[k + 1].ids),
                                       no_effect=changed_nothing(turns[k]["actions"], turns[k]["action_effective"])):
            break
        prompts.append(list(context.prompt_ids(trajectory)))
    return prompts


def turn_rows(record: dict, prompts: list[list[int]], replies: list[Rewritten]) -> tuple[list[dict], dict[str, int]]:
    """One episode's rows, one per turn with a valid action and a prompt, and counts of what was dropped or
    changed. `prompts[k]`: the ids shown before turn k's reply; `replies`: `rewrite_turns`."""
    counts = {"turns": len(record["turns"]), "dropped_turns": 0, "dropped_context": len(record["turns"]) - len(prompts),
              "invalid_actions_removed": 0, "model_wrote_spans": 0}
    states, rows = episode_states(record), []
    for k, (turn, prompt, reply) in enumerate(zip(record["turns"], prompts, replies)):
        counts["model_wrote_spans"] += all(span.search(turn["response"]) for span in SPANS.values())
        if not reply.actions:
            counts["dropped_turns"] += 1
            continue
        counts["invalid_actions_removed"] += len(reply.actions) < len(turn["actions"])
        rows.append({"tag": record["tag"], "seed": record["seed"], "turn": k, "reward": turn["reward"],
                     "success": record["success"], "input_ids": prompt + reply.ids,
                     "loss_mask": [0] * len(prompt) + [1] * len(reply.ids), "prompt_length": len(prompt),
                     "state": states[k], "next_state": states[k + 1], "actions": reply.actions,
                     "model_reply": turn["response"], "model_format_ok": turn["format_ok"],
                     # what the SFT trainer reads: the reply it scores greedy replies against, with the opening
                     "turns": json.dumps([{"response": THINK_OPEN + reply.text, "state": states[k],
                                           "actions": reply.actions}])})
    return rows, counts


# ---- 1. self-play ---------------------------------------------------------------------------------------
class SelfPlayPolicy:
    """Takes the actor worker group's place in `AgentProxy`: a rollout engine in this process generates the
    replies, and the prompt each environment was shown at each turn is kept (`prompts[env_id]`)."""

    def __init__(self, engine, env_manager: EnvStateManager):
        self.engine, self.env_manager = engine, env_manager
        self.prompts: dict[int, list[list[int]]] = {}

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        active = [state for state in self.env_manager.states if not state.done]
        prompt_ids = [list(ids) for ids in prompts.non_tensor_batch["prompt_ids"]]
        assert len(active) == len(prompt_ids), "the prompts are those of the unfinished environments, in order"
        for state, ids in zip(active, prompt_ids):
            self.prompts.setdefault(state.env_id, []).append(ids)
        generation = self.engine.generate(prompt_ids, prompts.meta_info["sampling"])
        return DataProto(non_tensor_batch={"response_ids": generation.token_ids,
                                           "response_log_probs": generation.log_probs})


def self_play_rows(cfg: RagenConfig, seeds: range, engine, tokenizer, play_format: str = "world_model",
                   episodes_per_rollout: int = 64, max_rows: int | None = None) -> tuple[pa.Table, dict[str, int]]:
    """The model's episodes from these start states, one row per kept turn (at most `max_rows`), and the
    counts of what was played, dropped and changed (`turn_rows`). `play_format`: world_model (the recipe's
    `agent_proxy` must ask for it; the rows' prompts are those the model saw) or recipe (the model plays in
    the recipe's format; the prompts are a world-model context manager's, `replayed_prompts`)."""
    if play_format not in PLAY_FORMATS:
        raise ValueError(f"play_format={play_format!r}: choose one of {list(PLAY_FORMATS)}")
    if play_format == "world_model" and cfg.agent_proxy.reply_format != "world_model":
        raise ValueError("self-play in the world-model format needs agent_proxy.reply_format=world_model")
    cfg = copy.deepcopy(cfg)  # the batches below rewrite its env groups and seed
    cfg.actor_rollout_ref.model.path = resolve_model_path(cfg.actor_rollout_ref.model.path)
    row_format = replace(cfg.agent_proxy, reply_format="world_model", enable_think=True)
    tags = cfg.es_manager.train.env_configs.tags
    rows, counts = [], dict.fromkeys(COUNTS, 0)
    for start in range(seeds.start, seeds.stop, episodes_per_rollout):
        if max_rows is not None and len(rows) >= max_rows:
            break
        batch_size = min(episodes_per_rollout, seeds.stop - start)
        # seeds start, start+1, ...: the env-state manager's seed for group g at step 0 is seed + g
        cfg.es_manager.train = EnvGroupsConfig(env_groups=batch_size, group_size=1,
                                               env_configs=EnvMixConfig(tags=list(tags), n_groups=[]))
        cfg.trainer.seed = start
        agent = make_agent(cfg, "train", None, tokenizer)
        policy = SelfPlayPolicy(engine, agent.env_manager)
        agent.actor_rollout_wg = policy
        context = ContextManager.for_envs(tokenizer, row_format, agent.env_manager.env_per_tag(),
                                          agent.context.eos_ids, agent.context.max_model_len)
        for record in agent.rollout(step=0).records:
            counts["episodes"] += 1
            counts["successes"] += bool(record["success"])
            if record["env_error"] is not None:
                counts["dropped_env_failures"] += 1
                continue
            replies = rewrite_turns(record, tokenizer, row_format.action_sep)
            prompts = policy.prompts[record["env_id"]] if play_format == "world_model" else replayed_prompts(
                context, record, replies, cfg.custom_envs[record["tag"]].max_actions_per_traj)
            episode_rows, episode_counts = turn_rows(record, prompts, replies)
            rows += episode_rows
            for key, value in episode_counts.items():
                counts[key] += value
    rows = rows[:max_rows]
    counts["rows"] = len(rows)
    table = pa.Table.from_pylist(rows, schema=ROW_SCHEMA)
    metadata = {"ragen.tokenizer": tokenizer_fingerprint(tokenizer), "ragen.model_path": cfg.model_path,
                "ragen.agent_proxy": json.dumps(asdict(row_format)), "ragen.tags": json.dumps(list(tags)),
                "ragen.play_format": play_format, "ragen.world_model": json.dumps(counts)}
    return table.replace_schema_metadata(metadata), counts


def write_data(cfg: RagenConfig, output: Path, train_episodes: int, test_episodes: int, seed: int = 0,
               max_train_turns: int = 6400, play_format: str = "world_model",
               episodes_per_rollout: int = 64) -> dict[str, dict[str, int]]:
    """`output/train.parquet`, `output/test.parquet` (held-out start states) and `output/stats.json`."""
    model_path = resolve_model_path(cfg.actor_rollout_ref.model.path)
    tokenizer = load_tokenizer(model_path)
    engine = load_engine(model_path, cfg.actor_rollout_ref.rollout, tokenizer)
    stats = {}
    test_start = seed + train_episodes
    for split, seeds, cap in (("train", range(seed, test_start), max_train_turns),
                              ("test", range(test_start, test_start + test_episodes), None)):
        start = time.perf_counter()
        table, stats[split] = self_play_rows(cfg, seeds, engine, tokenizer, play_format, episodes_per_rollout, cap)
        write_parquet(table, output / f"{split}.parquet")
        counts = stats[split]
        print(f"{output / f'{split}.parquet'}: {counts['rows']} rows from {counts['turns']} turns of "
              f"{counts['episodes']} episodes ({counts['dropped_turns']} turns without a valid action dropped, "
              f"{counts['model_wrote_spans']} with both state spans written by the model; success "
              f"{counts['successes'] / max(counts['episodes'], 1):.3f}) in {time.perf_counter() - start:.1f} s",
              flush=True)
    (output / "stats.json").write_text(json.dumps(stats, indent=2), encoding="utf-8")
    for split, counts in stats.items():
        if counts["rows"] == 0:
            hint = (" A small model rarely completes the world-model format (SmolLM2-135M: 0 of 60 turns on "
                    "CoordSokoban): try --play-format recipe." if play_format == "world_model" else "")
            raise ValueError(f"no {split} rows: in {counts['turns']} turns the model named no valid action.{hint}")
    return stats


# ---- 4. held-out score ----------------------------------------------------------------------------------
def score_replies(replies: list[str], states: list[str], next_states: list[str], actions: list[list[str]],
                  action_sep: str = "||", max_actions: int = 2) -> dict[str, float]:
    """Accuracies over the turns (module docstring, step 4): `<kind>/exact`, `<kind>/grid_exact`,
    `<kind>/coordinates_all` (over the turns whose true state has coordinate lines) and
    `<kind>/coordinates/<label>` (over the turns where the label is in the true or the written state), for
    kind observation and prediction; `written_spans` (both spans present), `format_ok` (the reply parses).
    The true next state follows the recorded `actions`, so `same_moves` is the share of turns whose reply
    answers those moves, and `prediction_same_moves/*` the prediction scores over those turns alone. The
    baseline `copy/prediction/*` writes the current state as the prediction (nothing moves): what a model
    scores that has learned to copy its input."""
    scores: dict[str, list[float]] = {"written_spans": [], "format_ok": [], "same_moves": []}

    def add(prefix: str, result: dict) -> None:
        for key in ("exact", "grid_exact", "coordinates_all"):
            if result[key] is not None:
                scores.setdefault(f"{prefix}/{key}", []).append(result[key])
        for label, ok in result["labels"].items():
            scores.setdefault(f"{prefix}/coordinates/{label}", []).append(ok)

    for reply, state, next_state, moves in zip(replies, states, next_states, actions, strict=True):
        written = {kind: written_span(reply, kind) for kind in SPANS}
        parsed = parse_reply(reply, True, action_sep, max_actions)
        same = [a.lower() for a in parsed.actions] == [a.strip().lower() for a in moves]
        scores["written_spans"].append(all(text is not None for text in written.values()))
        scores["format_ok"].append(parsed.format_ok)
        scores["same_moves"].append(same)
        add("observation", score_state(written["observation"], state))
        add("prediction", score_state(written["prediction"], next_state))
        if same:
            add("prediction_same_moves", score_state(written["prediction"], next_state))
        add("copy/prediction", score_state(state, next_state))
    return {"turns": len(replies)} | {key: float(np.mean(values)) for key, values in sorted(scores.items()) if values}


def score_model(model_path: str, data_file: Path, max_turns: int = 256, batch_size: int = 32,
                max_new_tokens: int | None = None, engine_name: str = "torch", dtype: str = "auto",
                train_file: Path | None = None) -> dict:
    """Greedy world-model replies of `model_path` to the first `max_turns` turns of `data_file` (its rows'
    prompts), scored by `score_replies`; given the training rows (`train_file`), scored again over the turns
    whose state none of them shows (`unseen_states/*`). `max_new_tokens` defaults to the longest true reply
    plus 32."""
    model_path = resolve_model_path(model_path)
    tokenizer = load_tokenizer(model_path)
    table = pq.read_table(data_file)
    if table.num_rows == 0:
        raise ValueError(f"{data_file} holds no turns to score: play more held-out episodes (--test-episodes)")
    rows = table.slice(0, max_turns).to_pylist()
    reply_format = json.loads(table.schema.metadata[b"ragen.agent_proxy"])
    prompts = [row["input_ids"][:row["prompt_length"]] for row in rows]
    longest = max(len(row["input_ids"]) - row["prompt_length"] for row in rows)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens or longest + 32, stop=[ANSWER_CLOSE])
    engine = load_engine(model_path, RolloutConfig(name=engine_name, dtype=dtype), tokenizer)
    opening = reply_opening(enable_think=True)
    replies = []
    for start in range(0, len(prompts), batch_size):
        generated = engine.generate(prompts[start:start + batch_size], sampling).token_ids
        replies += [reply_text(tokenizer, ids, opening) for ids in generated]

    def scored(picked: list[int]) -> dict[str, float]:
        return score_replies([replies[i] for i in picked], [rows[i]["state"] for i in picked],
                             [rows[i]["next_state"] for i in picked], [rows[i]["actions"] for i in picked],
                             reply_format["action_sep"], reply_format["max_actions_per_turn"])

    scores = scored(list(range(len(rows))))
    if train_file is not None:
        seen = set(pq.read_table(train_file, columns=["state"]).column("state").to_pylist())
        unseen = [i for i, row in enumerate(rows) if row["state"] not in seen]
        unseen_scores = scored(unseen) if unseen else {"turns": 0}
        scores |= {f"unseen_states/{key}": value for key, value in unseen_scores.items()}
    return scores | {"model_path": model_path, "examples": replies[:3]}


def format_scores(before: dict, after: dict) -> str:
    keys = [k for k in before if isinstance(before[k], float) and k in after]
    unseen = f" ({after['unseen_states/turns']} in no training state)" if "unseen_states/turns" in after else ""
    lines = [f"{'held-out turns: ' + str(after['turns']) + unseen:<44}{'before':>10}{'after':>10}"]
    lines += [f"{key:<44}{before[key]:>10.3f}{after[key]:>10.3f}" for key in keys]
    return "\n".join(lines)


# ---- 3. fine-tuning, and the stage ----------------------------------------------------------------------
def with_defaults(defaults: dict[str, str], overrides: Sequence[str]) -> list[str]:
    """Hydra overrides: `defaults` for the keys `overrides` do not set, then `overrides`."""
    given = {override.split("=", 1)[0].lstrip("+~") for override in overrides}
    return [f"{key}={value}" for key, value in defaults.items() if key not in given] + list(overrides)


def finetune(args: argparse.Namespace, base_model: str, data: Path) -> Path:
    """Run ragen/sft/trainer.py under torchrun on the self-play data; returns a folder `model_path=` takes."""
    splits = {split: pq.read_table(data / f"{split}.parquet", columns=["input_ids", "prompt_length"]).to_pylist()
              for split in ("train", "test")}
    everything = splits["train"] + splits["test"]
    longest = max((len(row["input_ids"]) for row in everything), default=0)
    longest_reply = max((len(row["input_ids"]) - row["prompt_length"] for row in everything), default=0)
    rows = len(splits["train"])
    steps = args.epochs * (rows // args.batch_size)
    if steps == 0:
        raise ValueError(f"{rows} training turns do not fill one batch of --batch-size {args.batch_size}: play more "
                         "episodes (--train-episodes) or lower --batch-size")
    save_path = args.output / "model"
    defaults = {"env": args.env, "model_path": base_model, "data.train_file": data / "train.parquet",
                "data.test_file": data / "test.parquet", "data.max_length": longest,
                "trainer.default_local_dir": save_path, "trainer.experiment_name": f"{args.env}-world-model",
                "trainer.total_epochs": args.epochs, "trainer.train_batch_size": args.batch_size,
                "optim.lr": args.lr, "optim.lr_warmup_steps": round(0.1 * steps),  # SPA: 10 % warm-up
                "lora.rank": args.lora_rank, "eval.max_new_tokens": longest_reply + 32}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
               f"--nproc_per_node={args.nproc}", "-m", "ragen.sft.trainer",
               *with_defaults({key: str(value) for key, value in defaults.items()}, args.sft)]
    print("[world-model] " + " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=REPO)
    if args.lora_rank == 0:
        return save_path
    merged = args.output / "model_merged"
    subprocess.run([sys.executable, str(REPO / "sft" / "utils" / "merge_lora.py"), "--base_model_name", base_model,
                    "--lora_model_path", str(save_path), "--output_path", str(merged)], check=True, cwd=REPO)
    return merged


def stage_data(args: argparse.Namespace, cfg: RagenConfig, base_model: str) -> tuple[dict, dict]:
    """(the data's counts, the arguments that made it): `write_data` into `<output>/data`, or the data already there
    when the same arguments made it (a stage run again after an interruption goes on with its data; the trainer
    then resumes from its last save). Data made by other arguments is refused, not overwritten."""
    data = args.output / "data"
    made_by = {"model_path": base_model, "overrides": list(args.overrides),
               **{key: getattr(args, key) for key in ("env", "train_episodes", "test_episodes", "seed",
                                                        "max_train_turns", "temperature", "play_format",
                                                        "response_length", "episodes_per_rollout")}}
    record = data / "command.json"
    if record.is_file():
        earlier = json.loads(record.read_text(encoding="utf-8"))
        if earlier != made_by:
            changed = ", ".join(f"{key}: {earlier.get(key)!r} -> {value!r}" for key, value in made_by.items()
                                if earlier.get(key) != value)
            raise ValueError(f"{data} holds self-play data made with other arguments ({changed}): choose another "
                             "--output, or remove that folder")
        print(f"[world-model] reusing the self-play data in {data}", flush=True)
        return json.loads((data / "stats.json").read_text(encoding="utf-8")), made_by
    stats = write_data(cfg, data, args.train_episodes, args.test_episodes, args.seed, args.max_train_turns,
                       args.play_format, args.episodes_per_rollout)
    record.write_text(json.dumps(made_by, indent=2), encoding="utf-8")  # last: the data is whole
    return stats, made_by


def run_stage(args: argparse.Namespace) -> dict:
    """Self-play data, the score before, fine-tuning, the score after: `<output>/score.json`. Run again after an
    interruption, it reuses the data and the score before (`<output>/score_before.json`) and the trainer goes on
    from its last save."""
    cfg = recipe(args)
    base_model = resolve_model_path(cfg.model_path)
    data = args.output / "data"
    stats, made_by = stage_data(args, cfg, base_model)
    engine = cfg.actor_rollout_ref.rollout
    scoring = {"model_path": base_model, "turns": args.score_turns, "batch_size": args.score_batch_size,
               "engine": engine.name, "dtype": engine.dtype,  # and the data it scored: made anew, scored anew
               "data": made_by}
    before_file = args.output / "score_before.json"
    before = json.loads(before_file.read_text(encoding="utf-8")) if before_file.is_file() else {}
    if before.get("scoring") != scoring:
        before = {"scoring": scoring, "score": score_model(base_model, data / "test.parquet", args.score_turns,
                                                           args.score_batch_size, engine_name=engine.name,
                                                           dtype=engine.dtype, train_file=data / "train.parquet")}
        before_file.write_text(json.dumps(before, indent=2), encoding="utf-8")
    score = {"before": before["score"]}
    trained = finetune(args, base_model, data)
    score["after"] = score_model(str(trained), data / "test.parquet", args.score_turns, args.score_batch_size,
                                 engine_name=engine.name, dtype=engine.dtype, train_file=data / "train.parquet")
    score["data"] = stats
    (args.output / "score.json").write_text(json.dumps(score, indent=2), encoding="utf-8")
    print(format_scores(score["before"], score["after"]))
    print(f"[world-model] model: {trained}; scores: {args.output / 'score.json'}", flush=True)
    return score


def recipe(args: argparse.Namespace) -> RagenConfig:
    """The recipe the model plays: with `--play-format world_model`, asking for that format (thinking on,
    replies long enough for two states); `--temperature` and `--response-length` when given."""
    defaults = {}
    if args.play_format == "world_model":
        defaults = {"agent_proxy.reply_format": "world_model", "agent_proxy.enable_think": "true",
                    "actor_rollout_ref.rollout.response_length": "256"}
    if args.response_length is not None:
        defaults["actor_rollout_ref.rollout.response_length"] = str(args.response_length)
    if args.temperature is not None:
        defaults["actor_rollout_ref.rollout.temperature"] = str(args.temperature)
    return load_config(args.env, with_defaults(defaults, args.overrides), announce=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    stage = commands.add_parser("stage", help="self-play data, score before, fine-tune, score after")
    data = commands.add_parser("data", help="self-play data only: <output>/{train,test}.parquet")
    score = commands.add_parser("score", help="the held-out score of one model on a test.parquet")
    for sub in (stage, data):
        recipes = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem not in ("base", "sft"))
        sub.add_argument("--env", required=True, choices=recipes, help="the recipe whose training envs are played")
        sub.add_argument("--output", type=Path, required=True, help="output folder")
        sub.add_argument("--train-episodes", type=int, default=1280,
                         help="self-play episodes for training (SPA: 1,280)")
        sub.add_argument("--test-episodes", type=int, default=64, help="held-out episodes (their own start states)")
        sub.add_argument("--seed", type=int, default=0, help="first train seed; the test seeds follow")
        sub.add_argument("--max-train-turns", type=int, default=6400, help="training rows kept at most (SPA: 6,400)")
        sub.add_argument("--temperature", type=float, help="self-play sampling temperature (default: the recipe's)")
        sub.add_argument("--play-format", default="world_model", choices=PLAY_FORMATS,
                         help="world_model (SPA): the model plays asked for the state spans, each row's prompt is "
                              "what it saw; recipe: it plays in the recipe's own format (where a small model names "
                              "valid moves), each row's prompt is the world-model prompt of the same turn")
        sub.add_argument("--response-length", type=int,
                         help="tokens per self-play reply (default: 256 for world_model, room for two states; "
                              "the recipe's for recipe)")
        sub.add_argument("--episodes-per-rollout", type=int, default=64, help="episodes played side by side")
        sub.add_argument("overrides", nargs="*", help="Hydra overrides of the recipe, e.g. model_path=... "
                                                      "es_manager.train.env_configs.tags=[CoordSokoban]")
    stage.add_argument("--nproc", type=int, default=1, help="torchrun ranks for fine-tuning (GPUs, or CPU processes)")
    stage.add_argument("--epochs", type=int, default=5, help="passes over the training turns (SPA: 5)")
    stage.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (SPA: 1e-4)")
    stage.add_argument("--batch-size", type=int, default=16, help="turns per optimizer step (SPA: 16)")
    stage.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning (SPA); else a LoRA adapter")
    stage.add_argument("--sft", action="append", default=[], metavar="KEY=VALUE",
                       help="a key of ragen/sft/trainer.py's SFTConfig, e.g. --sft trainer.micro_batch_size_per_gpu=4")
    for sub in (stage, score):
        sub.add_argument("--score-turns", type=int, default=256, help="held-out turns scored at most")
        sub.add_argument("--score-batch-size", type=int, default=32, help="prompts per generate call")
    score.add_argument("--data", type=Path, required=True, help="a test.parquet of `data` or `stage`")
    score.add_argument("--model-path", required=True, help="the model to score (anything model_path takes)")
    score.add_argument("--engine", default="torch", choices=sorted(ROLLOUT_ENGINES), help="rollout engine")
    score.add_argument("--train-data", type=Path,
                       help="the train.parquet beside it: also score the turns whose state it never shows")
    score.add_argument("--json", type=Path, help="also write the scores here")
    args = parser.parse_args(argv)
    quiet_libraries()  # no weight-loading bars at every engine start

    if args.command == "score":
        result = score_model(args.model_path, args.data, args.score_turns, args.score_batch_size,
                             engine_name=args.engine, train_file=args.train_data)
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
        return
    if args.train_episodes < 1 or args.test_episodes < 1 or args.max_train_turns < 1:
        parser.error("--train-episodes, --test-episodes and --max-train-turns must be >= 1")
    cfg = recipe(args)
    if args.seed < 0 or args.seed + args.train_episodes + args.test_episodes > cfg.trainer.val_seed:
        parser.error(f"seeds must lie in [0, {cfg.trainer.val_seed}): the validation start states of training "
                     "(trainer.val_seed) begin there")
    if args.command == "stage":
        if any(o.split("=", 1)[0].lstrip("+~") == "lora.rank" for o in args.sft):
            parser.error("set a LoRA rank with --lora-rank, not --sft lora.rank=...: the stage merges the adapter "
                         "before scoring it")
    if args.command == "data":
        write_data(cfg, args.output, args.train_episodes, args.test_episodes, args.seed, args.max_train_turns,
                   args.play_format, args.episodes_per_rollout)
    else:
        run_stage(args)


if __name__ == "__main__":
    main()
