"""The SFT warm start: expert data in the RL format, LoRA fine-tuning under torchrun, merging, RL from the result."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from ragen.config import ConfigError
from ragen.overrides import load_config
from ragen.context_manager import ContextManager, parse_reply, reply_spans
from ragen.env_state_manager import EPISODE_STREAM
from ragen.envs.utils import reseed
from ragen.envs import make_env
from ragen.envs.baselines import ORACLE_PLANS
from ragen.sft.data import expert_episodes, main as generate_main, tokenizer_fingerprint
from ragen.sft.trainer import load_split
from verl.utils.model import eos_token_ids

REPO = Path(__file__).parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


# The Sokoban recipe in whole turns with thinking (the recipe itself plays one move a turn without thinking)
THINKING = ["agent_proxy.enable_think=true", "agent_proxy.max_actions_per_turn=2", "agent_proxy.max_turn=5",
            "agent_proxy.max_context_window=-1", "es_manager.train.env_configs.tags=[SimpleSokoban]"]


def replay(row: dict, recipe: str, tokenizer, model_path: str, overrides=()) -> tuple[list[int], list[int]]:
    """The conversation rebuilt by hand from its turns with the RL context manager, the env and the oracle's replies."""
    cfg = load_config(recipe, list(overrides))
    spec = cfg.custom_envs[row["tag"]]
    env = make_env(spec.env_type, dict(spec.env_config))
    context = ContextManager.for_envs(tokenizer, cfg.agent_proxy, {row["tag"]: env}, eos_token_ids(model_path, tokenizer))
    obs, _ = env.reset(seed=row["seed"])
    reseed(env, [row["seed"], EPISODE_STREAM, 0])  # as the env-state manager does: the data uses groups of one
    actions_left = spec.max_actions_per_traj
    trajectory = context.start(row["tag"], obs, actions_left)
    turns = json.loads(row["turns"])
    for k, turn in enumerate(turns):
        assert turn["state"] == obs
        reply = tokenizer.encode(turn["response"].removeprefix(context.reply_open), add_special_tokens=False)
        context.add_response(trajectory, reply, [0.0] * len(reply))
        for action in turn["actions"]:
            obs, _, terminated, truncated, _ = env.step(action)
            actions_left -= 1
        if k + 1 < len(turns):
            assert context.add_observation(trajectory, obs, turn["reward"], actions_left,
                                           cfg.actor_rollout_ref.rollout.response_length)
    return trajectory.input_ids, trajectory.loss_mask


def test_sokoban_data_matches_the_context_manager_token_for_token(bundled_model_path, tokenizer):
    table = expert_episodes(load_config("sokoban", THINKING), range(100, 112), "train")
    rows = table.to_pylist()
    assert [r["seed"] for r in rows] == list(range(100, 112))
    assert sum(r["success"] for r in rows) >= 10  # BFS solves nearly every 6x6 one-box level within 10 actions
    for row in rows:
        input_ids, loss_mask = replay(row, "sokoban", tokenizer, bundled_model_path, THINKING)
        assert row["input_ids"] == input_ids and row["loss_mask"] == loss_mask
        assert row["text"] == tokenizer.decode(input_ids)
        turns = json.loads(row["turns"])
        spans = reply_spans(row["loss_mask"])
        assert len(spans) == len(turns) == row["num_turns"]
        for (start, end), turn in zip(spans, turns):  # the trained tokens are exactly the replies
            assert "<think>" + tokenizer.decode(row["input_ids"][start:end]) == turn["response"]
            parsed = parse_reply(turn["response"], True, "||", 2)
            assert parsed.format_ok and parsed.actions == turn["actions"] and turn["format_ok"]
    metadata = table.schema.metadata
    assert metadata[b"ragen.tokenizer"].decode() == tokenizer_fingerprint(tokenizer)


