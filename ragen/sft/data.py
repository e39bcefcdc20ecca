"""Expert conversations for the supervised warm start: `bash sft/generate_data.sh sokoban`.

The oracle agents of ragen/envs/baselines.py (BFS for Sokoban, value iteration for FrozenLake, ...) play the
recipe's training environments through the very rollout loop that RL runs (`AgentProxy`). The one thing
swapped out is the model: `ExpertPolicy` answers each prompt with the oracle's next actions in the reply
format, `<think>…</think><answer>a || b</answer>`. So the system prompt, the state messages, the chat
template, the forced opening (`<think>`, or `<answer>` without thinking), the action separator and the
per-turn action limit are those of an RL trajectory of the same recipe, token for token; SFT teaches exactly
the format RL uses.

Each row is one episode: its token ids and loss mask (1 on the reply tokens, as in RL), the rendered text, the
turns in words (state, reply, actions, reward), and the seed that reproduces it. With `--per-move` (RAGEN V1's
SFT samples) each turn holds one action and each row one move: the prompt exactly as the model saw it that
turn (the system prompt and the last `agent_proxy.max_context_window` turns, the new state included), then the
expert's reply, with the loss on that reply alone. Whole-episode rows let a model fit the expert by the turn
number (turn k of every episode looks alike); per-move rows carry the state the move must be read from. With
`--noise P` (per-move only; DART, Laskey et al. 2017) each turn plays a random move instead of the expert's with
probability P, and that move is no sample: the expert's replies from the states it leads to are, so the data
holds states off the expert's path (after a wrong push, beside a wall) and the way back from them. A state the
oracle cannot solve any more (a box pushed into a corner) gives no samples. With `--learner MODEL` (per-move
only; DAgger, Ross et al. 2011) that model plays, sampled as validation samples it (`rollout.val_kwargs`: greedy
by default), and the expert's reply at every state it reaches is a sample: the states a trained policy really
gets into, its mistakes included (a move into a wall repeated until the action budget ends), labelled with the
way on; `--append-to` puts them after the expert data, for training on from the learner. Train and test seeds never
overlap, and both lie below the validation seeds of training (`trainer.val_seed`). The file's metadata records
the recipe and a fingerprint of the tokenizer; the SFT trainer refuses data made with another tokenizer.
Image envs (`image_observation`, with a vision-language `model_path`): each per-move row also holds its prompt's
pictures, as PNG files in `images`, in the order of their image tokens; the trainer hands them to the model.

    python -m ragen.sft.data --env sokoban --train-size 1000 --test-size 64 --output data/sft/sokoban
"""

import argparse
import copy
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragen.config import CONFIG_DIR, AgentProxyConfig, EnvGroupsConfig, EnvMixConfig, RagenConfig
from ragen.context_manager import reply_text
from ragen.overrides import load_config
from ragen.create_data import write_parquet
from ragen.env_state_manager import EnvState, EnvStateManager
from ragen.envs import make_env
from ragen.envs.baselines import ORACLE_PLANS
from ragen.envs.boards import new_board_seeds
from ragen.envs.utils import png_bytes
from ragen.train import make_agent
from verl.protocol import DataProto
from verl.utils.model import load_tokenizer, resolve_model_path
from verl.workers.rollout import load_engine

EPISODES_PER_ROLLOUT = 64  # environments played side by side


