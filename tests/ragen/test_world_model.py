"""The world-model warm start (SPA): reply format, ground-truth substitution, rows, scorer, the whole stage."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ragen.config import AgentProxyConfig, ConfigError
from ragen.overrides import load_config
from ragen.context_manager import ContextManager, parse_reply
from ragen.env_state_manager import EPISODE_STREAM
from ragen.create_data import write_parquet
from ragen.envs.utils import reseed
from ragen.envs import make_env
from ragen.sft import world_model
from ragen.sft.trainer import load_split
from ragen.sft.world_model import model_thought, rewrite_turns, score_replies, self_play_rows, turn_rows
from ragen.world_model_reward import parse_state
from verl.utils.model import eos_token_ids
from verl.workers.rollout import Generation

GRID = "#####\n#P_O#\n#_X_#\n#####"
COORD_STATE = ("Board size: 4 rows x 5 cols (zero-indexed).\nTargets: (1, 3)\nBoxes: (2, 2)\nPlayer: (1, 1)\n"
               "Grid:\n" + GRID)


class ScriptedEngine:
    """A rollout engine whose k-th call answers every prompt with `replies[k]` (the text after `<think>`)."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer, self.replies, self.calls = tokenizer, replies, 0

    def generate(self, prompt_ids, sampling) -> Generation:
        ids = self.tokenizer.encode(self.replies[self.calls % len(self.replies)], add_special_tokens=False)
        self.calls += 1
        return Generation([list(ids) for _ in prompt_ids], [[0.0] * len(ids) for _ in prompt_ids])


# ---- the reply format ----------------------------------------------------------------------------------
def test_world_model_prompts_ask_for_the_state_spans(tokenizer):
    config = AgentProxyConfig(reply_format="world_model")
    context = ContextManager(tokenizer, config, {"Toy": "Rules."}, {"Toy": ("Left",)}, [tokenizer.eos_token_id])
    system, message = context._system_prompt("Toy"), context._state_message("Toy", GRID, 1, 10, None)
    assert "<observation>the current state</observation>I think Left is a good move." in system
    assert "<prediction>the state after Left</prediction></think><answer>Left</answer>" in system
    assert "<observation>...</observation>...<prediction>...</prediction></think><answer>...</answer>" in message
    plain = ContextManager(tokenizer, AgentProxyConfig(), {"Toy": "Rules."}, {"Toy": ("Left",)}, [0])
    assert "<observation>" not in plain._system_prompt("Toy") + plain._state_message("Toy", GRID, 1, 10, None)


def test_the_state_spans_do_not_break_the_strict_parser():
    reply = (f"<think><observation>\n{GRID}\n</observation>\ngo<prediction>\n{GRID}\n</prediction></think>"
             "<answer>Left || Up</answer>")
    assert parse_reply(reply, True, "||", 2).actions == ["Left", "Up"]
    assert not parse_reply("<think><observation>a</observation><think>b</think><answer>Left</answer>", True, "||",
                           2).format_ok  # a think tag inside the thought is still malformed


def test_a_bad_reply_format_is_a_config_error(tokenizer):
    for config, match in ((AgentProxyConfig(reply_format="spa"), "reply_format='spa'"),
                          (AgentProxyConfig(reply_format="world_model", enable_think=False), "enable_think=true")):
        with pytest.raises(ConfigError, match=match):
            ContextManager(tokenizer, config, {"Toy": "Rules."}, {"Toy": ("Left",)}, [0])


# ---- the substitution ----------------------------------------------------------------------------------
@pytest.mark.parametrize("reply, thought", [
    ("<think>I push the box.</think><answer>Left</answer>", "I push the box."),
    ("<think><observation>## P</observation> go  left <prediction>#P#</prediction></think><answer>Left</answer>",
     "go left"),
    ("<think>hmm <observation>#####\n#P_", "hmm"),  # cut off inside the state: nothing of it is kept
    ("<think>no close<answer>Left</answer>", "no close"),
    ("<think>a<think>b</observation></think><answer>Up</answer>", "a b"),  # stray tags go
    ("<think></think><answer>Up</answer>", ""),
    ("<think>just words", "just words"),
])
def test_thought_is_the_models_free_text(reply, thought):
    assert model_thought(reply) == thought


def episode_record(states: list[str], turns: list[tuple[str, list[str], list[bool]]]) -> dict:
    """An `AgentProxy` record: turn k answered states[k]; the last state is the final one."""
    return {"tag": "Toy", "seed": 3, "success": False, "env_id": 0, "env_error": None, "final_state": states[-1],
            "turns": [{"state": states[k], "response": reply, "actions": actions, "action_valid": valid,
                       "format_ok": parse_reply(reply, True, "||", 2).format_ok, "reward": -0.1 * k}
                      for k, (reply, actions, valid) in enumerate(turns)]}