def test_the_oracle_plays_the_first_moves_of_a_bfs_solution(bundled_model_path):
    row = expert_episodes(load_config("sokoban", THINKING), range(7, 8), "train").to_pylist()[0]
    env = make_env("sokoban", dict(load_config("sokoban").custom_envs["SimpleSokoban"].env_config))
    env.reset(seed=7)
    plan = ORACLE_PLANS[type(env)](env)
    played = [a for turn in json.loads(row["turns"]) for a in turn["actions"]]
    assert played == plan[:10] and row["success"] == (len(plan) <= 10)
    assert all(len(turn["actions"]) <= 2 for turn in json.loads(row["turns"]))  # max_actions_per_turn


def test_describe_state_puts_the_env_description_first_in_the_thought(bundled_model_path, tokenizer):
    cfg = load_config("sokoban", THINKING)
    rows = expert_episodes(cfg, range(20, 24), "train", describe_state=True).to_pylist()
    plain = expert_episodes(cfg, range(20, 24), "train").to_pylist()
    env = make_env("sokoban", dict(cfg.custom_envs["SimpleSokoban"].env_config))
    for row, plain_row in zip(rows, plain):
        input_ids, loss_mask = replay(row, "sokoban", tokenizer, bundled_model_path, THINKING)
        assert row["input_ids"] == input_ids and row["loss_mask"] == loss_mask
        turns, plain_turns = json.loads(row["turns"]), json.loads(plain_row["turns"])
        assert [t["actions"] for t in turns] == [t["actions"] for t in plain_turns]  # the same play
        env.reset(options={"room": turns[0]["state"]})
        first = plain_turns[0]["response"].removeprefix("<think>")
        assert turns[0]["response"] == f"<think>{env.describe()} {first}"
    with pytest.raises(ValueError, match="describe"):
        expert_episodes(load_config("bandit"), range(0, 1), "train", describe_state=True)
    with pytest.raises(ValueError, match="enable_think"):
        expert_episodes(load_config("sokoban", ["agent_proxy.enable_think=false"]), range(0, 1), "train",
                        describe_state=True)


@pytest.mark.parametrize("window", [-1, 1])
def test_per_move_rows_are_the_prompts_the_model_saw(window, bundled_model_path, tokenizer):
    overrides = [*THINKING, "agent_proxy.max_actions_per_turn=1", "agent_proxy.max_turn=10",
                 f"agent_proxy.max_context_window={window}"]
    rows = expert_episodes(load_config("sokoban", overrides), range(100, 104), "train", per_move=True).to_pylist()
    episodes = {r["seed"]: r for r in expert_episodes(load_config("sokoban", overrides), range(100, 104), "train").to_pylist()}
    for seed, episode in episodes.items():
        moves = [r for r in rows if r["seed"] == seed]
        turns = json.loads(episode["turns"])
        assert len(moves) == len(turns) >= 3 and all(r["num_turns"] == 1 for r in moves)
        spans = reply_spans(episode["loss_mask"])
        for k, (move, (start, end)) in enumerate(zip(moves, spans)):
            assert json.loads(move["turns"]) == [turns[k]]
            (move_start, move_end), = reply_spans(move["loss_mask"])  # exactly one reply, at the end
            assert move_end == len(move["input_ids"])
            assert move["input_ids"][move_start:] == episode["input_ids"][start:end]  # the expert's one-action reply
            assert len(parse_reply(turns[k]["response"], True, "||", 10).actions) == 1
            prompt = move["input_ids"][:move_start]
            if window < 0:  # the whole history: the episode up to this reply
                assert prompt == episode["input_ids"][:start]
            else:  # the system message, then this turn's state alone
                system = len(os.path.commonprefix([moves[0]["input_ids"], moves[1]["input_ids"]]))
                shown = tokenizer.decode(prompt[system:])
                assert prompt[:system] == episode["input_ids"][:system]
                assert prompt[system:] == episode["input_ids"][start - (len(prompt) - system):start]
                assert f"Turn {k + 1}. State:" in shown and (k == 0 or f"Turn {k}. State:" not in shown)
    with pytest.raises(ValueError, match="max_actions_per_turn=1"):
        expert_episodes(load_config("sokoban", ["agent_proxy.max_actions_per_turn=2"]), range(0, 1), "train",
                        per_move=True)