class ExpertPolicy:
    """Takes the actor worker group's place in `AgentProxy`: replies with the oracle's actions.

    The oracle is privileged (it reads the true environment state), so it is handed the environments;
    `generate_sequences` gets the prompts of the unfinished environments in their order, as the loop sends them.
    """

    def __init__(self, env_manager: EnvStateManager, tokenizer, config: AgentProxyConfig, seed: int = 0,
                 describe_state: bool = False, noise: float = 0.0, learner=None, learner_sampling=None):
        self.env_manager, self.tokenizer, self.config = env_manager, tokenizer, config
        self.describe_state = describe_state  # the thought first says where things are (the env's describe())
        self.noise = noise  # the chance that a turn plays a random move instead of the expert's
        self.learner = learner  # a rollout engine whose replies are played instead of the expert's (DAgger)
        self.learner_sampling = learner_sampling  # its sampling knobs (rollout.val_kwargs)
        self.rng = np.random.default_rng([seed, 2])
        # env id -> (prompt ids, reply ids, the oracle's own reply?, the prompt's pictures, its actions) per turn
        self.moves: dict[int, list[tuple[list[int], list[int], bool, list[np.ndarray], list[str]]]] = {}

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        active = [state for state in self.env_manager.states if not state.done]
        assert len(active) == len(prompts), "the prompts are those of the unfinished environments, in order"
        replies = [self.reply(state) for state in active]
        # the prompt already ends with the forced opening tag; the reply continues after it, like a sampled one
        ids = [self.tokenizer.encode(text, add_special_tokens=False) for text, *_ in replies]
        pictures = prompts.non_tensor_batch.get("prompt_images", [[]] * len(active))  # image envs: each prompt's
        for state, prompt, reply_ids, (_, expert, actions), shown in zip(
                active, prompts.non_tensor_batch["prompt_ids"], ids, replies, pictures):
            self.moves.setdefault(state.env_id, []).append((list(prompt), reply_ids, expert, list(shown), actions))
        if self.learner is not None:  # the learner's replies are played; the expert's above are the samples
            if "prompt_images" in prompts.non_tensor_batch:
                raise ValueError("--learner plays text observations only: this env shows pictures")
            knobs = self.learner_sampling
            sampling = replace(prompts.meta_info["sampling"], temperature=knobs.temperature, top_p=knobs.top_p,
                               top_k=knobs.top_k)
            played = self.learner.generate([list(p) for p in prompts.non_tensor_batch["prompt_ids"]], sampling)
            return DataProto(non_tensor_batch={"response_ids": played.token_ids,
                                               "response_log_probs": played.log_probs})
        # written, not sampled: no rollout log-probs (the SFT data keeps only the text)
        return DataProto(non_tensor_batch={"response_ids": ids, "response_log_probs": [[0.0] * len(r) for r in ids]})

    def reply(self, state: EnvState) -> tuple[str, bool, list[str]]:
        """(the reply, whether it is the oracle's, its actions): the oracle's next actions (as many as one turn may
        hold), or a random one where it has no plan or the turn is a noisy one."""
        env = state.env.unwrapped
        if type(env) not in ORACLE_PLANS:
            raise ValueError(f"no oracle for {type(env).__name__} (env tag {state.tag!r}); add its planner to "
                             "ragen.envs.baselines.ORACLE_PLANS to generate SFT data for it")
        plan = ORACLE_PLANS[type(env)](env)[:min(self.config.max_actions_per_turn, state.actions_left)]
        expert = bool(plan) and not (self.noise and self.rng.random() < self.noise)
        actions = plan if expert else [env.sample_action(self.rng)]
        answer = f"{f' {self.config.action_sep} '.join(actions)}</answer>"
        if not self.config.enable_think:  # the prompt already opened <answer>
            return answer, expert, actions
        thought = f"The best next action{'s are' if len(actions) > 1 else ' is'} {', '.join(actions)}."
        if self.describe_state:
            if not hasattr(env, "describe"):
                raise ValueError(f"--describe-state needs a describe() method on {type(env).__name__} "
                                 f"(env tag {state.tag!r}), which says where things are in words")
            thought = f"{env.describe()} {thought}"
        return f"{thought}</think><answer>{answer}", expert, actions


