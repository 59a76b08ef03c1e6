#!/usr/bin/env python3
"""Our models, checkpoints and tokenizers against the field's own libraries.

Run by ctest with the project's .venv interpreter (scripts/setup makes it
from scripts/python-requirements.txt):

  .venv/bin/python tests/reference/hf_reference_test.py --roll build/bin/roll \
      [unittest args, e.g. TransformersReference]

- TransformersReference: Qwen2, Qwen3 and Llama-3 checkpoints that Hugging
  Face `transformers` writes with random weights; `roll logits` must give its
  float32 logits within LOGIT_ATOL, and `roll generate` at temperature 0 its
  greedy `generate()` token for token. A model saved by roll (a random one,
  and each of those loaded and saved again) must load with `from_pretrained`
  and give roll's logits.
- TokenizersReference: every tokenizer.json under tests/models/testdata
  encoded and decoded by `roll tokenize --json` and by `tokenizers` on a
  corpus of mixed scripts, digits, whitespace runs, emoji, code and chat
  markup, plus generated strings: the same ids and the same text.
- SafetensorsReference: files written by the `safetensors` library in
  float32, bfloat16 and float16 are read by roll, and roll's files by it.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

# The tolerance on float32 logits (values of order 1): the two forwards sum
# in different orders, which moves the last bits of every product.
LOGIT_ATOL = 2e-4
NEW_TOKENS = 16
ROLL = None
TESTDATA = None


def run_roll(*args, stdin=None):
    proc = subprocess.run([ROLL, *args], input=stdin, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"roll {' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def roll_logits(model, prompts, save=None):
    args = ["logits", "--model", model, "--threads", "1",
            "--prompt-ids", ";".join(" ".join(map(str, p)) for p in prompts)]
    if save:
        args += ["--save", save]
    rows = [json.loads(line) for line in run_roll(*args).splitlines()]
    return [torch.tensor(r["logits"], dtype=torch.float32) for r in rows]


def roll_greedy(model, prompts, new_tokens):
    out = run_roll("generate", "--model", model, "--threads", "1", "--format", "ids",
                   "--temperature", "0", "--ignore-eos", "--max-new-tokens", str(new_tokens),
                   "--prompt-ids", ";".join(" ".join(map(str, p)) for p in prompts))
    return [[int(t) for t in line.split()] for line in out.splitlines()]


def hf_model(kind, seed):
    """A small checkpoint of `kind` with random weights, every parameter drawn
    (norm weights around 1 and biases too, not left at their initial values)."""
    import transformers as tf
    common = dict(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6)
    if kind == "qwen2":
        config = tf.Qwen2Config(**common, tie_word_embeddings=True, rope_theta=10000.0)
        cls = tf.Qwen2ForCausalLM
    elif kind == "qwen3":
        config = tf.Qwen3Config(**common, head_dim=24, tie_word_embeddings=False, rope_theta=1000000.0)
        cls = tf.Qwen3ForCausalLM
    elif kind == "llama3":
        config = tf.LlamaConfig(**common, tie_word_embeddings=False, rope_theta=500000.0,
                                bos_token_id=1, eos_token_id=2,
                                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
        cls = tf.LlamaForCausalLM
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.15)
    return model


def hf_logits(model, prompt):
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float()


def hf_greedy(model, prompt, new_tokens):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts_for(vocab, seed):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (1, 7, 23)]


class TempDirCase(unittest.TestCase):
    """A test case with a scratch directory of its own, removed afterwards."""
    prefix = "roll-ref-"

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix=self.prefix)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class TransformersReference(TempDirCase):
    prefix = "roll-hf-ref-"

    def assertLogitsClose(self, ours, theirs, what):
        self.assertEqual(tuple(ours.shape), tuple(theirs.shape), what)
        err = (ours - theirs).abs().max().item()
        self.assertLessEqual(err, LOGIT_ATOL, f"{what}: max |logit difference| {err:.3g} (scale {theirs.abs().max():.3g})")

    def check_kind(self, kind, seed):
        model = hf_model(kind, seed)
        src = os.path.join(self.dir, kind)
        model.save_pretrained(src)
        prompts = prompts_for(model.config.vocab_size, seed)
        # Logits of every position.
        resaved = os.path.join(self.dir, kind + "-roll")
        ours = roll_logits(src, prompts, save=resaved)
        for i, p in enumerate(prompts):
            self.assertLogitsClose(ours[i], hf_logits(model, p), f"{kind} prompt {i} ({len(p)} tokens)")
        # Greedy decoding, the prompts batched in one engine.
        got = roll_greedy(src, prompts, NEW_TOKENS)
        for i, p in enumerate(prompts):
            self.assertEqual(got[i], hf_greedy(model, p, NEW_TOKENS), f"{kind} greedy, prompt {i}")
        # The checkpoint roll writes loads in transformers as the same model.
        import transformers as tf
        back = tf.AutoModelForCausalLM.from_pretrained(resaved).eval()
        self.assertEqual(type(back).__name__, type(model).__name__)
        for i, p in enumerate(prompts):
            self.assertLogitsClose(ours[i], hf_logits(back, p), f"{kind} saved by roll, prompt {i}")

    def test_qwen2_tied_embeddings_and_qkv_bias(self):
        self.check_kind("qwen2", 1)

    def test_qwen3_qk_norm_and_explicit_head_dim(self):
        self.check_kind("qwen3", 2)

    def test_llama3_rope_scaling(self):
        self.check_kind("llama3", 3)

    def test_a_model_made_by_roll_loads_with_from_pretrained(self):
        import transformers as tf
        out = os.path.join(self.dir, "random")
        prompts = prompts_for(500, 4)
        ours = roll_logits("random:layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=500",
                           prompts, save=out)
        model = tf.AutoModelForCausalLM.from_pretrained(out).eval()
        self.assertEqual(type(model).__name__, "Qwen2ForCausalLM")
        for i, p in enumerate(prompts):
            self.assertLogitsClose(ours[i], hf_logits(model, p), f"random model, prompt {i}")


# Mixed scripts, digits, whitespace runs, emoji, code, chat markup, and text
# that normalization (NFC) changes.
CORPUS = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say it's fine, don't you?",
    "HE'S HERE. She'D go; we'VE", "naïve café résumé", "e\u0301 vs \u00e9, A\u030a vs \u00c5",
    "你好，世界！今天天气很好。", "日本語のテキストとカタカナ、ひらがな。", "한국어 문장입니다.",
    "Привет, как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم", "नमस्ते दुनिया", "שלום עולם", "สวัสดีชาวโลก",
    "1234567890", "3.14159 2.71828", "1,000,000 and 42%", "x = 12345678901234567890", "0x1F 0b1010 1e-9",
    "a  b   c    d", "\t\tindented\twith tabs", "line one\nline two\n\nline four", "  leading and trailing  ",
    "\n\n\n", " \n \n ", "\r\nwindows\r\nline ends", "mixed \t \n whitespace \u3000 ideographic",
    "emoji 😀😃😄 and 👍🏽 skin tone", "family 👨‍👩‍👧‍👦 zwj", "flags 🇯🇵🇺🇸🇩🇪", "❤️ ✨ 🔥🔥🔥", "math ∑∫√∞ ≠ ≤ ≥",
    "def f(x):\n    return x ** 2  # square\n", "if (a && b) { return c[i]; }", "https://example.com/a?b=c&d=e#f",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "<|begin_of_text|>hi",
    "snake_case CamelCase kebab-case SCREAMING_CASE", "...!!!???---___", "", " ", "a",
]


def generated_corpus(seed, n):
    """Strings drawn from a pool of the hard cases, mixed within one string."""
    pool = list("abcXYZ019 \t\n'.,!?-_") + ["  ", "\n\n", "é", "ü", "你", "好", "日", "カ", "한", "я", "ع",
                                              "😀", "👍🏽", "🇯🇵", "👨‍👩‍👧", "123", "4567", "'s", "'ll", "\u0301"]
    rng = random.Random(seed)
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def as_the_library_numbers_it(path, out_dir):
    """`path`, or a copy whose added tokens carry the ids `tokenizers` gives
    them. The library numbers an added token that is not in the model's
    vocabulary right after it, whatever id the file says: the trimmed Llama-3
    fixture keeps <|begin_of_text|> at 128000 over a 12000-token vocabulary,
    which the library reads as 12000. The copy gives both sides one file."""
    from tokenizers import Tokenizer
    ref = Tokenizer.from_file(path)
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    renumber = {}
    for t in j.get("added_tokens", []):
        now = ref.token_to_id(t["content"])
        if now is not None and now != t["id"]:
            renumber[t["id"]] = now
            t["id"] = now
    if not renumber:
        return path

    def walk(v):
        if isinstance(v, dict):
            if "ids" in v and isinstance(v["ids"], list):
                v["ids"] = [renumber.get(i, i) for i in v["ids"]]
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(j.get("post_processor"))
    copy = os.path.join(out_dir, os.path.basename(path))
    with open(copy, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return copy


class TokenizersReference(TempDirCase):
    prefix = "roll-tok-ref-"

    def files(self):
        d = os.path.join(TESTDATA, "tokenizers")
        names = sorted(f for f in os.listdir(d) if f.endswith(".json") and not f.endswith("_expected.json"))
        self.assertGreaterEqual(len(names), 3, d)
        return [as_the_library_numbers_it(os.path.join(d, f), self.dir) for f in names]

    def test_encode_and_decode_match_tokenizers(self):
        from tokenizers import Tokenizer
        texts = CORPUS + generated_corpus(5, 300)
        for path in self.files():
            name = os.path.basename(path)
            ref = Tokenizer.from_file(path)
            for special in (False, True):
                flags = ["--add-special-tokens"] if special else []
                out = run_roll("tokenize", "--tokenizer", path, "--json", *flags,
                               stdin="".join(json.dumps(t) + "\n" for t in texts))
                ours = [json.loads(line) for line in out.splitlines()]
                self.assertEqual(len(ours), len(texts), name)
                for text, ids in zip(texts, ours):
                    want = ref.encode(text, add_special_tokens=special).ids
                    self.assertEqual(ids, want, f"{name}, add_special_tokens={special}: encode({text!r})")
            # Decoding, with and without skipping special tokens.
            id_lists = [ref.encode(t).ids for t in texts]
            for skip in (False, True):
                flags = ["--skip-special-tokens"] if skip else []
                out = run_roll("tokenize", "--tokenizer", path, "--json", "--decode", *flags,
                               stdin="".join(json.dumps(ids) + "\n" for ids in id_lists))
                ours = [json.loads(line) for line in out.splitlines()]
                for ids, text in zip(id_lists, ours):
                    self.assertEqual(text, ref.decode(ids, skip_special_tokens=skip),
                                     f"{name}, skip_special_tokens={skip}: decode({ids})")


class SafetensorsReference(TempDirCase):
    prefix = "roll-st-ref-"

    def test_files_written_by_safetensors_load_in_every_dtype(self):
        from safetensors.torch import load_file, save_file
        model = hf_model("qwen2", 6)
        prompts = prompts_for(model.config.vocab_size, 6)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            d = os.path.join(self.dir, str(dtype).split(".")[-1])
            model.config.save_pretrained(d)
            tensors = {k: v.to(dtype).contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
            save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            # The reference: the same rounded weights, computed in float32.
            ref = hf_model("qwen2", 6)
            missing, unexpected = ref.load_state_dict(
                {k: v.float() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}, strict=False)
            self.assertEqual((list(missing), list(unexpected)), (["lm_head.weight"], []), "only the tied head is left out")
            ref.tie_weights()
            ours = roll_logits(d, prompts, save=os.path.join(d, "roll"))
            for i, p in enumerate(prompts):
                err = (ours[i] - hf_logits(ref, p)).abs().max().item()
                self.assertLessEqual(err, LOGIT_ATOL, f"{dtype}: prompt {i}: max |difference| {err:.3g}")
            # And roll's file read back by the library: the same names and values.
            back = load_file(os.path.join(d, "roll", "model.safetensors"))
            for k, v in tensors.items():
                self.assertIn(k, back)
                self.assertTrue(torch.equal(back[k].float(), v.float()), f"{dtype}: {k} changed on the round trip")


def main():
    global ROLL, TESTDATA
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--roll", required=True)
    parser.add_argument("--testdata", default=os.path.join(here, "..", "models", "testdata"))
    args, rest = parser.parse_known_args()
    ROLL, TESTDATA = os.path.abspath(args.roll), os.path.abspath(args.testdata)
    torch.set_num_threads(1)
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