def test_noisy_turns_are_played_but_not_samples(bundled_model_path):
    """--noise: a random move now and then; the rows are the oracle's replies from wherever the player stands."""
    from ragen.envs.frozen_lake import oracle_action

    overrides = ["es_manager.train.env_configs.tags=[CoordFrozenLake]", "agent_proxy.max_actions_per_turn=1",
                 "agent_proxy.max_turn=20", "agent_proxy.max_context_window=1"]
    cfg = load_config("frozen_lake", overrides)
    seeds = range(300, 316)
    clean = expert_episodes(cfg, seeds, "train", per_move=True)
    noisy = expert_episodes(cfg, seeds, "train", per_move=True, noise=0.5)
    assert json.loads(noisy.schema.metadata[b"ragen.noise"]) == 0.5
    spec = cfg.custom_envs["CoordFrozenLake"]
    env = make_env(spec.env_type, dict(spec.env_config)).unwrapped
    for row in noisy.to_pylist():
        (turn,) = json.loads(row["turns"])
        env.reset(seed=row["seed"])  # the map; then stand where the state says the player is
        row_col = turn["state"].split("Player: (")[1].split(")")[0]
        env.lake.s = int(row_col.split(", ")[0]) * env.desc.shape[1] + int(row_col.split(", ")[1])
        # every sample is the oracle's move from its state (a random move would match one time in four)
        assert turn["actions"] == [oracle_action(env)]
    off_path = {json.loads(r["turns"])[0]["state"] for r in noisy.to_pylist()} - \
        {json.loads(r["turns"])[0]["state"] for r in clean.to_pylist()}
    assert len(off_path) >= 10  # states the expert alone never visits
    with pytest.raises(ValueError, match="needs --per-move"):
        expert_episodes(cfg, seeds, "train", noise=0.2)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        expert_episodes(cfg, seeds, "train", per_move=True, noise=1.0)


def test_a_learner_plays_and_the_expert_labels_the_states_it_reaches(bundled_model_path, tiny_model_path):
    """--learner (DAgger): the model's replies are played (a random model's garble moves nothing, so it stays at
    the start and every turn is a sample of the start state), each sample is the oracle's reply there."""
    from ragen.envs.sokoban import solve_env

    cfg = load_config("sokoban", ["agent_proxy.max_turn=3"])
    seeds = range(500, 504)
    table = expert_episodes(cfg, seeds, "train", per_move=True, learner=tiny_model_path)
    assert json.loads(table.schema.metadata[b"ragen.learner"]) == tiny_model_path
    rows = table.to_pylist()
    assert sorted({row["seed"] for row in rows}) == list(seeds) and len(rows) == 3 * len(seeds)  # 3 turns each
    spec = cfg.custom_envs["CoordSokoban"]
    env = make_env(spec.env_type, dict(spec.env_config))
    for row in rows:
        (turn,) = json.loads(row["turns"])
        obs, _ = env.reset(seed=row["seed"])
        assert turn["state"] == obs  # the learner moved nothing
        assert turn["actions"] == solve_env(env.unwrapped)[:1] != turn["played"]
        assert row["text"].endswith(f"<|im_start|>assistant\n<answer>{turn['actions'][0]}</answer>")
        assert turn["response"] == f"<answer>{turn['actions'][0]}</answer>"
    with pytest.raises(ValueError, match="--learner needs --per-move"):
        expert_episodes(cfg, seeds, "train", learner=tiny_model_path)


