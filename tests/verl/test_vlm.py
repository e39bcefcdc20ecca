"""The vision-language model made here (verl/utils/vlm.py): a language model given a fresh vision tower."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

from ragen.envs import make_env
from tests.conftest import save_tiny_qwen_vl
from verl.utils.vlm import IMAGE_TOKEN, build_vlm


@pytest.fixture(scope="module")
def vlm_path(tiny_model_path, tmp_path_factory) -> str:
    return str(build_vlm(tiny_model_path, tmp_path_factory.mktemp("vlm"), image_size=96, patch_size=16,
                         vision_width=32, vision_layers=1, vision_heads=2))


@pytest.fixture(scope="module", params=["idefics3", "qwen2_vl"])
def any_vlm(request, vlm_path, tokenizer, tmp_path_factory) -> str:
    """Both ways a model takes pictures: image tokens in a row (Idefics3, made here) and on a grid of positions
    (the Qwen2-VL family's M-RoPE)."""
    if request.param == "idefics3":
        return vlm_path
    return save_tiny_qwen_vl(tmp_path_factory.mktemp(request.param), tokenizer, request.param)


def test_on_text_alone_it_computes_what_the_language_model_did(vlm_path, tiny_model_path):
    language = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    vlm = AutoModelForImageTextToText.from_pretrained(vlm_path, dtype=torch.float32)
    ids = AutoProcessor.from_pretrained(vlm_path).tokenizer("Push the box onto the target.", return_tensors="pt")
    expected = language(**ids).logits
    logits = vlm(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"]).logits
    assert torch.equal(logits[..., :expected.shape[-1]], expected)


def test_a_board_picture_becomes_one_image_token_per_cell_and_the_model_answers(vlm_path):
    _, info = make_env("sokoban", {"image_observation": "alone"}).reset(seed=0)
    processor = AutoProcessor.from_pretrained(vlm_path)
    inputs = processor(text=[f"{IMAGE_TOKEN}Where is the player?"], images=[[Image.fromarray(info["images"][0])]],
                       return_tensors="pt")
    image_token = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert (inputs["input_ids"] == image_token).sum() == 36  # 96 pixels / 16 per patch = 6 x 6 cells
    vlm = AutoModelForImageTextToText.from_pretrained(vlm_path, dtype=torch.float32)
    out = vlm.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 4)
    other = make_env("sokoban", {"image_observation": "alone"}).reset(seed=1)[1]["images"][0]
    assert not np.array_equal(other, info["images"][0])
    moved = processor(text=[f"{IMAGE_TOKEN}Where is the player?"], images=[[Image.fromarray(other)]],
                      return_tensors="pt")
    assert not torch.equal(vlm(**inputs).logits[0, -1], vlm(**moved).logits[0, -1])  # the picture reaches the LM


def test_a_size_that_does_not_fill_whole_patches_is_refused(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="image_size=100 must be a multiple of patch_size x scale_factor = 16"):
        build_vlm(tiny_model_path, tmp_path, image_size=100, patch_size=16)


def test_a_trajectory_with_pictures_holds_the_ids_the_processor_gives_its_text_and_pictures(any_vlm):
    from ragen.config import AgentProxyConfig
    from ragen.context_manager import ContextManager
    from verl.utils.model import load_processor
    from verl.utils.vlm import image_prompt_text, model_pixel_inputs, pixel_inputs

    processor = load_processor(any_vlm)
    env = make_env("sokoban", {"image_observation": "with_text", "cell_separator": " "})
    obs, info = env.reset(seed=3)
    image_text = image_prompt_text(processor, info["images"][0])
    config = AgentProxyConfig(max_turn=3, max_actions_per_turn=1, enable_think=False, max_context_window=1)
    cm = ContextManager.for_envs(processor.tokenizer, config, {"S": env}, eos_ids=[processor.tokenizer.eos_token_id],
                                 processor=processor)
    trajectory = cm.start("S", obs, 3, images=tuple(info["images"]))
    reply = processor.tokenizer.encode("<answer>Down</answer><|im_end|>", add_special_tokens=False)
    cm.add_response(trajectory, reply, [0.0] * len(reply))
    obs, _, _, _, info = env.step("Down")
    assert cm.add_observation(trajectory, obs, -0.1, 2, response_length=16, images=tuple(info["images"]))
    block = processor.tokenizer.encode(image_text, add_special_tokens=False)  # one picture's ids, as the processor
    assert len(block) >= 36  # at least one image token per board cell
    vlm = AutoModelForImageTextToText.from_pretrained(any_vlm, dtype=torch.float32)
    for window, shown in ((-1, 2), (1, 1)):  # the whole dialogue, then the last state alone
        cm.config.max_context_window = window
        ids, pictures = cm.prompt_ids(trajectory), cm.prompt_images(trajectory)
        assert len(pictures) == shown and np.array_equal(pictures[-1], info["images"][0])
        starts = [i for i in range(len(ids)) if ids[i:i + len(block)] == block]
        assert len(starts) == shown  # each picture shown is one processor block in the ids the engine gets
        input_ids = torch.tensor([ids])
        vlm(input_ids=input_ids, **model_pixel_inputs(vlm.config, pixel_inputs(processor, [pictures]), input_ids))
    with pytest.raises(ValueError, match="1 <image> placeholder\\(s\\) and comes with 0 picture"):
        cm.start("S", obs, 3)
    cm.processor = None
def test_the_hf_engine_generates_from_image_tokens_and_pictures_as_the_model_does(any_vlm, tiny_model_path):
    from verl.utils.model import load_processor
    from verl.utils.vlm import image_prompt_text, model_pixel_inputs, pixel_inputs
    from verl.workers.rollout import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    processor = load_processor(any_vlm)
    pictures = [make_env("sokoban", {"image_observation": "alone"}).reset(seed=s)[1]["images"][0] for s in (0, 1)]
    prompts = [processor.tokenizer.encode(image_prompt_text(processor, p) + "Where is the player?",
                                          add_special_tokens=False) for p in pictures]
    prompts[1] = prompts[1][:-2]  # rows of two lengths: left padding
    engine = HFRollout(any_vlm, processor.tokenizer, "float32", torch.device("cpu"))
    sampling = SamplingParams(temperature=0.0, max_new_tokens=5)
    out = engine.generate(prompts, sampling, images=[[p] for p in pictures])
    vlm = AutoModelForImageTextToText.from_pretrained(any_vlm, dtype=torch.float32)
    assert all(out.token_ids)
    for prompt, picture, response in zip(prompts, pictures, out.token_ids):
        input_ids = torch.tensor([prompt])
        pixels = model_pixel_inputs(vlm.config, pixel_inputs(processor, [[picture]]), input_ids)
        alone = vlm.generate(input_ids=input_ids, **pixels, max_new_tokens=5, do_sample=False,
                             eos_token_id=engine.eos_ids)
        assert response == alone[0, len(prompt):].tolist()[:len(response)]
    text_engine = HFRollout(tiny_model_path, processor.tokenizer, "float32", torch.device("cpu"))
    with pytest.raises(ValueError, match="need a vision-language model"):
        text_engine.generate(prompts, sampling, images=[[p] for p in pictures])


def picture_batch(vlm_path: str) -> dict[str, torch.Tensor]:
    return picture_rollout(vlm_path).batch


def picture_rollout(vlm_path: str):
    """Two 2-turn Sokoban trajectories on pictures alone, sampled by the hf engine with a context window of one
    turn, as the training batch holds them (ContextManager.to_batch: ids, window mask, every picture of a row),
    one start state (group) each."""
    from ragen.config import AgentProxyConfig
    from ragen.context_manager import ContextManager
    from verl.utils.model import load_processor
    from verl.workers.rollout import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    processor = load_processor(vlm_path)
    engine = HFRollout(vlm_path, processor.tokenizer, "float32", torch.device("cpu"))
    config = AgentProxyConfig(max_turn=3, max_actions_per_turn=1, enable_think=False, max_context_window=1)
    envs = [make_env("sokoban", {"image_observation": "alone"}) for _ in range(2)]
    cm = ContextManager.for_envs(processor.tokenizer, config, {"S": envs[0]}, eos_ids=engine.eos_ids,
                                 processor=processor)
    starts = [env.reset(seed=seed) for seed, env in enumerate(envs)]
    trajectories = [cm.start("S", obs, 3, tuple(info["images"])) for obs, info in starts]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=0)
    for turn in range(2):
        out = engine.generate([cm.prompt_ids(t) for t in trajectories], sampling,
                              images=[cm.prompt_images(t) for t in trajectories])
        for env, trajectory, ids, log_probs in zip(envs, trajectories, out.token_ids, out.log_probs):
            cm.add_response(trajectory, ids, log_probs)
            trajectory.turn_states.append(f"turn {turn}")  # what AgentProxy records of each turn
            trajectory.turn_rewards.append(0.0)
            obs, _, _, _, info = env.step("Up")
            if turn == 0:
                assert cm.add_observation(trajectory, obs, 0.0, 2, response_length=6, images=tuple(info["images"]))
    data = cm.to_batch(trajectories, [0, 1], ["S", "S"])
    batch = data.batch
    if "image_grid_thw" in batch:  # each row: the pictures of its two turns
        assert batch["image_grid_thw"].shape[:2] == (2, 2)
    else:
        assert batch["pixel_values"].shape[:2] == (2, 2)
    assert batch["picture_turns"].tolist() == [[0, 1], [0, 1]]
    return data