def tokenizer_fingerprint(tokenizer) -> str:
    """Changes with the vocabulary, the special tokens or the chat template: what the token ids depend on."""
    content = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens,
                          tokenizer.chat_template])
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def expert_episodes(cfg: RagenConfig, seeds: Sequence[int], split: str, describe_state: bool = False,
                    per_move: bool = False, noise: float = 0.0, learner: str | None = None) -> pa.Table:
    """One row per seed: the oracle's episode from that start state, as the RL loop records it; with
    `per_move`, one row per move instead (its prompt as the model saw it, the reply, the loss on the reply), the
    moves of a turn made random (with probability `noise`) left out; with `learner` (a model path), that model
    plays and the oracle's reply at each state it reaches is the row's."""
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"--noise {noise} must be in [0, 1)")
    if noise and not per_move:
        raise ValueError("--noise needs --per-move: a whole-episode row would teach its random moves too")
    if learner is not None and (noise or not per_move):
        raise ValueError("--learner needs --per-move (the expert's replies are the samples, the learner's are "
                         "played) and no --noise (the learner's own mistakes are the moves off the expert's path)")
    if describe_state and not cfg.agent_proxy.enable_think:
        raise ValueError("--describe-state writes the description into the thought: it needs "
                         "agent_proxy.enable_think=true")
    if per_move and cfg.agent_proxy.max_actions_per_turn != 1:
        raise ValueError(f"--per-move samples hold one action each, but the recipe allows "
                         f"agent_proxy.max_actions_per_turn={cfg.agent_proxy.max_actions_per_turn}: add the override "
                         "agent_proxy.max_actions_per_turn=1 (and enough agent_proxy.max_turn for the action budget)")
    cfg = copy.deepcopy(cfg)  # the batches below rewrite its env groups and seed
    cfg.actor_rollout_ref.model.path = resolve_model_path(cfg.actor_rollout_ref.model.path)
    tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.path)
    engine = None
    if learner is not None:
        learner_path = resolve_model_path(learner)
        if tokenizer_fingerprint(load_tokenizer(learner_path)) != tokenizer_fingerprint(tokenizer):
            raise ValueError(f"--learner {learner} has another tokenizer than model_path={cfg.model_path!r}, for "
                             "which the data is tokenized: pass model_path= of the model the learner was trained from")
        engine = load_engine(learner_path, cfg.actor_rollout_ref.rollout, tokenizer)
    tags = cfg.es_manager.train.env_configs.tags
    columns: dict[str, list] = {key: [] for key in ("tag", "seed", "split", "success", "reward", "num_turns",
                                                   "input_ids", "loss_mask", "text", "turns", "images")}

    def add_row(record: dict, ids: list[int], loss_mask: list[int], turns: list[dict],
                pictures: list[np.ndarray]) -> None:
        for key, value in (("tag", record["tag"]), ("seed", record["seed"]), ("split", split),
                           ("success", record["success"]), ("reward", record["reward"]), ("num_turns", len(turns)),
                           ("input_ids", ids), ("loss_mask", loss_mask), ("text", tokenizer.decode(ids)),
                           ("turns", json.dumps(turns)), ("images", [png_bytes(p) for p in pictures])):
            columns[key].append(value)

    seeds = list(seeds)
    for first in range(0, len(seeds), EPISODES_PER_ROLLOUT):
        batch = seeds[first:first + EPISODES_PER_ROLLOUT]  # a group each, tags split as batch_tags says
        cfg.es_manager.train = EnvGroupsConfig(env_groups=len(batch), group_size=1, seeds=batch,
                                               env_configs=EnvMixConfig(tags=list(tags), n_groups=[]))
        cfg.trainer.seed = batch[0]
        agent = make_agent(cfg, "train", None, tokenizer)
        expert = ExpertPolicy(agent.env_manager, tokenizer, cfg.agent_proxy, seed=batch[0],
                              describe_state=describe_state, noise=noise, learner=engine,
                              learner_sampling=cfg.actor_rollout_ref.rollout.val_kwargs)
        agent.actor_rollout_wg = expert
        rollout = agent.rollout(step=0)
        lengths = rollout.batch.batch["attention_mask"].sum(-1).tolist()
        for i, record in enumerate(rollout.records):
            if per_move:  # the loop plays env i's turns in order, so its k-th move answered turn k
                for (prompt, reply, oracle, shown, actions), turn in zip(expert.moves[record["env_id"]],
                                                                          record["turns"]):
                    if engine is not None:  # the turn the learner played, as the expert answers it
                        turn = {"state": turn["state"], "format_ok": True, "actions": actions,
                                "response": reply_text(tokenizer, reply, agent.context.reply_open),
                                "played": turn["actions"]}
                    if oracle:
                        add_row(record, prompt + reply, [0] * len(prompt) + [1] * len(reply), [turn], shown)
                continue
            if any(shown for _, _, _, shown, _ in expert.moves[record["env_id"]]):
                raise ValueError("whole-episode rows do not carry pictures: generate the data of an image env "
                                 "with --per-move")
            ids = rollout.batch.batch["input_ids"][i, :lengths[i]].tolist()
            add_row(record, ids, rollout.batch.batch["loss_mask"][i, :lengths[i]].to(int).tolist(), record["turns"],
                    [])
    table = pa.table(columns)
    metadata = {"ragen.tokenizer": tokenizer_fingerprint(tokenizer), "ragen.model_path": cfg.model_path,
                "ragen.agent_proxy": json.dumps(asdict(cfg.agent_proxy)), "ragen.tags": json.dumps(list(tags)),
                "ragen.describe_state": json.dumps(describe_state), "ragen.per_move": json.dumps(per_move),
                "ragen.noise": json.dumps(noise), "ragen.learner": json.dumps(learner)}
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})