def test_append_to_aggregates_data_of_one_recipe_on_other_start_states(tmp_path, bundled_model_path):
    """--append-to (DAgger's aggregate): the earlier rows, then the new; refused for another recipe's rows or shared
    start states, which would mix formats or count a level twice."""
    generate_main(["--env", "bandit", "--train-size", "3", "--test-size", "0", "--output", str(tmp_path / "a")])
    generate_main(["--env", "bandit", "--train-size", "2", "--test-size", "0", "--seed", "3", "--output",
                   str(tmp_path / "b"), "--append-to", str(tmp_path / "a" / "train.parquet")])
    assert pq.read_table(tmp_path / "b" / "train.parquet").column("seed").to_pylist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="already holds start states 2..2"):
        generate_main(["--env", "bandit", "--train-size", "2", "--test-size", "0", "--seed", "2", "--output",
                       str(tmp_path / "c"), "--append-to", str(tmp_path / "a" / "train.parquet")])
    with pytest.raises(ValueError, match="another tags"):
        generate_main(["--env", "sokoban", "--train-size", "1", "--test-size", "0", "--seed", "9", "--output",
                       str(tmp_path / "c"), "--append-to", str(tmp_path / "a" / "train.parquet")])


@pytest.mark.parametrize("recipe", ["sokoban", "frozen_lake", "bandit", "countdown"])
def test_every_recipe_with_an_oracle_gets_well_formed_data(recipe, bundled_model_path, tokenizer):
    rows = expert_episodes(load_config(recipe), range(0, 3), "test").to_pylist()
    for row in rows:
        input_ids, loss_mask = replay(row, recipe, tokenizer, bundled_model_path)
        assert row["input_ids"] == input_ids and row["loss_mask"] == loss_mask
        assert all(turn["format_ok"] for turn in json.loads(row["turns"]))


def test_cli_writes_disjoint_train_and_test_seeds(tmp_path, bundled_model_path, capsys):
    generate_main(["--env", "bandit", "--train-size", "5", "--test-size", "3", "--seed", "40",
                   "--output", str(tmp_path)])
    train, test = pq.read_table(tmp_path / "train.parquet"), pq.read_table(tmp_path / "test.parquet")
    assert train.column("seed").to_pylist() == list(range(40, 45))
    assert test.column("seed").to_pylist() == list(range(45, 48))
    assert "oracle success" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(SystemExit):
        generate_main(["--env", "bandit", "--train-size", "0"])
    with pytest.raises(SystemExit):
        generate_main(["--env", "sokobn"])
    assert "unknown recipe 'sokobn'" in capsys.readouterr().err


def test_distinct_boards_skips_the_seeds_of_boards_already_in_the_data(tmp_path, bundled_model_path):
    """--distinct-boards: train and test episodes are all different boards, the first such seeds from --seed on."""
    generate_main(["--env", "frozen_lake", "--train-size", "70", "--test-size", "6", "--distinct-boards",
                   "--output", str(tmp_path)])
    train, test = (pq.read_table(tmp_path / f"{split}.parquet").column("seed").to_pylist() for split in ("train", "test"))
    seeds = sorted(set(train)) + sorted(set(test))
    cfg = load_config("frozen_lake")
    spec = cfg.custom_envs[cfg.es_manager.train.env_configs.tags[0]]
    env = make_env(spec.env_type, dict(spec.env_config))
    boards = [env.reset(seed=seed)[0] for seed in seeds]
    assert len(set(train)) == 70 and len(set(test)) == 6 and len(set(boards)) == 76 and seeds == sorted(seeds)
    skipped = set(range(seeds[-1])) - set(seeds)
    assert skipped and all(env.reset(seed=seed)[0] in boards for seed in skipped)  # 4x4 maps repeat within 76 seeds


