"""Model shapes the tests and benchmarks share: (hidden, intermediate) of real MLPs."""

# Qwen2.5 dense models: hidden size K and MLP intermediate size N.
QWEN25_MLPS = {
    "qwen2.5-0.5b": (896, 4864),
    "qwen2.5-1.5b": (1536, 8960),
    "qwen2.5-3b": (2048, 11008),
    "qwen2.5-7b": (3584, 18944),
    "qwen2.5-14b": (5120, 13824),
    "qwen2.5-32b": (5120, 27648),
    "qwen2.5-72b": (8192, 29568),
}
