"""Sharding the actor and the critic over the ranks with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Each rank keeps 1/world_size of every parameter (a DTensor split on dim 0), of its gradient and of its
optimizer state. A transformer block all-gathers its full weights just before its forward and frees them
after; backward gathers them again and reduce-scatters the gradients. The model stays the Hugging Face
model: same forward, same parameter names.

How this departs from FSDP2's defaults:
- Gradients are SUMMED over ranks, not averaged. `ppo_update` already divides each micro-batch's loss by
  the mini-batch's units on all ranks together, so the sum is the gradient of the whole mini-batch.
- One code path for any number of ranks: a single rank joins a one-rank process group
  (`init_single_rank_group`) and shards too, so parameters, gradients and checkpoints look the same.

What a caller must keep to:
- Every rank loads the same weights before `shard_model`: FSDP keeps each rank's own slice, it broadcasts
  nothing.
- Build the optimizer after `shard_model`, from the sharded parameters.
- Every rank runs the same number of forward and backward passes: each one all-gathers.
- After no-grad forwards (scoring) call `reshard(model)`: the root unit (embeddings, final norm, LM head),
  and on a single rank every unit, keeps its weights gathered after a forward, expecting a backward that
  will not come. Meanwhile the memory stays taken and `model.parameters()` yields the gathered copies.
- No in-place op on the model's output (`logits += x`): it would skip FSDP's pre-backward all-gather.
- On GPU, call `torch.cuda.set_device(device)` before `shard_model`: the mesh uses the current device.
- `full_state_dict`, `save_sharded_state` and `load_sharded_state` are collectives: call them on every rank.
"""

import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

WHOLE = StateDictOptions(full_state_dict=True)  # plain unsharded tensors, on every rank
# Our forwards never modify a model's output in place, which is what this warning is about.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")


def init_single_rank_group(backend: str) -> None:
    """Join a one-rank process group in this process, unless one exists: FSDP2 needs a group even alone.

    The store is an in-memory HashStore, so no port or file is involved. A second worker in the same
    process (LocalWorkerGroup runs the actor and the critic side by side) reuses the group.
    """
    if dist.is_initialized():
        assert dist.get_world_size() == 1, "a one-rank worker found a process group with several ranks"
        return
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def shard_model(model: torch.nn.Module, *, param_dtype: str, cpu_offload: bool) -> torch.nn.Module:
    """Shard `model` in place over the default process group and return it (now also an FSDPModule).

    Each transformer block (a class named in the model's `_no_split_modules`) is one FSDP unit, gathered
    only for its own forward and backward; the root unit holds the rest (embeddings, final norm, head).
    `param_dtype="bfloat16"` gathers bf16 copies for compute and reduces gradients in fp32, while the
    sharded master weights and the optimizer stay fp32. `cpu_offload` keeps the shards, their gradients and
    the optimizer step in CPU memory.
    """
    if param_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"FSDP param_dtype={param_dtype!r}: use 'float32' or 'bfloat16' (fp16 would need a "
                         "loss scaler)")
    mixed_precision = MixedPrecisionPolicy() if param_dtype == "float32" else \
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # pinned memory needs an accelerator; without one the shards live on the CPU anyway
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()

    block_classes = set(model._no_split_modules or ())
    blocks = [module for module in model.modules() if type(module).__name__ in block_classes]
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no transformer block class in _no_split_modules, "
                         "so shard_model cannot tell where to cut it into FSDP units")
    # Alone, a rank gathers nothing: its "unsharded" weights are only the bf16 casts, which it keeps from the
    # forward to the backward instead of casting them twice (270 MB held for the 135M model).
    several_ranks = dist.get_world_size() > 1
    for block in blocks:
        fully_shard(block, mp_policy=mixed_precision, offload_policy=offload, reshard_after_forward=several_ranks)
    fully_shard(model, mp_policy=mixed_precision, offload_policy=offload)  # the root stays gathered after forward

    for module in model.modules():
        if isinstance(module, FSDPModule):  # each unit reduces its own gradients: set it on every one
            module.set_gradient_divide_factor(1.0)
            # A divide factor alone becomes a PREMUL_SUM reduce-scatter, which gloo lacks; forcing plain
            # SUM (and dividing by 1 after, a no-op) works on gloo and NCCL alike.
            module.set_force_sum_reduction_for_comms(True)
    return model


def reshard(model: torch.nn.Module) -> None:
    """Free every unit's gathered weights (see the module notes: after no-grad forwards)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the gradients to a global L2 norm of `max_norm`; return the norm before clipping.

    The norm is over the whole model on all ranks (identical on every rank), so every rank makes the
    same decision on a non-finite gradient.
    """
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if isinstance(norm, DTensor):  # sharded grads give a replicated DTensor: already all-reduced
        norm = norm.full_tensor()
    return norm.item()


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain tensors under their Hugging Face names, on every rank.

    Values are the master weights in their own dtype (fp32, not the bf16 compute copies). Each rank holds
    a full copy afterwards; tied weights (embedding and LM head) come back as two tensors.
    """
    return get_model_state_dict(model, options=WHOLE)


def load_full_state_dict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load whole (unsharded) weights, e.g. a `save_pretrained` folder's, into a sharded model.

    `model.load_state_dict` cannot: it would copy plain tensors into DTensor parameters. Every rank passes
    the same full weights and keeps its own slice.
    """
    # set_model_state_dict swaps the dict's tensors for shards in place; the caller's dict stays whole
    options = WHOLE if strict else StateDictOptions(full_state_dict=True, strict=False)  # strict=False: a part
    set_model_state_dict(model, dict(state_dict), options=options)


def save_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Write the model's and the optimizer's shards to `directory` (torch.distributed.checkpoint).

    Each rank writes its own file (`__<rank>_0.distcp`); rank 0 adds `.metadata`. All ranks must see the
    same directory. The files can be read back with another number of ranks.
    """
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory))


def load_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Load what `save_sharded_state` wrote into a sharded model and its optimizer, exactly."""
    # DCP reads into the tensors it is given, in place: the live shards and optimizer moments (which
    # get_state_dict creates, by a zero-lr step, for an optimizer that has not stepped yet)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
