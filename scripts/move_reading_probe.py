"""How fast does a small model learn to read the board from per-move expert data? A probe for issue 31's item 8
(a fast CI test of board reading), not a recipe.

    python -m ragen.sft.data --env sokoban --train-size 2000 --test-size 200 --per-move --output /tmp/sok
    python scripts/move_reading_probe.py /tmp/sok [--state-only] [--steps 450] [--lr 1e-3] [--batch 32]
                                                  [--hidden 128] [--layers 4] [--every 50] [--seed 0]

A Llama built from a config (`--hidden`, `--layers`, 4 heads; random weights, the bundled model's tokenizer;
nothing is downloaded) is trained on the rows of `train.parquet` by a bare loop: AdamW at a constant `--lr`
after 5 warm-up steps, bf16 autocast, gradient clip 1, the loss on the reply tokens only, logits only where
they are scored. Every `--every` steps it prints the share of the first 256 held-out moves (`test.parquet`)
whose expert move gets the highest logit among the env's moves, teacher-forced after `<answer>` (one forward,
no sampling), beside two trivial policies fitted on the train rows: the commonest move, and the commonest move
at each turn number (a policy that reads the turn, not the board). `--state-only` drops the system prompt from
every row (the chat's first user turn on), to see what its ~210 tokens cost a small model.

The SFT trainer (`ragen/sft/trainer.py`) is the code path for warm starts; this loop exists because that one
always trains on the prompt as the recipe shows it, and the probe's question is what the prompt costs.
"""

import argparse
import collections
import random
import re
import time

import pyarrow.parquet as pq
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verl.utils.model import load_tokenizer, resolve_model_path

USER_TURN = "<|im_start|>user"
ANSWER = re.compile(r"<answer>(\w+)</answer>")
TURN = re.compile(r"Turn (\d+)\.")


def load_rows(path: str, tokenizer, state_only: bool) -> list[dict]:
    """Each row: its ids and loss mask (from the chat's first user turn on, with `state_only`), the index where
    the expert's move token is predicted, the move, and the turn number."""
    user = tokenizer.encode(USER_TURN)
    rows = []
    for row in pq.read_table(path, columns=["input_ids", "loss_mask", "text"]).to_pylist():
        ids, mask = row["input_ids"], row["loss_mask"]
        if state_only:
            start = next(i for i in range(len(ids)) if ids[i:i + len(user)] == user)
            ids, mask = ids[start:], mask[start:]
        move = ANSWER.findall(row["text"])[-1]
        move_token, reply = tokenizer.encode(move)[0], mask.index(1)
        move_at = reply + ids[reply:].index(move_token)
        rows.append(dict(ids=ids, mask=mask, move=move, move_at=move_at, turn=int(TURN.findall(row["text"])[-1])))
    return rows


def trivial_policies(train: list[dict], test: list[dict]) -> dict[str, float]:
    overall = collections.Counter(r["move"] for r in train).most_common(1)[0][0]
    by_turn = collections.defaultdict(collections.Counter)
    for r in train:
        by_turn[r["turn"]][r["move"]] += 1
    per_turn = {turn: counts.most_common(1)[0][0] for turn, counts in by_turn.items()}
    return {"commonest move": sum(r["move"] == overall for r in test) / len(test),
            "commonest move per turn": sum(r["move"] == per_turn.get(r["turn"], overall) for r in test) / len(test)}


@torch.no_grad()
def move_accuracy(model, rows: list[dict], move_ids: dict[str, int], pad_id: int) -> float:
    """Teacher-forced: does the expert's move get the highest logit among the moves, after its prompt?"""
    model.eval()
    names, ids = list(move_ids), torch.tensor(list(move_ids.values()))
    right = 0
    for start in range(0, len(rows), 32):
        chunk = rows[start:start + 32]
        width = max(r["move_at"] for r in chunk)
        x = torch.full((len(chunk), width), pad_id)
        attention = torch.zeros_like(x)
        for i, r in enumerate(chunk):  # left-padded, so that the last column predicts the move
            x[i, width - r["move_at"]:] = torch.tensor(r["ids"][:r["move_at"]])
            attention[i, width - r["move_at"]:] = 1
        with torch.autocast("cpu", torch.bfloat16):
            hidden = model.model(input_ids=x, attention_mask=attention).last_hidden_state[:, -1]
            logits = model.lm_head(hidden)[:, ids]
        right += sum(names[int(k)] == r["move"] for k, r in zip(logits.argmax(-1), chunk))
    model.train()
    return right / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="a folder of ragen.sft.data --per-move output (train/test.parquet)")
    parser.add_argument("--state-only", action="store_true", help="drop the system prompt from every row")
    parser.add_argument("--steps", type=int, default=450)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(resolve_model_path("bundled:SmolLM2-135M-Instruct"))
    train = load_rows(f"{args.data}/train.parquet", tokenizer, args.state_only)
    test = load_rows(f"{args.data}/test.parquet", tokenizer, args.state_only)[:256]
    move_ids = {move: tokenizer.encode(move)[0] for move in sorted({r["move"] for r in train})}
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
    order = list(range(len(train)))
    random.Random(args.seed).shuffle(order)

    baselines = ", ".join(f"{name} {share:.3f}" for name, share in trivial_policies(train, test).items())
    mean_length = sum(len(r["ids"]) for r in train) / len(train)
    print(f"{len(train)} train moves ({mean_length:.0f} tokens each), {len(test)} held-out; {baselines}")
    print(f"step 0: held-out move accuracy {move_accuracy(model, test, move_ids, tokenizer.pad_token_id):.3f}")
    start = time.time()
    for step in range(1, args.steps + 1):
        batch = [train[order[((step - 1) * args.batch + i) % len(order)]] for i in range(args.batch)]
        width = max(len(r["ids"]) for r in batch)
        x = torch.full((len(batch), width), tokenizer.pad_token_id)
        scored = torch.zeros((len(batch), width), dtype=torch.bool)
        for i, r in enumerate(batch):
            x[i, :len(r["ids"])] = torch.tensor(r["ids"])
            scored[i, :len(r["ids"])] = torch.tensor(r["mask"], dtype=torch.bool)
        attention = (torch.arange(width)[None] < torch.tensor([len(r["ids"]) for r in batch])[:, None]).long()
        with torch.autocast("cpu", torch.bfloat16):
            hidden = model.model(input_ids=x, attention_mask=attention).last_hidden_state[:, :-1]
            targets = scored[:, 1:]  # position t predicts token t + 1
            loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[targets]).float(), x[:, 1:][targets])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        warmup.step()
        optimizer.zero_grad()
        if step % args.every == 0 or step == args.steps:
            accuracy = move_accuracy(model, test, move_ids, tokenizer.pad_token_id)
            print(f"step {step}: loss {loss.item():.3f}, held-out move accuracy {accuracy:.3f} "
                  f"({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
