import pytest
import torch

from verl.workers.rollout import HFRollout, SamplingParams


@pytest.fixture
def engine(tiny_model_path, tokenizer):
    return HFRollout(tiny_model_path, tokenizer, "bfloat16", torch.device("cpu"))


def prompts(tokenizer):
    return [tokenizer.encode("hello there, how are you", add_special_tokens=False),
            tokenizer.encode("a", add_special_tokens=False)]  # different lengths: left padding


def test_same_seed_same_samples(engine, tokenizer):
    sampling = SamplingParams(max_new_tokens=8, seed=3)
    first, second = engine.generate(prompts(tokenizer), sampling), engine.generate(prompts(tokenizer), sampling)
    assert first == second and all(1 <= len(r) <= 8 for r in first)


def test_ignore_eos_generates_exactly_max_new_tokens(engine, tokenizer):
    out = engine.generate(prompts(tokenizer), SamplingParams(max_new_tokens=6, ignore_eos=True, seed=0))
    assert [len(r) for r in out] == [6, 6]


def test_rows_are_cut_after_eos_and_after_stop_strings(engine, tokenizer):
    eos = tokenizer.eos_token_id
    answer = tokenizer.encode("x</answer>", add_special_tokens=False)
    assert engine._cut([5, 6, eos, eos, eos], stop=[]) == [5, 6, eos]  # padding uses the EOS id
    assert engine._cut(answer + [7, 8], stop=["</answer>"]) == answer
    assert engine._cut([5, 6, 7], stop=["</answer>"]) == [5, 6, 7]  # hit the length limit


def test_sync_weights_changes_what_is_generated(engine, tokenizer):
    sampling = SamplingParams(max_new_tokens=8, ignore_eos=True, seed=0)
    before = engine.generate(prompts(tokenizer), sampling)
    state = {k: torch.randn_like(v, dtype=torch.float32) for k, v in engine.model.state_dict().items()}
    engine.sync_weights(state)
    assert torch.equal(engine.model.model.layers[0].mlp.up_proj.weight,
                       state["model.layers.0.mlp.up_proj.weight"].to(torch.bfloat16))
    assert engine.generate(prompts(tokenizer), sampling) != before
