"""Weight fingerprints: hand-computed values, the same values in any layout give the same fingerprint, one
entry one bf16 step off gives another, and the sync check names what differs."""

import pytest
import torch

from verl.utils.fingerprint import (COLUMN_STRIDE, Fingerprint, WeightSyncError, check_weight_sync, fingerprints,
                                    sampled_columns, weight_fingerprints)


def test_hand_computed():
    matrix = torch.zeros(2, 2 * COLUMN_STRIDE + 1)  # columns 0, COLUMN_STRIDE and 2 * COLUMN_STRIDE are sampled
    matrix[:, 0], matrix[:, COLUMN_STRIDE], matrix[:, 2 * COLUMN_STRIDE] = torch.tensor([1.0, 2.0]), 3.0, -4.0
    matrix[:, 1] = 100.0  # not sampled
    found = weight_fingerprints({"w": matrix, "b": torch.tensor([1.0, -2.0])}, torch.float32)
    assert found == {"w": Fingerprint(sum=1 + 2 + 3 + 3 - 4 - 4, sum_sq=1 + 4 + 9 + 9 + 16 + 16, count=6),
                     "b": Fingerprint(sum=-1.0, sum_sq=5.0, count=2)}


def test_the_same_values_in_another_layout_match_and_one_bf16_step_does_not():
    torch.manual_seed(0)
    master = torch.randn(1536, 576) * 0.05  # fp32, as the trainer holds it
    expected = weight_fingerprints({"w": master}, torch.bfloat16)["w"]
    loaded = sampled_columns(master.to(torch.bfloat16))  # what an engine holds after casting on load
    layouts = {
        "as loaded": loaded,
        "rows in another order": loaded[torch.randperm(len(loaded))],
        "transposed, as a GEMM probe reads it": loaded.T.contiguous(),
        "padded with zero rows (vLLM's vocabulary)": torch.cat([loaded, torch.zeros(64, loaded.shape[1],
                                                                                     dtype=torch.bfloat16)]),
    }
    for layout, tensor in layouts.items():
        assert expected.matches(fingerprints({"w": tensor})["w"]), layout

    for row, column, step in [(0, 0, 1), (1000, 7, -1)]:  # one entry moved by one bf16 step (its last bit)
        moved = loaded.clone()
        moved.view(torch.int16)[row, column] += step
        assert 0 < abs(moved[row, column].float() - loaded[row, column].float()) < 1e-3
        assert not expected.matches(fingerprints({"w": moved})["w"])


def test_a_zero_tensor_matches_only_zeros():
    zeros = weight_fingerprints({"b": torch.zeros(8)}, torch.bfloat16)["b"]
    assert zeros.matches(zeros)
    assert not zeros.matches(fingerprints({"b": torch.tensor([0.0] * 7 + [1e-30])})["b"])


def test_check_weight_sync_names_the_differing_tensors_and_counts_them():
    weights = {f"layers.{i}.weight": torch.full((4, 4), float(i + 1)) for i in range(8)}
    expected = weight_fingerprints(weights, torch.bfloat16)
    check_weight_sync(expected, dict(expected), engine="torch")  # equal: nothing raised

    stale = weights | {f"layers.{i}.weight": torch.zeros(4, 4) for i in range(7)}
    with pytest.raises(WeightSyncError) as error:
        check_weight_sync(expected, weight_fingerprints(stale, torch.bfloat16), engine="torch")
    message = str(error.value)
    assert "7 of 8 tensors differ" in message and "actor_rollout_ref.rollout.name=torch" in message
    assert all(f"layers.{i}.weight: trainer sum {4 * (i + 1)}, sum of squares {4 * (i + 1) ** 2}; engine sum 0, "
               "sum of squares 0" in message for i in range(5))  # 4 x 4 of i + 1: one sampled column
    assert "layers.5.weight" not in message and "layers.7.weight" not in message  # the first five are named

    renamed = {name.replace("layers.0", "blocks.0"): fp for name, fp in expected.items()}
    with pytest.raises(WeightSyncError, match="0 of 8 tensors differ, 1 missing in the engine, 1 unknown to the "
                                              r"trainer\): layers\.0\.weight: not in the engine; blocks\.0\.weight"):
        check_weight_sync(expected, renamed, engine="vllm")