def test_warm_start_sends_options_to_the_data_and_keys_to_the_trainer(tmp_path, tiny_model_path):
    """sft/warm_start.sh: --option=value, --flag and the recipe's env/agent keys to ragen.sft.data, other key=value
    to the trainer, the data kept in the output and reused by a call with the same data options; others are
    refused while the output holds a model trained on that data."""
    out = tmp_path / "warm"

    def warm_start(*data_options, returncode=0):
        done = subprocess.run(["bash", str(REPO / "sft" / "warm_start.sh"), "sokoban", str(out), *data_options,
                               "--test-size=2", f"model.path={tiny_model_path}", "trainer.total_training_steps=1",
                               "trainer.train_batch_size=8", "eval.max_turns=0"],
                              capture_output=True, text=True, cwd=tmp_path, env=os.environ | {"HF_HUB_OFFLINE": "1"})
        assert done.returncode == returncode, done.stderr[-2000:]
        return "reusing the expert data" in done.stdout if returncode == 0 else done.stderr

    options = ("--noise=0.3", "--describe-state", "--train-size=6", "agent_proxy.enable_think=true")  # a bare flag too
    assert not warm_start(*options)
    assert warm_start(*options)  # a second sitting with the same data options
    train = pq.read_table(out / "data" / "train.parquet")
    assert json.loads(train.schema.metadata[b"ragen.noise"]) == 0.3
    assert sorted(set(train.column("seed").to_pylist())) <= list(range(6))
    assert (out / "model.safetensors").is_file() and (out / "sft_state.json").is_file()
    assert json.loads((out / "sft_state.json").read_text())["step"] == 1
    assert "Board size" in train.column("text")[0].as_py() and "The player is at" in train.column("text")[0].as_py()
    # other data options: refused while the folder holds a model trained on the old data (which stays), made anew
    # once it does not; the recipe's env and agent keys go to the data, so that the expert plays the board as RL
    # will show it
    other_options = ("--train-size=4", "custom_envs.CoordSokoban.env_config.observation_format=grid")
    assert "holds a model trained on expert data made with other options" in warm_start(*other_options, returncode=2)
    assert pq.read_table(out / "data" / "train.parquet").equals(train)
    (out / "sft_state.json").unlink()
    assert not warm_start(*other_options)
    other = pq.read_table(out / "data" / "train.parquet")
    assert other.num_rows < train.num_rows and "Board size" not in other.column("text")[0].as_py()


