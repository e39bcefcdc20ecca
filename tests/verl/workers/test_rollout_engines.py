"""The two engines that run an HF model: HF `generate` (HFRollout) and our decode loop (TorchRollout). Both
keep the contract (seeded, EOS and stop strings, weight sync, prefix reuse); the decode loop gives `generate`'s
tokens under greedy decoding and samples from the distribution HF's logits processors define."""

from dataclasses import replace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from verl.utils.model import load_causal_lm
from verl.workers.rollout import HFRollout, SamplingParams, TorchRollout

ENGINES = [HFRollout, TorchRollout]


@pytest.fixture(params=ENGINES, ids=lambda cls: cls.__name__)
def engine_cls(request):
    return request.param


@pytest.fixture
def engine(engine_cls, tiny_model_path, tokenizer):
    return engine_cls(tiny_model_path, tokenizer, "bfloat16", torch.device("cpu"))


def prompts(tokenizer):
    return [tokenizer.encode("hello there, how are you", add_special_tokens=False),
            tokenizer.encode("a", add_special_tokens=False)]  # different lengths: left padding


def test_same_seed_same_samples(engine_cls, tiny_model_path, tokenizer):
    """Without prefix reuse: a second call served from the cache feeds its prompts' last tokens in other shapes,
    which in bf16 rounds differently on some CPUs (reuse is tested token for token in fp32 below)."""
    engine = engine_cls(tiny_model_path, tokenizer, "bfloat16", torch.device("cpu"), prefix_cache=False)
    sampling = SamplingParams(max_new_tokens=8, seed=3)
    first, second = (engine.generate(prompts(tokenizer), sampling).token_ids for _ in range(2))
    assert first == second and all(1 <= len(r) <= 8 for r in first)


def test_ignore_eos_generates_exactly_max_new_tokens(engine, tokenizer):
    out = engine.generate(prompts(tokenizer), SamplingParams(max_new_tokens=6, ignore_eos=True, seed=0))
    assert [len(r) for r in out.token_ids] == [len(r) for r in out.log_probs] == [6, 6]


def test_rows_are_cut_after_eos_and_after_stop_strings(tiny_model_path, tokenizer):
    engine = HFRollout(tiny_model_path, tokenizer, "bfloat16", torch.device("cpu"))
    eos = tokenizer.eos_token_id
    answer = tokenizer.encode("x</answer>", add_special_tokens=False)
    assert engine._cut([5, 6, eos, eos, eos], stop=[]) == [5, 6, eos]  # padding uses the EOS id
    assert engine._cut(answer + [7, 8], stop=["</answer>"]) == answer
    assert engine._cut([5, 6, 7], stop=["</answer>"]) == [5, 6, 7]  # hit the length limit


def test_sync_weights_changes_what_is_generated(engine, tokenizer):
    sampling = SamplingParams(max_new_tokens=8, ignore_eos=True, seed=0)
    before = engine.generate(prompts(tokenizer), sampling).token_ids
    state = {k: torch.randn_like(v, dtype=torch.float32) for k, v in engine.model.state_dict().items()}
    engine.sync_weights(state)
    assert torch.equal(engine.model.model.layers[0].mlp.up_proj.weight,
                       state["model.layers.0.mlp.up_proj.weight"].to(torch.bfloat16))
    assert engine.generate(prompts(tokenizer), sampling).token_ids != before


def teacher_forced_log_probs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each response token, the whole sequence fed at once (T = 1 for greedy)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()  # (R, V)
    return (logits / (temperature or 1.0)).log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 3, 0.9), (0.0, 0, 1.0)])
def test_log_probs_are_the_policys_under_teacher_forcing(engine_cls, tiny_model_path, tokenizer, temperature, top_k,
                                                         top_p):
    """Each sampled token's log-prob is log_softmax(logits / T) of a plain forward over prompt + response: not
    renormalised over the top-k / top-p set (0.7, 3, 0.9). Rows of different lengths (a stop string), left
    padding, and a second turn served from the prefix cache."""
    engine = engine_cls(tiny_model_path, tokenizer, "float32", torch.device("cpu"))
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=10, stop=["k"],
                              seed=0)
    first = prompts(tokenizer) + [tokenizer.encode("The quick brown fox", add_special_tokens=False)]
    out_first = engine.generate(first, sampling)
    second = [p + r + [7, 8, 9] for p, r in zip(first, out_first.token_ids)]
    out_second = engine.generate(second, replace(sampling, seed=1))
    assert engine.last_reused_tokens > 0
    model = load_causal_lm(tiny_model_path, "float32").eval()
    for batch, out in ((first, out_first), (second, out_second)):
        for prompt, response, log_probs in zip(batch, out.token_ids, out.log_probs):
            assert len(log_probs) == len(response) > 0
            expected = teacher_forced_log_probs(model, prompt, response, temperature)
            torch.testing.assert_close(torch.tensor(log_probs), expected, atol=1e-5, rtol=0)


