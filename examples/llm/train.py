"""Trains a small byte-level Qwen3 decoder (transformers' Qwen3ForCausalLM) on the
Debian-files corpus (data.py) on the CPU.

Seeded: weights from torch.manual_seed(seed), training windows from numpy's default_rng(seed).
Trains in float32; saves to --out every --ckpt-minutes with save_pretrained, the weights in
bfloat16 (config.json, generation_config.json, model.safetensors) beside the tokenizer of
hf_tokenizer.py, so that AutoModelForCausalLM and AutoTokenizer load the directory. Logs to
--out/train.log, stops after --steps steps or --minutes of training, whichever first, then
loads the saved bfloat16 weights back in float32 and writes their held-out perplexity per byte,
computed through a DynamicCache (a prefix in one forward, then one token per forward).
"""

import argparse
import copy
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import AutoTokenizer, DynamicCache, Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
import hf_tokenizer  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--minutes", type=float, default=25.0,
                   help="wall-time limit of the training loop")
    p.add_argument("--steps", type=int, default=0,
                   help="steps of the cosine schedule; 0: estimated from the first steps' speed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--ckpt-minutes", type=float, default=4.0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-docs", type=int, default=8,
                   help="held-out documents in the final perplexity")
    p.add_argument("--eval-prefix", type=int, default=512,
                   help="tokens of each evaluated document fed in one forward before one "
                   "token per forward")
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


class Log:
    def __init__(self, path):
        self.f = open(path, "a")

    def __call__(self, msg):
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def lr_at(step, args, total):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    cos = 0.5 * (1 + math.cos(math.pi * frac))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * cos)


def model_config(args):
    """The Qwen3Config of the flags: byte vocabulary, tied embeddings, no sliding window."""
    return Qwen3Config(
        vocab_size=hf_tokenizer.VOCAB_SIZE, hidden_size=args.hidden,
        intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, hidden_act="silu", max_position_embeddings=args.ctx,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, attention_bias=False,
        use_sliding_window=False, bos_token_id=hf_tokenizer.BOS_ID,
        eos_token_id=hf_tokenizer.EOS_ID)


