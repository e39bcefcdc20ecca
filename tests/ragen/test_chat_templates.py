"""Token-exact trajectories under the chat templates we support: SmolLM2 (ChatML), Qwen2.5 (ChatML with a
default system prompt) and Llama-3 (header tokens, `<|eot_id|>`, a BOS in the template).

No hub access: the Qwen2.5 and Llama-3 tokenizers are the bundled SmolLM2 tokenizer with the other family's
special tokens and a chat template written here in that family's format.
"""

import pytest
import torch
from transformers import AutoTokenizer

from ragen.config import AgentProxyConfig
from ragen.context_manager import ContextManager

QWEN25_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message.role != 'system' %}"
    "{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}"
    "{% if message.role == 'system' %}{{ 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{% endif %}"
    "{{ message.content | trim }}{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@pytest.fixture(scope="module", params=["smollm2", "qwen2.5", "llama3"])
def family(request, bundled_model_path):
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path)
    if request.param == "qwen2.5":
        tokenizer.chat_template = QWEN25_TEMPLATE
    elif request.param == "llama3":
        tokenizer.add_special_tokens({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                      "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>"]})
        tokenizer.chat_template = LLAMA3_TEMPLATE
    return request.param, tokenizer


def converse(tokenizer, config, replies, window=-1):
    """Play len(replies) turns with canned replies (each ending in EOS when it is a tuple (text, True))."""
    config = AgentProxyConfig(**{**config.__dict__, "max_context_window": window})
    context = ContextManager(tokenizer, config, {"T": "Rules."}, {"T": "Left"}, [tokenizer.eos_token_id])
    trajectory = context.start("T", "state 1", actions_left=10)
    prompts, texts, reply_ids = [], [], []
    for turn, (reply, with_eos) in enumerate(replies):
        prompts.append(list(context.prompt_ids(trajectory)))
        ids = tokenizer.encode(reply, add_special_tokens=False) + ([tokenizer.eos_token_id] if with_eos else [])
        texts.append(context.add_response(trajectory, ids, [-1.0] * len(ids)))
        reply_ids.append(ids)
        trajectory.turn_rewards.append(0.0)
        trajectory.turn_states.append(f"state {turn + 1}")
        if turn + 1 < len(replies):
            assert context.add_observation(trajectory, f"state {turn + 2}", -0.1, 9 - turn, response_length=16)
    return context, trajectory, prompts, texts, reply_ids


REPLIES_THINK = [("ok</think><answer>Left</answer>", True), ("hm</think><answer>Up || Down</answer>", False),
                 ("done</think><answer>Right</answer>", True)]
# after the forced <answer>
REPLIES_ANSWER = [("Left</answer>", True), ("Up</answer>", False), ("Right</answer>", True)]


@pytest.mark.parametrize("enable_think", [True, False])
def test_trajectory_is_the_rendered_conversation_token_for_token(family, enable_think):
    _, tokenizer = family
    config = AgentProxyConfig(enable_think=enable_think, max_actions_per_turn=2)
    replies = REPLIES_THINK if enable_think else REPLIES_ANSWER
    context, trajectory, prompts, texts, reply_ids = converse(tokenizer, config, replies)

    # Each prompt extends the previous prompt and reply, id for id: what the model saw is never re-tokenized.
    for turn in range(1, len(replies)):
        assert prompts[turn][: len(prompts[turn - 1]) + len(reply_ids[turn - 1])] == prompts[turn - 1] + reply_ids[turn - 1]
    # The loss mask selects exactly the generated ids; turn_ends point at each reply's last id.
    assert [t for t, m in zip(trajectory.input_ids, trajectory.loss_mask) if m] == sum(reply_ids, [])
    assert [trajectory.input_ids[i] for i in trajectory.turn_ends] == [ids[-1] for ids in reply_ids]
    # Decoded, the sequence is the chat template's rendering of the whole conversation.
    messages = [{"role": "system", "content": context._system_prompt("T")}]
    for turn, text in enumerate(texts):
        reward = None if turn == 0 else -0.1
        messages.append({"role": "user", "content": context._state_message("T", f"state {turn + 1}", turn + 1, 10 - turn,
                                                                            reward)})
        messages.append({"role": "assistant", "content": text})
    rendered = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(trajectory.input_ids) == rendered + context.reply_open + tokenizer.decode(reply_ids[-1])
    # Each reply parses: the forced opening is part of the text the parser sees.
    assert all(context.parse(text).format_ok for text in texts)


