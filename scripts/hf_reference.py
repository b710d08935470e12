#!/usr/bin/env python3
"""An independent PyTorch implementation of the decoders Nimble Network runs
(Llama / Mistral, Qwen2, GPT-2), reading a Hugging Face model folder by hand:
config.json and safetensors files (F32, F16 or BF16; one file or shards with
model.safetensors.index.json). No transformers, no safetensors package: only
torch (Debian's python3-torch 1.13) and the standard library.

  python3 scripts/hf_reference.py logits FOLDER --tokens 1,2,3 [--greedy 32] > out.json
      the logits of every position for the tokens (float32 math), and the
      greedy continuation of `--greedy` steps
  python3 scripts/hf_reference.py check FOLDER FIXTURE.json [--tolerance 1e-4]
      recomputes FIXTURE's logits from FOLDER (e.g. an `nbcli model export`)
      and exits 1 when any differs by more than the tolerance

The fixtures under test/fixtures/hf-reference/ come from this script
(scripts/hf-reference-fixtures.ts runs it), so CI needs no PyTorch.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        start, end = e["data_offsets"]
        raw = bytearray(data[start:end])
        dtype = e["dtype"]
        if dtype == "BF16":
            # bf16 is the upper half of an f32: widen by hand (1.13 has no frombuffer for bfloat16 on every build)
            u16 = torch.frombuffer(raw, dtype=torch.int16).to(torch.int32) & 0xFFFF
            t = (u16 << 16).view(torch.float32)
        else:
            t = torch.frombuffer(raw, dtype=DTYPES[dtype]).to(torch.float32)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def read_folder(folder):
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(folder, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for file in files:
        tensors.update(read_safetensors(os.path.join(folder, file)))
    return config, tensors


def rope_inv_freq(config, head_dim):
    theta = config.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    scaling = config.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "linear":
            inv = inv / scaling["factor"]
        elif kind == "llama3":
            factor = scaling["factor"]
            low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
            old = scaling["original_max_position_embeddings"]
            low_wl, high_wl = old / low, old / high
            wavelen = 2 * math.pi / inv
            smooth = (old / wavelen - low) / (high - low)
            scaled = torch.where(wavelen > low_wl, inv / factor, inv)
            mid = (1 - smooth) * scaled / factor + smooth * scaled
            is_mid = (wavelen <= low_wl) & (wavelen >= high_wl)
            inv = torch.where(is_mid, mid, scaled)
    return inv.to(torch.float32)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def attention(q, k, v, T):
    # q: [H, T, d], k, v: [H, T, d]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def llama_forward(config, w, tokens):
    C = config["hidden_size"]
    H = config["num_attention_heads"]
    KV = config.get("num_key_value_heads", H)
    d = config.get("head_dim", C // H)
    eps = config.get("rms_norm_eps", 1e-6)
    qwen = config["model_type"] == "qwen2"
    tied = config.get("tie_word_embeddings", qwen)
    T = len(tokens)

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def lin(x, name, bias):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias and (name + ".bias") in w else y

    inv = rope_inv_freq(config, d)
    pos = torch.arange(T, dtype=torch.float32)
    freqs = torch.outer(pos, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    for l in range(config["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = lin(h, p + "self_attn.q_proj", True).view(T, H, d).transpose(0, 1)
        k = lin(h, p + "self_attn.k_proj", True).view(T, KV, d).transpose(0, 1)
        v = lin(h, p + "self_attn.v_proj", True).view(T, KV, d).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=0)
        v = v.repeat_interleave(H // KV, dim=0)
        a = attention(q, k, v, T).transpose(0, 1).reshape(T, H * d)
        x = x + lin(a, p + "self_attn.o_proj", True)
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = lin(h, p + "mlp.gate_proj", True)
        u = lin(h, p + "mlp.up_proj", True)
        x = x + lin(torch.nn.functional.silu(g) * u, p + "mlp.down_proj", True)
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    return x @ head.T


def gpt2_forward(config, w, tokens):
    w = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in w.items()}
    C = config["n_embd"]
    H = config["n_head"]
    d = C // H
    eps = config.get("layer_norm_epsilon", 1e-5)
    T = len(tokens)

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv1d(x, p):
        return x @ w[p + ".weight"] + w[p + ".bias"]

    x = w["wte.weight"][torch.tensor(tokens)] + w["wpe.weight"][:T]
    for l in range(config["n_layer"]):
        p = f"h.{l}."
        qkv = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(T, H, d).transpose(0, 1) for t in (q, k, v))
        a = attention(q, k, v, T).transpose(0, 1).reshape(T, C)
        x = x + conv1d(a, p + "attn.c_proj")
        h = conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")
        h = torch.nn.functional.gelu(h, approximate="tanh")
        x = x + conv1d(h, p + "mlp.c_proj")
    x = ln(x, "ln_f")
    head = w.get("lm_head.weight", w["wte.weight"]) if not config.get("tie_word_embeddings", True) else w["wte.weight"]
    return x @ head.T


def forward(config, w, tokens):
    with torch.no_grad():
        if config["model_type"] in ("llama", "mistral", "qwen2"):
            return llama_forward(config, w, tokens)
        if config["model_type"] == "gpt2":
            return gpt2_forward(config, w, tokens)
    raise SystemExit(f"model_type {config['model_type']} is not implemented here")


def greedy(config, w, tokens, steps):
    seq = list(tokens)
    for _ in range(steps):
        seq.append(int(forward(config, w, seq)[-1].argmax()))
    return seq[len(tokens):]


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits")
    lg.add_argument("folder")
    lg.add_argument("--tokens", required=True)
    lg.add_argument("--greedy", type=int, default=0)
    ck = sub.add_parser("check")
    ck.add_argument("folder")
    ck.add_argument("fixture")
    ck.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.cmd == "logits":
        config, w = read_folder(args.folder)
        tokens = [int(t) for t in args.tokens.split(",")]
        logits = forward(config, w, tokens)
        out = {"model_type": config["model_type"], "tokens": tokens, "logits": logits.tolist(), "greedy": greedy(config, w, tokens, args.greedy), "torch": torch.__version__}
        json.dump(out, sys.stdout)
        return
    with open(args.fixture) as f:
        fixture = json.load(f)
    config, w = read_folder(args.folder)
    logits = forward(config, w, fixture["tokens"])
    diff = (logits - torch.tensor(fixture["logits"])).abs().max().item()
    print(json.dumps({"max_abs_logit_diff": diff, "tolerance": args.tolerance}))
    sys.exit(0 if diff <= args.tolerance else 1)


if __name__ == "__main__":
    main()