def init_weights(model, std=0.02):
    """Normal(0, std) weights, residual output projections scaled by depth, norms at 1."""
    layers = model.config.num_hidden_layers
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.ones_(p)
        elif name.endswith(".bias"):
            nn.init.zeros_(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            nn.init.normal_(p, std=std / math.sqrt(2 * layers))
        else:
            nn.init.normal_(p, std=std)


def nll(logits, tokens, reduction="mean"):
    """Cross entropy (nats) of tokens[:, 1:] under logits[:, :-1] ([b, n or more, vocab])."""
    n = tokens.shape[1] - 1
    return F.cross_entropy(logits[:, :n].reshape(-1, logits.shape[-1]).float(),
                           tokens[:, 1:].reshape(-1), reduction=reduction)


def lm_loss(model, x):
    """Mean next-token cross entropy over windows x [b, n + 1], one full-sequence forward of
    x[:, :-1]."""
    return nll(model(input_ids=x[:, :-1], use_cache=False).logits, x)


@torch.no_grad()
def quick_heldout(model, docs, ctx, n=4):
    """Held-out loss (nats per byte) of full-sequence forwards on the first ctx+1 tokens of n
    docs."""
    model.eval()
    losses = [lm_loss(model, torch.from_numpy(d[: ctx + 1].astype(np.int64)).unsqueeze(0)).item()
              for d in docs[:n]]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def score(model, tokens, prefix):
    """Logits [b, T, vocab] for tokens [b, T]: the first `prefix` tokens in one forward, then
    one token per forward, all through one DynamicCache."""
    cache = DynamicCache(config=model.config)
    out = [model(input_ids=tokens[:, :prefix], past_key_values=cache, use_cache=True).logits]
    for t in range(prefix, tokens.shape[1]):
        out.append(model(input_ids=tokens[:, t : t + 1], past_key_values=cache,
                         use_cache=True).logits)
    return torch.cat(out, dim=1)


@torch.no_grad()
def final_perplexity(model, docs, ctx, prefix):
    """Perplexity per byte over the first ctx tokens of each doc, scored through a
    DynamicCache; also the full-sequence value for comparison."""
    model.eval()
    total = total_full = 0.0
    count = 0
    for d in docs:
        toks = torch.from_numpy(d[:ctx].astype(np.int64)).unsqueeze(0)
        total += nll(score(model, toks, prefix), toks, "sum").item()
        total_full += nll(model(input_ids=toks, use_cache=False).logits, toks, "sum").item()
        count += toks.shape[1] - 1
    return math.exp(total / count), math.exp(total_full / count), count


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def save_checkpoint(model, tok, out, info):
    """save_pretrained of a bfloat16 copy of model (training goes on in float32), the
    tokenizer beside it, then checkpoint.json."""
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    write_json(os.path.join(out, "checkpoint.json"), info)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train.log"))
    log(f"args {json.dumps(vars(args))}")

    t0 = time.time()
    corpus = data.build(os.path.join(args.out, "manifest.json"))
    train = corpus["train"]
    heldout = [d for d in corpus["heldout"] if len(d) >= 2048]
    log(f"data: train {len(train)} tokens, heldout {len(heldout)} documents "
        f"{sum(len(d) for d in heldout)} tokens ({time.time() - t0:.1f} s)")

    assert data.BOS_ID == hf_tokenizer.BOS_ID
    cfg = model_config(args)
    model = Qwen3ForCausalLM(cfg)
    init_weights(model)
    nparams = sum(p.numel() for p in model.parameters())
    log(f"model: {json.dumps(cfg.to_diff_dict())} params {nparams} "
        f"({nparams * 2 / 1e6:.1f} MB bfloat16)")
    tok = hf_tokenizer.build(model_max_length=args.ctx)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    total = args.steps if args.steps > 0 else None
    budget = args.minutes * 60
    start = time.time()
    last_ckpt = start
    step, tokens, loss_acc, n_acc = 0, 0, 0.0, 0
    t_log = time.time()
    tok_log = 0
    t_measure = None
    model.train()
    while True:
        elapsed = time.time() - start
        if (total is not None and step >= total) or elapsed >= budget:
            break
        if total is None and step == 10:
            t_measure = time.time()
        if total is None and step == 30:
            per_step = (time.time() - t_measure) / 20
            total = step + int((budget - elapsed) / per_step * 0.97)
            log(f"schedule: {per_step:.3f} s/step measured, {total} steps in all")
        lr = lr_at(step, args, total if total is not None else 10 ** 9)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train) - args.ctx - 1, size=args.batch)
        x = torch.from_numpy(np.stack([train[s : s + args.ctx + 1] for s in starts])
                             .astype(np.int64))
        loss = lm_loss(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        step += 1
        tokens += x.shape[0] * args.ctx
        tok_log += x.shape[0] * args.ctx
        loss_acc += loss.item()
        n_acc += 1
        if step % args.log_every == 0:
            now = time.time()
            log(f"step {step} tokens {tokens} loss {loss_acc / n_acc:.4f} "
                f"bpb {loss_acc / n_acc / math.log(2):.3f} lr {lr:.2e} gnorm {gnorm:.2f} "
                f"tok/s {tok_log / (now - t_log):.0f} elapsed {now - start:.0f}s")
            loss_acc, n_acc, t_log, tok_log = 0.0, 0, now, 0
        if time.time() - last_ckpt >= args.ckpt_minutes * 60:
            hl = quick_heldout(model, heldout, args.ctx)
            save_checkpoint(model, tok, args.out,
                            {"step": step, "tokens": tokens, "heldout_loss": hl, "final": False})
            log(f"checkpoint step {step} tokens {tokens} heldout_loss {hl:.4f} "
                f"heldout_ppl_per_byte {math.exp(hl):.3f}")
            last_ckpt = time.time()

    train_s = time.time() - start
    hl = quick_heldout(model, heldout, args.ctx)
    info = {"step": step, "tokens": tokens, "train_seconds": round(train_s), "heldout_loss": hl,
            "final": True}
    save_checkpoint(model, tok, args.out, info)
    log(f"final checkpoint step {step} tokens {tokens} train {train_s:.0f}s "
        f"mean {tokens / train_s:.0f} tok/s heldout_loss {hl:.4f}")
    hf_tokenizer.check(AutoTokenizer.from_pretrained(args.out))
    # The figures are those of the weights as shipped: bfloat16, computed in float32.
    saved = Qwen3ForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    docs = heldout[: args.eval_docs]
    t1 = time.time()
    ppl, ppl_full, count = final_perplexity(saved, docs, args.ctx, args.eval_prefix)
    info.update({"heldout_ppl_per_byte": ppl, "heldout_bits_per_byte": math.log2(ppl),
                 "heldout_ppl_per_byte_full_forward": ppl_full, "eval_documents": len(docs),
                 "eval_tokens": count, "eval_prefix": args.eval_prefix,
                 "eval_weights": "bfloat16 as saved, computed in float32"})
    write_json(os.path.join(args.out, "checkpoint.json"), info)
    log(f"final heldout perplexity per byte (bfloat16 weights as saved, float32, DynamicCache, "
        f"prefix {args.eval_prefix} then 1 token per forward, {len(docs)} documents, {count} "
        f"predicted bytes): {ppl:.4f} [{math.log2(ppl):.4f} bits/byte; full-sequence forward "
        f"{ppl_full:.4f}] ({time.time() - t1:.0f}s)")


if __name__ == "__main__":
    main()
