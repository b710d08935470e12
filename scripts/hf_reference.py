#!/usr/bin/env python3
"""An independent PyTorch implementation of the decoders Nimble Network runs
(Llama / Mistral, Qwen2, GPT-2), reading a Hugging Face model folder by hand:
config.json and safetensors files (F32, F16 or BF16; one file or shards with
model.safetensors.index.json). No transformers, no safetensors package: only
torch (Debian's python3-torch 1.13) and the standard library.

  python3 scripts/hf_reference.py logits FOLDER --tokens 1,2,3 [--greedy 32] [--adapter DIR] > out.json
      the logits of every position for the tokens (float32 math), and the
      greedy continuation of `--greedy` steps; with --adapter, a LoRA adapter
      in PEFT's layout (adapter_config.json, adapter_model.safetensors) over
      the folder's weights, applied unmerged as PEFT's forward does in eval
      mode: y = base(x) + (lora_alpha / r) * (x A^T) B^T on each adapted module
  python3 scripts/hf_reference.py check FOLDER FIXTURE.json [--tolerance 1e-4]
      recomputes FIXTURE's logits from FOLDER (e.g. an `nbcli model export`)
      and exits 1 when any differs by more than the tolerance
  python3 scripts/hf_reference.py bench FOLDER [--batches 1,8] [--prompt 8] [--steps 32] [--repeats 5] [--prefill 512] [--threads 2]
      tokens/s of KV-cached greedy decoding (float32) of each batch of sessions
      after a prompt, the ms of a prefill of --prefill tokens, each repeat's
      figure (bench/models.bench.ts runs it beside the engine)

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


def read_adapter(folder):
    """A PEFT LoRA folder: {module name: (A [r, in], B [out, r], scale)}, module
    names as the model's (model.layers.0.self_attn.q_proj, transformer.h.0.attn.c_attn)."""
    with open(os.path.join(folder, "adapter_config.json")) as f:
        cfg = json.load(f)
    if cfg.get("peft_type") != "LORA" or cfg.get("use_dora") or cfg.get("use_rslora"):
        raise SystemExit("adapter: plain LoRA only")
    scale = cfg["lora_alpha"] / cfg["r"]
    tensors = read_safetensors(os.path.join(folder, "adapter_model.safetensors"))
    out = {}
    prefix = "base_model.model."
    for name, t in tensors.items():
        if not name.startswith(prefix) or not (name.endswith(".lora_A.weight") or name.endswith(".lora_B.weight")):
            raise SystemExit(f"adapter: unexpected tensor {name}")
        module = name[len(prefix):-len(".lora_A.weight")]
        a, b = out.get(module, (None, None))
        if name.endswith(".lora_A.weight"):
            a = t
        else:
            b = t
        out[module] = (a, b)
    for module, (a, b) in out.items():
        if a is None or b is None or a.shape[0] != cfg["r"] or b.shape[1] != cfg["r"]:
            raise SystemExit(f"adapter: {module} needs lora_A [r, in] and lora_B [out, r]")
    return {m: (a, b, scale) for m, (a, b) in out.items()}


def lora_delta(adapter, module, x):
    """The adapter's addition to module's output for input x (0 when the module is not adapted)."""
    if not adapter or module not in adapter:
        return 0
    a, b, scale = adapter[module]
    return (x @ a.T) @ b.T * scale


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


def llama_forward(config, w, tokens, adapter=None):
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
        y = y + w[name + ".bias"] if bias and (name + ".bias") in w else y
        return y + lora_delta(adapter, name, x)

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


def gpt2_forward(config, w, tokens, adapter=None):
    w = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in w.items()}
    C = config["n_embd"]
    H = config["n_head"]
    d = C // H
    eps = config.get("layer_norm_epsilon", 1e-5)
    T = len(tokens)

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv1d(x, p):
        # Conv1D's weight is [in, out]; PEFT's adapter on it is the same lora_A [r, in], lora_B [out, r]
        return x @ w[p + ".weight"] + w[p + ".bias"] + lora_delta(adapter, "transformer." + p, x)

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


def forward(config, w, tokens, adapter=None):
    with torch.no_grad():
        if config["model_type"] in ("llama", "mistral", "qwen2"):
            return llama_forward(config, w, tokens, adapter)
        if config["model_type"] == "gpt2":
            return gpt2_forward(config, w, tokens, adapter)
    raise SystemExit(f"model_type {config['model_type']} is not implemented here")


def greedy(config, w, tokens, steps, adapter=None):
    seq = list(tokens)
    for _ in range(steps):
        seq.append(int(forward(config, w, seq, adapter)[-1].argmax()))
    return seq[len(tokens):]


