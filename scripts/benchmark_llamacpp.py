"""llama.cpp against RAGEN's torch engine on one batched decode: is llama.cpp a faster rollout engine here?

    pip install llama-cpp-python          # builds llama.cpp from source (about 4 min on 2 cores); not a RAGEN
                                          # dependency: install it in a copy of the environment to measure
    python scripts/benchmark_llamacpp.py [--rows 32] [--prompt 255] [--new 64] [--threads 2]

Both engines get the same bundled SmolLM2-135M weights in bf16 (the GGUF the model ships as, dequantized and
written again as BF16 with the `gguf` package), the same random prompts, and decode greedily a fixed number
of tokens (EOS ignored), so they do the same arithmetic. llama.cpp is driven through its batch API, one
sequence per row, the way a rollout engine would use it. Printed per engine: prefill tokens/s, milliseconds
per decode step of the whole batch, generated tokens/s, and how many rows produced the same tokens as the
torch engine (bf16 sums in another order may flip a near-tie).
"""

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
import torch

from verl.utils.model import BUNDLED_MODELS, load_tokenizer, resolve_model_path
from verl.workers.rollout import SamplingParams
from verl.workers.rollout.torch_rollout import TorchRollout


MODEL = "SmolLM2-135M-Instruct"


def bundled_gguf() -> Path:
    package, name, _ = BUNDLED_MODELS[MODEL]
    return Path(importlib.util.find_spec(package).submodule_search_locations[0]) / name


def write_bf16_gguf(source: Path, target: Path) -> None:
    """`source` with every matrix stored as BF16 (vectors stay F32, as llama.cpp expects); metadata copied."""
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"]
    writer = gguf.GGUFWriter(target, bytes(arch.parts[arch.data[0]]).decode())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            if field.types[1] == gguf.GGUFValueType.STRING:
                value = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
            else:
                value = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_key_value(name, value, kind, sub_type=field.types[1])
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_key_value(name, bytes(field.parts[field.data[0]]).decode(), kind)
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        values = values.reshape([int(n) for n in reversed(tensor.shape)])
        if values.ndim == 2:
            writer.add_tensor(tensor.name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.BF16),
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(tensor.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run_llamacpp(path: Path, prompts: np.ndarray, new: int, threads: int) -> tuple[float, float, np.ndarray]:
    """Greedy batched decode, one llama.cpp sequence per row. Returns (prefill s, decode s, tokens)."""
    import llama_cpp as lc

    rows, length = prompts.shape
    quiet = lc.llama_log_callback(lambda level, text, data: None)  # kept referenced while llama.cpp runs
    lc.llama_log_set(quiet, None)
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = rows * (length + new), 2048, 512
    params.n_seq_max, params.n_threads, params.n_threads_batch = rows, threads, threads
    context = lc.llama_init_from_model(model, params)
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    batch = lc.llama_batch_init(params.n_batch, 0, 1)

    def decode(tokens, positions, sequences, wanted) -> None:
        batch.n_tokens = len(tokens)
        for i, (token, position, sequence, want) in enumerate(zip(tokens, positions, sequences, wanted)):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(token), int(position), 1
            batch.seq_id[i][0], batch.logits[i] = int(sequence), bool(want)
        if lc.llama_decode(context, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def greedy(outputs: int) -> np.ndarray:  # the batch's last `outputs` logits rows, in batch order
        logits = np.ctypeslib.as_array(lc.llama_get_logits(context), shape=(outputs * vocab,))
        return logits.reshape(outputs, vocab).argmax(1)

    start = time.perf_counter()
    flat = [(prompts[r, p], p, r, p == length - 1) for r in range(rows) for p in range(length)]
    last = np.zeros(rows, dtype=np.int64)
    for offset in range(0, len(flat), params.n_batch):
        chunk = flat[offset:offset + params.n_batch]
        decode(*zip(*chunk))
        ends = [item[2] for item in chunk if item[3]]
        if ends:
            last[ends] = greedy(len(ends))
    prefilled = time.perf_counter()
    generated = [last]
    for step in range(new - 1):
        decode(generated[-1], [length + step] * rows, range(rows), [True] * rows)
        generated.append(greedy(rows))
    finished = time.perf_counter()
    lc.llama_batch_free(batch)
    lc.llama_free(context)
    lc.llama_model_free(model)
    return prefilled - start, finished - prefilled, np.stack(generated, 1)


def run_torch(model_path: str, prompts: np.ndarray, new: int) -> tuple[float, float, np.ndarray]:
    """The same decode by TorchRollout (bf16). Prefill is timed as a call that generates one token."""
    engine = TorchRollout(model_path, load_tokenizer(model_path), "bfloat16", torch.device("cpu"),
                          prefix_cache=False)
    rows = prompts.tolist()
    greedy = dict(temperature=0.0, ignore_eos=True)
    engine.generate(rows[:2], SamplingParams(max_new_tokens=4, **greedy))  # warm-up
    start = time.perf_counter()
    engine.generate(rows, SamplingParams(max_new_tokens=1, **greedy))
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    tokens = engine.generate(rows, SamplingParams(max_new_tokens=new, **greedy)).token_ids
    return prefill, time.perf_counter() - start - prefill, np.array(tokens)


def report(name: str, rows: int, length: int, new: int, prefill: float, decode: float, same: str) -> None:
    print(f"{name:10s} prefill {rows * length / prefill:7.0f} tokens/s | decode {decode / (new - 1) * 1e3:6.1f} ms "
          f"a step of {rows} rows | {rows * new / (prefill + decode):6.1f} generated tokens/s | {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=255)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts = np.random.default_rng(0).integers(100, 40_000, size=(args.rows, args.prompt))

    prefill, decode, reference = run_torch(resolve_model_path(f"bundled:{MODEL}"), prompts, args.new)
    report("torch", args.rows, args.prompt, args.new, prefill, decode, "the reference")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model-bf16.gguf"
        write_bf16_gguf(bundled_gguf(), path)
        prefill, decode, tokens = run_llamacpp(path, prompts, args.new, args.threads)
    same = int((tokens == reference).all(1).sum())
    report("llama.cpp", args.rows, args.prompt, args.new, prefill, decode, f"{same}/{args.rows} rows as the torch engine")


if __name__ == "__main__":
    main()
