"""The vision alignment stage (ragen/sft/vision_align.py): pictures in, the board's coordinates out."""

import json

import numpy as np
import torch
from safetensors.torch import load_file

from ragen.envs import make_env
from ragen.sft.vision_align import boards, main
from verl.utils.vlm import build_vlm


def test_each_picture_is_paired_with_the_coordinates_of_the_same_state():
    pairs = boards("sokoban", range(40), walk=5)
    env = make_env("sokoban", {"observation_format": "coord"})
    walked = 0
    for seed, (picture, text) in zip(range(40), pairs):
        start = env.reset(seed=seed)[0]
        walked += text != start  # a random walk moved the player (or nothing) from the start state
        assert text.startswith("Board size: 6 rows x 6 cols") and "Player" in text and picture.shape == (96, 96, 3)
        # the player's disc is drawn in the cell the text names
        row, col = (int(x) for x in text.split("Player")[1].split("(")[1].split(")")[0].split(", "))
        cell = picture[16 * row:16 * row + 16, 16 * col:16 * col + 16]
        assert (cell == np.array([40, 80, 220], dtype=np.uint8)).all(axis=-1).any()
    assert walked > 10


def test_alignment_trains_the_vision_side_only_and_scores_before_and_after(tiny_model_path, tmp_path):
    vlm = build_vlm(tiny_model_path, tmp_path / "vlm", vision_width=32, vision_layers=1, vision_heads=2)
    score = main([str(vlm), str(tmp_path / "out"), "--steps", "3", "--batch-size", "2", "--test-boards", "2",
                  "--max-new-tokens", "8", "--lr", "1e-2"])
    assert json.loads((tmp_path / "out" / "score.json").read_text())["after"] == score["after"]
    assert 0 <= score["after"]["partial"] <= 1 and len(score["losses"]) == 3 and np.isfinite(score["losses"]).all()
    old, new = load_file(vlm / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    changed = {k for k in old if not torch.equal(old[k], new[k])}
    assert changed and all("vision_model" in k or "connector" in k for k in changed)
