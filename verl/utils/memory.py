"""A start-up estimate of the memory one rank needs, so that a run that cannot fit stops before loading.

The count is deliberately simple (bytes per parameter, plus the largest activations of one micro-batch):
- a trained model: fp32 weights (4), fp32 gradients (4) and AdamW's two moments (8) per trainable
  parameter, 4 per frozen one; sharded over the ranks when the workers shard (FSDP);
- the rollout engine's copy of the policy in its dtype, whole on every rank;
- the reference policy (fp32, frozen), unless LoRA provides it by switching the adapter off;
- activations of one micro-batch: the fp32 logits and their softmax over the vocabulary (3 copies) at the
  generated tokens only (the actor computes no other logits), and per layer ~34 bytes per hidden unit and
  token in bf16 (Korthikanti et al., 2022), or ~2 with gradient checkpointing.
It is an estimate, printed with its parts; the tokens per trajectory are an upper guess from the config.
"""

import os
import resource
from dataclasses import dataclass

import torch

from verl.utils.model import model_class

GIB = 1024**3


@dataclass
class ModelShape:
    params: int
    hidden: int
    layers: int
    vocab: int


def model_shape(path: str) -> ModelShape:
    """Parameter count and sizes from the config alone (the model is built on the meta device)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = model_class(path).from_config(config)
    text = config.get_text_config()
    return ModelShape(params=sum(p.numel() for p in model.parameters()), hidden=text.hidden_size,
                      layers=text.num_hidden_layers, vocab=text.vocab_size)


def lora_params(path: str, rank: int, target_modules) -> int:
    """Parameters of a LoRA adapter: rank * (in + out) for every adapted linear layer."""
    from transformers import AutoConfig

    with torch.device("meta"):
        model = model_class(path).from_config(AutoConfig.from_pretrained(path))
    output = model.get_output_embeddings()
    return sum(rank * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and m is not output
               and (target_modules == "all-linear" or name.split(".")[-1] in target_modules))


def estimate_per_rank(shape: ModelShape, *, world_size: int, sharded: bool, trainable_fraction: float,
                      reference: bool, critic: bool, rollout_bytes: int, micro_batch: int, tokens: int,
                      generated_tokens: int, checkpointing: bool) -> dict[str, float]:
    """GiB per rank, by part. `tokens` per trajectory, `generated_tokens` of them by the policy."""
    share = 1 / world_size if sharded else 1.0
    trainable = shape.params * trainable_fraction
    trained = (4 * shape.params + 12 * trainable) * share
    activation_per_layer = (2 if checkpointing else 34) * micro_batch * tokens * shape.hidden
    activations = 3 * 4 * micro_batch * generated_tokens * shape.vocab + shape.layers * activation_per_layer
    parts = {"actor weights + optimizer": trained, "rollout copy": rollout_bytes * shape.params,
             "reference": 4 * shape.params * share if reference else 0.0,
             "critic weights + optimizer": 16 * shape.params * share if critic else 0.0,
             "activations of one micro-batch": activations}
    return {k: v / GIB for k, v in parts.items()}


def available_per_rank(ranks_per_node: int) -> float:
    """GiB one rank may use: its GPU's memory, or this machine's RAM split over the node's ranks."""
    if torch.cuda.is_available():
        return torch.cuda.mem_get_info()[1] / GIB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB / ranks_per_node


def peak_memory_gib(device: torch.device) -> float:
    """This process's peak so far: CUDA memory allocated on a GPU, resident memory (RSS) on a CPU, to set
    beside the start-up estimate."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux reports KiB


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def keep_freed_blocks() -> None:
    """Have glibc's malloc keep freed memory for reuse instead of handing it back to the kernel.

    On a CPU every activation, gradient and K/V buffer is a malloc. By default glibc returns blocks over a
    few MB to the kernel when freed, so the next step's tensors of the same sizes fault their pages in
    again (the kernel zeroes each one). Measured on the bandit's update (8 rows of ~220 tokens, 2 cores,
    after a generation, five updates): 3.6 M -> 2.6 M page faults, 7.4 -> 6.6 s an update. Blocks up to
    32 MB (glibc's largest mmap threshold) now come from the heap, and the heap is never trimmed: the
    process keeps its peak, which it reaches again every step anyway. A no-op where the C library is not
    glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
