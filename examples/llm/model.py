"""A Llama / Qwen3-style decoder whose attention goes through a pluggable KV cache.

Tensor names follow the Hugging Face layout, so a directory with config.json and
*.safetensors written by either side loads on the other. All sequences of one batch advance
together (no padding): every forward appends the same number of tokens to each.
"""

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import safetensors


@dataclass
class Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    attention_bias: bool = False

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.model_type not in ("llama", "qwen3"):
            raise ValueError(f"model_type {self.model_type!r} is neither llama nor qwen3")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def to_dict(self):
        d = asdict(self)
        d["architectures"] = ["Qwen3ForCausalLM" if self.model_type == "qwen3" else "LlamaForCausalLM"]
        d["hidden_act"] = "silu"
        return d


class KVCache:
    """The cache of one batch of sequences, as the attention layers use it."""

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor) -> None:
        """Adds the post-RoPE keys and values [batch, n_new, kv_heads, head_dim] of the new
        tokens; q [batch, n_new, q_heads, head_dim] are their post-RoPE queries (a cache that
        evicts by attention reads them)."""
        raise NotImplementedError

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Causal attention of the n_new queries [batch, n_new, q_heads, head_dim] over the
        cached tokens and the new ones up to each query; returns [batch, n_new, q_heads,
        head_dim]."""
        raise NotImplementedError

    def step_done(self, n_new: int) -> None:
        """Called once per forward, after all layers."""


def attention(q, k, v, n_past, block=128):
    """Causal grouped-query attention in float32.

    q [b, n, H, D]; k, v [b, T, KV, D] with T = n_past + n: query i sees keys 0 .. n_past + i.
    Query head h reads KV head h // (H / KV). Queries go in blocks of `block`, each against
    the keys up to its last query only. Returns [b, n, H, D] in q's dtype."""
    b, n, H, D = q.shape
    T, KV = k.shape[1], k.shape[2]
    if T != n_past + n:
        raise ValueError(f"{T} keys for {n_past} past and {n} new tokens")
    g = H // KV
    qf = q.float().reshape(b, n, KV, g, D).permute(0, 2, 3, 1, 4)  # [b, KV, g, n, D]
    kf = k.float().permute(0, 2, 1, 3).unsqueeze(2)  # [b, KV, 1, T, D]
    vf = v.float().permute(0, 2, 1, 3).unsqueeze(2)
    scale = 1.0 / math.sqrt(D)
    outs = []
    for s in range(0, n, block):
        e = min(n, s + block)
        kend = n_past + e
        sc = torch.matmul(qf[:, :, :, s:e], kf[:, :, :, :kend].transpose(-1, -2)) * scale
        if e - s > 1:
            i = torch.arange(s, e, device=q.device).unsqueeze(1)
            j = torch.arange(kend, device=q.device).unsqueeze(0)
            sc = sc.masked_fill(j > i + n_past, float("-inf"))
        outs.append(torch.matmul(torch.softmax(sc, dim=-1), vf[:, :, :, :kend]))
    o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=3)  # [b, KV, g, n, D]
    return o.permute(0, 3, 1, 2, 4).reshape(b, n, H, D).to(q.dtype)