def test_the_collapse_check_tells_picture_prompts_apart_and_scores_each_reply_with_its_prompts_pictures(any_vlm):
    """Two start states shown as pictures alone: their first prompts are the same tokens, so only the pictures tell
    them apart. Both count as inputs, and every cross-scoring row carries its prompt's pictures: a first reply
    scored under its own prompt gets the log-prob the engine gave it, and under the other board another one."""
    from verl.trainer.collapse import cross_scoring_pairs, score_matrix
    from verl.workers.actor import token_log_probs

    data = picture_rollout(any_vlm)
    batch = data.batch
    first = batch["loss_mask"].bool() & (batch["turn_ids"] == 0)
    prompts = [batch["input_ids"][b, :int(first[b].nonzero()[0])] for b in (0, 1)]
    assert torch.equal(*prompts) and (batch["state_ids"][0] != batch["state_ids"][1]).all()
    pairs, own_input = cross_scoring_pairs(data, inputs=2, replies=1)
    assert own_input.tolist() == [0, 1] and len(pairs) == 4
    vlm = AutoModelForImageTextToText.from_pretrained(any_vlm, dtype=torch.float32)
    log_probs = token_log_probs(vlm, pairs.batch, with_entropy=False, temperature=1.0)[0]
    scores = score_matrix(log_probs, pairs.batch["loss_mask"], num_replies=2)  # (inputs, replies)
    sampled = (batch["rollout_log_probs"] * first).sum(-1)  # each first reply, as the engine scored it
    torch.testing.assert_close(scores.diagonal(), sampled, atol=1e-3, rtol=0)
    assert (scores - scores.diagonal()).abs().max() > 1e-4  # the other board's pictures score it otherwise