def test_turn_rows_put_the_true_states_in_the_reply(tokenizer):
    states = ["S0", "S1", "S2", "S3"]
    record = episode_record(states, [
        ("<think>Push it.</think><answer>Left || Up</answer>", ["Left", "Up"], [True, True]),
        ("<think><observation>wrong</observation>ok<prediction>wrong</prediction></think><answer>Jump || Down"
         "</answer>", ["Jump", "Down"], [False, True]),
        ("<think>rambling without an answer", [], []),  # malformed: no action, dropped
    ])
    prompts = [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7]]
    rows, counts = turn_rows(record, prompts, rewrite_turns(record, tokenizer, "||"))
    assert counts == {"turns": 3, "dropped_turns": 1, "dropped_context": 0, "invalid_actions_removed": 1,
                      "model_wrote_spans": 1}
    assert [row["turn"] for row in rows] == [0, 1]
    first = ("<observation>\nS0\n</observation>\nPush it.\n<prediction>\nS1\n</prediction></think>"
             "<answer>Left || Up</answer>")
    second = "<observation>\nS1\n</observation>\nok\n<prediction>\nS2\n</prediction></think><answer>Down</answer>"
    for row, prompt, response, actions in zip(rows, prompts, (first, second), (["Left", "Up"], ["Down"])):
        n = len(prompt)
        assert row["input_ids"][:n] == prompt and row["prompt_length"] == n
        assert row["loss_mask"] == [0] * n + [1] * (len(row["input_ids"]) - n)
        assert tokenizer.decode(row["input_ids"][n:]) == response
        turn = json.loads(row["turns"])[0]
        assert turn["response"] == "<think>" + response and row["actions"] == actions
        assert parse_reply(turn["response"], True, "||", 2).actions == actions
    # the last kept turn's next state is the final state when it is the episode's last turn
    record = episode_record(["S0", "END"], [("<think>x</think><answer>Up</answer>", ["Up"], [True])])
    rows, _ = turn_rows(record, [[1]], rewrite_turns(record, tokenizer, "||"))
    assert rows[0]["next_state"] == "END"
    assert "<prediction>\nEND\n</prediction>" in json.loads(rows[0]["turns"])[0]["response"]


def test_a_turn_without_thought_has_no_empty_line(tokenizer):
    record = episode_record(["S0", "S1"], [("<think></think><answer>Up</answer>", ["Up"], [True])])
    rows, _ = turn_rows(record, [[1]], rewrite_turns(record, tokenizer, "||"))
    assert json.loads(rows[0]["turns"])[0]["response"] == (
        "<think><observation>\nS0\n</observation>\n<prediction>\nS1\n</prediction></think><answer>Up</answer>")


# ---- self-play rows ------------------------------------------------------------------------------------
REPLIES = ["I go.</think><answer>Left || Up</answer>",
           "<observation>x</observation>y</think><answer>Jump || Down</answer>",
           "Right.</think><answer>Right</answer>"]
RECIPE = ["agent_proxy.reply_format=world_model", "agent_proxy.enable_think=true", "agent_proxy.max_turn=3",
          "agent_proxy.max_actions_per_turn=2", "agent_proxy.max_context_window=2",
          "actor_rollout_ref.rollout.response_length=64"]


@pytest.fixture(scope="module")
def self_play(tokenizer, bundled_model_path, tmp_path_factory):
    cfg = load_config("sokoban", RECIPE)
    table, counts = self_play_rows(cfg, range(40, 43), ScriptedEngine(tokenizer, REPLIES), tokenizer)
    path = tmp_path_factory.mktemp("world_model") / "test.parquet"
    write_parquet(table, path)
    return cfg, table, counts, path


