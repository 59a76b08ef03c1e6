#!/usr/bin/env python3
"""Baseline for `roll bench generate`: greedy decoding in eager PyTorch.

The loop is written the way Hugging Face `generate` runs a Qwen2/LLaMA model
with its dynamic cache: one full forward per step in eager mode, keys and
values appended to a growing cache with torch.cat, the argmax of the last
logits fed back. EOS is ignored so every sequence makes --new tokens. Only
torch and the standard library are used; the checkpoint (config.json +
model.safetensors, or a sharded index) is parsed here directly.

Timing mode (default) prints one JSON line: tokens_per_s (all generated
tokens over prefill + decode time), decode_tokens_per_s, prefill_tokens_per_s,
best of --repeats after one short warm-up run.

Check mode (--prompt-ids "1 2 3") prints the greedy continuation's ids, to
compare with `roll generate --format ids --temperature 0 --ignore-eos`.
"""

import argparse
import json
import math
import os
import struct
import time

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        buf = bytearray(data[base + start:base + end])
        t = torch.frombuffer(buf, dtype=DTYPES[info["dtype"]]) if buf else torch.empty(0)
        out[name] = t.view(info["shape"]).to(torch.float32)
    return out


def load_checkpoint(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for name in files:
            tensors.update(read_safetensors(os.path.join(model_dir, name)))
    else:
        tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    if config.get("model_type") not in ("qwen2", "llama"):
        raise SystemExit("hf_style_generate.py: only qwen2 and llama checkpoints")
    if config.get("rope_scaling"):
        raise SystemExit("hf_style_generate.py: rope_scaling is not implemented")
    return config, tensors


class Model:
    def __init__(self, config, w):
        self.w = w
        self.hidden = config["hidden_size"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads", self.heads)
        self.head_dim = config.get("head_dim", self.hidden // self.heads)
        self.layers = config["num_hidden_layers"]
        self.eps = config.get("rms_norm_eps", 1e-6)
        theta = config.get("rope_theta", 10000.0)
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32)
                                         / self.head_dim))
        self.lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])

    def rms_norm(self, x, weight):
        var = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(var + self.eps))

    def linear(self, x, name):
        return torch.nn.functional.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    @staticmethod
    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, ids, past, start):
        """ids [B, T]; past: list of (k, v) per layer or None; start: cached length."""
        B, T = ids.shape
        x = torch.nn.functional.embedding(ids, self.w["model.embed_tokens.weight"])
        pos = torch.arange(start, start + T, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        mask = None
        if T > 1:
            mask = torch.full((T, start + T), float("-inf")).triu(start + 1)
        new_past = []
        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = self.rms_norm(x, self.w[p + "input_layernorm.weight"])
            q = self.linear(h, p + "self_attn.q_proj").view(B, T, self.heads, self.head_dim).transpose(1, 2)
            k = self.linear(h, p + "self_attn.k_proj").view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.linear(h, p + "self_attn.v_proj").view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            if past is not None:
                k = torch.cat([past[i][0], k], dim=2)
                v = torch.cat([past[i][1], v], dim=2)
            new_past.append((k, v))
            groups = self.heads // self.kv_heads
            kr = k.repeat_interleave(groups, dim=1) if groups > 1 else k
            vr = v.repeat_interleave(groups, dim=1) if groups > 1 else v
            scores = torch.matmul(q, kr.transpose(2, 3)) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores + mask
            attn = torch.matmul(torch.softmax(scores, dim=-1), vr)
            attn = attn.transpose(1, 2).reshape(B, T, self.heads * self.head_dim)
            x = x + self.linear(attn, p + "self_attn.o_proj")
            h = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            act = torch.nn.functional.silu(self.linear(h, p + "mlp.gate_proj")) * self.linear(h, p + "mlp.up_proj")
            x = x + self.linear(act, p + "mlp.down_proj")
        x = self.rms_norm(x[:, -1:], self.w["model.norm.weight"])
        return torch.nn.functional.linear(x, self.lm_head)[:, -1], new_past


def generate(model, prompts, new_tokens):
    """Greedy; returns (tokens [B, new], prefill seconds, decode seconds)."""
    with torch.inference_mode():
        t0 = time.perf_counter()
        logits, past = model.forward(prompts, None, 0)
        nxt = logits.argmax(-1)
        out = [nxt]
        t1 = time.perf_counter()
        length = prompts.shape[1]
        for _ in range(new_tokens - 1):
            logits, past = model.forward(nxt[:, None], past, length)
            length += 1
            nxt = logits.argmax(-1)
            out.append(nxt)
        t2 = time.perf_counter()
    return torch.stack(out, 1), t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-ids", help="check mode: print the greedy continuation")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config, tensors = load_checkpoint(args.model)
    model = Model(config, tensors)

    if args.prompt_ids:
        ids = torch.tensor([[int(t) for t in args.prompt_ids.split()]], dtype=torch.long)
        tokens, _, _ = generate(model, ids, args.new)
        print(" ".join(str(int(t)) for t in tokens[0]))
        return

    g = torch.Generator().manual_seed(args.seed)
    vocab = config["vocab_size"]
    generate(model, torch.randint(vocab, (args.batch, args.prompt_len), generator=g), 4)
    best_total = best_prefill = best_decode = float("inf")
    for _ in range(args.repeats):
        prompts = torch.randint(vocab, (args.batch, args.prompt_len), generator=g)
        _, prefill_s, decode_s = generate(model, prompts, args.new)
        best_total = min(best_total, prefill_s + decode_s)
        best_prefill = min(best_prefill, prefill_s)
        best_decode = min(best_decode, decode_s)
    print(json.dumps({
        "impl": "eager-pytorch-hf-style",
        "torch": torch.__version__,
        "threads": args.threads,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new,
        "tokens_per_s": args.batch * args.new / best_total,
        "decode_tokens_per_s": args.batch * (args.new - 1) / best_decode,
        "prefill_tokens_per_s": args.batch * args.prompt_len / best_prefill,
    }))


if __name__ == "__main__":
    main()
