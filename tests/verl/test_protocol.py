import numpy as np
import pytest
import torch

from verl.protocol import DataProto


def make(n: int = 4) -> DataProto:
    return DataProto(batch={"x": torch.arange(n * 2).view(n, 2)},
                     non_tensor_batch={"tag": [f"t{i}" for i in range(n)], "ids": [[i] * i for i in range(n)]},
                     meta_info={"step": 3})


def test_len_and_mismatched_sizes():
    assert len(make(4)) == 4
    with pytest.raises(ValueError, match="batch size"):
        DataProto(batch={"x": torch.zeros(3, 1)}, non_tensor_batch={"tag": ["a", "b"]})


def test_ragged_lists_stay_per_sample():
    data = make(4)
    assert data.non_tensor_batch["ids"].dtype == object
    assert data.non_tensor_batch["ids"][3] == [3, 3, 3]


def test_index_by_int_slice_list_bool_tensor():
    data = make(4)
    assert data[1].batch["x"].tolist() == [[2, 3]]
    assert list(data[1:3].non_tensor_batch["tag"]) == ["t1", "t2"]
    assert list(data[[3, 0]].non_tensor_batch["tag"]) == ["t3", "t0"]
    assert list(data[np.array([True, False, False, True])].non_tensor_batch["tag"]) == ["t0", "t3"]
    assert data[torch.tensor([2])].batch["x"].tolist() == [[4, 5]]
    assert data[1:3].meta_info == {"step": 3}


def test_select_and_union():
    data = make(4)
    left, right = data.select(["x"]), data.select(non_tensor_keys=["tag"])
    assert set(left.batch) == {"x"} and not left.non_tensor_batch
    merged = left.union(right).union(DataProto(batch={"y": torch.ones(4)}))
    assert set(merged.batch) == {"x", "y"} and list(merged.non_tensor_batch["tag"]) == list(data.non_tensor_batch["tag"])


def test_union_rejects_conflicts_and_size_mismatch():
    data = make(4)
    with pytest.raises(ValueError, match="differs"):
        data.union(DataProto(batch={"x": torch.zeros(4, 2, dtype=torch.long)}))
    with pytest.raises(ValueError, match="size"):
        data.union(make(3))


def test_chunk_concat_roundtrip_with_uneven_sizes():
    data = make(5)
    chunks = data.chunk(2)
    assert [len(c) for c in chunks] == [2, 3] or [len(c) for c in chunks] == [3, 2]
    back = DataProto.concat(chunks)
    assert torch.equal(back.batch["x"], data.batch["x"])
    assert list(back.non_tensor_batch["tag"]) == list(data.non_tensor_batch["tag"])


def test_split_into_micro_batches():
    assert [len(p) for p in make(5).split(2)] == [2, 2, 1]


def test_repeat_interleave_and_tile():
    data = make(2)
    assert list(data.repeat(2).non_tensor_batch["tag"]) == ["t0", "t0", "t1", "t1"]
    assert list(data.repeat(2, interleave=False).non_tensor_batch["tag"]) == ["t0", "t1", "t0", "t1"]
    assert data.repeat(3).batch["x"].shape == (6, 2)
