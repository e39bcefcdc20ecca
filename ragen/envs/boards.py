"""Start boards and the seeds that give new ones.

Small boards repeat across seeds: 2,000 seeds of 6×6 one-box Sokoban give 1,569 distinct levels (60,000 give
14,686) and 2,000 of 4×4 FrozenLake 733 maps. A board is what `env.reset(seed)` shows the policy: the start
observation's text and the bytes of its pictures (`info["images"]`; an image-only observation's text is the same
for every seed). `new_board_seeds` picks seeds whose boards are all different and none of a known set: expert data
without repeats (`ragen.sft.data --distinct-boards`), tests on boards no run saw (scripts/seen_boards.py,
scripts/reproduce.py --test-new-boards).
"""

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import gymnasium
import numpy as np


def start_board(env: gymnasium.Env, seed: int) -> str:
    """The start board of `env` at `seed`: the observation's text, then a digest of each picture it shows."""
    text, info = env.reset(seed=seed)
    pictures = [hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest() for image in info.get("images", ())]
    return "\n".join([text, *pictures])


def start_boards(env: gymnasium.Env, seeds: Iterable[int]) -> set[str]:
    """The start boards of `env` at `seeds`."""
    return {start_board(env, seed) for seed in seeds}


def new_board_seeds(group_tags: Sequence[str], envs: Mapping[str, gymnasium.Env], start: int,
                    known: Mapping[str, set[str]] | None = None, tries: int = 1000) -> list[int]:
    """For each group in turn (its tag in `group_tags`, its env in `envs`), the next seed from `start` on, rising,
    whose start board is neither among its tag's `known` boards nor an earlier pick's. ValueError when `tries`
    seeds in a row give none (a tag with too few distinct boards)."""
    taken = {tag: set((known or {}).get(tag, ())) for tag in group_tags}
    seeds, seed = [], start
    for tag in group_tags:
        for seed in range(seed, seed + tries):
            board = start_board(envs[tag], seed)
            if board not in taken[tag]:
                taken[tag].add(board)
                seeds.append(seed)
                break
        else:
            raise ValueError(f"{tries} seeds in a row from {seed - tries + 1} hold no {tag} board that is new: the "
                             f"tag has too few distinct boards for {len(group_tags)} groups")
        seed += 1
    return seeds