@pytest.mark.parametrize("family", ["idefics3"])  # the Qwen2-VL family passed too (its processor's saving: test_vlm)
def test_a_warm_start_on_pictures_trains_a_vision_language_model(family, tmp_path, tiny_model_path, tokenizer):
    """sft/warm_start.sh with a vision-language model_path and Sokoban on pictures alone: each per-move sample
    holds the picture its prompt showed (a PNG), the trainer feeds it to the model (the vision tower learns),
    scores greedy replies from pictures, and the saved folder is a complete model_path (its processor with it)."""
    from transformers import AutoModelForImageTextToText

    from ragen.envs.utils import from_png
    from tests.conftest import save_tiny_qwen_vl
    from verl.utils.model import load_processor
    from verl.utils.vlm import build_vlm

    vlm = str(build_vlm(tiny_model_path, tmp_path / "vlm", vision_width=32, vision_layers=1, vision_heads=2)
              if family == "idefics3" else save_tiny_qwen_vl(tmp_path / "vlm", tokenizer))
    out = tmp_path / "warm"
    done = subprocess.run(["bash", str(REPO / "sft" / "warm_start.sh"), "sokoban", str(out), f"model_path={vlm}",
                           "+custom_envs.CoordSokoban.env_config.image_observation=alone", "--train-size=2",
                           "--test-size=1", "trainer.total_training_steps=2", "trainer.train_batch_size=4",
                           "trainer.micro_batch_size_per_gpu=2", "eval.max_turns=2", "eval.max_new_tokens=4",
                           "optim.lr=1e-3"],
                          capture_output=True, text=True, cwd=tmp_path, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    train = pq.read_table(out / "data" / "train.parquet")
    pictures = train.column("images").to_pylist()
    assert all(len(row) == 1 and from_png(row[0]).shape == (96, 96, 3) for row in pictures)  # window 1: one state
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "val/action_accuracy" in metrics[-1] and metrics[-1]["val/format_accuracy"] >= 0  # replies to pictures
    assert load_processor(str(out)) is not None
    before = AutoModelForImageTextToText.from_pretrained(vlm).state_dict()
    after = AutoModelForImageTextToText.from_pretrained(str(out)).state_dict()
    tower = "vision_model" if family == "idefics3" else "visual"
    assert any(tower in key and not torch.equal(before[key], after[key]) for key in before)


def test_data_for_another_tokenizer_is_refused(tmp_path, bundled_model_path, tokenizer):
    generate_main(["--env", "bandit", "--train-size", "2", "--test-size", "0", "--output", str(tmp_path)])
    assert len(load_split(str(tmp_path / "train.parquet"), tokenizer, 4096)) == 2
    other = type(tokenizer).from_pretrained(bundled_model_path)
    other.chat_template = other.chat_template.replace("<|im_start|>", "<|im_start|> ")
    with pytest.raises(ConfigError, match="regenerate the data"):
        load_split(str(tmp_path / "train.parquet"), other, 4096)
    with pytest.raises(ConfigError, match="max_length"):
        load_split(str(tmp_path / "train.parquet"), tokenizer, 16)
    with pytest.raises(ConfigError, match="generate_data.sh"):
        load_split(str(tmp_path / "missing.parquet"), tokenizer, 4096)


@pytest.fixture(scope="module")
def sokoban_data(tmp_path_factory, bundled_model_path) -> Path:
    folder = tmp_path_factory.mktemp("sft_data")
    subprocess.run(["bash", str(REPO / "sft" / "generate_data.sh"), "sokoban", "--train-size", "16", "--test-size",
                    "4", "--output", str(folder)], check=True, env=ENV, capture_output=True)
    return folder


def finetune_command(data: Path, model_path: str, save_path: Path, ranks: int, *overrides: str) -> list[str]:
    return ["bash", str(REPO / "sft" / "finetune_lora.sh"), "sokoban", str(ranks), str(save_path),
            f"model_path={model_path}", f"data.train_file={data / 'train.parquet'}",
            f"data.test_file={data / 'test.parquet'}", "trainer.train_batch_size=8", "trainer.total_epochs=2",
            "optim.lr=1e-2", "optim.lr_warmup_steps=0", "lora.rank=8", "lora.alpha=16", "eval.max_turns=4",
            "eval.max_new_tokens=8",
            # fp32: ranks cut their micro-batches to other widths, and bf16 results depend on the shapes
            "model.dtype=float32",
            *overrides]


def finetune(data: Path, model_path: str, save_path: Path, ranks: int, *overrides: str) -> list[dict]:
    command = finetune_command(data, model_path, save_path, ranks, *overrides)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads(line) for line in (save_path / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_rank_run(sokoban_data, tiny_model_path, tmp_path_factory) -> tuple[Path, list[dict]]:
    save_path = tmp_path_factory.mktemp("sft_one_rank")
    return save_path, finetune(sokoban_data, tiny_model_path, save_path, 1)


def test_sft_lowers_the_loss_and_saves_a_peft_adapter(one_rank_run):
    save_path, metrics = one_rank_run
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]  # 16 conversations / 8 per step x 2 epochs
    assert metrics[-1]["val/loss"] < metrics[0]["val/loss"] - 0.05
    assert metrics[-1]["sft/loss"] < metrics[1]["sft/loss"]
    for m in (metrics[0], metrics[2], metrics[4]):  # before training and after each epoch
        assert 0.0 <= m["val/format_accuracy"] <= 1.0 and 0.0 <= m["val/action_accuracy"] <= m["val/format_accuracy"]
    saved = {p.name for p in save_path.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "sft_config.yaml", "tokenizer.json"} <= saved
    assert json.loads((save_path / "sft_state.json").read_text())["epoch"] == 2
    assert json.loads((save_path / "adapter_config.json").read_text())["r"] == 8


def test_full_fine_tuning_saves_a_whole_model_every_test_freq_steps(sokoban_data, tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    metrics = finetune(sokoban_data, tiny_model_path, tmp_path, 1, "lora.rank=0", "trainer.total_training_steps=3",
                       "trainer.test_freq=2", "optim.lr=1e-3")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]  # 3 steps: past the 2-step epoch, into the next
    assert [("val/loss" in m) for m in metrics] == [True, False, True, True]  # every 2 steps and at the end
    assert metrics[-1]["val/loss"] < metrics[0]["val/loss"]
    assert json.loads((tmp_path / "sft_state.json").read_text())["step"] == 3
    assert not (tmp_path / "adapter_config.json").exists()
    trained = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)  # loads as model_path= does
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    changed = [k for k, v in base.state_dict().items() if not torch.equal(v, trained.state_dict()[k])]
    assert len(changed) == len(base.state_dict())  # every weight trained, not an adapter's few


