"""Teach a vision-language model to read a board from its picture, on rendered frames, in two stages.

    python -m ragen.sft.vision_align <vlm folder> <output folder> [--env sokoban] [--cell-steps 100] [--steps 300] ...

The model is a folder `verl/utils/vlm.py` wrote, or any Idefics3-style model with a processor, with one image
token per board cell (16-pixel tiles, 16-pixel patches, no pixel shuffle; for FrozenLake's 4 x 4 boards build
it with `--image-size 64`).

1. Cells (`--cell-steps`). The vision tower and the connector learn to turn each cell's patch into the
   language model's input embedding of that cell's symbol as the text grid writes it (`" #"`, `" P"`, ...; the
   mean of the pieces of a symbol of several tokens): mean squared error against those embeddings, nothing
   through the language model, so a step costs a forward and backward of the vision side alone. The picture
   then reaches the language model as the grid's own tokens, one per cell, without the line breaks. Reading
   is scored on held-out boards by decoding each image token to the nearest symbol embedding: `cell_accuracy`
   (against `commonest_symbol`, what reading every cell as the commonest symbol scores), and `exact`, the share
   of boards read right in every cell (so every position on them).
2. Language (`--steps`): LLaVA's first stage. The model is shown the picture of a board and asked for its
   state; the answer it learns is the board's coordinate text (the env's `observation_format: coord`: one
   `(row, col)` line per kind of cell). Both stages draw their answers from the same state as the picture,
   so data costs nothing and is never wrong. The vision tower and the connector learn (AdamW, a cosine
   after `--warmup` steps, bf16 autocast on a GPU or a CPU with AMX, else fp32) and by default the language
   model stays frozen (LLaVA's first stage; `--lm-lr` trains it too, at its own learning rate), on boards
   from start states and from random walks of up to `--walk` moves (so that the player, not only the level,
   varies). One process, no FSDP.

Before and after stage 2 it scores greedy answers on `--test-boards` boards no training step used (seeds from
`--test-seed`): `exact`, the share of answers equal to the true text, and `partial`, the mean share of
coordinate lines right (ragen/world_model_reward.py's per-object credit). Both stages' scores go to
`<output>/score.json` and the model, with its processor, to `<output>`.
"""

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from ragen.envs import make_env
from ragen.world_model_reward import state_credit
from verl.utils.model import resolve_dtype
from verl.utils.vlm import IMAGE_TOKEN

QUESTION = "Where is each thing on the board? Answer with one line of (row, col) coordinates per kind of cell."


def boards(env_type: str, seeds: range, walk: int, config: dict | None = None) -> list[tuple[np.ndarray, str]]:
    """(picture, text) of one board per seed: its start state after a random walk of 0..walk moves, both drawn
    by the env from the same state; the text in `config`'s observation format, by default the coordinates."""
    env = make_env(env_type, {"observation_format": "coord"} | (config or {}) | {"image_observation": "with_text"})
    out = []
    for seed in seeds:
        observation, info = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        for _ in range(int(rng.integers(walk + 1))):
            observation, _, terminated, truncated, info = env.step(env.sample_action(rng))
            if terminated or truncated:
                break
        out.append((info["images"][0], observation.removeprefix(IMAGE_TOKEN + "\n")))
    return out


def cell_boards(env_type: str, seeds: range, walk: int) -> list[tuple[np.ndarray, list[str]]]:
    """(picture, each cell's symbol in reading order) of one board per seed (`boards`)."""
    grids = boards(env_type, seeds, walk, {"observation_format": "grid", "cell_separator": " "})
    return [(picture, text.replace("\n", " ").split(" ")) for picture, text in grids]


