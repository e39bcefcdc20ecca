"""The training workers on a tiny fp32 Llama: the update depends only on the mini-batch (not on how it is cut
into micro-batches or ranks), log-probs and values are aligned with input_ids, the reference policy is the
initial policy, and the critic fits its returns."""


import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, LlamaForTokenClassification

from ragen.config import AgentProxyConfig
from ragen.context_manager import ContextManager, Trajectory, reply_spans
from verl.protocol import DataProto
from verl.single_controller import LocalWorkerGroup, RayWorkerGroup
from verl.trainer.config import (ActorConfig, ActorRolloutRefConfig, CriticConfig, ModelConfig, OptimConfig,
                                 RolloutConfig)
from verl.trainer.core_algos import truncated_is_weights
from verl.utils.fsdp import full_state_dict
from verl.utils.model import load_value_model
from verl.workers.actor import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker
from verl.workers.rollout import SamplingParams

LENGTHS = (12, 7, 10, 5)  # right-padded to 12
# generated spans [start, end) per sequence; the rest is prompt, environment (8..10 of the first) or pad
SPANS = (((3, 6), (8, 12)), ((2, 7),), ((4, 10),), ((1, 5),))
LOSS_AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


def make_batch(tokenizer, seed: int = 0) -> DataProto:
    """Four right-padded sequences of different lengths, with random advantages and returns on their
    generated tokens (and stand-in rollout log-probs). old_log_probs and values are the workers' to add."""
    gen = torch.Generator().manual_seed(seed)
    size, width = len(LENGTHS), max(LENGTHS)
    input_ids = torch.full((size, width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((size, width), dtype=torch.long)
    position_ids = torch.zeros((size, width), dtype=torch.long)
    loss_mask = torch.zeros((size, width))
    for i, (n, spans) in enumerate(zip(LENGTHS, SPANS)):
        input_ids[i, :n] = torch.randint(len(tokenizer), (n,), generator=gen)
        attention_mask[i, :n] = 1
        position_ids[i, :n] = torch.arange(n)
        for start, end in spans:
            loss_mask[i, start:end] = 1
    return DataProto(batch={
        "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
        "loss_mask": loss_mask, "adv_mask": loss_mask.clone(),
        "advantages": torch.randn((size, width), generator=gen) * loss_mask,
        "returns": torch.randn((size, width), generator=gen) * loss_mask,
        "rollout_log_probs": torch.zeros((size, width))})  # every rollout's batch has the engine's log-probs


def actor_config(model_path: str, temperature: float = 1.0, **actor) -> ActorRolloutRefConfig:
    actor = dict(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4, ppo_epochs=1, entropy_coeff=0.01,
                 optim=OptimConfig(lr=1e-3)) | actor
    rollout = RolloutConfig(dtype="float32", log_prob_micro_batch_size_per_gpu=3, temperature=temperature)
    return ActorRolloutRefConfig(model=ModelConfig(path=model_path, dtype="float32"), actor=ActorConfig(**actor),
                                 rollout=rollout)


def critic_config(model_path: str, **critic) -> CriticConfig:
    critic = dict(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4, forward_micro_batch_size_per_gpu=3,
                  ppo_epochs=1, optim=OptimConfig(lr=1e-3)) | critic
    return CriticConfig(model=ModelConfig(path=model_path, dtype="float32"), **critic)


def local_actor(model_path: str, use_reference: bool = False, temperature: float = 1.0, **actor) -> LocalWorkerGroup:
    group = LocalWorkerGroup(ActorRolloutRefWorker, actor_config(model_path, temperature, **actor))
    group.init_model(use_reference=use_reference)
    return group


def local_critic(model_path: str, **critic) -> LocalWorkerGroup:
    group = LocalWorkerGroup(CriticWorker, critic_config(model_path, **critic))
    torch.manual_seed(0)  # the value head is initialised at random: the same seed, the same head
    group.init_model()
    return group


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A worker's parameters and gradients are FSDP shards (DTensors); with one rank the shard is all."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def params(group: LocalWorkerGroup) -> dict[str, torch.Tensor]:
    return {k: whole(v.detach()).clone() for k, v in group.worker.model.named_parameters()}


def grads(group: LocalWorkerGroup) -> dict[str, torch.Tensor]:
    """The last mini-batch's gradient (ppo_update zeroes it before, not after, a step)."""
    return {k: whole(v.grad).clone() for k, v in group.worker.model.named_parameters()}


def leave_stale_gradients(group: LocalWorkerGroup) -> None:
    """What an earlier update leaves on the parameters; the next mini-batch must start from zero."""
    for p in group.worker.model.parameters():
        p.grad = torch.ones_like(p)


def assert_same_update(before, after_a, after_b, grad_a, rel: float = 0.01) -> None:
    """Both updates moved the parameters, and by the same amount up to `rel` of the largest move, wherever the
    gradient stands well clear of Adam's eps (|g| > 1e-6 = 100 eps).

    Adam's first step is lr * g / (|g| + 1e-8): where |g| is near eps, the rounding of g (~1e-9, from summing
    micro-batches in another order; the gradients themselves are compared tightly) moves a parameter by a
    sizeable share of lr. Clear of eps that share is below 1e-3."""
    moved = max((after_a[k] - before[k]).abs().max().item() for k in before)
    assert moved > 1e-4, "the update left the parameters where they were"
    diff = max(((after_a[k] - after_b[k]).abs() * (grad_a[k].abs() > 1e-6)).max().item() for k in before)
    assert diff <= rel * moved, f"updates differ by {diff:.3g}, the largest move is {moved:.3g}"


def assert_same_tensors(a: dict, b: dict, rel: float) -> None:
    scale = max(v.abs().max().item() for v in a.values())
    assert scale > 0
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=rel * scale, msg=lambda m: f"{k}: {m}")


def hand_policy_gradient(model: torch.nn.Module, batch: DataProto, mode: str, entropy_coeff: float):
    """The gradient of the mini-batch's PPO loss at ratio 1 (no clipping), written out per aggregation mode."""
    b = batch.batch
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                   position_ids=b["position_ids"]).logits[:, :-1]
    log_p = logits.log_softmax(-1)
    token_log_p = log_p.gather(-1, b["input_ids"][:, 1:, None]).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    mask, adv = b["loss_mask"][:, 1:], b["advantages"][:, 1:]
    per_token = (-adv * torch.exp(token_log_p - token_log_p.detach()) - entropy_coeff * entropy) * mask
    if mode == "token-mean":
        loss = per_token.sum() / mask.sum()
    elif mode == "seq-mean-token-sum":
        loss = per_token.sum(-1).mean()
    else:
        loss = (per_token.sum(-1) / mask.sum(-1)).mean()
    loss.backward()
    return {k: v.grad for k, v in model.named_parameters()}