def test_rows_hold_the_prompts_the_context_manager_showed(self_play, tokenizer, bundled_model_path):
    """Each row's prompt is the context manager's prompt_ids of that turn, replayed here by hand with the env (the
    window of 2 turns cuts the third prompt), and its states are the env's before and after the valid actions."""
    cfg, table, counts, _ = self_play
    rows = table.to_pylist()
    assert counts["episodes"] == 3 and counts["turns"] == len(rows) == counts["rows"] > 0
    assert counts["invalid_actions_removed"] == sum(row["turn"] == 1 for row in rows)
    for seed in range(40, 43):
        episode = [row for row in rows if row["seed"] == seed]
        tag = episode[0]["tag"]
        spec = cfg.custom_envs[tag]
        env = make_env(spec.env_type, dict(spec.env_config))
        obs, _ = env.reset(seed=seed)
        reseed(env, [seed, EPISODE_STREAM, 0])  # as the env-state manager does
        context = ContextManager.for_envs(tokenizer, cfg.agent_proxy, {tag: env},
                                          eos_token_ids(bundled_model_path, tokenizer))
        actions_left = spec.max_actions_per_traj
        trajectory = context.start(tag, obs, actions_left)
        for k, row in enumerate(episode):
            assert row["turn"] == k and row["state"] == obs
            assert row["input_ids"][:row["prompt_length"]] == context.prompt_ids(trajectory)
            reply = tokenizer.encode(REPLIES[k], add_special_tokens=False)
            context.add_response(trajectory, reply, [0.0] * len(reply))
            for action in row["actions"]:
                obs, *_ = env.step(action)
                actions_left -= 1
            assert row["next_state"] == obs
            if k + 1 < len(episode):
                assert context.add_observation(trajectory, obs, row["reward"], actions_left, 64)
        assert len(episode) == 3 and len(context.prompt_ids(trajectory)) < len(trajectory.input_ids)  # windowed


def test_rows_load_with_the_sft_trainer(self_play, tokenizer):
    _, table, _, path = self_play
    split = load_split(str(path), tokenizer, 4096)
    assert len(split) == table.num_rows
    assert split.reply_format.reply_format == "world_model"
    for i, row in enumerate(table.to_pylist()):
        assert split.expert_replies[i] == [json.loads(row["turns"])[0]["response"]]
        generated = [t for t, m in zip(split.input_ids[i], split.loss_mask[i]) if m]
        assert "<think>" + tokenizer.decode(generated) == split.expert_replies[i][0]


def test_recipe_play_rows_hold_the_world_model_prompt_of_each_turn(tokenizer, tmp_path):
    """The model plays in the recipe's format (here: no thinking, one move a turn, a window of one turn); each
    row's prompt is what a world-model context manager shows at that turn: its system prompt, the turn's state
    (with the budget the played moves left) and the forced <think>."""
    cfg = load_config("sokoban", ["agent_proxy.enable_think=false", "agent_proxy.max_actions_per_turn=1",
                                  "agent_proxy.max_context_window=1", "agent_proxy.max_turn=3"])
    replies = ["Left</answer>", "Jump</answer>", "Up</answer>"]  # the second is invalid: dropped, and free
    table, counts = self_play_rows(cfg, range(50, 52), ScriptedEngine(tokenizer, replies), tokenizer, "recipe")
    assert counts["turns"] == 6 and counts["dropped_turns"] == 2 and counts["rows"] == table.num_rows == 4
    row_format = json.loads(table.schema.metadata[b"ragen.agent_proxy"])
    assert row_format["reply_format"] == "world_model" and row_format["enable_think"]
    tag = cfg.es_manager.train.env_configs.tags[0]
    env = make_env(cfg.custom_envs[tag].env_type, dict(cfg.custom_envs[tag].env_config))
    config = AgentProxyConfig(**{k: v for k, v in row_format.items() if k != "reward_normalization"})
    context = ContextManager.for_envs(tokenizer, config, {tag: env}, [tokenizer.eos_token_id])
    system = tokenizer.apply_chat_template([{"role": "system", "content": context._system_prompt(tag)}], tokenize=False)
    for row in table.to_pylist():
        prompt_ids = row["input_ids"][:row["prompt_length"]]
        prompt = tokenizer.decode(prompt_ids)
        assert row["actions"] == {0: ["Left"], 2: ["Up"]}[row["turn"]]
        assert prompt.startswith(system) and prompt.count("<|im_start|>user") == 1  # a window of one turn
        actions_left = 10 - (row["turn"] > 0)  # Left cost one move, Jump nothing
        assert f"Turn {row['turn'] + 1}. State:\n{row['state']}\nYou have {actions_left} actions left" in prompt
        assert prompt.endswith("<|im_start|>assistant\n<think>")
        if row["turn"] == 0:
            assert prompt_ids == context.start(tag, row["state"], 10).input_ids
    write_parquet(table, tmp_path / "train.parquet")
    assert len(load_split(str(tmp_path / "train.parquet"), tokenizer, 4096)) == 4