def gpt2_cached(config, w):
    """A step function over a KV cache: step(tokens [B, n], cache, pos) -> logits of each row [B, n, V]."""
    w = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in w.items()}
    C = config["n_embd"]
    H = config["n_head"]
    d = C // H
    eps = config.get("layer_norm_epsilon", 1e-5)
    head = w["wte.weight"] if config.get("tie_word_embeddings", True) or "lm_head.weight" not in w else w["lm_head.weight"]

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv1d(x, p):
        return torch.addmm(w[p + ".bias"], x.reshape(-1, x.shape[-1]), w[p + ".weight"]).view(*x.shape[:-1], -1)

    def step(tokens, cache, pos, last_only=True):
        B, n = tokens.shape
        x = w["wte.weight"][tokens] + w["wpe.weight"][pos:pos + n]
        for l in range(config["n_layer"]):
            p = f"h.{l}."
            q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=-1)
            q, k, v = (t.view(B, n, H, d).transpose(1, 2) for t in (q, k, v))
            if l in cache:
                k = torch.cat((cache[l][0], k), dim=2)
                v = torch.cat((cache[l][1], v), dim=2)
            cache[l] = (k, v)
            scores = q @ k.transpose(-1, -2) / math.sqrt(d)
            if n > 1:
                mask = torch.ones(n, pos + n, dtype=torch.bool).triu(pos + 1)
                scores = scores.masked_fill(mask, float("-inf"))
            a = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, n, C)
            x = x + conv1d(a, p + "attn.c_proj")
            h = torch.nn.functional.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
            x = x + conv1d(h, p + "mlp.c_proj")
        if last_only:
            x = x[:, -1:]
        return torch.nn.functional.linear(ln(x, "ln_f"), head)  # lm_head is an nn.Linear in transformers

    return step


def bench(args):
    import time
    torch.set_num_threads(args.threads)
    config, w = read_folder(args.folder)
    if config["model_type"] != "gpt2":
        raise SystemExit("bench: gpt2 folders only for now")
    step = gpt2_cached(config, w)
    V = config["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "decode": {}, "prefill_ms": []}
    with torch.no_grad():
        for B in [int(b) for b in args.batches.split(",")]:
            rates = []
            for r in range(args.repeats + 1):
                prompt = torch.randint(0, V, (B, args.prompt), generator=gen)
                cache = {}
                nxt = step(prompt, cache, 0)[:, -1].argmax(-1, keepdim=True)
                t0 = time.perf_counter()
                for t in range(args.steps):
                    nxt = step(nxt, cache, args.prompt + t)[:, -1].argmax(-1, keepdim=True)
                dt = time.perf_counter() - t0
                if r > 0:  # the first run warms up
                    rates.append(B * args.steps / dt)
            out["decode"][f"b{B}"] = rates
        if args.prefill > 0:
            for r in range(args.prefill_repeats + 1):
                prompt = torch.randint(0, V, (1, args.prefill), generator=gen)
                t0 = time.perf_counter()
                step(prompt, {}, 0).argmax(-1)
                dt = time.perf_counter() - t0
                if r > 0:
                    out["prefill_ms"].append(dt * 1000)
    json.dump(out, sys.stdout)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits")
    lg.add_argument("folder")
    lg.add_argument("--tokens", required=True)
    lg.add_argument("--greedy", type=int, default=0)
    lg.add_argument("--adapter", default=None)
    ck = sub.add_parser("check")
    ck.add_argument("folder")
    ck.add_argument("fixture")
    ck.add_argument("--tolerance", type=float, default=1e-4)
    bn = sub.add_parser("bench")
    bn.add_argument("folder")
    bn.add_argument("--batches", default="1,8")
    bn.add_argument("--prompt", type=int, default=8)
    bn.add_argument("--steps", type=int, default=32)
    bn.add_argument("--repeats", type=int, default=5)
    bn.add_argument("--prefill", type=int, default=512)
    bn.add_argument("--prefill-repeats", type=int, default=3)
    bn.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.cmd == "bench":
        bench(args)
        return
    torch.set_num_threads(1)
    if args.cmd == "logits":
        config, w = read_folder(args.folder)
        tokens = [int(t) for t in args.tokens.split(",")]
        adapter = read_adapter(args.adapter) if args.adapter else None
        if adapter is not None:
            unknown = [m for m in adapter if m.replace("transformer.", "", 1) + ".weight" not in w and m + ".weight" not in w]
            if unknown:
                raise SystemExit(f"adapter: no module {unknown[0]} in the base model")
        logits = forward(config, w, tokens, adapter)
        out = {"model_type": config["model_type"], "tokens": tokens, "logits": logits.tolist(), "greedy": greedy(config, w, tokens, args.greedy, adapter), "torch": torch.__version__}
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
