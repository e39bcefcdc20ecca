"""FSDP2 sharding on CPU ranks joined by gloo: a sharded update equals the unsharded one on the same
mini-batch, the full fp32 weights reach every rank, bf16 mixed precision stays close to fp32, and a sharded
checkpoint resumes exactly.

Each test runs its ranks as fresh processes (`run_on_ranks`); the functions they run live at module level
so the processes can import them. The unsharded reference runs in the test's own process.
"""

import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.utils.fsdp import (clip_grad_norm, full_state_dict, init_single_rank_group, load_full_state_dict,
                             load_sharded_state, reshard, save_sharded_state, shard_model)
from verl.utils.model import load_causal_lm, load_value_model, untied

BATCH_SIZE, SEQ_LEN, MICRO_BATCH_SIZE = 8, 10, 2  # per rank: 8 / world_size sequences, in micro-batches of 2
LR, GRAD_CLIP = 1e-3, 0.5  # the clip binds (norms are ~2), so a wrong, per-rank norm would show


def run_on_ranks(world_size: int, fn, *args) -> list:
    """Run `fn(*args)` on `world_size` fresh processes joined in a gloo group; each rank's result, in rank order.

    A lone rank joins the one-rank group that a single worker joins (`init_single_rank_group`).
    """
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(world_size, tmp, fn, args), nprocs=world_size)
        return [torch.load(Path(tmp) / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def _rank_main(rank: int, world_size: int, tmp: str, fn, args: tuple) -> None:
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world_size))  # the cores this test may use
    if world_size == 1:
        init_single_rank_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world_size)
    try:
        torch.save(fn(*args), Path(tmp) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


# ---- what a worker does: load, (shard), update the way ppo_update does --------------------------------------

def make_batch(seed: int) -> dict[str, torch.Tensor]:
    """BATCH_SIZE right-padded sequences of different lengths; the loss covers each one's second half."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(SEQ_LEN // 2, SEQ_LEN + 1, (BATCH_SIZE,), generator=gen)
    positions = torch.arange(SEQ_LEN)[None, :]  # (1, T)
    attention_mask = (positions < lengths[:, None]).long()  # (B, T)
    loss_mask = (attention_mask.bool() & (positions >= lengths[:, None] // 2)).float()  # (B, T)
    input_ids = torch.randint(1000, (BATCH_SIZE, SEQ_LEN), generator=gen) * attention_mask  # vocab is larger
    returns = torch.randn((BATCH_SIZE, SEQ_LEN), generator=gen) * loss_mask
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask, "returns": returns}


def actor_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed negative log-likelihood of the masked tokens (a stand-in for the policy loss)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
    log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V): position t predicts t+1
    token_log_probs = log_probs.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)  # (B, T-1)
    return -(token_log_probs * batch["loss_mask"][:, 1:]).sum()


def critic_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed squared error of the values against the returns on the masked tokens."""
    values = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[..., 0]  # (B, T)
    return ((values.float() - batch["returns"]) ** 2 * batch["loss_mask"]).sum()


MODELS = {"actor": (load_causal_lm, actor_loss), "critic": (load_value_model, critic_loss)}


def this_ranks_part(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The contiguous slice of the batch that a DATA_PARALLEL call hands this rank."""
    if not dist.is_initialized():
        return batch
    return {k: v.chunk(dist.get_world_size())[dist.get_rank()] for k, v in batch.items()}


def update(model, optimizer, batch: dict[str, torch.Tensor], loss_fn) -> tuple[float, float]:
    """One optimizer step on this rank's part of the mini-batch, normalised like ppo_update: each
    micro-batch's summed loss is divided by the mini-batch's loss tokens on all ranks together.
    Returns the mini-batch loss (summed over ranks) and the gradient norm."""
    micros = [dict(zip(batch, values)) for values in zip(*(v.split(MICRO_BATCH_SIZE) for v in batch.values()))]
    units = batch["loss_mask"].sum()
    if dist.is_initialized():
        dist.all_reduce(units)
    optimizer.zero_grad()
    loss = torch.zeros(())
    for micro in micros:
        micro_loss = loss_fn(model, micro) / units
        micro_loss.backward()
        loss += micro_loss.detach()
    grad_norm = clip_grad_norm(model, GRAD_CLIP)
    optimizer.step()
    if dist.is_initialized():
        dist.all_reduce(loss)
    return loss.item(), grad_norm


def load(kind: str, model_path: str, param_dtype: str | None, cpu_offload: bool = False):
    """The model of `kind` and its AdamW; sharded unless `param_dtype` is None."""
    loader, _ = MODELS[kind]
    model = loader(model_path)
    if param_dtype is not None:
        shard_model(model, param_dtype=param_dtype, cpu_offload=cpu_offload)
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def train(kind: str, model_path: str, param_dtype: str | None, steps: int, cpu_offload: bool = False) -> dict:
    """`steps` updates on the same batch; the losses, gradient norms and the final full weights."""
    _, loss_fn = MODELS[kind]
    model, optimizer = load(kind, model_path, param_dtype, cpu_offload)
    batch = this_ranks_part(make_batch(seed=0))
    losses, grad_norms = zip(*(update(model, optimizer, batch, loss_fn) for _ in range(steps)))
    weights = full_state_dict(model) if param_dtype is not None else model.state_dict()
    return {"losses": losses, "grad_norms": grad_norms, "weights": weights}


# ---- the tests --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, world_size, cpu_offload",
                         [("actor", 1, False), ("actor", 2, False), ("actor", 2, True), ("critic", 2, False)])
def test_sharded_update_matches_the_unsharded_one(tiny_model_path, kind, world_size, cpu_offload):
    reference = train(kind, tiny_model_path, param_dtype=None, steps=2)
    initial = MODELS[kind][0](tiny_model_path).state_dict()

    for rank_result in run_on_ranks(world_size, train, kind, tiny_model_path, "float32", 2, cpu_offload):
        torch.testing.assert_close(rank_result["losses"], reference["losses"], rtol=1e-5, atol=0)
        torch.testing.assert_close(rank_result["grad_norms"], reference["grad_norms"], rtol=1e-4, atol=0)
        assert rank_result["weights"].keys() == reference["weights"].keys()
        for name, weight in reference["weights"].items():  # the full weights, updated, on every rank
            assert not isinstance(rank_result["weights"][name], torch.distributed.tensor.DTensor)
            # Adam divides by |gradient|, so summation-order noise in near-zero gradients shows up as
            # ~LR * 1e-3 here; a wrong gradient would move weights by ~LR
            torch.testing.assert_close(rank_result["weights"][name], weight, rtol=0, atol=LR * 2e-2)
    assert any(not torch.equal(reference["weights"][k], v) for k, v in initial.items())  # the update moved them


def bf16_against_fp32(model_path: str) -> dict:
    fp32, bf16 = (train("actor", model_path, param_dtype, steps=1) for param_dtype in ("float32", "bfloat16"))
    return {"fp32": fp32["losses"][0], "bf16": bf16["losses"][0],
            "bf16_weights_dtypes": {w.dtype for w in bf16["weights"].values()}}


def test_bf16_mixed_precision_is_close_to_fp32(tiny_model_path):
    for rank_result in run_on_ranks(2, bf16_against_fp32, tiny_model_path):
        assert rank_result["bf16"] != rank_result["fp32"]  # the forward really ran in bf16
        assert rank_result["bf16"] == pytest.approx(rank_result["fp32"], rel=1e-3)
        assert rank_result["bf16_weights_dtypes"] == {torch.float32}  # master weights stay fp32


def full_weights_at_each_stage(model_path: str, save_dir: str) -> dict:
    model, _ = load("actor", model_path, param_dtype="bfloat16")
    stages = {"sharded": full_state_dict(model)}
    model.eval()
    with torch.no_grad():  # scoring leaves weights gathered until reshard()
        model(input_ids=torch.arange(6)[None])
    stages["after_no_grad_forward"] = full_state_dict(model)
    reshard(model)
    resharded = all(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())

    other, _ = load("actor", model_path, param_dtype="float32")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    load_full_state_dict(other, stages["sharded"])
    stages["loaded_into_another"] = full_state_dict(other)

    if dist.get_rank() == 0:  # how a worker writes the policy as a Hugging Face folder
        model.save_pretrained(save_dir, state_dict=stages["sharded"])
    return {"stages": stages, "resharded": resharded}


@pytest.mark.parametrize("ranks", [1, 2])  # alone, a rank keeps every unit gathered from forward to backward
def test_full_state_dict_is_the_original_weights_on_every_rank(tiny_model_path, tmp_path, ranks):
    model = load_causal_lm(tiny_model_path)
    original = untied(model.state_dict(), model.config)  # one rank leaves a tied head out, two gather it
    for rank_result in run_on_ranks(ranks, full_weights_at_each_stage, tiny_model_path, str(tmp_path)):
        assert rank_result["resharded"]
        for stage, weights in rank_result["stages"].items():
            weights = untied(weights, model.config)
            assert weights.keys() == original.keys(), stage
            for name, weight in original.items():
                assert torch.equal(weights[name], weight), (stage, name)  # fp32, exact, despite bf16 compute
    saved = load_causal_lm(str(tmp_path)).state_dict()
    assert all(torch.equal(saved[name], weight) for name, weight in original.items())


def resume_twice(model_path: str, checkpoint_dir: str) -> dict:
    """Step, save, step again; then load the checkpoint into a fresh model and optimizer and redo that step."""
    _, loss_fn = MODELS["actor"]
    model, optimizer = load("actor", model_path, param_dtype="float32")
    update(model, optimizer, this_ranks_part(make_batch(seed=0)), loss_fn)
    save_sharded_state(model, optimizer, checkpoint_dir)
    second_batch = this_ranks_part(make_batch(seed=1))
    continued = update(model, optimizer, second_batch, loss_fn), full_state_dict(model)

    model, optimizer = load("actor", model_path, param_dtype="float32")
    load_sharded_state(model, optimizer, checkpoint_dir)
    resumed = update(model, optimizer, second_batch, loss_fn), full_state_dict(model)
    return {"continued": continued, "resumed": resumed}


def test_sharded_checkpoint_resumes_exactly(tiny_model_path, tmp_path):
    for rank_result in run_on_ranks(2, resume_twice, tiny_model_path, str(tmp_path)):
        (continued_metrics, continued_weights), (resumed_metrics, resumed_weights) = \
            rank_result["continued"], rank_result["resumed"]
        assert resumed_metrics == continued_metrics
        assert all(torch.equal(resumed_weights[k], w) for k, w in continued_weights.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