def batch_tags(tags: Sequence[str], episodes: int) -> list[str]:
    """The tag of each of `episodes` episodes, in order, as expert_episodes plays them (batches of
    EPISODES_PER_ROLLOUT, each split evenly over the tags)."""
    mix = EnvMixConfig(tags=list(tags), n_groups=[])
    return [tag for first in range(0, episodes, EPISODES_PER_ROLLOUT)
            for tag in mix.group_tags(min(EPISODES_PER_ROLLOUT, episodes - first))]


def distinct_board_seeds(cfg: RagenConfig, start: int, sizes: Sequence[int]) -> list[int]:
    """The first seeds from `start` on whose start boards differ from each other's (per training tag), as many as
    the splits' `sizes` add up to, in the order expert_episodes plays each split (ragen/envs/boards.py)."""
    tags = [tag for size in sizes for tag in batch_tags(cfg.es_manager.train.env_configs.tags, size)]
    envs = {tag: make_env(cfg.custom_envs[tag].env_type, dict(cfg.custom_envs[tag].env_config)) for tag in set(tags)}
    return new_board_seeds(tags, envs, start)


def appended(earlier: pa.Table, new: pa.Table, path: Path) -> pa.Table:
    """`earlier`'s rows, then `new`'s, under `new`'s metadata; refused unless both are samples of the same recipe
    (env tags, reply format) for the same tokenizer, from start states none of them share."""
    before = {k.decode(): v.decode() for k, v in (earlier.schema.metadata or {}).items()}
    after = {k.decode(): v.decode() for k, v in new.schema.metadata.items()}
    for key in ("ragen.tokenizer", "ragen.tags", "ragen.agent_proxy", "ragen.per_move", "ragen.describe_state"):
        if before.get(key) != after[key]:
            raise ValueError(f"--append-to {path} was made with another {key.removeprefix('ragen.')} "
                             f"(that file: {before.get(key)}; this call: {after[key]}): give this call the overrides "
                             "and options that made it")
    shared = set(earlier.column("seed").to_pylist()) & set(new.column("seed").to_pylist())
    if shared:
        raise ValueError(f"--append-to {path} already holds start states {min(shared)}..{max(shared)}: give --seed "
                         "a start past its seeds")
    return pa.concat_tables([earlier.select(new.column_names).cast(new.schema), new])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", required=True, help="a recipe in config/ (sokoban, frozen_lake, bandit, countdown): "
                                                     "its training envs, reply format and model's tokenizer")
    parser.add_argument("--train-size", type=int, default=1000, help="episodes in train.parquet")
    parser.add_argument("--test-size", type=int, default=64, help="episodes in test.parquet")
    parser.add_argument("--seed", type=int, default=0, help="first train seed; test seeds follow the train seeds")
    parser.add_argument("--output", type=Path, help="folder for train/test.parquet (default data/sft/<env>)")
    parser.add_argument("--describe-state", action="store_true",
                        help="the expert's thought first says where things are (the env's describe(); Sokoban: "
                             "the rows and columns of the player, box and target), then names its actions")
    parser.add_argument("--per-move", action="store_true",
                        help="one row per move (RAGEN V1's samples): the prompt as the model saw it that turn, then "
                             "the expert's one-action reply; needs agent_proxy.max_actions_per_turn=1")
    parser.add_argument("--noise", type=float, default=0.0,
                        help="with --per-move: the chance that a turn plays a random move (not a sample), so that "
                             "the expert's replies from states off its path are samples too (DART)")
    parser.add_argument("--learner", help="with --per-move: a model (a warm start's folder) that plays instead of "
                                           "the expert, sampled as in validation; the expert's reply at each state "
                                           "it reaches is a sample (DAgger)")
    parser.add_argument("--distinct-boards", action="store_true",
                        help="skip a seed whose start board an earlier seed already gave (small boards repeat: 2,000 "
                             "Sokoban seeds hold 1,569 levels), so that the train and test episodes are all "
                             "different boards; the seeds then reach past --seed + --train-size + --test-size")
    parser.add_argument("--append-to", type=Path,
                        help="an earlier train.parquet of the same recipe and tokenizer: the new train.parquet holds "
                             "its rows, then the new ones (DAgger's aggregated data); their seeds must not overlap")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the recipe, e.g. agent_proxy.max_turn=3")
    args = parser.parse_args(argv)
    if args.train_size < 1 or args.test_size < 0:
        parser.error("--train-size must be >= 1 and --test-size >= 0")
    if not 0.0 <= args.noise < 1.0 or (args.noise and not args.per_move):
        parser.error("--noise must be in [0, 1) and needs --per-move (a whole-episode row would teach the random moves)")
    recipes = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem not in ("base", "sft"))
    if args.env not in recipes:
        parser.error(f"unknown recipe {args.env!r}; the recipes in config/ are {recipes}")
    cfg = load_config(args.env, args.overrides, announce=True)
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    sizes = (args.train_size, args.test_size)
    picked = distinct_board_seeds(cfg, args.seed, sizes) if args.distinct_boards else \
        list(range(args.seed, args.seed + sum(sizes)))
    if picked[-1] >= cfg.trainer.val_seed:
        parser.error(f"seeds must lie in [0, {cfg.trainer.val_seed}): the validation start states of training "
                     f"(trainer.val_seed) begin there (these reach {picked[-1]})")
    output = args.output or Path("data/sft") / args.env

    for split, seeds in (("train", picked[:args.train_size]), ("test", picked[args.train_size:])):
        if not seeds:
            continue
        start = time.perf_counter()
        table = expert_episodes(load_config(args.env, args.overrides), seeds, split, args.describe_state,
                                args.per_move, args.noise, args.learner)
        if split == "train" and args.append_to:
            table = appended(pq.read_table(args.append_to), table, args.append_to)
        write_parquet(table, output / f"{split}.parquet")
        episodes = {seed: ok for seed, ok in zip(table.column("seed").to_pylist(), table.column("success").to_pylist())}
        tokens = sum(len(ids) for ids in table.column("input_ids").to_pylist())
        rows = f"{table.num_rows} moves of {len(episodes)} episodes" if args.per_move else f"{table.num_rows} episodes"
        print(f"{output / f'{split}.parquet'}: {rows}, {tokens} tokens, "
              f"{'the learner' if args.learner else 'oracle'} success "
              f"{np.mean(list(episodes.values())):.3f} ({time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
