import numpy as np
import pytest
import torch

from ragen.config import AgentProxyConfig, RewardNormalizationConfig
from ragen.context_manager import ContextManager, Trajectory, parse_reply, reply_kinds, state_key, window_layout
from verl.trainer.config import REPLY_KINDS


@pytest.fixture
def context(tokenizer):
    return ContextManager(tokenizer, AgentProxyConfig(max_actions_per_turn=2), instructions={"Toy": "Rules."},
                          example_actions={"Toy": ("Left",)}, eos_ids=[tokenizer.eos_token_id])


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("first_ends_with_eos", [True, False])
def test_two_turn_trajectory_is_token_exact(tokenizer, context, first_ends_with_eos):
    eos = tokenizer.eos_token_id
    trajectory = context.start("Toy", "grid one", actions_left=10)
    prompt1 = list(trajectory.input_ids)
    reply1 = encode(tokenizer, " Go left.</think><answer>Left || Up</answer>") + ([eos] if first_ends_with_eos else [])
    text1 = context.add_response(trajectory, reply1, [-1.0] * len(reply1))
    assert context.add_observation(trajectory, "grid two", reward=-0.1, actions_left=8, response_length=16)
    prompt2 = list(trajectory.input_ids)
    reply2 = encode(tokenizer, "Down now.</think><answer>Down</answer>")  # stopped at </answer>: no EOS
    text2 = context.add_response(trajectory, reply2, [-1.0] * len(reply2))

    # What the model saw at turn 2 begins with exactly what it saw and wrote at turn 1.
    assert prompt2[: len(prompt1) + len(reply1)] == prompt1 + reply1
    # The loss mask selects exactly the generated ids, in order; decoding them gives back the replies.
    generated = [t for t, m in zip(trajectory.input_ids, trajectory.loss_mask) if m]
    assert generated == reply1 + reply2
    assert tokenizer.decode(generated, skip_special_tokens=True) == text1[len("<think>"):] + text2[len("<think>"):]
    assert trajectory.turn_ends == [len(prompt1) + len(reply1) - 1, len(trajectory.input_ids) - 1]
    assert set(np.array(trajectory.turn_ids)[np.array(trajectory.loss_mask) == 1]) == {0, 1}
    # The whole sequence is the conversation as the chat template renders it.
    messages = [{"role": "system", "content": context._system_prompt("Toy")},
                {"role": "user", "content": context._state_message("Toy", "grid one", 1, 10, None)},
                {"role": "assistant", "content": text1},
                {"role": "user", "content": context._state_message("Toy", "grid two", 2, 8, -0.1)}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + text2
    assert tokenizer.decode(trajectory.input_ids) == expected


def test_rollout_log_probs_stay_on_their_tokens_through_to_batch(tokenizer, context):
    """Column t of `rollout_log_probs` is the engine's log-prob of input_ids[t], as in the actor's old_log_probs:
    each reply's log-probs land on exactly its ids, every prompt and padding column is 0."""
    trajectory = context.start("Toy", "grid one", actions_left=10)
    reply1 = encode(tokenizer, "a</think><answer>Left</answer>")
    log_probs1 = [-0.1 * (k + 1) for k in range(len(reply1))]
    context.add_response(trajectory, reply1, log_probs1)
    assert context.add_observation(trajectory, "grid two", reward=0.0, actions_left=9, response_length=16)
    reply2 = encode(tokenizer, "b</think><answer>Up</answer>")
    log_probs2 = [-1.0 - 0.1 * k for k in range(len(reply2))]
    context.add_response(trajectory, reply2, log_probs2)
    trajectory.turn_rewards, trajectory.turn_states = [0.0, 1.0], ["grid one", "grid two"]
    short = Trajectory(input_ids=[5, 6], loss_mask=[0, 1], reply_kinds=[0, 5], rollout_log_probs=[0, -3.0], turn_ids=[0, 0],
                       turn_ends=[1], turn_rewards=[0.0], turn_states=["s"])
    batch = context.to_batch([trajectory, short], group_ids=[0, 1], tags=["Toy", "Toy"]).batch

    rollout, mask, ids = batch["rollout_log_probs"][0], batch["loss_mask"][0].bool(), batch["input_ids"][0]
    start1, start2 = trajectory.turn_ends[0] + 1 - len(reply1), trajectory.turn_ends[1] + 1 - len(reply2)
    assert ids[start1:start1 + len(reply1)].tolist() == reply1 and ids[start2:start2 + len(reply2)].tolist() == reply2
    assert rollout[start1:start1 + len(reply1)].tolist() == pytest.approx(log_probs1)
    assert rollout[start2:start2 + len(reply2)].tolist() == pytest.approx(log_probs2)
    assert torch.equal(rollout[~mask], torch.zeros(int((~mask).sum())))
    assert batch["rollout_log_probs"][1].tolist() == [0, -3.0] + [0] * (len(trajectory.input_ids) - 2)


def test_replies_parse_into_actions(context):
    trajectory = context.start("Toy", "grid", actions_left=3)
    ids = context._encode("hmm</think><answer>Left || Up || Down</answer>")
    reply = context.add_response(trajectory, ids, [-1.0] * len(ids))
    assert reply.startswith("<think>")
    parsed = context.parse(reply)
    assert parsed.format_ok and parsed.actions == ["Left", "Up"]  # max_actions_per_turn=2


@pytest.mark.parametrize("max_actions, think, answer", [
    (1, True, "<think>I think Right is a good move.</think><answer>Right</answer>"),
    (2, True, "<think>I think Right then Down is a good move.</think><answer>Right || Down</answer>"),
    (4, False, "<answer>Right || Down || Right</answer>"),  # the env gives 3: all of them
])
def test_format_example_shows_as_many_actions_as_a_turn_takes(tokenizer, max_actions, think, answer):
    """Shown one action, the bundled model answered one per turn and could not reach FrozenLake's goal."""
    config = AgentProxyConfig(max_actions_per_turn=max_actions, enable_think=think)
    context = ContextManager(tokenizer, config, instructions={"Toy": "Rules."},
                             example_actions={"Toy": ("Right", "Down", "Right")}, eos_ids=[tokenizer.eos_token_id])
    prompt = context._system_prompt("Toy")
    assert f"for example: {answer}" in prompt
    assert context.parse(answer).actions == ["Right", "Down", "Right"][:max_actions]  # the example parses


def test_reply_text_is_cut_at_the_stop_string(context):
    # A stop string can end inside a token ("></"), so the decoded reply may run a few chars past it.
    trajectory = context.start("Toy", "grid", actions_left=3)
    ids = context._encode("ok</think><answer>Up</answer><")
    reply = context.add_response(trajectory, ids, [-1.0] * len(ids))
    assert reply.endswith("</answer>") and context.parse(reply).actions == ["Up"]


def test_to_batch_places_summed_reward_on_last_generated_token(tokenizer):
    a = Trajectory(input_ids=[5, 6, 7, 8], loss_mask=[0, 1, 0, 1], reply_kinds=[0, 5, 0, 5],
                   rollout_log_probs=[0, -0.5, 0, -1.5],
                   turn_ids=[0, 0, 1, 1], turn_ends=[1, 3], turn_rewards=[-0.1, 1.0], turn_states=["s1", "s2"])
    b = Trajectory(input_ids=[5, 9], loss_mask=[0, 1], reply_kinds=[0, 5], rollout_log_probs=[0, -2.0], turn_ids=[0, 0], turn_ends=[1],
                   turn_rewards=[0.5], turn_states=["s1"])
    context = ContextManager(tokenizer, AgentProxyConfig(), {"T": ""}, {"T": "x"}, [tokenizer.eos_token_id])
    batch = context.to_batch([a, b], group_ids=[0, 0], tags=["T", "T"])
    assert batch.batch["input_ids"].shape == (2, 4)
    assert torch.allclose(batch.batch["token_rewards"], torch.tensor([[0, 0, 0, 0.9], [0, 0.5, 0, 0]]))
    assert batch.batch["loss_mask"].tolist() == [[0, 1, 0, 1], [0, 1, 0, 0]]
    assert batch.batch["rollout_log_probs"].tolist() == [[0, -0.5, 0, -1.5], [0, -2.0, 0, 0]]
    assert batch.batch["rollout_log_probs"].dtype == torch.float32
    assert batch.batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.batch["turn_ids"][1].tolist() == [0, 0, -1, -1]
    assert batch.batch["state_ids"].tolist() == [[0, 0, 1, 1], [0, 0, -1, -1]]  # "s1" is one state in both
    assert batch.batch["trajectory_rewards"].tolist() == pytest.approx([0.9, 0.5])


def test_a_state_shown_as_a_picture_is_known_by_its_pixels():
    """GiGPO's anchor states (`state_ids`): a picture-only state's text is `<image>` on every board, so two
    turns answered the same state only when their pictures are the same too."""
    board = np.zeros((4, 4, 3), dtype=np.uint8)
    other = board.copy()
    other[1, 2] = 255
    t = Trajectory(turn_states=["<image>"] * 3, images=[board, other, board.copy()], image_turns=[0, 1, 2])
    keys = [state_key(text, t, turn) for turn, text in enumerate(t.turn_states)]
    assert keys[0] == keys[2] != keys[1]
    assert state_key("grid", Trajectory(turn_states=["grid"]), 0) == ("grid",)  # text states: the text


@pytest.mark.parametrize("window, positions, hidden_from", [
    # system 0..2, then turns [3, 6), [6, 8), [8, 11)
    (1, [0, 1, 2, 3, 4, 5, 3, 4, 3, 4, 5], [11, 11, 11, 6, 6, 6, 8, 8, 11, 11, 11]),
    (2, [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 7], [11, 11, 11, 8, 8, 8, 11, 11, 11, 11, 11]),
    (3, list(range(11)), [11] * 11),  # every turn fits: the whole sequence, causal
])
def test_window_layout_by_hand(window, positions, hidden_from):
    layout = window_layout([3, 6, 8], length=11, window=window)
    assert [t.tolist() for t in layout] == [positions, hidden_from]


def windowed_trajectory(tokenizer, window: int, turns: int = 3) -> tuple[ContextManager, Trajectory, list[list[int]]]:
    """A trajectory of `turns` turns through the real context manager, and what each turn's prompt + reply was."""
    config = AgentProxyConfig(max_context_window=window, enable_think=False)
    context = ContextManager(tokenizer, config, {"Toy": "Rules."}, {"Toy": ("Left",)}, [tokenizer.eos_token_id])
    trajectory = context.start("Toy", "grid zero", actions_left=9)
    seen = []
    for turn in range(turns):
        prompt, reply = context.prompt_ids(trajectory), encode(tokenizer, f"Left{turn}</answer>")
        seen.append(prompt + reply)
        context.add_response(trajectory, reply, [-1.0] * len(reply))
        if turn + 1 < turns:
            assert context.add_observation(trajectory, "grid " + "x" * (turn + 1), reward=0.0, actions_left=8 - turn,
                                           response_length=16)
    trajectory.turn_rewards, trajectory.turn_states = [0.0] * turns, [f"s{turn}" for turn in range(turns)]
    return context, trajectory, seen


@pytest.mark.parametrize("window", [1, 2])
def test_each_reply_attends_to_exactly_the_prompt_it_was_sampled_from(tokenizer, window):
    """The tokens a turn's last reply token may attend to (s <= q < hidden_from[s]) are that turn's prompt and
    reply, in order; their positions are those of the prompt wherever one row can give them (k = 1: always;
    k = 2: the first two turns, and the system message and the turn's own tokens after them)."""
    context, trajectory, seen = windowed_trajectory(tokenizer, window)
    short = Trajectory(input_ids=[5, 6], loss_mask=[0, 1], reply_kinds=[0, 5], rollout_log_probs=[0, -3.0], turn_ids=[0, 0], turn_ends=[1],
                       turn_starts=[1], turn_rewards=[0.0], turn_states=["s"])
    batch = context.to_batch([trajectory, short], group_ids=[0, 1], tags=["Toy", "Toy"]).batch
    ids, positions, hidden_from = batch["input_ids"][0], batch["position_ids"][0], batch["hidden_from"][0]
    system = trajectory.turn_starts[0]
    for turn, (last, expected) in enumerate(zip(trajectory.turn_ends, seen)):
        visible = [s for s in range(last + 1) if last < hidden_from[s]]
        assert ids[visible].tolist() == expected
        own = visible[:system] + [s for s in visible if s >= trajectory.turn_starts[turn]]
        assert positions[own].tolist() == [visible.index(s) for s in own]
        if window == 1 or turn < window:
            assert positions[visible].tolist() == list(range(len(expected)))
    width = len(trajectory.input_ids)
    assert batch["hidden_from"][1].tolist() == [2] * 2 + [width] * (width - 2)  # never hidden; padding neither
    assert batch["position_ids"][1].tolist() == [0, 1] + [0] * (width - 2)


def test_without_a_window_the_batch_is_as_before(tokenizer):
    context, trajectory, _ = windowed_trajectory(tokenizer, window=-1)
    batch = context.to_batch([trajectory], group_ids=[0], tags=["Toy"]).batch
    assert "hidden_from" not in batch  # the trainer then builds no (T, T) mask
    assert batch["position_ids"][0].tolist() == list(range(len(trajectory.input_ids)))


def one_turn(reward: float, state: str = "s") -> Trajectory:
    return Trajectory(input_ids=[5, 6], loss_mask=[0, 1], reply_kinds=[0, 5], rollout_log_probs=[0, -1.0], turn_ids=[0, 0],
                      turn_ends=[1], turn_rewards=[reward], turn_states=[state])


@pytest.mark.parametrize("grouping, method, expected", [
    ("state", "identity", [1.0, 0.0, 3.0, 3.0]),  # ARPO: raw rewards
    ("state", "mean", [0.5, -0.5, 0.0, 0.0]),
    ("state", "mean_std", [0.7071, -0.7071, 0.0, 0.0]),  # a group of equal rewards gets 0, not NaN
    ("batch", "mean", [-0.75, -1.75, 1.25, 1.25]),  # BRPO's centring over the whole batch
    ("batch", "mean_std", [-0.5, -1.1667, 0.8333, 0.8333]),  # mean 1.75, unbiased std 1.5
    ("inductive", "mean", [0.0, -2.0, 1.0, 1.0]),  # per env tag: A alone; B = 0, 3, 3 (mean 2)
    ("batch", "asym_clip", [-0.5, -1.0, 0.8333, 0.8333]),  # mean_std clipped to [-1, 3]
])
def test_reward_normalization_groupings_and_methods(tokenizer, grouping, method, expected):
    config = AgentProxyConfig(reward_normalization=RewardNormalizationConfig(grouping=grouping, method=method))
    context = ContextManager(tokenizer, config, {"A": "", "B": ""}, {"A": "x", "B": "x"}, [tokenizer.eos_token_id])
    batch = context.to_batch([one_turn(1.0), one_turn(0.0), one_turn(3.0), one_turn(3.0)], group_ids=[0, 0, 1, 1],
                             tags=["A", "B", "B", "B"])
    assert batch.batch["token_rewards"][:, 1].tolist() == pytest.approx(expected, abs=1e-4)
    assert batch.batch["trajectory_rewards"].tolist() == [1.0, 0.0, 3.0, 3.0]  # the raw rewards are kept


@pytest.mark.parametrize("text, actions", [
    ("<think>a</think><answer>Left</answer>", ["Left"]),
    ("  <think>\nmulti\nline</think>\n<answer> Up || Down </answer>\n", ["Up", "Down"]),
    ("<think></think><answer>Up||</answer>", ["Up"]),
])
def test_parse_well_formed(text, actions):
    parsed = parse_reply(text, enable_think=True, action_sep="||", max_actions=3)
    assert parsed.format_ok and parsed.actions == actions


@pytest.mark.parametrize("text", [
    "", "Left", "<think>a</think>", "<answer>Left</answer>", "<think>a</think><answer></answer>",
    "<think>a</think><answer> || </answer>", "<think>a</think>b</think><answer>Left</answer>",
    "<think>a</think><answer>Left</answer> and more", "</answer><think>a</think><answer>Left",
    "<think><answer>x</answer></think><answer>Left</answer>", "<think>a</think><answer><answer>L</answer></answer>",
])
def test_parse_malformed_gives_no_actions(text):
    parsed = parse_reply(text, enable_think=True, action_sep="||", max_actions=3)
    assert not parsed.format_ok and parsed.actions == []


def test_parse_without_think():
    assert parse_reply("<answer>Up</answer>", enable_think=False, action_sep="||", max_actions=1).actions == ["Up"]
    assert not parse_reply("<think>a</think><answer>Up</answer>", False, "||", 1).format_ok


def test_parse_never_raises_on_random_text():
    rng = np.random.default_rng(0)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "||", "Left", " ", "\n", "é", "<|im_end|>", "<", ">"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces, size=rng.integers(0, 12)))
        parsed = parse_reply(text, enable_think=True, action_sep="||", max_actions=2)
        assert parsed.format_ok == bool(parsed.actions) and len(parsed.actions) <= 2


