"""Parsing is total: any string a model can produce gives actions or a format penalty, never an exception."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragen.config import AgentProxyConfig
from ragen.context_manager import ContextManager, parse_reply

PIECES = ["<think>", "</think>", "<answer>", "</answer>", "<answer", "think>", "||", "|", "Left", "Up", " ", "\n",
          "\t", "é", "漢", "🙂", "\x00", "<|im_end|>", "<|im_start|>", "<", ">", "/", "\\", "$", "{}", "()"]
# Model-like replies: tags and words in any order and number, plus arbitrary unicode text.
REPLIES = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=40).map("".join),
    st.text(max_size=300),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=30).map("".join),
)


@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=REPLIES, enable_think=st.booleans(), max_actions=st.integers(1, 4))
def test_any_reply_parses_to_actions_or_a_format_failure(text, enable_think, max_actions):
    parsed = parse_reply(text, enable_think=enable_think, action_sep="||", max_actions=max_actions)
    assert isinstance(parsed.actions, list) and all(isinstance(a, str) and a == a.strip() and a for a in parsed.actions)
    assert len(parsed.actions) <= max_actions
    assert parsed.format_ok == bool(parsed.actions)
    if parsed.format_ok:  # a well-formed reply has exactly one answer block, and the actions come from it
        assert text.count("<answer>") == 1 and text.count("</answer>") == 1
        answer = text[text.index("<answer>") + len("<answer>"):text.index("</answer>")]
        assert all(action in answer for action in parsed.actions)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(ids=st.lists(st.integers(0, 49_151), max_size=60))
def test_any_generated_token_ids_give_a_reply_that_parses(tokenizer, ids):
    """Whatever ids the engine returns (special tokens included) become reply text and a parse, never an error."""
    context = ContextManager(tokenizer, AgentProxyConfig(), {"T": "Rules."}, {"T": "Left"}, [tokenizer.eos_token_id])
    trajectory = context.start("T", "grid", actions_left=3)
    reply = context.add_response(trajectory, ids, [-1.0] * len(ids))
    parsed = context.parse(reply)
    assert parsed.format_ok == bool(parsed.actions)
    assert trajectory.input_ids[len(trajectory.input_ids) - len(ids):] == ids


def test_huge_and_adversarial_replies():
    for text in ["<think>" * 100_000, "</answer><answer>" * 50_000, "a" * 1_000_000,
                 "<think>" + "x" * 500_000 + "</think><answer>Up</answer>"]:
        parsed = parse_reply(text, enable_think=True, action_sep="||", max_actions=2)
        assert parsed.format_ok == (text.endswith("<answer>Up</answer>"))