def hand_value_gradient(model: torch.nn.Module, batch: DataProto):
    """The gradient of the token-mean value loss 0.5 (V - R)^2 where values are still the old values (no clipping)."""
    b = batch.batch
    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    values, returns, mask = out[:, :-1, 0], b["returns"][:, 1:], b["adv_mask"][:, 1:]
    (0.5 * ((values - returns) ** 2 * mask).sum() / mask.sum()).backward()
    return {k: v.grad for k, v in model.named_parameters()}


# ---- gradient accumulation --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_actor_update_does_not_depend_on_the_micro_batch_size(tiny_model_path, tokenizer, mode):
    # no gradient clipping, so the gradients left on the parameters are the raw mini-batch gradient
    one, four = (local_actor(tiny_model_path, ppo_micro_batch_size_per_gpu=micro, loss_agg_mode=mode, grad_clip=1e9)
                 for micro in (1, 4))
    batch = make_batch(tokenizer)
    batch = batch.union(one.compute_log_prob(batch))
    before, initial_model = params(one), AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    for group in (one, four):
        leave_stale_gradients(group)
    metrics_one, metrics_four = one.update_actor(batch), four.update_actor(batch)

    assert_same_tensors(grads(four), grads(one), rel=1e-5)
    assert_same_tensors(hand_policy_gradient(initial_model, batch, mode, entropy_coeff=0.01), grads(four),
                        rel=1e-5)
    assert metrics_one["actor/grad_norm"] == pytest.approx(metrics_four["actor/grad_norm"], rel=1e-5)
    assert metrics_one["actor/loss"] == pytest.approx(metrics_four["actor/loss"], rel=1e-5)
    assert_same_update(before, params(one), params(four), grads(one))
    rollout_weights = four.worker.rollout.model.state_dict()  # fp32 here, so an exact copy
    assert all(torch.equal(rollout_weights[k], v) for k, v in full_state_dict(four.worker.model).items()), \
        "the rollout engine still samples from the old policy"