KIND = {kind: REPLY_KINDS.index(kind) + 1 for kind in REPLY_KINDS}


def test_each_generated_token_gets_the_kind_of_text_of_its_first_character():
    pieces = ["<observation>", "\nP", "_\n", "</observation>", "go", " up<", "prediction>", "X", "</prediction>",
              "</think>", "<answer>", "Up", "</answer>", "<|im_end|>"]
    assert reply_kinds("<think>", pieces) == [KIND[k] for k in (
        "format", "observation", "observation", "format", "think", "think", "format", "prediction", "format",
        "format", "format", "answer", "format", "format")]
    assert reply_kinds("<answer>", ["Up", "</answer>"]) == [KIND["answer"], KIND["format"]]
    assert reply_kinds("<think>", ["still", " thinking"]) == [KIND["think"]] * 2  # cut off: the span runs to the end
    assert reply_kinds("<answer>", ["Up", " and", "</answer>", " more"]) == [KIND["answer"]] * 2 + [KIND["format"]] * 2
    assert reply_kinds("<think>", []) == []  # a reply of no token


def test_the_kinds_follow_the_generated_tokens_into_the_batch(tokenizer, context):
    trajectory = context.start("Toy", "grid one", actions_left=10)
    reply = encode(tokenizer, " Go left.</think><answer>Left</answer>") + [tokenizer.eos_token_id]
    context.add_response(trajectory, reply, [-1.0] * len(reply))
    trajectory.turn_rewards, trajectory.turn_states = [0.0], ["grid one"]
    kinds = np.array(trajectory.reply_kinds)
    assert ((kinds > 0) == np.array(trajectory.loss_mask, dtype=bool)).all()  # a kind exactly on generated tokens
    generated = np.array(trajectory.input_ids)[kinds > 0]
    assert tokenizer.decode(generated[kinds[kinds > 0] == KIND["think"]]) == " Go left."
    assert tokenizer.decode(generated[kinds[kinds > 0] == KIND["answer"]]) == "Left"
    batch = context.to_batch([trajectory], group_ids=[0], tags=["Toy"])
    assert batch.batch["reply_kinds"][0].tolist() == trajectory.reply_kinds
    # the end of the turn is format, even where the model never closed its thought
    cut = encode(tokenizer, " Still thinking") + [tokenizer.eos_token_id]
    context.add_response(trajectory, cut, [-1.0] * len(cut))
    assert trajectory.reply_kinds[-len(cut):] == [KIND["think"]] * (len(cut) - 1) + [KIND["format"]]
