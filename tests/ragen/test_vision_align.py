"""The vision alignment stages (ragen/sft/vision_align.py): pictures in, each cell's symbol and the board's
coordinates out."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ragen.envs import make_env
from ragen.sft.vision_align import boards, cell_boards, main
from verl.utils.vlm import build_vlm

REPO = Path(__file__).parents[2]


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


def test_each_cell_symbol_is_the_one_drawn_in_its_tile():
    sokoban = make_env("sokoban", {"image_observation": "alone"})
    for picture, cells in cell_boards("sokoban", range(20), walk=5):
        assert len(cells) == 36 and picture.shape == (96, 96, 3)
        for index, symbol in enumerate(cells):
            row, col = divmod(index, 6)
            tile = sokoban.tiles[symbol]
            assert np.array_equal(picture[16 * row:16 * row + 16, 16 * col:16 * col + 16], tile)


def test_the_cell_stage_learns_to_read_every_cell_from_pixels(tiny_model_path, tmp_path):
    """Stage 1 alone, on a tiny model (a 1-layer, 32-wide tower): each image token, decoded to the nearest symbol
    embedding, names its cell's symbol on held-out boards far more often than reading every cell as the
    commonest symbol does; before training it names none. The language model is untouched."""
    vlm = build_vlm(tiny_model_path, tmp_path / "vlm", vision_width=32, vision_layers=1, vision_heads=2)
    score = main([str(vlm), str(tmp_path / "out"), "--cell-steps", "60", "--cell-batch-size", "16",
                  "--cell-lr", "3e-3", "--steps", "0", "--test-boards", "32", "--max-new-tokens", "2"])
    before, after = score["cells"]["before"], score["cells"]["after"]
    assert "after" not in score  # no language stage: not scored either
    assert before["cell_accuracy"] < after["commonest_symbol"] < 0.75 < 0.9 < after["cell_accuracy"]  # walls: 69 %
    old, new = load_file(vlm / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    changed = {k for k in old if not torch.equal(old[k], new[k])}
    assert changed and all("vision_model" in k or "connector" in k for k in changed)
    with pytest.raises(ValueError, match="the cell stage needs one per cell"):  # 4 x 4 boards, 6 x 6 tokens
        main([str(vlm), str(tmp_path / "fl"), "--env", "frozen_lake", "--cell-steps", "1", "--steps", "0",
              "--test-boards", "1"])


def test_alignment_trains_the_vision_side_only_and_scores_before_and_after(tiny_model_path, tmp_path):
    vlm = build_vlm(tiny_model_path, tmp_path / "vlm", vision_width=32, vision_layers=1, vision_heads=2)
    score = main([str(vlm), str(tmp_path / "out"), "--cell-steps", "0", "--steps", "3", "--batch-size", "2",
                  "--test-boards", "2", "--max-new-tokens", "8", "--lr", "1e-2"])
    assert json.loads((tmp_path / "out" / "score.json").read_text())["after"] == score["after"]
    assert 0 <= score["after"]["partial"] <= 1 and len(score["losses"]) == 3 and np.isfinite(score["losses"]).all()
    assert {"Player", "Boxes", "Targets"} <= score["after"]["lines"].keys()  # each line's share read right
    old, new = load_file(vlm / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    changed = {k for k in old if not torch.equal(old[k], new[k])}
    assert changed and all("vision_model" in k or "connector" in k for k in changed)
    main([str(vlm), str(tmp_path / "lm"), "--cell-steps", "0", "--steps", "1", "--batch-size", "2",
          "--test-boards", "1", "--max-new-tokens", "2", "--lm-lr", "1e-2"])  # the language model learns too
    new = load_file(tmp_path / "lm" / "model.safetensors")
    assert any("text_model" in k and not torch.equal(old[k], new[k]) for k in old)


def test_the_entry_script_builds_the_model_once_and_aligns_it(tiny_model_path, tmp_path):
    """`bash sft/vision_align.sh <env> <out>`: the model is built into <out>/base (reused by a second call), the
    aligned one written to <out>/model with its score."""
    command = ["bash", str(REPO / "sft" / "vision_align.sh"), "frozen_lake", str(tmp_path), "--cell-steps", "2",
               "--steps", "1", "--batch-size", "2", "--test-boards", "2", "--max-new-tokens", "4"]
    env = {**os.environ, "LM": tiny_model_path, "HF_HUB_OFFLINE": "1"}
    built = []
    for _ in range(2):
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        built.append((tmp_path / "base" / "model.safetensors").stat().st_mtime_ns)
    assert built[0] == built[1]  # the second call reused the built model
    assert json.loads((tmp_path / "model" / "score.json").read_text())["args"]["env"] == "frozen_lake"
    assert "[cells] after 2 steps" in result.stdout and "[vision] after 1 steps" in result.stdout