def test_an_on_policy_update_needs_no_old_log_probs(tiny_model_path, tokenizer):
    """One epoch over one mini-batch: scoring the old log-probs first changes nothing but the time it takes."""
    scored, unscored = (local_actor(tiny_model_path, grad_clip=1e9, temperature=0.7) for _ in range(2))
    batch = make_batch(tokenizer)
    before = params(scored)
    scored.update_actor(batch.union(scored.compute_log_prob(batch)))
    unscored.update_actor(batch)
    assert_same_tensors(grads(scored), grads(unscored), rel=1e-5)
    assert_same_update(before, params(scored), params(unscored), grads(scored))


def test_the_engines_prefix_cache_is_freed_before_the_update(tiny_model_path, tokenizer, monkeypatch):
    import verl.workers.actor as actor_module

    actor = local_actor(tiny_model_path)
    engine = actor.worker.rollout
    engine.generate([[5, 6, 7, 8]], SamplingParams(max_new_tokens=4, seed=0))
    assert engine._cache is not None
    held_during_update = []
    update = actor_module.ppo_update
    monkeypatch.setattr(actor_module, "ppo_update",
                        lambda *args, **kwargs: held_during_update.append(engine._cache) or update(*args, **kwargs))
    actor.update_actor(make_batch(tokenizer))
    assert held_during_update == [None]


def test_critic_update_does_not_depend_on_the_micro_batch_size(tiny_model_path, tokenizer):
    one, four = (local_critic(tiny_model_path, ppo_micro_batch_size_per_gpu=micro, grad_clip=1e9)
                 for micro in (1, 4))
    assert_same_tensors(params(one), params(four), rel=0)  # the same value head
    batch = make_batch(tokenizer)
    batch = batch.union(one.compute_values(batch))
    before, initial_model = params(one), load_value_model(tiny_model_path)  # the same fixed-seed value head
    for group in (one, four):
        leave_stale_gradients(group)
    metrics_one, metrics_four = one.update_critic(batch), four.update_critic(batch)

    assert_same_tensors(grads(four), grads(one), rel=1e-5)
    assert_same_tensors(hand_value_gradient(initial_model, batch), grads(four), rel=1e-5)
    assert metrics_one["critic/grad_norm"] == pytest.approx(metrics_four["critic/grad_norm"], rel=1e-5)
    assert metrics_one["critic/loss"] == pytest.approx(metrics_four["critic/loss"], rel=1e-5)
    assert_same_update(before, params(one), params(four), grads(one))