class CellReader:
    """Stage 1: each cell's image token regressed onto the language model's embedding of the cell's symbol."""

    def __init__(self, model, processor, symbols: list[str], lr: float):
        self.model, self.processor = model, processor
        embeddings = model.get_input_embeddings().weight.detach()
        pieces = [processor.tokenizer.encode(" " + symbol, add_special_tokens=False) for symbol in symbols]
        self.symbols = {symbol: i for i, symbol in enumerate(symbols)}
        self.targets = torch.stack([embeddings[ids].mean(dim=0) for ids in pieces])  # (S, H)
        language = {id(p) for p in [*model.model.text_model.parameters(), *model.lm_head.parameters()]}
        self.trained = [p for p in model.parameters() if id(p) not in language]
        self.optimizer = torch.optim.AdamW(self.trained, lr=lr, weight_decay=0.0)

    def tokens(self, pictures: list[np.ndarray]) -> torch.Tensor:
        """(boards, image tokens, H): what the connector hands the language model for each picture."""
        pixels = self.processor.image_processor([[Image.fromarray(p)] for p in pictures], return_tensors="pt")
        out = self.model.model.get_image_features(pixels["pixel_values"], pixels["pixel_attention_mask"])
        features = out.pooler_output if hasattr(out, "pooler_output") else out
        features = torch.stack(list(features)) if isinstance(features, (list, tuple)) else features
        return features.reshape(len(pictures), -1, features.shape[-1])

    def _labels(self, batch: list[tuple[np.ndarray, list[str]]], tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] != len(batch[0][1]):
            raise ValueError(f"the model gives {tokens.shape[1]} image tokens for a board of {len(batch[0][1])} "
                             "cells: the cell stage needs one per cell (python -m verl.utils.vlm --image-size "
                             "<16 x the board's side> --patch-size 16 --scale-factor 1)")
        return torch.tensor([[self.symbols[c] for c in cells] for _, cells in batch])

    def step(self, batch: list[tuple[np.ndarray, list[str]]]) -> float:
        self.model.train()
        tokens = self.tokens([p for p, _ in batch])
        loss = torch.nn.functional.mse_loss(tokens, self.targets[self._labels(batch, tokens)])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    @torch.no_grad()
    def score(self, test: list[tuple[np.ndarray, list[str]]], batch_size: int) -> dict:
        """Each image token read as the symbol with the nearest embedding."""
        self.model.eval()
        right = []
        for start in range(0, len(test), batch_size):
            chunk = test[start:start + batch_size]
            tokens = self.tokens([p for p, _ in chunk])
            read = torch.cdist(tokens, self.targets[None]).argmin(dim=-1)  # (boards, cells)
            right.append(read == self._labels(chunk, tokens))
        right = torch.cat(right)
        cells = [c for _, board in test for c in board]
        commonest = max(map(cells.count, set(cells))) / len(cells)  # reading every cell as the commonest symbol
        return {"cell_accuracy": right.float().mean().item(), "exact": right.all(dim=1).float().mean().item(),
                "commonest_symbol": commonest, "boards": len(test)}


class Aligner:
    def __init__(self, model_path: str, lr: float, steps: int, warmup: int, lm_lr: float = 0.0):
        self.processor = AutoProcessor.from_pretrained(model_path)
        self.model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32)
        language = [*self.model.model.text_model.parameters(), *self.model.lm_head.parameters()]
        language_ids = {id(p) for p in language}  # the head may be tied to the embeddings
        vision = [p for p in self.model.parameters() if id(p) not in language_ids]
        for parameter in language:
            parameter.requires_grad_(lm_lr > 0)
        self.trained = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": vision, "lr": lr}] + ([{"params": list({id(p): p for p in language}.values()),
                                                     "lr": lm_lr}] if lm_lr > 0 else [])
        self.optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: min(
            (step + 1) / max(warmup, 1), 0.5 * (1 + math.cos(math.pi * min(step / max(steps, 1), 1.0)))))
        tokenizer = self.processor.tokenizer
        self.prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"{IMAGE_TOKEN}\n{QUESTION}"}],
                                                    tokenize=False, add_generation_prompt=True)
        self.eos = tokenizer.eos_token
        self._prompt_lengths: dict[tuple[int, ...], int] = {}  # per picture size: the prompt's tokens

    def _inputs(self, pictures: list[np.ndarray], texts: list[str]) -> dict:
        tokenizer = self.processor.tokenizer
        tokenizer.padding_side = "left"  # generation continues every row from its last token
        return self.processor(text=texts, images=[[Image.fromarray(p)] for p in pictures], return_tensors="pt",
                              padding=True)

    def step(self, batch: list[tuple[np.ndarray, str]]) -> float:
        """One update on the answers' tokens (the prompt, the picture and padding carry no loss)."""
        self.model.train()
        inputs = self._inputs([p for p, _ in batch], [self.prompt + text + self.eos for _, text in batch])
        labels = inputs["input_ids"].clone()
        answer_length = inputs["attention_mask"].sum(1) - torch.tensor([self._prompt_length(p) for p, _ in batch])
        width = labels.shape[1]
        positions = torch.arange(width)[None, :]
        labels[positions < width - answer_length[:, None]] = -100  # left padding: the answer is each row's end
        with torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16,
                            enabled=resolve_dtype("auto") == "bfloat16"):  # fp32 on a CPU slow in bf16
            loss = self.model(**inputs, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.trained, 1.0)
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def _prompt_length(self, picture: np.ndarray) -> int:
        """The prompt's tokens (the question and the picture's image tokens), which depend on the picture's size."""
        if picture.shape not in self._prompt_lengths:
            self._prompt_lengths[picture.shape] = int(self._inputs([picture], [self.prompt])["attention_mask"].sum())
        return self._prompt_lengths[picture.shape]

    @torch.no_grad()
    def score(self, test: list[tuple[np.ndarray, str]], batch_size: int, max_new_tokens: int) -> dict:
        """Greedy readings of `test`: `exact` and `partial` (above), and per line of the true text (`Player`,
        `Boxes`, ...) the share of the boards that have it where the reading's line is the same."""
        self.model.eval()
        exact = partial = 0.0
        lines: dict[str, list[bool]] = {}
        for start in range(0, len(test), batch_size):
            chunk = test[start:start + batch_size]
            inputs = self._inputs([p for p, _ in chunk], [self.prompt] * len(chunk))
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
            replies = self.processor.tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:],
                                                            skip_special_tokens=True)
            for reply, (_, truth) in zip(replies, chunk):
                exact += state_credit(reply.strip(), truth, "exact")
                partial += state_credit(reply.strip(), truth, "partial")
                read = dict(line.split(":", 1) for line in reply.strip().split("\n") if ":" in line)
                for line in truth.split("\n"):
                    label, value = line.split(":", 1)
                    lines.setdefault(label, []).append(read.get(label) == value)
        return {"exact": exact / len(test), "partial": partial / len(test), "boards": len(test),
                "lines": {label: float(np.mean(right)) for label, right in lines.items()}}