def test_the_trainer_scores_a_picture_trajectory_as_the_engine_sampled_it(any_vlm):
    """Token-exact with pictures: the training batch gives the sampled tokens the log-probs the engine gave them;
    without the pixel inputs it does not, so the pictures are what the trainer reads."""
    from verl.utils.vlm import PIXEL_KEYS
    from verl.workers.actor import token_log_probs

    batch = picture_batch(any_vlm)
    vlm = AutoModelForImageTextToText.from_pretrained(any_vlm, dtype=torch.float32)
    mask = batch["loss_mask"].bool()
    seen = token_log_probs(vlm, batch, with_entropy=False, temperature=1.0)[0]
    torch.testing.assert_close(seen[mask], batch["rollout_log_probs"][mask], atol=1e-4, rtol=0)
    blind = {k: v for k, v in batch.items() if k not in PIXEL_KEYS}
    assert (token_log_probs(vlm, blind, with_entropy=False, temperature=1.0)[0][mask] - seen[mask]).abs().max() > 1e-3


def test_the_critic_of_a_vision_language_model_reads_the_pictures(any_vlm):
    """The value model of a vision-language policy is that model with a one-output head: its backbone weights
    are the policy's, its values (B, T, 1) change with the pictures, and it starts the same on every load."""
    from verl.utils.model import forward_inputs, load_value_model
    from verl.utils.vlm import PIXEL_KEYS

    batch = picture_batch(any_vlm)
    critic = load_value_model(any_vlm)
    policy = AutoModelForImageTextToText.from_pretrained(any_vlm, dtype=torch.float32)
    weights = policy.state_dict()
    backbone = {k: v for k, v in critic.state_dict().items() if not k.startswith("lm_head.")}
    assert backbone and all(torch.equal(v, weights[k]) for k, v in backbone.items())
    with torch.no_grad():
        values = critic(**forward_inputs(critic, batch)).logits
        blind = {k: v for k, v in batch.items() if k not in PIXEL_KEYS}
        assert values.shape == (*batch["input_ids"].shape, 1)
        assert (critic(**forward_inputs(critic, blind)).logits - values).abs().max() > 1e-4
        again = load_value_model(any_vlm)
        assert torch.equal(again(**forward_inputs(again, batch)).logits, values)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_mrope_positions_of_whole_prompts_are_the_models_own(family, tokenizer, tmp_path):
    """`mrope_position_ids` (which the trainer uses, context windows included) against the model's own
    `get_rope_index` on right-padded rows of two lengths, one with two pictures of two sizes, one with none."""
    from verl.utils.model import load_processor
    from verl.utils.vlm import image_prompt_text, model_pixel_inputs, mrope_position_ids, pixel_inputs

    path = save_tiny_qwen_vl(tmp_path / "model", tokenizer, family)
    processor = load_processor(path)
    processor.save_pretrained(tmp_path / "copy")  # what a warm start saves beside its model
    from transformers import AutoImageProcessor, AutoTokenizer

    assert AutoImageProcessor.from_pretrained(tmp_path / "copy").to_dict() == processor.image_processor.to_dict()
    assert AutoTokenizer.from_pretrained(tmp_path / "copy").get_vocab() == processor.tokenizer.get_vocab()
    small = make_env("sokoban", {"image_observation": "alone"}).reset(seed=0)[1]["images"][0]  # 96 x 96
    wide = np.concatenate([small, small], axis=1)  # 96 x 192: a grid of 6 x 12 image tokens
    rows = [[small, wide], []]
    texts = ["A" + image_prompt_text(processor, small) + "B C" + image_prompt_text(processor, wide) + "D E F", "G H"]
    ids = [processor.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    width = max(map(len, ids))
    input_ids = torch.tensor([row + [processor.tokenizer.pad_token_id] * (width - len(row)) for row in ids])
    attention_mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    pixels = pixel_inputs(processor, rows)
    vlm = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    model_inputs = model_pixel_inputs(vlm.config, pixels, input_ids)
    expected, _ = vlm.model.get_rope_index(input_ids, model_inputs["mm_token_type_ids"],
                                           image_grid_thw=model_inputs["image_grid_thw"], attention_mask=attention_mask)
    positions = mrope_position_ids(vlm.config, input_ids, torch.arange(width).expand(2, -1), pixels["image_grid_thw"])
    real = attention_mask.bool()
    assert torch.equal(positions[:, real], expected[:, real])
    assert not torch.equal(positions[0, 0], positions[1, 0])  # the pictures' tokens: rows and columns apart


def test_the_torch_engine_generates_from_pictures_as_the_model_does(vlm_path, tokenizer, tmp_path):
    """The default engine on pictures (Idefics3): greedy tokens and log-probs equal the hf engine's, for left-padded
    prompts with one picture each; a second call with other pictures is not answered from the first's cache. The
    Qwen2-VL family is refused with the engine to use instead."""
    from verl.utils.model import load_processor
    from verl.utils.vlm import image_prompt_text
    from verl.workers.rollout import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout
    from verl.workers.rollout.torch_rollout import TorchRollout

    processor = load_processor(vlm_path)
    pictures = [make_env("sokoban", {"image_observation": "alone"}).reset(seed=s)[1]["images"][0] for s in range(4)]
    prompts = [processor.tokenizer.encode(image_prompt_text(processor, p) + "Where is the player?",
                                          add_special_tokens=False) for p in pictures]
    prompts[1] = prompts[1][:-2]  # rows of two lengths: left padding
    sampling = SamplingParams(temperature=0.0, max_new_tokens=6)
    engines = [cls(vlm_path, processor.tokenizer, "float32", torch.device("cpu")) for cls in (HFRollout, TorchRollout)]
    first_log_probs = []
    for shown in (pictures[:2], pictures[2:]):  # the same prompt texts, other pictures
        expected, got = (engine.generate(prompts[:2], sampling, images=[[p] for p in shown]) for engine in engines)
        assert got.token_ids == expected.token_ids and all(got.token_ids)
        for a, b in zip(got.log_probs, expected.log_probs):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=0)
        first_log_probs.append(got.log_probs[0][0])
    assert first_log_probs[0] != first_log_probs[1]  # the pictures, not only the text, decide the reply
    with pytest.raises(ValueError, match="rollout.name=hf"):
        TorchRollout(save_tiny_qwen_vl(tmp_path, tokenizer), processor.tokenizer, "float32", torch.device("cpu"))


