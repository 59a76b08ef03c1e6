#!/usr/bin/env python3
"""TRL's GRPOTrainer and roll's GRPO on the same work, one after the other.

  .venv/bin/python benchmarks/trl_grpo_peer.py --roll build/bin/roll [--steps 20] [--eval-every 10]
      [--threads 2] [--out bench-trl]

The work is configs/rlvr_base.yaml's (the quickstart's task and model, plain
GRPO): two-operand addition prompts written once to JSONL and read by both;
the SFT base that `roll sft` makes from them, a Hugging Face checkpoint,
loaded by both; per step 32 prompts x 8 samples, at most 6 new tokens at
temperature 1, four optimizer steps of 64 samples, learning rate 2e-4 held
constant, clip 0.2, no KL term, token-mean loss (TRL's "dapo"), advantages
normalised by the group's std, the same number of steps and threads.
Validation: greedy accuracy on the same 256 held-out prompts at the same
steps, each side with its own generator (roll's engine, TRL's model's
`generate`), not counted in the training time.

Prints one JSON object: for each side samples/s and s/step over the
training steps, and val accuracy by step; `roll_vs_trl_samples_per_s`.
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time


def write_task(out, seed, num_train=4000, num_val=256, lo=0, hi=49):
    """Addition prompts: validation questions distinct, training ones never
    a validation question (as the arithmetic task generator draws them)."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)]
    rng.shuffle(pairs)
    val, rest = pairs[:num_val], pairs[num_val:]
    train = [rest[rng.randrange(len(rest))] for _ in range(num_train)]
    paths = {}
    for name, items in (("train", train), ("val", val)):
        path = os.path.join(out, f"{name}.jsonl")
        with open(path, "w") as f:
            for i, (a, b) in enumerate(items):
                f.write(json.dumps({"id": f"{name}-{i}", "prompt": f"{a}+{b}=", "ground_truth": str(a + b)}) + "\n")
        paths[name] = path
    return paths


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def correct(completion, truth):
    """The math rule's verdict on these answers: the first number in the
    completion equals the ground truth."""
    m = re.search(r"-?\d+", completion)
    return m is not None and m.group(0) == truth


def run(cmd, **kw):
    print("trl_grpo_peer: " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, **kw)


def roll_side(args, common):
    out = os.path.join(args.out, "roll")
    run([args.roll, "run", args.config, *common, f"output_dir={out}", f"max_steps={args.steps}",
         f"eval_steps={args.eval_every}", "save_steps=0", "--quiet"])
    rows = load_jsonl(os.path.join(out, "metrics.jsonl"))
    steps = [r for r in rows if "time/step_s" in r and r.get("step", 0) >= 1]
    train_s = sum(r["time/step_s"] - r.get("time/val_s", 0.0) for r in steps)
    val = {r["step"]: r["val/accuracy"] for r in rows if "val/accuracy" in r}
    return train_s, len(steps), val