def test_window_shows_the_system_message_and_the_last_k_turns(family):
    _, tokenizer = family
    context, trajectory, prompts, texts, reply_ids = converse(tokenizer, AgentProxyConfig(max_actions_per_turn=2),
                                                              REPLIES_THINK, window=2)
    full = trajectory.input_ids
    system_end = trajectory.turn_starts[0]
    assert prompts[0] == full[:len(prompts[0])] and prompts[1] == full[:len(prompts[1])]  # all turns fit the window
    # Turn 3 sees the system message, then turns 2 and 3 only.
    reply3_start = trajectory.turn_ends[2] - len(reply_ids[2]) + 1
    assert prompts[2] == full[:system_end] + full[trajectory.turn_starts[1]:reply3_start]
    shown = tokenizer.decode(prompts[2])
    assert "state 1" not in shown and "state 2" in shown and "state 3" in shown
    assert shown.startswith(tokenizer.decode(full[:system_end]))
    # The shown prompt is itself a well-formed conversation in the template.
    messages = [{"role": "system", "content": context._system_prompt("T")},
                {"role": "user", "content": context._state_message("T", "state 2", 2, 9, -0.1)},
                {"role": "assistant", "content": texts[1]},
                {"role": "user", "content": context._state_message("T", "state 3", 3, 8, -0.1)}]
    assert shown == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"


def test_turn_scores_put_each_turn_reward_on_its_last_generated_token(tokenizer):
    config = AgentProxyConfig(use_turn_scores=True, max_actions_per_turn=2)
    context, trajectory, *_ = converse(tokenizer, config, REPLIES_THINK)
    trajectory.turn_rewards = [-0.1, 1.0, 10.0]
    rewards = context.to_batch([trajectory], group_ids=[0], tags=["T"]).batch["token_rewards"][0]
    assert rewards[trajectory.turn_ends].tolist() == pytest.approx([-0.1, 1.0, 10.0])
    assert rewards.sum().item() == pytest.approx(10.9) and torch.count_nonzero(rewards) == 3
    context.config = AgentProxyConfig(use_turn_scores=False)
    summed = context.to_batch([trajectory], group_ids=[0], tags=["T"]).batch["token_rewards"][0]
    assert summed[trajectory.turn_ends[-1]].item() == pytest.approx(10.9) and torch.count_nonzero(summed) == 1


def test_every_turn_states_the_format_and_the_actions_left(tokenizer):
    config = AgentProxyConfig(max_actions_per_turn=3, action_sep="|")
    context = ContextManager(tokenizer, config, {"T": "Rules."}, {"T": "Left"}, [tokenizer.eos_token_id])
    message = context._state_message("T", "grid", turn=2, actions_left=2, reward=1.0)
    assert message.startswith("Reward: 1\nTurn 2. State:\ngrid\nYou have 2 actions left.")
    assert "<think>...</think><answer>...</answer>" in message and "up to 2 actions separated by '|'" in message
    answer_only = ContextManager(tokenizer, AgentProxyConfig(enable_think=False, max_actions_per_turn=1),
                                 {"T": "Rules."}, {"T": "Left"}, [tokenizer.eos_token_id])
    message = answer_only._state_message("T", "grid", turn=1, actions_left=5, reward=None)
    assert "Reply as <answer>...</answer>." in message and "<think>" not in message and "separated" not in message
    assert "Choose" not in message  # no action_choices for "T"


def test_an_env_that_lists_its_moves_gets_them_in_every_state_message(tokenizer):
    config = AgentProxyConfig(enable_think=False, max_actions_per_turn=1)
    context = ContextManager(tokenizer, config, {"A": "Rules.", "B": "Rules."}, {"A": "Left", "B": "x"},
                             [tokenizer.eos_token_id], action_choices={"A": "Left or Right"})
    trajectory = context.start("A", "grid", actions_left=3)
    reply = context._encode("Left</answer>")
    context.add_response(trajectory, reply, [-1.0] * len(reply))
    assert context.add_observation(trajectory, "grid 2", reward=0.0, actions_left=2, response_length=8)
    text = tokenizer.decode(trajectory.input_ids)
    assert text.count("You have 3 actions left. Choose from Left or Right. Reply as <answer>...</answer>.") == 1
    assert text.count("You have 2 actions left. Choose from Left or Right. Reply as <answer>...</answer>.") == 1
    other = tokenizer.decode(context.start("B", "grid", actions_left=3).input_ids)
    assert "Choose from" not in other