def test_a_lora_adapter_on_a_vision_language_model_reads_the_pictures_and_merges_exactly(any_vlm):
    """LoRA ("all-linear") adapts the vision side and the language model alike; the adapted model scores a
    picture trajectory through the trainer's forward, and the merged weights (what the rollout engine gets)
    score it the same, in a plain model of the base class."""
    from verl.utils.lora import ADAPTER, apply_lora, merge_lora
    from verl.workers.actor import token_log_probs

    batch = picture_batch(any_vlm)
    adapted = apply_lora(AutoModelForImageTextToText.from_pretrained(any_vlm, dtype=torch.float32), rank=4, alpha=8,
                         target_modules="all-linear")
    layers = [name for name, module in adapted.named_modules() if hasattr(module, "lora_B")]
    tower = "vision_model" if "vision_model" in "".join(layers) else "visual"
    assert any(tower in name for name in layers) and any(tower not in name for name in layers)
    torch.manual_seed(0)
    with torch.no_grad():  # a trained adapter: lora_B is zero at the start
        for name, module in adapted.named_modules():
            if hasattr(module, "lora_B"):
                module.lora_B[ADAPTER].weight.normal_(std=0.05)
    mask = batch["loss_mask"].bool()
    seen = token_log_probs(adapted, batch, with_entropy=False, temperature=1.0)[0]
    assert (seen[mask] - batch["rollout_log_probs"][mask]).abs().max() > 1e-3  # the adapter changed the policy
    merged = AutoModelForImageTextToText.from_pretrained(any_vlm, dtype=torch.float32)
    merged.load_state_dict(merge_lora(adapted.state_dict(), scale=8 / 4))
    torch.testing.assert_close(token_log_probs(merged, batch, with_entropy=False, temperature=1.0)[0][mask],
                               seen[mask], atol=1e-4, rtol=0)