def trl_side(args, paths, base, prompt_template, sizes):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    # roll feeds the prompt's characters alone; this tokenizer class would
    # otherwise put <bos> (id 1) in front of every prompt TRL tokenizes.
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(base, "tokenizer.json"), add_bos_token=False,
                                  add_eos_token=False)
    cfg = json.load(open(os.path.join(base, "config.json")))
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    tok.eos_token = tok.convert_ids_to_tokens(eos)
    tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)

    render = lambda p: prompt_template.replace("{prompt}", p)
    train = load_jsonl(paths["train"])
    val = load_jsonl(paths["val"])
    dataset = Dataset.from_list([{"prompt": render(r["prompt"]), "ground_truth": r["ground_truth"]} for r in train])

    def reward(completions, ground_truth, **_):
        return [1.0 if correct(c, t) else 0.0 for c, t in zip(completions, ground_truth)]

    def evaluate(m):
        m.eval()
        hits = 0
        with torch.no_grad():
            for i in range(0, len(val), 128):
                chunk = val[i:i + 128]
                enc = tok([render(r["prompt"]) for r in chunk], return_tensors="pt", padding=True,
                          add_special_tokens=False)
                gen = m.generate(**enc, max_new_tokens=sizes["new_tokens"], do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=eos)
                texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                hits += sum(correct(t, r["ground_truth"]) for t, r in zip(texts, chunk))
        m.train()
        return hits / len(val)

    per_step = sizes["prompts"] * sizes["group"] // sizes["mini_batch"]

    class Timer(TrainerCallback):
        def __init__(self):
            self.train_s, self.val, self.t = 0.0, {}, None

        def on_train_begin(self, a, state, control, model=None, **kw):
            self.val[0] = evaluate(model)
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, model=None, **kw):
            if state.global_step % per_step == 0:
                step = state.global_step // per_step
                self.train_s += time.perf_counter() - self.t
                if step % args.eval_every == 0 or step == args.steps:
                    self.val[step] = evaluate(model)
                self.t = time.perf_counter()

    timer = Timer()
    config = GRPOConfig(
        output_dir=os.path.join(args.out, "trl"), use_cpu=True, seed=args.seed, report_to=[],
        save_strategy="no", logging_steps=per_step, disable_tqdm=True, bf16=False,
        per_device_train_batch_size=sizes["mini_batch"], gradient_accumulation_steps=1,
        num_generations=sizes["group"], generation_batch_size=sizes["prompts"] * sizes["group"],
        max_completion_length=sizes["new_tokens"], temperature=1.0, top_p=1.0,
        learning_rate=sizes["lr"], lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        beta=0.0, epsilon=sizes["clip"], num_iterations=1, loss_type="dapo", scale_rewards="group",
        max_steps=args.steps * per_step, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tok, callbacks=[timer])
    trainer.train()
    return timer.train_s, args.steps, timer.val


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser()
    p.add_argument("--roll", required=True)
    p.add_argument("--config", default=os.path.join(here, "..", "configs", "rlvr_base.yaml"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="bench-trl")
    p.add_argument("--only", choices=["roll", "trl"], default=None)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    args.out = os.path.abspath(args.out)

    sizes = dict(prompts=32, group=8, mini_batch=64, new_tokens=6, lr=2e-4, clip=0.2)
    paths = write_task(args.out, args.seed)
    base = os.path.join(args.out, "base")
    # Both sides: the same files, base, sizes and schedule (constant, no warm-up).
    common = [f"data.train_files=[{paths['train']}]", f"data.val_files=[{paths['val']}]", "data.num_val=256",
              f"sft.output_dir={base}", f"seed={args.seed}", "val_batch_size=256",
              f"rollout_batch_size={sizes['prompts']}", f"num_return_sequences_in_group={sizes['group']}",
              f"response_length={sizes['new_tokens']}",
              f"actor_infer.generating_args.max_new_tokens={sizes['new_tokens']}",
              f"actor_train.training_args.learning_rate={sizes['lr']}",
              f"actor_train.training_args.per_device_train_batch_size={sizes['mini_batch']}",
              "actor_train.training_args.lr_scheduler_type=constant", "actor_train.training_args.warmup_steps=0",
              f"pg_clip={sizes['clip']}", "adv_estimator=grpo", "loss_agg_mode=token-mean"]
    if not os.path.exists(os.path.join(base, "config.json")):
        run([args.roll, "sft", args.config, *common, f"output_dir={os.path.join(args.out, 'sft')}",
             f"runtime.threads_per_worker={args.threads}"])
    resolved = subprocess.run([args.roll, "config", args.config, *common], check=True, capture_output=True,
                              text=True).stdout
    m = re.search(r"^\s*prompt_template:\s*(.*)$", resolved, re.M)
    prompt_template = json.loads(m.group(1)) if m and m.group(1).startswith('"') else (m.group(1) if m else "{prompt}")
    if re.search(r"^\s*chat_template:\s*chatml", resolved, re.M):
        raise SystemExit("trl_grpo_peer: the config renders ChatML; this comparison feeds TRL plain prompts")

    result = {"steps": args.steps, "threads": args.threads, "samples_per_step": sizes["prompts"] * sizes["group"],
              "sizes": sizes}
    import torch, transformers, trl
    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    for side in ("roll", "trl"):
        if args.only and side != args.only:
            continue
        t0 = time.perf_counter()
        if side == "roll":
            train_s, steps, val = roll_side(args, common)
        else:
            train_s, steps, val = trl_side(args, paths, base, prompt_template, sizes)
        result[side] = {"train_s": train_s, "s_per_step": train_s / steps,
                        "samples_per_s": steps * result["samples_per_step"] / train_s,
                        "val_accuracy": {str(k): v for k, v in sorted(val.items())},
                        "wall_s": time.perf_counter() - t0}
    if "roll" in result and "trl" in result:
        result["roll_vs_trl_samples_per_s"] = result["roll"]["samples_per_s"] / result["trl"]["samples_per_s"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
