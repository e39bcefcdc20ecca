"""A DataProto as one safetensors file, read back exactly: what a training step updated on, for replaying it
(`python -m ragen.replay`).

Tensors are stored under their own names; integer tensors in the narrowest integer type that holds their
values (token ids int32, masks int8: 41 % of the bytes on the bandit recipe), cast back on reading.
Non-tensors and `meta_info` are JSON in the file's metadata, each non-tensor with its numpy dtype; so are
every tensor's dtype and shape, which `read_batch` checks the file against before it returns anything.
"""

import json
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from verl.protocol import DataProto

FORMAT = "ragen-batch/1"
NARROW_INTS = (torch.int8, torch.int16, torch.int32, torch.int64)


class BatchFileError(ValueError):
    """A file that is not a whole batch as `write_batch` wrote it; the message names the file and the fault."""


def batch_path(rollout_data_dir: str | Path, step: int) -> Path:
    """Where training step `step`'s batch lies, next to its trajectory records (`train/step_N.jsonl`)."""
    return Path(rollout_data_dir) / "train" / f"step_{step}.batch.safetensors"


def write_batch(path: str | Path, batch: DataProto, **info) -> None:
    """Save `batch` whole or not at all (a staging file renamed into place). `info`: JSON-able facts about
    where it was saved (step, thread counts), returned by `read_batch`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {key: narrowed(tensor).contiguous() for key, tensor in batch.batch.items()}
    non_tensors = {key: {"dtype": values.dtype.str, "values": values.tolist()}
                   for key, values in batch.non_tensor_batch.items()}
    metadata = {"format": FORMAT, "dtypes": json.dumps({key: str(t.dtype) for key, t in batch.batch.items()}),
                "shapes": json.dumps({key: list(t.shape) for key, t in batch.batch.items()}),
                "non_tensor_batch": json.dumps(non_tensors), "meta_info": json.dumps(batch.meta_info),
                "info": json.dumps(info)}
    staging = path.with_name(path.name + ".tmp")
    staging.write_bytes(save(tensors, metadata=metadata))  # save_file would make it readable by its owner only
    os.replace(staging, path)


def read_batch(path: str | Path) -> tuple[DataProto, dict]:
    """The batch `write_batch` saved, every tensor and array in its original dtype, and its `info`. A file that
    is not one, or not whole (a damaged header, cut short, a tensor of another dtype or shape than recorded,
    arrays of different batch sizes) raises BatchFileError."""
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata()
            if metadata is None or metadata.get("format") != FORMAT:
                raise BatchFileError(f"{path} is not a batch file written by verl.utils.batch_file.write_batch")
            dtypes = json.loads(metadata["dtypes"])
            # files of before the shapes were recorded: the shapes they hold
            shapes = json.loads(metadata["shapes"]) if "shapes" in metadata else \
                {key: f.get_slice(key).get_shape() for key in f.keys()}
            if set(f.keys()) != set(dtypes) or set(dtypes) != set(shapes):
                raise BatchFileError(f"{path} holds the tensors {sorted(f.keys())}, and its header lists {sorted(dtypes)}")
            tensors = {key: f.get_tensor(key) for key in dtypes}
            non_tensors = {key: as_array(saved) for key, saved in json.loads(metadata["non_tensor_batch"]).items()}
            meta_info, info = json.loads(metadata["meta_info"]), json.loads(metadata["info"])
    except BatchFileError:
        raise
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as e:  # a damaged header or body
        raise BatchFileError(f"{path} is damaged: {type(e).__name__}: {e}") from e
    for key, tensor in tensors.items():
        dtype = getattr(torch, dtypes[key].removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise BatchFileError(f"{path}: tensor {key} has the unknown dtype {dtypes[key]!r} in the header")
        if tensor.is_floating_point() != dtype.is_floating_point or tensor.dtype.itemsize > dtype.itemsize:
            raise BatchFileError(f"{path}: tensor {key} is stored as {tensor.dtype}, which does not hold {dtype}")
        if list(tensor.shape) != shapes[key]:
            raise BatchFileError(f"{path}: tensor {key} has shape {list(tensor.shape)}, {shapes[key]} when saved")
        tensors[key] = tensor.to(dtype)
    sizes = {len(t) for t in tensors.values() if t.dim() > 0} | {len(a) for a in non_tensors.values()}
    if len(sizes) > 1:
        raise BatchFileError(f"{path}: its tensors and arrays hold different numbers of trajectories {sorted(sizes)}")
    lengths = {key: t.shape[1] for key, t in tensors.items() if t.dim() > 1}  # the per-token tensors: (B, T)
    if len(set(lengths.values())) > 1:
        raise BatchFileError(f"{path}: its per-token tensors have different lengths {lengths}")
    return DataProto(batch=tensors, non_tensor_batch=non_tensors, meta_info=meta_info), info


def narrowed(tensor: torch.Tensor) -> torch.Tensor:
    """An integer tensor in the narrowest of int8..int64 that holds its values; any other tensor as it is."""
    if tensor.dtype not in NARROW_INTS or tensor.numel() == 0:
        return tensor
    low, high = tensor.min().item(), tensor.max().item()
    fits = next(t for t in NARROW_INTS if torch.iinfo(t).min <= low and high <= torch.iinfo(t).max)
    return tensor.to(fits)


def as_array(saved: dict) -> np.ndarray:
    """A non-tensor as `write_batch` saved it: `values` as a 1-D array of `dtype`."""
    if saved["dtype"] != "|O":
        return np.array(saved["values"], dtype=saved["dtype"])
    array = np.empty(len(saved["values"]), dtype=object)  # np.array would make a list of equal lists 2-D
    array[:] = saved["values"]
    return array