def train(step, data: list, steps: int, batch_size: int, stage: str) -> list[float]:
    """`steps` calls of `step` on consecutive batches of `data`; the losses, printed every 10 steps."""
    losses, start = [], time.perf_counter()
    for i in range(steps):
        losses.append(step(data[i * batch_size:(i + 1) * batch_size]))
        if (i + 1) % 10 == 0 or i + 1 == steps:
            print(f"[{stage}] step {i + 1}: loss {np.mean(losses[-10:]):.6f} "
                  f"({(time.perf_counter() - start) / (i + 1):.2f} s a step)", flush=True)
    return losses


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a vision-language model folder (python -m verl.utils.vlm)")
    parser.add_argument("output", help="where the trained model, its processor and score.json go")
    parser.add_argument("--env", default="sokoban", choices=["sokoban", "frozen_lake"])
    parser.add_argument("--cell-steps", type=int, default=100, help="stage 1's steps (0: skip it)")
    parser.add_argument("--cell-lr", type=float, default=1e-3)
    parser.add_argument("--cell-batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300, help="stage 2's steps (0: skip it)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3, help="the vision tower's and connector's learning rate")
    parser.add_argument("--lm-lr", type=float, default=0.0,
                        help="the language model's learning rate; 0 (the default) keeps it frozen (LLaVA's stage 1)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--walk", type=int, default=5, help="random moves after the start state, at most")
    parser.add_argument("--seed", type=int, default=0, help="the first training board's seed")
    parser.add_argument("--test-seed", type=int, default=1_000_000)
    parser.add_argument("--test-boards", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    aligner = Aligner(args.model, args.lr, args.steps, args.warmup, args.lm_lr)
    tested = range(args.test_seed, args.test_seed + args.test_boards)
    cell_test = cell_boards(args.env, tested, args.walk)
    cell_train = cell_boards(args.env, range(args.seed, args.seed + args.cell_steps * args.cell_batch_size), args.walk)
    symbols = sorted({c for _, cells in cell_train + cell_test for c in cells})
    reader = CellReader(aligner.model, aligner.processor, symbols, args.cell_lr)
    cells = {"before": reader.score(cell_test, args.cell_batch_size)}
    print(f"[cells] before: cell accuracy {cells['before']['cell_accuracy']:.3f}, exact {cells['before']['exact']:.3f}",
          flush=True)
    cell_losses = train(reader.step, cell_train, args.cell_steps, args.cell_batch_size, "cells")
    cells |= {"after": reader.score(cell_test, args.cell_batch_size), "losses": cell_losses}
    print(f"[cells] after {args.cell_steps} steps: cell accuracy {cells['after']['cell_accuracy']:.3f}, "
          f"exact {cells['after']['exact']:.3f} of {args.test_boards} held-out boards", flush=True)
    score = {"cells": cells}
    if args.steps > 0:
        test = boards(args.env, tested, args.walk)
        data = boards(args.env, range(args.seed, args.seed + args.steps * args.batch_size), args.walk)
        before = aligner.score(test, args.batch_size, args.max_new_tokens)
        print(f"[vision] before: exact {before['exact']:.3f}, partial {before['partial']:.3f}", flush=True)
        losses = train(aligner.step, data, args.steps, args.batch_size, "vision")
        after = aligner.score(test, args.batch_size, args.max_new_tokens)
        print(f"[vision] after {args.steps} steps: exact {after['exact']:.3f}, partial {after['partial']:.3f}",
              flush=True)
        score |= {"before": before, "after": after, "losses": losses}
    output = Path(args.output)
    aligner.model.save_pretrained(output)
    aligner.processor.save_pretrained(output)
    score["args"] = vars(args)
    (output / "score.json").write_text(json.dumps(score, indent=1), encoding="utf-8")
    return score


if __name__ == "__main__":
    main()
