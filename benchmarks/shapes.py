"""MLP shapes of public dense gated-MLP models: the one list tests, benchmarks and tuning share.

Each entry is (hidden size K, intermediate size N), as the model's published config gives
``hidden_size`` and ``intermediate_size``. Models with the same shape appear once, under one
name; the comment names the others. ``HELD_OUT`` shapes (and ``HELD_OUT_M``) are never used to
fit the selection's tuning data: the tuning reports measure how well it generalizes on them.
"""

# Qwen2.5 dense models.
QWEN25_MLPS = {
    "qwen2.5-0.5b": (896, 4864),
    "qwen2.5-1.5b": (1536, 8960),
    "qwen2.5-3b": (2048, 11008),
    "qwen2.5-7b": (3584, 18944),  # also Qwen2-7B
    "qwen2.5-14b": (5120, 13824),  # also Llama 2 13B, OLMo 2 13B
    "qwen2.5-32b": (5120, 27648),
    "qwen2.5-72b": (8192, 29568),
}

PUBLIC_MLPS = {
    **QWEN25_MLPS,
    "qwen3-0.6b": (1024, 3072),
    "qwen3-1.7b": (2048, 6144),
    "qwen3-4b": (2560, 9728),
    "qwen3-8b": (4096, 12288),
    "qwen3-14b": (5120, 17408),
    "qwen3-32b": (5120, 25600),
    "llama-2-7b": (4096, 11008),  # also DeepSeek LLM 7B, Yi 6B, OLMo 2 7B
    "llama-2-70b": (8192, 28672),  # also Llama 3 / 3.1 / 3.3 70B
    "llama-3-8b": (4096, 14336),  # also Llama 3.1 8B, Mistral 7B, InternLM2 7B
    "llama-3.2-1b": (2048, 8192),  # also SmolLM2 1.7B
    "llama-3.2-3b": (3072, 8192),  # also Phi-3 mini
    "mistral-nemo-12b": (5120, 14336),
    "mistral-small-24b": (5120, 32768),
    "phi-4": (5120, 17920),  # also Phi-3 medium
    "deepseek-llm-67b": (8192, 22016),
    "deepseek-coder-33b": (7168, 19200),
    "internlm2-20b": (6144, 16384),
    "yi-34b": (7168, 20480),
    "granite-3-8b": (4096, 12800),
    "smollm2-360m": (960, 2560),
    "command-r-35b": (8192, 22528),
}

# Never fitted: the tuning data's generalization is reported on these.
HELD_OUT = ("smollm2-360m", "llama-3.2-3b", "granite-3-8b", "mistral-nemo-12b",
            "internlm2-20b", "yi-34b")
FIT = tuple(name for name in PUBLIC_MLPS if name not in HELD_OUT)

# Tokens per call the tuning grid measures (log-spaced, with ragged values between), and
# the held-out M values measured only to check the fit.
GRID_M = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384,
          448, 512, 640, 768, 1024, 1280, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
HELD_OUT_M = (5, 11, 40, 100, 200, 700, 1400, 3000, 6000, 11000)
# Decode and small-batch serving: what the decode benchmark runs.
DECODE_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_RAGGED_M = (3, 48, 200, 300)


# Expert MLPs of public mixture-of-experts models: (hidden size K, expert intermediate size F,
# routed experts E, experts per token), as their published configs give hidden_size,
# moe_intermediate_size (or intermediate_size), the number of routed experts and the top-k.
MOE_MLPS = {
    "mixtral-8x7b": (4096, 14336, 8, 2),  # also Mixtral 8x22B's routing (6144 x 16384)
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "deepseek-v3": (7168, 2048, 256, 8),  # also Kimi K2's experts (384 routed)
    "gpt-oss-20b": (2880, 2880, 32, 4),
    "qwen1.5-moe-a2.7b": (2048, 1408, 60, 4),
    "olmoe-1b-7b": (2048, 1024, 64, 8),
}
# Never merged into the grouped tuning data: its generalization is reported on these.
MOE_HELD_OUT = ("qwen1.5-moe-a2.7b", "olmoe-1b-7b")
# Tokens per call (each routed to top-k experts: T = tokens * top-k rows).
MOE_TOKENS = (1, 8, 64, 512, 4096, 16384)


def mlp_shape(name: str) -> tuple[int, int]:
    """(K, N) of a model in ``PUBLIC_MLPS``, or of "KxN" for any other shape."""
    if name in PUBLIC_MLPS:
        return PUBLIC_MLPS[name]
    k, sep, n = name.partition("x")
    if not (sep and k.isdigit() and n.isdigit()):
        raise ValueError(f"unknown model {name!r}: one of {', '.join(PUBLIC_MLPS)}, or KxN")
    return int(k), int(n)