def test_recipe_play_history_holds_the_rewritten_replies(tokenizer):
    """Without a window, turn k's prompt continues the earlier turn's row token for token: its prompt, then its
    rewritten reply (the rows train on the conversation a world-model player would have had)."""
    cfg = load_config("sokoban", ["agent_proxy.enable_think=false", "agent_proxy.max_actions_per_turn=1",
                                  "agent_proxy.max_context_window=-1", "agent_proxy.max_turn=3"])
    table, _ = self_play_rows(cfg, range(60, 61), ScriptedEngine(tokenizer, ["Left</answer>", "Up</answer>"]),
                              tokenizer, "recipe")
    rows = table.to_pylist()
    assert [row["turn"] for row in rows] == [0, 1, 2]
    for earlier, later in zip(rows, rows[1:]):
        assert later["input_ids"][:len(earlier["input_ids"])] == earlier["input_ids"]
        assert later["prompt_length"] > len(earlier["input_ids"])


# ---- the scorer ----------------------------------------------------------------------------------------
def test_state_lines_and_coordinates():
    lines, cells = parse_state(COORD_STATE.replace("Boxes: (2, 2)", "Boxes on target: (1, 3), (2,2)"))
    assert lines == ["Board size: 4 rows x 5 cols (zero-indexed).", "Grid:", *GRID.splitlines()]
    assert cells == {"Targets": [(1, 3)], "Boxes on target": [(1, 3), (2, 2)], "Player": [(1, 1)]}
    assert parse_state("Start: (0, 0)\nGoal: (3, 3)\nHoles: (1, 1), (2, 3)\nP___")[1] == {
        "Start": [(0, 0)], "Goal": [(3, 3)], "Holes": [(1, 1), (2, 3)]}


def reply(observation: str | None, prediction: str | None) -> str:
    spans = "" if observation is None else f"<observation>\n{observation}\n</observation>"
    spans += "" if prediction is None else f"ok<prediction>{prediction}</prediction>"
    return f"<think>{spans}</think><answer>Left</answer>"


def test_scores_on_exact_partial_and_garbled_replies():
    next_state = COORD_STATE.replace("Player: (1, 1)", "Player: (1, 2)").replace("#P_O#", "#_PO#")
    wrong_player = COORD_STATE.replace("Player: (1, 1)", "Player: (2, 1)")
    extra_label = next_state.replace("Boxes: (2, 2)", "Boxes: (2, 2)\nBoxes on target: (1, 3)")
    replies = [reply(COORD_STATE, next_state),  # exact
               reply(wrong_player, extra_label),  # one label wrong; a label the true state lacks
               "<think>I go left.</think><answer>Left</answer>",  # no spans
               reply("garbled ## P", "(1, 1)")]  # garbled spans
    scores = score_replies(replies, [COORD_STATE] * 4, [next_state] * 4, [["Left"], ["Left"], ["Up"], ["left"]])
    assert scores["turns"] == 4 and scores["format_ok"] == 1.0
    assert scores["written_spans"] == 0.75
    assert scores["observation/exact"] == scores["observation/coordinates_all"] == 0.25
    assert scores["observation/grid_exact"] == 0.5  # the wrong player line is a coordinate line
    assert scores["observation/coordinates/Player"] == 0.25
    assert scores["observation/coordinates/Targets"] == scores["observation/coordinates/Boxes"] == 0.5
    assert scores["prediction/exact"] == 0.25 and scores["prediction/grid_exact"] == 0.5
    assert scores["prediction/coordinates/Boxes on target"] == 0.0  # only the reply that added it has it
    assert scores["prediction/coordinates/Player"] == 0.5 and scores["prediction/coordinates_all"] == 0.25
    # the true next state is that of the recorded moves: the third reply answered Left where Up was played
    assert scores["same_moves"] == 0.75
    assert scores["prediction_same_moves/exact"] == pytest.approx(1 / 3)
    # copying the current state: the grid and the player changed, the targets and boxes did not
    assert scores["copy/prediction/exact"] == scores["copy/prediction/coordinates/Player"] == 0.0
    assert scores["copy/prediction/coordinates/Targets"] == scores["copy/prediction/coordinates/Boxes"] == 1.0


def test_grid_states_are_scored_without_coordinates():
    scores = score_replies([reply(GRID, GRID + "\n"), reply(GRID.replace("P", "_"), None)], [GRID] * 2, [GRID] * 2,
                           [["Left"]] * 2)
    assert scores["observation/exact"] == 0.5 and scores["prediction/exact"] == 0.5
    assert not any("coordinates" in key for key in scores)


