"""Weight-sync fingerprints: does the rollout engine sample with the weights the trainer holds?

A sync can fail silently: a tensor skipped, a LoRA adapter never merged in, a reload that updates a parameter
the engine no longer computes with. Generation still runs, on another policy, and training goes on with
off-policy samples nobody asked for. So after every sync the actor compares a fingerprint of its weights
(LoRA merged, cast to the engine's dtype) with one each engine reads back from its own live model
(`weight_fingerprint()`), and a mismatch stops the run (`WeightSyncError`).

A tensor's fingerprint is the float64 sum and sum of squares of its entries in every `COLUMN_STRIDE`-th
column (dimension 1: a linear layer's inputs, an embedding's hidden units), or of all entries of a 1-D
tensor. Why that:
- layouts: sums ignore the order of the entries and padding adds zeros (vLLM pads the vocabulary), so the
  fingerprint does not depend on how an engine stores a tensor; an engine that fuses projections along the
  output dimension (vLLM's qkv_proj, gate_up_proj) splits its rows back into the Hugging Face tensors;
- exact: both sides sum the same values (the trainer casts to the engine's dtype first, as loading does),
  so they agree to float64 rounding (~1e-16 relative); `RTOL` 1e-9 is far below what one entry moving by one
  bf16 step changes (~1e-7 of a 10^5-entry sample's sum of squares);
- cheap: a sixteenth of the columns, still every row (output unit) of every tensor; a broken sync (a stale,
  skipped or unmerged tensor) changes entries throughout the tensor. SmolLM2-135M, one CPU core: 0.05 s for
  the trainer's side, 0.04 s for the torch or hf engine's, 0.10 s for vLLM's (read through its GEMMs).
Not seen: entries swapped within a tensor, and a change confined to columns outside the sample.
"""

import math
from dataclasses import dataclass

import torch

COLUMN_STRIDE = 16  # fingerprint columns 0, 16, 32, ... of each matrix
RTOL = 1e-9
SHOWN = 5  # differing tensors named in the error


class WeightSyncError(RuntimeError):
    """The rollout engine's live weights are not the trainer's after a sync."""


@dataclass(frozen=True)
class Fingerprint:
    sum: float
    sum_sq: float
    count: int  # entries summed (the engine's may include padding zeros)

    def matches(self, other: "Fingerprint") -> bool:
        """Equal up to float64 rounding: sqrt(count * sum_sq) bounds |sum| and so its rounding error."""
        sum_scale = math.sqrt(max(self.count, other.count) * max(self.sum_sq, other.sum_sq))
        return (abs(self.sum - other.sum) <= RTOL * sum_scale
                and abs(self.sum_sq - other.sum_sq) <= RTOL * max(self.sum_sq, other.sum_sq))

    def __str__(self) -> str:
        return f"sum {self.sum:.9g}, sum of squares {self.sum_sq:.9g}"


def sampled_columns(tensor: torch.Tensor) -> torch.Tensor:
    """The entries a fingerprint covers: every COLUMN_STRIDE-th column of a matrix, all of a vector."""
    return tensor[:, ::COLUMN_STRIDE] if tensor.ndim >= 2 else tensor


def fingerprints(entries: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, Fingerprint]:
    """Fingerprints of tensors that hold exactly the entries to sum (`sampled_columns` already taken), cast to
    `dtype` first if given. Tensor by tensor: each one's float64 copy stays in cache (4x faster on one core
    than summing segments of one long vector)."""
    sums = []
    for tensor in entries.values():
        values = (tensor if dtype is None else tensor.to(dtype)).detach().double().flatten()
        sums.append(torch.stack([values.sum(), torch.dot(values, values)]))
    sums = torch.stack(sums).tolist()  # one device sync for all tensors
    return {name: Fingerprint(total, total_sq, tensor.numel())
            for (name, tensor), (total, total_sq) in zip(entries.items(), sums)}


@torch.no_grad()
def weight_fingerprints(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, Fingerprint]:
    """Fingerprints of whole weights as they are once loaded in `dtype`: the trainer's (to compare) and an
    engine's that holds plain tensors under the Hugging Face names."""
    return fingerprints({name: sampled_columns(tensor) for name, tensor in weights.items()}, dtype)


def check_weight_sync(expected: dict[str, Fingerprint], actual: dict[str, Fingerprint], engine: str) -> None:
    """Raise WeightSyncError unless the engine's fingerprints (`actual`) match the trainer's (`expected`)
    tensor for tensor, naming the first differing tensors with both fingerprints and how many differ."""
    differing = [name for name in expected if name in actual and not expected[name].matches(actual[name])]
    missing = [name for name in expected if name not in actual]
    unknown = [name for name in actual if name not in expected]
    if not (differing or missing or unknown):
        return
    problems = [f"{name}: trainer {expected[name]}; engine {actual[name]}" for name in differing[:SHOWN]]
    problems += [f"{name}: not in the engine" for name in missing[:SHOWN]]
    problems += [f"{name}: in the engine, not in the trainer's weights" for name in unknown[:SHOWN]]
    counts = f"{len(differing)} of {len(expected)} tensors differ"
    if missing or unknown:
        counts += f", {len(missing)} missing in the engine, {len(unknown)} unknown to the trainer"
    raise WeightSyncError(
        f"the {engine} rollout engine does not hold the policy's weights after a weight sync ({counts}): "
        + "; ".join(problems) + ". It would sample from a policy other than the one being trained. This is a bug "
        f"in the sync_weights of actor_rollout_ref.rollout.name={engine}: another engine may work meanwhile; "
        "actor_rollout_ref.rollout.check_weight_sync=false turns this check off")