class ContiguousCache(KVCache):
    """Keys and values kept whole in growing tensors, nothing evicted: the reference."""

    def __init__(self):
        self.k = {}
        self.v = {}
        self.length = 0

    def append(self, layer, k, v, q):
        if layer in self.k:
            self.k[layer] = torch.cat([self.k[layer], k], dim=1)
            self.v[layer] = torch.cat([self.v[layer], v], dim=1)
        else:
            self.k[layer], self.v[layer] = k, v

    def attend(self, layer, q):
        k, v = self.k[layer], self.v[layer]
        return attention(q, k, v, k.shape[1] - q.shape[1])

    def step_done(self, n_new):
        self.length += n_new


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope_cos_sin(positions, head_dim, theta, dtype):
    """cos, sin [b, n, 1, head_dim] for absolute positions [b, n] (HF rotate_half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = positions.float().unsqueeze(-1) * inv_freq.to(positions.device)
    emb = torch.cat([freqs, freqs], dim=-1).unsqueeze(2)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        H, KV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.H, self.KV, self.D = H, KV, D
        self.q_proj = nn.Linear(cfg.hidden_size, H * D, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, KV * D, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, KV * D, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(H * D, cfg.hidden_size, bias=False)
        if cfg.model_type == "qwen3":
            self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(D, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, cos, sin, cache: KVCache, layer: int):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.H, self.D)
        k = self.k_proj(x).view(b, n, self.KV, self.D)
        v = self.v_proj(x).view(b, n, self.KV, self.D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        cache.append(layer, k, v, q)
        o = cache.attend(layer, q)
        return self.o_proj(o.reshape(b, n, self.H * self.D))


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache, layer):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Model(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def init_weights(self, std=0.02):
        """Normal(0, std) weights, residual output projections scaled by depth, norms at 1."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=std / math.sqrt(2 * self.config.num_hidden_layers))
            else:
                nn.init.normal_(p, std=std)

    def forward(self, tokens, positions, cache: KVCache):
        """tokens, positions [b, n] int64 -> logits [b, n, vocab] float32."""
        m = self.model
        h = m.embed_tokens(tokens)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, h.dtype)
        for i, layer in enumerate(m.layers):
            h = layer(h, cos, sin, cache, i)
        h = m.norm(h)
        w = m.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        cache.step_done(tokens.shape[1])
        return F.linear(h, w).float()

    def save(self, directory, dtype=torch.float32):
        """Writes config.json and model.safetensors (tensors in dtype) to directory."""
        os.makedirs(directory, exist_ok=True)
        d = self.config.to_dict()
        d["torch_dtype"] = {torch.float32: "float32", torch.bfloat16: "bfloat16",
                            torch.float16: "float16"}[dtype]
        tmp = os.path.join(directory, f"config.json.tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(d, f, indent=2)
            f.write("\n")
        os.replace(tmp, os.path.join(directory, "config.json"))
        sd = {k: v.to(dtype) for k, v in self.state_dict().items()}
        safetensors.save_file(sd, os.path.join(directory, "model.safetensors"), {"format": "pt"})

    @classmethod
    def load(cls, directory, dtype=torch.float32):
        """Builds the model of directory/config.json with the weights of its *.safetensors."""
        cfg = Config.from_json(os.path.join(directory, "config.json"))
        model = cls(cfg)
        sd = {}
        for name in sorted(os.listdir(directory)):
            if name.endswith(".safetensors"):
                sd.update(safetensors.load_file(os.path.join(directory, name)))
        sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}
        if cfg.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        own = model.state_dict()
        missing = sorted(set(own) - set(sd))
        unexpected = sorted(set(sd) - set(own))
        if missing or unexpected:
            raise ValueError(f"weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ValueError(f"{k}: shape {tuple(v.shape)}, config wants {tuple(own[k].shape)}")
        model.load_state_dict({k: v.to(dtype) for k, v in sd.items()})
        return model.to(dtype)


@torch.no_grad()
def score(model, tokens, cache_factory=ContiguousCache, chunk=None):
    """Logits [b, T, vocab] for tokens [b, T] (or [T]): the first `chunk` tokens in one
    forward, then one token per forward, all through one cache from cache_factory()."""
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    b, T = tokens.shape
    chunk = T if chunk is None else max(1, min(chunk, T))
    cache = cache_factory()
    pos = torch.arange(T, dtype=torch.int64).unsqueeze(0).expand(b, T)
    out = [model(tokens[:, :chunk], pos[:, :chunk], cache)]
    for t in range(chunk, T):
        out.append(model(tokens[:, t : t + 1], pos[:, t : t + 1], cache))
    return torch.cat(out, dim=1)


def nll_per_token(logits, tokens):
    """Mean negative log-likelihood (nats) of tokens[:, 1:] under logits[:, :-1]."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).item()


@torch.no_grad()
def generate(model, prompt, n, cache_factory=ContiguousCache, temperature=0.0, seed=0, eos_id=None):
    """Continues prompt [T] by up to n tokens (greedy at temperature 0); returns the new ids."""
    gen = torch.Generator().manual_seed(seed)
    cache = cache_factory()
    T = prompt.shape[0]
    logits = model(prompt.view(1, T), torch.arange(T).view(1, T), cache)[0, -1]
    out = []
    for i in range(n):
        if temperature > 0:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen).item()
        else:
            nxt = int(logits.argmax())
        out.append(nxt)
        if nxt == eos_id:
            break
        logits = model(torch.tensor([[nxt]]), torch.tensor([[T + i]]), cache)[0, -1]
    return out