# ---- prefix reuse ------------------------------------------------------------------------------------
FIRST_PROMPTS = ["hello there, how are you", "a", "The quick brown fox jumps over", "Sokoban grid ### #_# ###"]


def play(engine, tokenizer, sampling, turns=3):
    """A multi-turn rollout as the agent drives it: each prompt grows by the returned response and an
    observation of a different length per row; one episode ends per turn, the row order flips every turn,
    and in the last turn a new episode joins and one row keeps only half its response (a partial prefix).

    Returns the responses per turn, the last-position logits of every forward pass, and the prompt
    tokens the engine took from its cache per turn.
    """
    logits = []
    # HF runs the head on (B, 1, V) positions, the decode loop on the last position only (B, V)
    hook = engine.model.lm_head.register_forward_hook(
        lambda m, i, out: logits.append((out[:, -1] if out.dim() == 3 else out).float().clone()))
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    prompts = {i: encode(text) for i, text in enumerate(FIRST_PROMPTS)}
    responses, reused = [], []
    for turn in range(turns):
        order = sorted(prompts, reverse=turn % 2 == 1)
        out = engine.generate([prompts[i] for i in order], replace(sampling, seed=turn)).token_ids
        responses.append(out)
        reused.append(engine.last_reused_tokens)
        prompts = {i: prompts[i] + r + encode(f"\nobservation {turn}:" + " #" * i) for i, r in zip(order, out)
                   if i != turn}
        if turn == turns - 2:
            prompts[len(FIRST_PROMPTS)] = encode("a brand new episode")
            row = min(prompts)
            prompts[row] = prompts[row][: len(prompts[row]) - len(out[order.index(row)]) // 2 - 3]
    hook.remove()
    return responses, logits, reused


@pytest.mark.parametrize("model", ["tiny", "bundled"])
def test_prefix_reuse_gives_the_same_tokens_and_logits(engine_cls, model, tiny_model_path, bundled_model_path,
                                                       tokenizer):
    path = tiny_model_path if model == "tiny" else bundled_model_path
    # tiny: seeded sampling (greedy only repeats the last token of a random model); bundled: greedy
    sampling = (SamplingParams(max_new_tokens=12, stop=["k"]) if model == "tiny"
                else SamplingParams(temperature=0, max_new_tokens=16, stop=["."]))
    engines = {reuse: engine_cls(path, tokenizer, "float32", torch.device("cpu"), prefix_cache=reuse)
               for reuse in (True, False)}
    reused_run, fresh_run = (play(engines[reuse], tokenizer, sampling) for reuse in (True, False))
    (responses, logits, reused), (fresh_responses, fresh_logits, fresh_reused) = reused_run, fresh_run

    assert responses == fresh_responses
    lengths = [len(r) for turn in responses for r in turn]
    assert min(lengths) < sampling.max_new_tokens and max(lengths) == sampling.max_new_tokens  # cut and uncut rows
    assert reused[0] == 0 and all(n > 0 for n in reused[1:]) and fresh_reused == [0, 0, 0]
    assert len(logits) == len(fresh_logits)
    for step, fresh in zip(logits, fresh_logits):
        torch.testing.assert_close(step, fresh, atol=2e-4, rtol=1e-4)


def test_prefix_cache_is_dropped_by_sync_weights_and_over_its_memory_bound(engine_cls, tiny_model_path, tokenizer):
    sampling = SamplingParams(max_new_tokens=8, seed=0)
    first = prompts(tokenizer)
    engine = engine_cls(tiny_model_path, tokenizer, "float32", torch.device("cpu"))
    second = [p + r + [7, 8, 9] for p, r in zip(first, engine.generate(first, sampling).token_ids)]
    state = {k: torch.randn_like(v) for k, v in engine.model.state_dict().items()}
    engine.sync_weights(state)
    after_sync = engine.generate(second, sampling).token_ids
    assert engine.last_reused_tokens == 0

    fresh = engine_cls(tiny_model_path, tokenizer, "float32", torch.device("cpu"), prefix_cache=False)
    fresh.sync_weights(state)
    assert after_sync == fresh.generate(second, sampling).token_ids

    tight = engine_cls(tiny_model_path, tokenizer, "float32", torch.device("cpu"), prefix_cache_max_bytes=0)
    tight.generate(second, sampling)
    tight.generate([p + [5] for p in second], sampling)
    assert tight.last_reused_tokens == 0


def test_prefix_reuse_keeps_the_batch_no_wider_than_its_longest_prompt(engine_cls, tiny_model_path, tokenizer):
    sampling = SamplingParams(max_new_tokens=8, ignore_eos=True, seed=0)
    engines = [engine_cls(tiny_model_path, tokenizer, "float32", torch.device("cpu"), prefix_cache=reuse)
               for reuse in (True, False)]
    long, short = list(range(1000, 1040)), [5, 6, 7]
    outputs = []
    for engine in engines:
        response_long, response_short = engine.generate([long, short], sampling).token_ids
        # 40 + 8 + 2 = 50 tokens with 47 cached (the last sampled token has no K/V), and 3 + 8 + 30 = 41 with 10
        outputs.append(engine.generate([long + response_long + [9, 9], short + response_short + [8] * 30],
                                       sampling).token_ids)
    assert outputs[0] == outputs[1]
    # 31 new columns for the short row leave 50 - 31 = 19 cached ones: the long row reuses 19, the short one 10
    assert engines[0].last_reused_tokens == 19 + 10


# ---- the decode loop against HF generate ---------------------------------------------------------------
@pytest.mark.parametrize("model", ["tiny", "bundled"])
def test_decode_loop_gives_generates_tokens_under_greedy_decoding(model, tiny_model_path, bundled_model_path,
                                                                  tokenizer):
    """Token for token over a multi-turn rollout (prefix reuse, rows ending at EOS, at a stop string and at
    the length limit, finished rows leaving the batch), in fp32 where both run the same arithmetic."""
    path = tiny_model_path if model == "tiny" else bundled_model_path
    sampling = SamplingParams(temperature=0, max_new_tokens=16, stop=["."] if model == "bundled" else ["k"])
    runs = [play(cls(path, tokenizer, "float32", torch.device("cpu")), tokenizer, sampling) for cls in ENGINES]
    (hf_responses, _, _), (responses, _, reused) = runs
    assert responses == hf_responses
    if model == "bundled":  # the random model's greedy replies repeat one token to the limit
        lengths = [len(r) for turn in responses for r in turn]
        assert min(lengths) < sampling.max_new_tokens and max(lengths) == sampling.max_new_tokens
    assert reused[0] == 0 and all(n > 0 for n in reused[1:])


def test_identical_prompts_are_prefilled_once_and_sampled_apart(tiny_model_path, tokenizer):
    engine = TorchRollout(tiny_model_path, tokenizer, "float32", torch.device("cpu"), prefix_cache=False)
    prompt, other = prompts(tokenizer)
    batch = [prompt, other, prompt, prompt]  # a group of three and one more, as a rollout's first turn
    out = engine.generate(batch, SamplingParams(max_new_tokens=8, ignore_eos=True, seed=1)).token_ids
    assert engine.last_reused_tokens == 2 * len(prompt)  # fed once, copied twice
    assert len({tuple(out[i]) for i in (0, 2, 3)}) > 1, "copies of a row must draw their own samples"
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    hf = HFRollout(tiny_model_path, tokenizer, "float32", torch.device("cpu"), prefix_cache=False)
    assert engine.generate(batch, greedy).token_ids == hf.generate(batch, greedy).token_ids


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8),
                                                       (0.7, 4, 0.9)])
def test_sampler_draws_from_hfs_warped_distribution(tiny_model_path, tokenizer, temperature, top_k, top_p):
    engine = TorchRollout(tiny_model_path, tokenizer, "float32", torch.device("cpu"))
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0]])
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1:
        expected = TopPLogitsWarper(top_p)(None, expected)
    expected = expected.softmax(-1)[0]
    draws = 40_000
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens = engine._sample(logits.expand(draws, -1), sampling, torch.Generator().manual_seed(0))
    frequencies = torch.bincount(tokens, minlength=logits.shape[1]).float() / draws
    assert torch.all(frequencies[expected == 0] == 0), "a token the warpers remove was drawn"
    torch.testing.assert_close(frequencies, expected, atol=0.01, rtol=0)  # ~4 standard errors at p = 0.5


def test_decode_loop_refuses_other_architectures(tmp_path, tokenizer):
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="rollout.name=hf"):
        TorchRollout(str(tmp_path), tokenizer, "float32", torch.device("cpu"))
