"""DataProto: the one batch object that flows between every stage of a training step.

A DataProto holds
- `batch`: tensors that all share the leading batch dimension (input_ids, loss_mask, advantages, ...),
- `non_tensor_batch`: per-sample numpy object arrays of the same length (env ids, group ids, raw text),
- `meta_info`: a small dict that applies to the whole batch (sampling settings, the step number).

Metrics never travel inside it: stages return them as `dict[str, float]` next to the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch


@dataclass
class DataProto:
    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.non_tensor_batch = {k: _as_object_array(v) for k, v in self.non_tensor_batch.items()}
        sizes = {k: len(v) for k, v in self.batch.items()} | {k: len(v) for k, v in self.non_tensor_batch.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"DataProto fields disagree on the batch size: {sizes}")

    def __len__(self) -> int:
        for v in self.batch.values():
            return len(v)
        for v in self.non_tensor_batch.values():
            return len(v)
        return 0

    def __getitem__(self, index: int | slice | Sequence[int] | torch.Tensor | np.ndarray) -> DataProto:
        """Index the batch dimension. An int keeps the dimension (returns a batch of one)."""
        if isinstance(index, int):
            index = [index]
        if isinstance(index, torch.Tensor):
            index = index.cpu().numpy()
        if not isinstance(index, slice):
            index = np.asarray(index)
            if index.dtype == bool:
                index = np.nonzero(index)[0]
        tensor_index = index if isinstance(index, slice) else torch.as_tensor(index, dtype=torch.long)
        return DataProto(
            batch={k: v[tensor_index] for k, v in self.batch.items()},
            non_tensor_batch={k: v[index] for k, v in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    def select(self, batch_keys: Sequence[str] = (), non_tensor_keys: Sequence[str] = ()) -> DataProto:
        return DataProto(
            batch={k: self.batch[k] for k in batch_keys},
            non_tensor_batch={k: self.non_tensor_batch[k] for k in non_tensor_keys},
            meta_info=dict(self.meta_info),
        )

    def union(self, other: DataProto) -> DataProto:
        """Merge the fields of two batches of the same samples. A key present in both must agree."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"cannot union batches of size {len(self)} and {len(other)}")
        for k in self.batch.keys() & other.batch.keys():
            if not torch.equal(self.batch[k], other.batch[k]):
                raise ValueError(f"union: tensor '{k}' differs between the two batches")
        for k in self.non_tensor_batch.keys() & other.non_tensor_batch.keys():
            if not np.array_equal(self.non_tensor_batch[k], other.non_tensor_batch[k]):
                raise ValueError(f"union: non-tensor '{k}' differs between the two batches")
        return DataProto(
            batch=self.batch | other.batch,
            non_tensor_batch=self.non_tensor_batch | other.non_tensor_batch,
            meta_info=self.meta_info | other.meta_info,
        )

    @staticmethod
    def concat(parts: Sequence[DataProto]) -> DataProto:
        """Stack batches along the batch dimension. Tensors must agree on all other dimensions."""
        if not parts:
            raise ValueError("concat needs at least one DataProto")
        first = parts[0]
        return DataProto(
            batch={k: torch.cat([p.batch[k] for p in parts]) for k in first.batch},
            non_tensor_batch={k: np.concatenate([p.non_tensor_batch[k] for p in parts]) for k in first.non_tensor_batch},
            meta_info=dict(first.meta_info),
        )

    def chunk(self, n: int) -> list[DataProto]:
        """Split into n contiguous parts (one per rank) whose sizes differ by at most one."""
        bounds = np.linspace(0, len(self), n + 1).round().astype(int)
        return [self[int(bounds[i]) : int(bounds[i + 1])] for i in range(n)]

    def split(self, size: int) -> list[DataProto]:
        """Split into consecutive parts of at most `size` samples (mini- and micro-batches)."""
        return [self[i : i + size] for i in range(0, len(self), size)]

    def repeat(self, times: int, interleave: bool = True) -> DataProto:
        """Repeat every sample: interleave gives a,a,b,b; otherwise a,b,a,b."""
        if interleave:
            index = np.repeat(np.arange(len(self)), times)
        else:
            index = np.tile(np.arange(len(self)), times)
        return self[index]

    def to(self, device: torch.device | str) -> DataProto:
        return DataProto({k: v.to(device) for k, v in self.batch.items()}, self.non_tensor_batch, self.meta_info)


def _as_object_array(values) -> np.ndarray:
    """Per-sample python objects (lists of token ids, strings, dicts) as a 1-D object array."""
    if isinstance(values, np.ndarray) and values.ndim == 1:
        return values
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array