# ---- alignment ---------------------------------------------------------------------------------------
def test_log_probs_are_aligned_with_input_ids(tiny_model_path, tokenizer):
    actor = local_actor(tiny_model_path)
    batch = make_batch(tokenizer)
    log_probs = actor.compute_log_prob(batch).batch["old_log_probs"]
    assert log_probs.shape == batch.batch["input_ids"].shape
    assert torch.equal(log_probs[:, 0], torch.zeros(len(batch)))  # token 0 has no prediction

    scored = batch.batch["loss_mask"].bool()
    assert torch.equal(log_probs[~scored], torch.zeros((~scored).sum()))  # only the generated tokens are scored
    assert (log_probs[scored] < 0).all()

    i, n = 1, LENGTHS[1]  # a padded sequence, scored by hand without its padding
    ids = batch.batch["input_ids"][i, :n]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        log_p = model(input_ids=ids[None]).logits[0].log_softmax(-1)  # (n, V)
    expected = log_p[torch.arange(n - 1), ids[1:]]  # log pi(token t | tokens < t), t = 1..n-1
    generated = scored[i, 1:n]
    torch.testing.assert_close(log_probs[i, 1:n][generated], expected[generated], rtol=0, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_log_probs_are_those_of_the_sampling_distribution(tiny_model_path, tokenizer, temperature):
    """The actor scores a sampled token with the distribution the rollout drew it from: softmax(logits / T).
    The sampler's own log-probs come from generate's processed scores (temperature applied)."""
    group = local_actor(tiny_model_path, temperature=temperature)
    engine = group.worker.rollout
    torch.manual_seed(0)
    prompt = torch.randint(len(tokenizer), (3, 6))
    out = engine.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                temperature=temperature, top_p=None, top_k=0, max_new_tokens=8, min_new_tokens=8,
                                output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    sampled = out.sequences[:, prompt.shape[1]:]  # (B, 8)
    scores = torch.stack(out.scores, dim=1).log_softmax(-1)  # (B, 8, V) of the sampling distribution
    sampling_log_probs = scores.gather(-1, sampled[..., None]).squeeze(-1)
    sequences = out.sequences
    loss_mask = torch.zeros(sequences.shape)
    loss_mask[:, prompt.shape[1]:] = 1
    batch = DataProto(batch={"input_ids": sequences, "attention_mask": torch.ones_like(sequences),
                             "position_ids": torch.arange(sequences.shape[1]).expand_as(sequences),
                             "loss_mask": loss_mask})
    actor_log_probs = group.compute_log_prob(batch).batch["old_log_probs"][:, prompt.shape[1]:]
    torch.testing.assert_close(actor_log_probs, sampling_log_probs, atol=1e-4, rtol=0)
    # the same tokens scored at T = 1 are a different distribution (what the actor used to compute)
    at_one = local_actor(tiny_model_path).compute_log_prob(batch).batch["old_log_probs"][:, prompt.shape[1]:]
    assert (at_one - sampling_log_probs).abs().mean() > 1e-2


def test_values_are_aligned_with_input_ids_and_deterministic(tiny_model_path, tokenizer):
    critic = local_critic(tiny_model_path)
    model = critic.worker.model
    assert isinstance(model, LlamaForTokenClassification) and model.config.num_labels == 1
    assert model.score.out_features == 1  # a scalar value head

    batch = make_batch(tokenizer)
    values = critic.compute_values(batch).batch["values"]
    assert values.shape == batch.batch["input_ids"].shape
    assert torch.equal(values[:, 0], torch.zeros(len(batch)))
    assert torch.equal(critic.compute_values(batch).batch["values"], values)

    i, n = 1, LENGTHS[1]
    model.train()  # dropout before the head is off: training forwards see the same values
    with torch.no_grad():
        head = model(input_ids=batch.batch["input_ids"][i:i + 1, :n]).logits[0, :, 0]  # (n,)
    torch.testing.assert_close(values[i, 1:n], head[:-1], rtol=0, atol=1e-5)  # V(tokens < t) at t - 1


# ---- reference policy and KL loss -------------------------------------------------------------------
def test_no_reference_log_probs_without_a_reference(tiny_model_path, tokenizer):
    actor = local_actor(tiny_model_path, use_reference=False)
    with pytest.raises(AssertionError, match="use_reference=True"):
        actor.compute_ref_log_prob(make_batch(tokenizer))


def test_reference_is_the_initial_policy_and_kl_loss_pulls_towards_it(tiny_model_path, tokenizer):
    with_kl, without_kl = (local_actor(tiny_model_path, use_reference=True, use_kl_loss=use, kl_loss_coef=10.0)
                           for use in (True, False))
    batch = make_batch(tokenizer)
    old, ref = with_kl.compute_log_prob(batch), with_kl.compute_ref_log_prob(batch)
    torch.testing.assert_close(ref.batch["ref_log_probs"], old.batch["old_log_probs"], rtol=0, atol=1e-6)
    batch = batch.union(old).union(ref)

    first = with_kl.update_actor(batch), without_kl.update_actor(batch)
    assert [m["actor/kl_loss"] for m in first] == pytest.approx([0, 0], abs=1e-9)  # policy == reference
    assert_same_tensors(params(with_kl), params(without_kl), rel=1e-6)  # low_var_kl has no gradient at 0

    second = with_kl.update_actor(batch), without_kl.update_actor(batch)
    assert all(m["actor/kl_loss"] > 0 for m in second)  # logged whenever a reference exists
    kl = [(g.compute_log_prob(batch).batch["old_log_probs"] - ref.batch["ref_log_probs"]).abs().sum().item()
          for g in (with_kl, without_kl)]
    assert kl[0] < kl[1], f"the KL loss did not pull the policy towards the reference: {kl}"
    torch.testing.assert_close(with_kl.compute_ref_log_prob(batch).batch["ref_log_probs"],
                               ref.batch["ref_log_probs"], rtol=0, atol=0)  # the reference is frozen


# ---- the critic learns --------------------------------------------------------------------------------
def test_critic_fits_constant_returns(tiny_model_path, tokenizer):
    critic = local_critic(tiny_model_path, cliprange_value=100.0)
    batch = make_batch(tokenizer)
    batch.batch["returns"] = 2.0 * batch.batch["adv_mask"]
    losses = [critic.update_critic(batch.union(critic.compute_values(batch)))["critic/vf_loss"] for _ in range(8)]
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.2 * losses[0], losses


# ---- data parallel -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


def test_two_ranks_update_like_one(ray_cluster, tiny_model_path, tokenizer, tmp_path):
    # micro-batches of 1: rank 0 gets sequences 0-1, rank 1 gets 2-3, each two micro-batches
    config = actor_config(tiny_model_path, ppo_micro_batch_size_per_gpu=1, loss_agg_mode="seq-mean-token-mean")
    two = RayWorkerGroup(ActorRolloutRefWorker, config, world_size=2, num_cpus=0.5, num_gpus=0)
    two.init_model()
    one = local_actor(tiny_model_path, ppo_micro_batch_size_per_gpu=1, loss_agg_mode="seq-mean-token-mean")
    batch = make_batch(tokenizer)
    old = one.compute_log_prob(batch)
    torch.testing.assert_close(two.compute_log_prob(batch).batch["old_log_probs"], old.batch["old_log_probs"],
                               rtol=0, atol=1e-5)
    batch = batch.union(old)
    before = params(one)
    metrics_one, metrics_two = one.update_actor(batch), two.update_actor(batch)

    assert metrics_two["actor/grad_norm"] == pytest.approx(metrics_one["actor/grad_norm"], rel=1e-5)
    two.save_checkpoint(str(tmp_path))
    saved = load_file(tmp_path / "model.safetensors")  # rank 0's weights
    assert saved.keys() == before.keys()
    assert_same_update(before, params(one), saved, grads(one))
    # rank 1 holds the same policy: every row scored on both ranks gets the same log-prob
    log_probs = two.compute_log_prob(DataProto.concat([batch, batch])).batch["old_log_probs"]
    torch.testing.assert_close(log_probs[4:], log_probs[:4], rtol=0, atol=1e-6)


def test_critic_ranks_hold_the_same_value_model(ray_cluster, tiny_model_path, tokenizer):
    # The value head is new (not in the checkpoint) and must start the same on every rank. Every row
    # appears on both ranks, so the ranks' values can be compared, before and after an update.
    two = RayWorkerGroup(CriticWorker, critic_config(tiny_model_path, ppo_mini_batch_size=8), world_size=2,
                         num_cpus=0.5, num_gpus=0)
    two.init_model()
    batch = make_batch(tokenizer)
    doubled = DataProto.concat([batch, batch])
    for _ in range(2):
        values = two.compute_values(doubled).batch["values"]
        torch.testing.assert_close(values[4:], values[:4], rtol=0, atol=1e-6)
        two.update_critic(doubled.union(DataProto(batch={"values": values})))


# ---- rollout engine vs trainer -------------------------------------------------------------------------
def sampled_batch(actor: LocalWorkerGroup, tokenizer, temperature: float) -> DataProto:
    """Two turns sampled by the actor's own engine for three prompts (an observation between the turns), built
    into a batch by the context manager, with random advantages on the generated tokens."""
    context = ContextManager(tokenizer, AgentProxyConfig(), {"T": ""}, {"T": "x"}, [tokenizer.eos_token_id])
    trajectories = [Trajectory(tag="T", turn_rewards=[0.0, 1.0], turn_states=["s0", "s1"]) for _ in range(3)]
    for trajectory, text in zip(trajectories, ["hello there, how are you", "a", "The quick brown fox"]):
        trajectory.extend(tokenizer.encode(text, add_special_tokens=False), turn=0)
    for turn in range(2):
        sampling = SamplingParams(temperature=temperature, max_new_tokens=6, seed=turn)
        prompts = DataProto(non_tensor_batch={"prompt_ids": [t.input_ids for t in trajectories]},
                            meta_info={"sampling": sampling})
        out = actor.generate_sequences(prompts).non_tensor_batch
        for trajectory, ids, log_probs in zip(trajectories, out["response_ids"], out["response_log_probs"]):
            context.add_response(trajectory, list(ids), list(log_probs))
            if turn == 0:
                trajectory.extend([7, 8, 9], turn=0)  # the environment's reply
    batch = context.to_batch(trajectories, group_ids=[0, 1, 2], tags=["T"] * 3)
    advantages = torch.randn(batch.batch["loss_mask"].shape, generator=torch.Generator().manual_seed(0))
    return batch.union(DataProto(batch={"advantages": advantages * batch.batch["loss_mask"]}))


def test_rollout_mismatch_is_zero_for_a_synced_fp32_engine_and_grows_when_it_drifts(tiny_model_path, tokenizer):
    # micro-batches of one row: the logged max must be the max over all of them, not their mean
    actor = local_actor(tiny_model_path, temperature=0.7, ppo_micro_batch_size_per_gpu=1)
    batch = sampled_batch(actor, tokenizer, temperature=0.7)
    mask = batch.batch["loss_mask"].bool()
    old_log_probs = actor.compute_log_prob(batch).batch["old_log_probs"]
    # to_batch's rollout_log_probs are aligned as old_log_probs: column t is token t given the tokens before it
    torch.testing.assert_close(batch.batch["rollout_log_probs"][mask], old_log_probs[mask], atol=1e-5, rtol=0)
    synced = actor.update_actor(batch)  # on-policy: measured against the current log-probs
    assert synced["actor/rollout_logprob_diff_max"] < 1e-4 and abs(synced["actor/rollout_kl"]) < 1e-8
    assert "actor/tis_weight_mean" not in synced  # off by default

    engine = actor.worker.rollout  # synced to the updated policy; now it drifts away from it
    torch.manual_seed(0)
    engine.sync_weights({k: v + 0.05 * torch.randn_like(v) for k, v in engine.model.state_dict().items()})
    batch = sampled_batch(actor, tokenizer, temperature=0.7)
    batch = batch.union(actor.compute_log_prob(batch))
    drifted = actor.update_actor(batch)
    diff = (batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"])[batch.batch["loss_mask"].bool()].abs()
    assert drifted["actor/rollout_logprob_diff_mean"] > 0.01 and drifted["actor/rollout_kl"] > 1e-4
    assert drifted["actor/rollout_logprob_diff_max"] == pytest.approx(diff.max().item(), rel=1e-5)
    assert drifted["actor/rollout_logprob_diff_max"] > drifted["actor/rollout_logprob_diff_mean"]


# ---- context window ------------------------------------------------------------------------------------
def windowed_rollout(actor: LocalWorkerGroup, tokenizer, window: int, temperature: float,
                     turns: int = 3) -> tuple[DataProto, list[list[tuple[list[int], list[int]]]]]:
    """`turns` turns of three start states sampled by the actor's own engine through the real context manager
    with a `window`-turn context window: the batch (zero advantages), and per row and turn (prompt, reply),
    the prompt as the engine saw it."""
    config = AgentProxyConfig(max_context_window=window, enable_think=False)
    context = ContextManager(tokenizer, config, {"T": "Rules."}, {"T": ("Up",)}, [tokenizer.eos_token_id])
    trajectories = [context.start("T", state, actions_left=9) for state in ("a", "a longer state", "b c")]
    seen = [[] for _ in trajectories]
    for turn in range(turns):
        prompts = [list(context.prompt_ids(t)) for t in trajectories]  # a copy: it can be the growing trajectory
        sampling = SamplingParams(temperature=temperature, max_new_tokens=4, seed=turn)
        out = actor.generate_sequences(DataProto(non_tensor_batch={"prompt_ids": prompts},
                                                 meta_info={"sampling": sampling})).non_tensor_batch
        for i, (trajectory, ids, log_probs) in enumerate(zip(trajectories, out["response_ids"],
                                                             out["response_log_probs"])):
            context.add_response(trajectory, list(ids), list(log_probs))
            seen[i].append((prompts[i], list(ids)))
            if turn + 1 < turns:  # states of different lengths: the rows differ in length
                assert context.add_observation(trajectory, "x" * (turn + 3 * i + 1), reward=0.0,
                                               actions_left=8 - turn, response_length=4)
    for trajectory in trajectories:
        trajectory.turn_rewards, trajectory.turn_states = [0.0] * turns, ["s"] * turns
    batch = context.to_batch(trajectories, group_ids=[0, 1, 2], tags=["T"] * 3)
    return batch.union(DataProto(batch={"advantages": torch.zeros(batch.batch["loss_mask"].shape)})), seen


@pytest.mark.parametrize("window", [1, 2])
def test_with_a_context_window_every_reply_is_scored_in_the_prompt_it_was_sampled_from(tiny_model_path, tokenizer,
                                                                                     window):
    """Old and reference log-probs and values of every reply token are those of the model run on exactly the
    prompt the engine saw plus the reply, and the update measures no gap to the engine. k = 2 is exact for the
    first two turns; the third sees the second as it was in its own window, and the gap shows."""
    temperature = 0.7
    actor = local_actor(tiny_model_path, use_reference=True, temperature=temperature, ppo_micro_batch_size_per_gpu=2)
    batch, seen = windowed_rollout(actor, tokenizer, window, temperature)
    old = actor.compute_log_prob(batch).batch["old_log_probs"]
    ref = actor.compute_ref_log_prob(batch).batch["ref_log_probs"]
    values = local_critic(tiny_model_path).compute_values(batch).batch["values"]
    policy, value_model = AutoModelForCausalLM.from_pretrained(tiny_model_path), load_value_model(tiny_model_path)
    exact, approximate = [], []
    for i, turns in enumerate(seen):
        spans = reply_spans(batch.batch["loss_mask"][i].int().tolist())
        assert len(spans) == len(turns)
        for turn, ((start, end), (prompt, reply)) in enumerate(zip(spans, turns)):
            ids = torch.tensor([prompt + reply])  # (1, P + R): what the engine ran
            with torch.no_grad():
                logits = policy(input_ids=ids).logits[0, len(prompt) - 1:-1] / temperature  # (R, V)
                head = value_model(input_ids=ids).logits[0, len(prompt) - 1:-1, 0]  # (R,): V(tokens < t)
            alone = logits.log_softmax(-1).gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)
            gap = max((old[i, start:end] - alone).abs().max().item(), (values[i, start:end] - head).abs().max().item())
            (exact if window == 1 or turn < window else approximate).append(gap)
    assert max(exact) < 1e-5, exact
    torch.testing.assert_close(ref, old, rtol=0, atol=1e-6)  # the reference goes through the same window
    metrics = actor.update_actor(batch)  # on-policy: the training forward's own log-probs against the engine's
    if window == 1:
        assert metrics["actor/rollout_logprob_diff_max"] < 1e-4 and abs(metrics["actor/rollout_kl"]) < 1e-8
    else:
        assert min(approximate) > 1e-5 and metrics["actor/rollout_logprob_diff_max"] > 1e-4

    # scored as one causal sequence (as before windows were masked), the later turns are off
    whole = {k: v for k, v in batch.batch.items() if k != "hidden_from"}
    whole["position_ids"] = torch.arange(whole["input_ids"].shape[1]) * whole["attention_mask"]
    causal = actor.compute_log_prob(DataProto(batch=whole)).batch["old_log_probs"]
    assert (causal - batch.batch["rollout_log_probs"]).abs().max() > 1e-3


def test_truncated_importance_sampling_weights_each_tokens_loss(tiny_model_path, tokenizer):
    """With tis_imp_ratio_cap the per-token PPO loss is multiplied by the capped ratio; a positive weight
    scales every branch of the clipped loss, so that is the plain loss with the advantages so weighted."""
    sampler = local_actor(tiny_model_path, temperature=0.7)
    torch.manual_seed(0)
    engine = sampler.worker.rollout
    engine.sync_weights({k: v + 0.05 * torch.randn_like(v) for k, v in engine.model.state_dict().items()})
    batch = sampled_batch(sampler, tokenizer, temperature=0.7)
    batch = batch.union(sampler.compute_log_prob(batch))
    b = batch.batch
    weights = truncated_is_weights(old_log_probs=b["old_log_probs"], rollout_log_probs=b["rollout_log_probs"], cap=1.5)
    assert (weights[b["loss_mask"].bool()] == 1.5).any() and (weights[b["loss_mask"].bool()] < 1).any()

    corrected, by_hand = (local_actor(tiny_model_path, temperature=0.7, grad_clip=1e9, tis_imp_ratio_cap=cap)
                          for cap in (1.5, None))
    metrics = corrected.update_actor(batch)
    weighted = DataProto(batch=dict(b) | {"advantages": b["advantages"] * weights})
    by_hand.update_actor(weighted)
    assert metrics["actor/tis_weight_mean"] == pytest.approx(
        (weights * b["loss_mask"]).sum().item() / b["loss_mask"].sum().item(), rel=1e-5)
    assert_same_tensors(grads(corrected), grads(by_hand), rel=1e-5)


@pytest.mark.parametrize("amx, dtype", [(False, "float32"), (True, "bfloat16")])
def test_workers_make_auto_dtypes_concrete_on_their_machine(tiny_model_path, monkeypatch, amx, dtype):
    monkeypatch.setattr("verl.utils.model.cpu_has_fast_bf16", lambda cpuinfo=None: amx)  # this test runs on a CPU
    config = ActorRolloutRefConfig(model=ModelConfig(path=tiny_model_path), rollout=RolloutConfig())
    assert (config.model.dtype, config.rollout.dtype) == ("auto", "auto")  # the defaults
    actor = ActorRolloutRefWorker(config, rank=0, world_size=1, init_method=None)
    assert (actor.config.model.dtype, actor.config.rollout.dtype) == (dtype, dtype)
    assert config.model.dtype == "auto"  # the caller's config is left as given
    critic = CriticWorker(CriticConfig(model=ModelConfig(path=tiny_model_path)), rank=0, world_size=1, init_method=None)
    assert critic.config.model.dtype == dtype
