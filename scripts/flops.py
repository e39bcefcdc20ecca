"""FLOP counts and the machine's matmul peak, shared by the benchmarks that report a share of the
compute bound (benchmark_rollout.py, benchmark_vs_trl.py) or the peaks (benchmark_step.py). Counts are the
matmuls of a Llama-family decoder (its config's sizes); element-wise work is not counted."""

import time

import torch


def matmul_peak(size: int = 2048, seconds: float = 3.0, dtype: torch.dtype = torch.bfloat16) -> float:
    """GEMM FLOP/s of this machine in `dtype` at its torch thread count: the best of the square matmuls that fit
    in about `seconds`, `size` wide unless one would take over a tenth of them. A CPU without native bf16
    (`avx512_bf16`/`amx_bf16` in /proc/cpuinfo) may run bf16 hundreds of times slower than fp32; there the
    matmuls shrink (one 2048-wide bf16 matmul takes ~40 s on such an EPYC) rather than the benchmark stall."""
    probe = torch.randn(256, 256, dtype=dtype)
    probe @ probe  # the thread pool started
    start = time.perf_counter()
    probe @ probe
    rate = 2 * 256 ** 3 / max(time.perf_counter() - start, 1e-9)  # a first, rough FLOP/s
    while size > 256 and 2 * size ** 3 / rate > seconds / 10:
        size //= 2
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while best == float("inf") or time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def query_width(config) -> int:
    """Query heads x head dim."""
    return config.num_attention_heads * (getattr(config, "head_dim", None)
                                         or config.hidden_size // config.num_attention_heads)


def weight_flops_per_token(config) -> int:
    """One token's forward through every decoder layer's weights and the LM head (attention scores excluded)."""
    hidden, q = config.hidden_size, query_width(config)
    kv = q // config.num_attention_heads * config.num_key_value_heads
    layer = 2 * (hidden * (q + 2 * kv) + q * hidden + 3 * hidden * config.intermediate_size)
    return layer * config.num_hidden_layers + 2 * hidden * config.vocab_size


def update_flops(config, lengths: list[int], scored: int) -> float:
    """One forward + backward (3x the forward) over sequences of `lengths` tokens, with causal attention
    scores, the LM head applied at `scored` positions only."""
    head = 2 * config.hidden_size * config.vocab_size
    attention = sum(2 * 2 * query_width(config) * n * (n + 1) / 2 for n in lengths) * config.num_hidden_layers
    forward = (weight_flops_per_token(config) - head) * sum(lengths) + attention + head * scored
    return 3 * forward