def picture_nll(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed negative log-likelihood of the sampled tokens, through the trainer's forward (pictures included)."""
    from verl.workers.actor import token_log_probs

    return -(token_log_probs(model, batch, with_entropy=False, temperature=1.0)[0] * batch["loss_mask"]).sum()


def update_on_pictures(vlm_path: str, batch: dict[str, torch.Tensor], sharded: bool) -> dict:
    """test_fsdp's update (one AdamW step, normalised as ppo_update does) on this rank's rows of a picture batch,
    all of it unsharded: the loss (summed over ranks), the gradient norm and the full weights after the step."""
    from tests.verl.test_fsdp import LR, this_ranks_part, update
    from verl.utils.fsdp import full_state_dict, shard_model
    from verl.utils.model import load_causal_lm

    model = load_causal_lm(vlm_path)
    if sharded:
        shard_model(model, param_dtype="float32", cpu_offload=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loss, grad_norm = update(model, optimizer, this_ranks_part(batch), picture_nll)
    return {"loss": loss, "grad_norm": grad_norm, "weights": full_state_dict(model) if sharded else model.state_dict()}


def test_fsdp_over_two_ranks_updates_a_vision_language_model_as_one_process_does(any_vlm):
    """The actor's sharding (FSDP2 over 2 gloo ranks, one picture trajectory each, its pixel inputs split with
    its rows) gives the loss, gradient norm and updated weights, vision tower included, of the unsharded update
    of the whole batch."""
    from tests.verl.test_fsdp import run_on_ranks

    rollout = picture_rollout(any_vlm)
    batch = {key: value for key, value in rollout.batch.items() if isinstance(value, torch.Tensor)}
    reference = update_on_pictures(any_vlm, batch, sharded=False)
    initial = AutoModelForImageTextToText.from_pretrained(any_vlm, dtype=torch.float32).state_dict()
    tower = "vision_model" if any("vision_model" in key for key in initial) else "visual"
    assert any(tower in key and not torch.equal(value, reference["weights"][key]) for key, value in initial.items())
    for rank in run_on_ranks(2, update_on_pictures, any_vlm, batch, True):
        assert rank["loss"] == pytest.approx(reference["loss"], rel=1e-5)
        assert rank["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-4)
        assert rank["weights"].keys() == reference["weights"].keys()
        for name, weight in reference["weights"].items():  # Adam's near-zero-gradient noise: ~lr * 1e-3
            torch.testing.assert_close(rank["weights"][name], weight, rtol=0, atol=2e-5)