def test_a_killed_run_resumes_where_its_last_save_left_it(sokoban_data, tiny_model_path, tmp_path):
    args = ("lora.rank=0", "trainer.total_training_steps=8", "trainer.test_freq=2", "optim.lr=1e-3",
            "optim.lr_warmup_steps=3")
    whole = finetune(sokoban_data, tiny_model_path, tmp_path / "whole", 1, *args)
    killed = tmp_path / "killed"
    process = subprocess.Popen(finetune_command(sokoban_data, tiny_model_path, killed, 1, *args), env=ENV,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def saved_step() -> int:  # the newest save's, also where the kill cut its move into the folder short
        for state in (killed / ".staging" / "sft_state.json", killed / "sft_state.json"):
            try:
                return json.loads(state.read_text())["step"]
            except (OSError, ValueError):
                pass
        return 0
    deadline = time.monotonic() + 300
    while saved_step() < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    for child in psutil.Process(process.pid).children(recursive=True):  # torchrun's worker has its own session
        child.kill()
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert 2 <= saved_step() < 8, "the run was not killed between its first save and its end"
    unfinished = shutil.copytree(killed, tmp_path / "unfinished")

    resumed = finetune(sokoban_data, tiny_model_path, killed, 1, *args)  # the same command again
    assert [m["step"] for m in resumed] == list(range(9))  # the log goes on from the save, steps not repeated
    for a, b in zip(whole, resumed, strict=True):
        for key in ("sft/loss", "val/loss", "sft/lr"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-6), (a["step"], key)  # same samples, same schedule
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(killed / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)
    assert not list(killed.glob("train_state_rank*.pt"))  # a finished run drops the optimizer state

    def refused(folder: Path, *overrides: str) -> str:
        result = subprocess.run(finetune_command(sokoban_data, tiny_model_path, folder, 1, *args, *overrides),
                                capture_output=True, text=True, timeout=300, env=ENV)
        assert result.returncode != 0, result.stdout[-2000:]
        return result.stderr
    assert "trainer.seed: 0 -> 1" in refused(unfinished, "trainer.seed=1")
    other_data = shutil.copytree(unfinished, tmp_path / "other_data")  # as if saved from data made otherwise
    state = json.loads((other_data / "sft_state.json").read_text())
    (other_data / "sft_state.json").write_text(json.dumps(state | {"train_data": "0" * 16}))
    assert "trained on other data" in refused(other_data)
    assert "finished run of 8 steps" in refused(killed, "trainer.total_training_steps=10")


def test_a_save_cut_short_in_its_move_is_finished_on_the_next_start(tmp_path):
    from ragen.sft.trainer import publish

    target, staging = tmp_path, tmp_path / ".staging"
    staging.mkdir()
    for name, text in (("model.safetensors", "new"), ("train_state_rank0.pt", "new"), ("sft_state.json", "new")):
        (staging / name).write_text(text)
    for name in ("model.safetensors", "train_state_rank0.pt", "train_state_rank1.pt"):
        (target / name).write_text("old")
    os.replace(staging / "model.safetensors", target / "model.safetensors")  # killed here, after one move
    publish(staging, target)
    assert {p.name: p.read_text() for p in target.iterdir()} == {
        "model.safetensors": "new", "train_state_rank0.pt": "new", "sft_state.json": "new"}  # rank 1's old state gone


def test_two_ranks_on_gloo_match_one_rank(one_rank_run, sokoban_data, tiny_model_path, tmp_path):
    _, one = one_rank_run
    two = finetune(sokoban_data, tiny_model_path, tmp_path, 2)
    for a, b in zip(one, two, strict=True):
        for key in ("sft/loss", "val/loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["step"], key)


def test_bad_sft_config_is_a_clear_error(sokoban_data, tiny_model_path, tmp_path):
    command = [sys.executable, "-m", "ragen.sft.trainer", f"model_path={tiny_model_path}",
               f"data.train_file={sokoban_data / 'train.parquet'}", f"data.test_file={sokoban_data / 'test.parquet'}",
               f"trainer.default_local_dir={tmp_path}", "trainer.train_batch_size=7"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=ENV, cwd=REPO)
    assert result.returncode != 0 and "train_batch_size=7 must be a multiple" in result.stderr
    for bad, message in (("trainer.experiment_name=../../x", "must be a name"), ("trainer.default_local_dir=/", "is /")):
        kept = [arg for arg in command[:-1] if not arg.startswith(bad.partition("=")[0] + "=")]
        result = subprocess.run(kept + [bad], capture_output=True, text=True, timeout=300, env=ENV, cwd=REPO)
        assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]


def merge(base: str, adapter: Path, output: Path) -> Path:
    subprocess.run([sys.executable, str(REPO / "sft" / "utils" / "merge_lora.py"), "--base_model_name", base,
                    "--lora_model_path", str(adapter), "--output_path", str(output)],
                   check=True, env=ENV, capture_output=True)
    return output


def test_merged_model_computes_what_base_plus_adapter_computes(one_rank_run, tiny_model_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter, _ = one_rank_run
    output = merge(tiny_model_path, adapter, tmp_path / "merged")
    input_ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(input_ids).logits
        adapted_logits = PeftModel.from_pretrained(base, str(adapter)).eval()(input_ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(output, dtype=torch.float32)(input_ids).logits
    assert not torch.allclose(adapted_logits, base_logits, atol=1e-3)  # the adapter learned something
    torch.testing.assert_close(merged_logits, adapted_logits, atol=1e-5, rtol=1e-5)
    assert (output / "model.safetensors").is_file() and (output / "tokenizer.json").is_file()


def test_merge_without_an_adapter_is_a_clear_error(tiny_model_path, tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "sft" / "utils" / "merge_lora.py"), "--base_model_name",
                             tiny_model_path, "--lora_model_path", str(tmp_path), "--output_path",
                             str(tmp_path / "out")], capture_output=True, text=True, env=ENV)
    assert result.returncode != 0 and "holds no LoRA adapter" in result.stderr
    assert not (tmp_path / "out").exists()


def test_rl_trains_from_the_merged_model(one_rank_run, tiny_model_path, tmp_path):
    from tests.test_train_e2e import read_metrics, train

    adapter, _ = one_rank_run
    merged = merge(tiny_model_path, adapter, tmp_path / "merged")
    run_dir = tmp_path / "rl"
    train("sokoban", str(merged), run_dir, "trainer.total_training_steps=1", "trainer.backend=local",
          "agent_proxy.max_turn=2")
    assert [m["step"] for m in read_metrics(run_dir)] == [0, 1]
    assert (run_dir / "global_step_1" / "actor" / "model.safetensors").is_file()
