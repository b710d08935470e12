# Reference rotary-embedding tables for test/model/rope.test.ts, computed with
# PyTorch the way Hugging Face transformers computes them
# (modeling_rope_utils.py: the default, linear and llama3 rope types;
# LlamaRotaryEmbedding.forward for cos/sin), written independently of
# src/model/rope.ts. Run with a Python that has torch (Debian's python3-torch):
#   /usr/bin/python3 scripts/reference/rope_tables.py > test/model/fixtures/rope-tables.json
import json
import math

import torch


def default_inv_freq(dim, base):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, old_context_len):
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def inv_freq_of(case):
    inv = default_inv_freq(case["headDim"], case["ropeTheta"])
    s = case["ropeScaling"]
    if s is None:
        return inv
    if s["kind"] == "linear":
        inv = inv.clone()
        inv /= s["factor"]
        return inv
    return llama3_inv_freq(inv, s["factor"], s["lowFreqFactor"], s["highFreqFactor"], s["originalContextLength"])


CASES = [
    {"name": "llama2 default", "headDim": 64, "ropeTheta": 10000.0, "ropeScaling": None},
    {"name": "qwen2 default", "headDim": 64, "ropeTheta": 1000000.0, "ropeScaling": None},
    {"name": "odd half", "headDim": 12, "ropeTheta": 10000.0, "ropeScaling": None},
    {"name": "linear x4", "headDim": 128, "ropeTheta": 10000.0, "ropeScaling": {"kind": "linear", "factor": 4.0}},
    {"name": "llama3.2", "headDim": 64, "ropeTheta": 500000.0, "ropeScaling": {
        "kind": "llama3", "factor": 32.0, "lowFreqFactor": 1.0, "highFreqFactor": 4.0, "originalContextLength": 8192}},
    {"name": "llama3.1", "headDim": 128, "ropeTheta": 500000.0, "ropeScaling": {
        "kind": "llama3", "factor": 8.0, "lowFreqFactor": 1.0, "highFreqFactor": 4.0, "originalContextLength": 8192}},
]
POSITIONS = [0, 1, 2, 7, 100, 1023, 4095]

out = []
for case in CASES:
    inv = inv_freq_of(case)
    pos = torch.tensor([POSITIONS], dtype=torch.int64)
    # LlamaRotaryEmbedding.forward: float32 matmul of inv_freq[:, None] and positions[None, :]
    freqs = (inv[None, :, None].float() @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    half = case["headDim"] // 2
    out.append({
        **case,
        "invFreq": [float(x) for x in inv.tolist()],
        "positions": POSITIONS,
        "cos": [[float(x) for x in row[:half]] for row in emb.cos()[0].tolist()],
        "sin": [[float(x) for x in row[:half]] for row in emb.sin()[0].tolist()],
    })
print(json.dumps({"torch": torch.__version__, "cases": out}, indent=None))