def test_score_model_generates_on_the_held_out_prompts(self_play, tiny_model_path):
    _, table, _, path = self_play
    scores = world_model.score_model(tiny_model_path, path, max_turns=4, batch_size=2, max_new_tokens=8)
    assert scores["turns"] == min(4, table.num_rows) and len(scores["examples"]) == 3
    assert all(0.0 <= value <= 1.0 for key, value in scores.items() if isinstance(value, float))
    assert not any(key.startswith("unseen_states/") for key in scores)  # no training rows given

    # Given training rows, the turns whose state they show are scored again without them
    states = table.column("state").to_pylist()[:4]
    train = path.with_name("train_rows.parquet")
    pq.write_table(pa.table({"state": states[:1]}), train)
    again = world_model.score_model(tiny_model_path, path, max_turns=4, batch_size=2, max_new_tokens=8,
                                     train_file=train)
    assert again["unseen_states/turns"] == sum(state != states[0] for state in states) < 4
    unseen = {key.removeprefix("unseen_states/") for key in again if key.startswith("unseen_states/")}
    assert "observation/exact" in unseen and unseen <= set(scores)
    pq.write_table(pa.table({"state": states}), train)  # every state seen: nothing left to score
    assert {key: value for key, value in world_model.score_model(
        tiny_model_path, path, max_turns=4, batch_size=2, max_new_tokens=8, train_file=train).items()
        if key.startswith("unseen_states/")} == {"unseen_states/turns": 0}


# ---- the stage -----------------------------------------------------------------------------------------
def test_stage_end_to_end(tmp_path, tiny_model_path, tokenizer, monkeypatch):
    """Self-play (scripted replies stand in for the untrained model, which names no valid action), the score
    before, one step of full fine-tuning of the tiny model under torchrun, its score after."""
    real_engine = world_model.load_engine

    def load_engine(model_path, rollout, tokenizer):
        if model_path == str(Path(tiny_model_path).resolve()):
            return ScriptedEngine(tokenizer, REPLIES)
        return real_engine(model_path, rollout, tokenizer)

    monkeypatch.setattr(world_model, "load_engine", load_engine)
    output = tmp_path / "stage"
    argv = ["stage", "--env", "sokoban", "--output", str(output), "--train-episodes", "2",
            "--test-episodes", "1", "--epochs", "1", "--batch-size", "4", "--score-turns", "2",
            "--sft", "trainer.micro_batch_size_per_gpu=2", "--sft", "eval.max_turns=0",
            "--sft", "model.dtype=float32", f"model_path={tiny_model_path}", "agent_proxy.max_turn=2",
            "agent_proxy.max_actions_per_turn=2", "actor_rollout_ref.rollout.response_length=32"]
    world_model.main(argv)
    score = json.loads((output / "score.json").read_text())
    assert score["data"]["train"]["rows"] == 4 and score["data"]["test"]["rows"] == 2
    assert score["before"]["written_spans"] == 0.0 and score["before"]["format_ok"] == 1.0  # REPLIES[0] each time
    assert score["after"]["turns"] == 2 and score["after"]["model_path"] == str(output / "model")
    assert 0 <= score["before"]["unseen_states/turns"] == score["after"]["unseen_states/turns"] <= 2
    metrics = [json.loads(line) for line in (output / "model" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    from safetensors.torch import load_file
    trained = load_file(output / "model" / "model.safetensors")
    base = load_file(Path(tiny_model_path) / "model.safetensors")
    assert any(not torch.equal(trained[k], base[k]) for k in base)
    assert pq.read_table(output / "data" / "train.parquet").num_rows == 4

    # Run again (after an interruption): the data and the score before are reused, the finished fine-tuning is not
    # redone, and the model is scored again; other data arguments are refused, not written over the data.
    def no_self_play(*args, **kwargs):
        raise AssertionError("the self-play data was made again")

    scored = []
    real_score = world_model.score_model
    monkeypatch.setattr(world_model, "write_data", no_self_play)
    monkeypatch.setattr(world_model, "score_model",
                        lambda model, *a, **k: scored.append(model) or real_score(model, *a, **k))
    world_model.main(argv)
    assert scored == [str(output / "model")]
    again = json.loads((output / "score.json").read_text())
    assert again["before"] == score["before"] and again["data"] == score["data"]
    metrics = [json.loads(line) for line in (output / "model" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    with pytest.raises(ValueError, match="train_episodes: 2 -> 3"):
        world_model.main([*argv[:6], "3", *argv[7:]])


def test_stage_refuses_a_lora_rank_through_sft(tmp_path, capsys):
    """`--sft lora.rank=8` would leave an unmerged adapter to score. (A `model/` trained on other self-play data
    is refused by the trainer's data fingerprint, test_sft.)"""
    with pytest.raises(SystemExit):
        world_model.main(["stage", "--env", "sokoban", "--output", str(tmp_path), "--sft", "lora.rank=8"])
    assert "--lora-rank" in capsys.readouterr().err
