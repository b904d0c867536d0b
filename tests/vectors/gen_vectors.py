#!/usr/bin/python3
"""Independent NumPy implementation of the eviction policies, used to make test vectors.

This is a second implementation of the algorithm of kernels/ALGORITHM.md (windowed
attention scores, value metrics, sketched leverage, R-KV redundancy, topk, the
exponential-race sample, every policy, the eviction trigger and compaction), written from its
specification alone, not from the C kernels, and computed in float32 like the reference. It
has two jobs:

  gen_vectors.py --verify DIR...   run it on shipped cases (tests/vectors/reference) and compare
                                   with their expected keep / evict_steps / final_pos; print
                                   PASS or FAIL per case, exit 1 if any fails. A DIR without
                                   params.txt is searched for case subdirectories.
  gen_vectors.py OUTDIR            write additional cases, in exactly the format of
                                   tests/vectors/FORMAT.md, with geometries and parameters
                                   the shipped ones do not cover (G = 1, G = 4, D = 32 and 128,
                                   other budgets and windows, n_sink 0 and 8, n_large >= K,
                                   temperatures 0.5 and 2, smooth 1 and 3, lambda 0.3, rank 8,
                                   long prompts, exact ties, several traces, and protected
                                   prompts: protect_prompt, which the reference does not have).

Passing --verify on every shipped case is what makes the generated cases trustworthy. The
generator is deterministic (one fixed seed per case) and guards against cases that another
correct float32 implementation could decide differently: every comparison a selection depends
on must be separated by a relative gap of at least GAP_REL, or be an exact tie built so that
it stays exact in any summation order (sink markers, exact zeros from softmax underflow,
quantized values, duplicated rows). A draw that fails the guard is replaced by the next seed.
"""

import argparse
import math
import os
import sys

import numpy as np

F32 = np.float32
GAP_REL = 5e-6  # smallest relative gap between two compared values (float32 error is ~3e-7)

# ---------------------------------------------------------------------------------------------
# Decision guard
# ---------------------------------------------------------------------------------------------


class Guard:
    """Records every selection decision whose outcome float rounding could flip.

    A pair of adjacent values in a sort is fragile when they differ by less than GAP_REL of
    their error scale, or when they are equal without the tie being one the case was built
    to contain. Verification ignores the guard; generation rejects fragile draws.
    """

    def __init__(self, allow_ties=False):
        self.allow_ties = allow_ties
        self.problems = []
        self.min_gap = math.inf

    def order(self, x, order, n, what, exact=None, scale=None):
        """x sorted descending by `order` (a full stable argsort); the first n are taken."""
        pairs = min(n, len(order) - 1)
        if pairs <= 0:
            return
        ia = order[:pairs]
        ib = order[1:pairs + 1]
        a = x[ia].astype(np.float64)
        b = x[ib].astype(np.float64)
        sc = np.abs(x).astype(np.float64) if scale is None else np.asarray(scale, np.float64)
        sa, sb = sc[ia], sc[ib]
        for p in range(pairs):
            va, vb = a[p], b[p]
            for v in (va, vb):
                if v != 0 and math.isfinite(v) and abs(v) < 1e-30:
                    self.problems.append("%s: denormal-range value %g" % (what, v))
            if va == vb:
                if math.isinf(va):
                    continue  # +inf markers (sinks) or -inf exclusions: exact by construction
                if exact is not None and exact[ia[p]] and exact[ib[p]]:
                    continue
                if self.allow_ties:
                    continue
                self.problems.append("%s: exact tie at rank %d" % (what, p))
                continue
            if math.isinf(va) or math.isinf(vb):
                continue
            rel = (va - vb) / max(sa[p], sb[p], 1e-38)
            self.min_gap = min(self.min_gap, rel)
            if rel < GAP_REL:
                self.problems.append("%s: rank %d/%d gap %.2e" % (what, p, p + 1, rel))


# ---------------------------------------------------------------------------------------------
# Primitives (ALGORITHM.md, "Selection primitives")
# ---------------------------------------------------------------------------------------------


def topk(x, n, guard=None, what="topk", exact=None, scale=None):
    """The n largest of x, descending, ties in ascending index."""
    x = np.asarray(x)
    order = np.argsort(-x, kind="stable")
    if guard is not None:
        guard.order(x, order, n, what, exact, scale)
    return order[:n].astype(np.int64)


def sample(w, n, exp_draws, exclude=None, guard=None, what="sample"):
    """Exponential race: key = w / E, topk(key, n); zero weights last in ascending index.

    Indices in `exclude` are never drawn (their key is -inf), so when fewer than n weights
    are positive the zero-weight slots that are not excluded fill in ascending order.
    """
    w = np.asarray(w, F32)
    if np.any(w < 0):
        raise ValueError("negative weight")
    key = (w / exp_draws.astype(F32)).astype(F32)
    if exclude is not None and len(exclude):
        key = key.copy()
        key[exclude] = -np.inf
        if n > len(w) - len(exclude):
            raise ValueError("not enough slots to sample")
    return topk(key, n, guard, what)


# ---------------------------------------------------------------------------------------------
# Scores (ALGORITHM.md, "Scores")
# ---------------------------------------------------------------------------------------------


def box_filter(a, width):
    """Mean over a window of `width` centred on each slot, zeros outside, always / width."""
    if width <= 1:
        return a
    half = width // 2
    n = a.shape[-1]
    padded = np.concatenate([np.zeros(half, F32), a, np.zeros(half, F32)])
    acc = np.zeros(n, F32)
    for d in range(width):
        acc = acc + padded[d:d + n]
    return (acc / F32(width)).astype(F32)


def window_attention(k, q, temperature, smooth):
    """s[g][j]: softmax over candidates per query, mean over the window, box filter, mean
    over the query heads of group g.  k [Hkv][N][D], q [Hq][W][D] -> [Hkv][N]."""
    hkv, n, d = k.shape
    hq = q.shape[0]
    group = hq // hkv
    denom = F32(math.sqrt(d) * temperature)
    s = np.zeros((hkv, n), F32)
    for g in range(hkv):
        acc = np.zeros(n, F32)
        for h in range(g * group, (g + 1) * group):
            logits = (q[h] @ k[g].T).astype(F32) / denom
            logits = logits - logits.max(axis=1, keepdims=True)
            e = np.exp(logits)
            p = e / e.sum(axis=1, keepdims=True)
            a = p.mean(axis=0, dtype=F32)
            acc = acc + box_filter(a, smooth)
        s[g] = acc / F32(group)
    return s


def value_metric(v, metric):
    """m[...][j] of rows v[..., j, :]."""
    if metric == "range":
        return (v.max(axis=-1) - v.min(axis=-1)).astype(F32)
    if metric == "l2":
        return np.sqrt((v * v).sum(axis=-1, dtype=F32)).astype(F32)
    if metric == "var":
        return v.var(axis=-1, ddof=1, dtype=F32).astype(F32)
    if metric == "absmax":
        return np.abs(v).max(axis=-1).astype(F32)
    raise ValueError("unknown metric %r" % metric)


def leverage(kg, vg, gauss, n_sink):
    """Sketched leverage c[j] = k2 v2 / sum(k2 v2) of one KV head, sinks set to 1."""
    r = gauss.shape[1]
    gm = (gauss.astype(F32) / F32(math.sqrt(r))).astype(F32)
    ks = kg @ gm
    vs = vg @ gm
    k2 = (ks * ks).sum(axis=1, dtype=F32)
    v2 = (vs * vs).sum(axis=1, dtype=F32)
    prod = k2 * v2
    c = (prod / prod.sum(dtype=F32)).astype(F32)
    c[:n_sink] = F32(1.0)
    return c


def redundancy(kg):
    """R-KV red[j] = softmax_j(mean_i C[i, j]), C the key cosine similarity, zero diagonal."""
    norm = np.sqrt((kg * kg).sum(axis=1, dtype=F32))
    kn = kg / (norm[:, None] + F32(1e-8))
    c = (kn @ kn.T).astype(F32)
    np.fill_diagonal(c, F32(0))
    mean = c.mean(axis=0, dtype=F32)
    e = np.exp(mean - mean.max())
    return (e / e.sum(dtype=F32)).astype(F32)


# ---------------------------------------------------------------------------------------------
# Policies (ALGORITHM.md, "Policies"), by the reference's mode name
# ---------------------------------------------------------------------------------------------

SAMPLING_MODES = {"range_sink_sample_attn", "l2_sink_sample_attn", "var_sink_sample_attn",
                  "absmax_sink_sample_attn", "range_sample_attn", "attn_sample", "random"}
GAUSS_MODES = {"cur_resample_gauss", "cur_fixed_gauss"}
ATTN_MODES = {"range_sink_sample_attn", "l2_sink_sample_attn", "var_sink_sample_attn",
              "absmax_sink_sample_attn", "range_sample_attn", "range_attn", "attn",
              "attn_sample", "attn_rkv"}
ALL_MODES = ATTN_MODES | GAUSS_MODES | {"evict_large_range", "streaming", "random"}


def large_then_sample(m, s, e, n_sink, n_large, kk, sink_rule, guard, what, prompt=0):
    """VaSE-AttnV and its ablations: P = topk(m', n_large); s[P] = 0; P ++ sample(s, K - |P|),
    both picks among the candidates after the protected prompt [0, prompt)."""
    mp = excluded(m, prompt)
    if sink_rule and n_sink > prompt:
        mp[prompt:n_sink] = np.inf
    if n_large >= kk:
        return topk(mp, kk, guard, what + " m'")
    p = topk(mp, n_large, guard, what + " m'")
    w = s.copy()
    w[p] = F32(0)
    rest = sample(w, kk - n_large, e, exclude=np.concatenate([np.arange(prompt), p]).astype(int),
                  guard=guard, what=what + " sample")
    return np.concatenate([p, rest])


def excluded(x, prompt):
    """x with the protected prompt [0, prompt) at -inf: ranked after every candidate."""
    x = np.array(x, F32)
    x[:prompt] = -np.inf
    return x


def protected(prm):
    """The protected prompt: the first `prompt` candidates when protect_prompt is set."""
    return prm["prompt"] if prm.get("protect_prompt") else 0


def plan(mode, prm, k, v, q, exp_noise=None, gauss=None, guard=None):
    """keep [Hkv][K] for one eviction over candidates k, v [Hkv][N][D], queries q [Hq][W][D].

    With protect_prompt the plan is the prompt [0, P) in slot order, then the policy's K - P
    picks among the other candidates (the scores are still computed over all N)."""
    hkv, n, _ = k.shape
    kk = prm["budget"] - prm["window"]
    if kk > n:
        raise ValueError("K=%d > N=%d" % (kk, n))
    prompt = protected(prm)
    if prompt > kk:
        raise ValueError("protected prompt %d > K=%d" % (prompt, kk))
    s = None
    if mode in ATTN_MODES:
        s = window_attention(k, q, prm["temperature"], prm["smooth_kernel"])
    keep = np.zeros((hkv, kk), np.int64)
    for g in range(hkv):
        picks = plan_head(mode, prm, g, k, v, s, exp_noise, gauss, guard, prompt)
        keep[g] = np.concatenate([np.arange(prompt), picks])
    return keep


def plan_head(mode, prm, g, k, v, s, exp_noise, gauss, guard, prompt):
    """The K - prompt picks of KV head g among the candidates after the protected prompt."""
    n = k.shape[1]
    kk = prm["budget"] - prm["window"] - prompt
    n_sink = prm["n_sink"]
    n_large = prm["n_large"]
    skip = np.arange(prompt)
    what = "%s head %d" % (mode, g)
    if mode.endswith("_sink_sample_attn"):
        metric = mode[:-len("_sink_sample_attn")]
        m = value_metric(v[g], metric)
        return large_then_sample(m, s[g], exp_noise[g], n_sink, n_large, kk, True, guard,
                                 what, prompt)
    if mode == "range_sample_attn":
        m = value_metric(v[g], "range")
        return large_then_sample(m, s[g], exp_noise[g], n_sink, n_large, kk, False, guard,
                                 what, prompt)
    if mode == "range_attn":
        m = excluded(value_metric(v[g], "range"), prompt)
        if n_large >= kk:
            return topk(m, kk, guard, what + " m")
        p = topk(m, n_large, guard, what + " m")
        sx = excluded(s[g], prompt)
        sx[p] = -np.inf
        return np.concatenate([p, topk(sx, kk - n_large, guard, what + " s")])
    if mode == "evict_large_range":
        m = value_metric(v[g], "range")
        return topk(excluded(-m, prompt), kk, guard, what)
    if mode == "attn":
        return topk(excluded(s[g], prompt), kk, guard, what)
    if mode == "attn_sample":
        return sample(s[g], kk, exp_noise[g], exclude=skip, guard=guard, what=what)
    if mode == "attn_rkv":
        lam = F32(prm["rkv_lambda"])
        red = redundancy(k[g])
        score = (lam * s[g] - (F32(1) - lam) * red).astype(F32)
        scale = lam * s[g] + (F32(1) - lam) * red
        return topk(excluded(score, prompt), kk, guard, what, scale=scale)
    if mode in GAUSS_MODES:
        c = leverage(k[g], v[g], gauss, n_sink)
        exact = np.zeros(n, bool)
        exact[:n_sink] = True
        return topk(excluded(c, prompt), kk, guard, what, exact=exact)
    if mode == "streaming":
        # The sinks, or the prompt when it is longer, then the most recent candidates.
        ns = min(max(n_sink, prompt), kk + prompt) - prompt
        return np.concatenate([np.arange(prompt, prompt + ns),
                               np.arange(n - (kk - ns), n)])
    if mode == "random":
        return sample(np.ones(n, F32), kk, exp_noise[g], exclude=skip, guard=guard, what=what)
    raise ValueError("mode %r not supported" % mode)


# ---------------------------------------------------------------------------------------------
# Traces (ALGORITHM.md, "When eviction runs" and "Compaction")
# ---------------------------------------------------------------------------------------------


def run_trace(mode, prm, k_stream, v_stream, q_stream, draw_exp, draw_gauss, guard=None):
    """Prefill `prompt` tokens, decode the rest, evict on the trigger rule, compact.

    draw_exp(round, n) -> [Hkv][n] and draw_gauss(round) -> [D][r] supply the draws.
    Returns (evict_steps, final_pos [Hkv][len]).
    """
    total, hkv, _ = k_stream.shape
    budget, window = prm["budget"], prm["window"]
    prompt = prm["prompt"]
    pos = [list(range(prompt)) for _ in range(hkv)]  # token index held by each slot
    steps = []
    fixed_gauss = None
    for t in range(prompt, total):
        for g in range(hkv):
            pos[g].append(t)
        length = len(pos[0])
        if not (length > budget and length % window == 0):
            continue
        rnd = len(steps)
        n = length - window
        idx = np.array([p[:n] for p in pos])  # [Hkv][N] token of each candidate slot
        k = np.stack([k_stream[idx[g], g] for g in range(hkv)])
        v = np.stack([v_stream[idx[g], g] for g in range(hkv)])
        q = np.ascontiguousarray(q_stream[t - window + 1:t + 1].transpose(1, 0, 2))
        e = draw_exp(rnd, n) if mode in SAMPLING_MODES else None
        gs = None
        if mode == "cur_resample_gauss":
            gs = draw_gauss(rnd)
        elif mode == "cur_fixed_gauss":
            if fixed_gauss is None:
                fixed_gauss = draw_gauss(0)
            gs = fixed_gauss
        keep = plan(mode, prm, k, v, q, e, gs, guard)
        for g in range(hkv):
            old = pos[g]
            pos[g] = [old[j] for j in keep[g]] + old[n:]
        steps.append(t)
    return np.array(steps, np.int32), np.array(pos, np.int32)


# ---------------------------------------------------------------------------------------------
# Case files
# ---------------------------------------------------------------------------------------------

INT_KEYS = ("Hq", "Hkv", "D", "budget", "window", "cur_len", "prompt", "steps", "n_large",
            "n_sink", "smooth_kernel", "sketch_rank", "protect_prompt")
FLOAT_KEYS = ("temperature", "rkv_lambda")


def read_params(case_dir):
    prm = {}
    with open(os.path.join(case_dir, "params.txt")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, val = line.partition("=")
            key, val = key.strip(), val.strip()
            if key in INT_KEYS:
                prm[key] = int(val)
            elif key in FLOAT_KEYS:
                prm[key] = float(val)
            else:
                prm[key] = val
    return prm


def load(case_dir, name):
    return np.load(os.path.join(case_dir, name + ".npy"))


def verify_case(case_dir):
    """Returns (ok, message)."""
    prm = read_params(case_dir)
    mode = prm["mode"]
    if "cur_len" in prm:
        k, v, q = load(case_dir, "k"), load(case_dir, "v"), load(case_dir, "q")
        e = load(case_dir, "exp_noise") if mode in SAMPLING_MODES else None
        gs = load(case_dir, "gauss") if mode in GAUSS_MODES else None
        guard = Guard()
        got = plan(mode, prm, k, v, q, e, gs, guard)
        want = load(case_dir, "keep")
        if got.shape != want.shape:
            return False, "keep shape %s, expected %s" % (got.shape, want.shape)
        bad = np.argwhere(got != want)
        if len(bad):
            g, i = bad[0]
            return False, "%d of %d keep entries differ; first at head %d rank %d: %d vs %d" % (
                len(bad), want.size, g, i, got[g, i], want[g, i])
        return True, "keep %s matches (min gap %.1e)" % (want.shape, guard.min_gap)
    ks, vs, qs = load(case_dir, "k_stream"), load(case_dir, "v_stream"), load(case_dir, "q_stream")

    def draw_exp(rnd, n):
        e = load(case_dir, "exp_noise_%03d" % rnd)
        if e.shape[1] != n:
            raise ValueError("exp_noise_%03d has %d columns, round has N=%d" % (rnd, e.shape[1], n))
        return e

    guard = Guard()
    steps, final = run_trace(mode, prm, ks, vs, qs, draw_exp,
                             lambda rnd: load(case_dir, "gauss_%03d" % rnd), guard)
    want_steps, want_final = load(case_dir, "evict_steps"), load(case_dir, "final_pos")
    if not np.array_equal(steps, want_steps):
        return False, "evict_steps %s, expected %s" % (steps.tolist(), want_steps.tolist())
    if final.shape != want_final.shape:
        return False, "final_pos shape %s, expected %s" % (final.shape, want_final.shape)
    bad = np.argwhere(final != want_final)
    if len(bad):
        return False, "%d of %d final_pos entries differ; first at head %d slot %d" % (
            len(bad), want_final.size, bad[0][0], bad[0][1])
    return True, "%d evictions, final_pos %s match (min gap %.1e)" % (
        len(steps), final.shape, guard.min_gap)


def case_dirs(paths):
    out = []
    for p in paths:
        if os.path.isfile(os.path.join(p, "params.txt")):
            out.append(p)
        elif os.path.isdir(p):
            out += sorted(os.path.join(p, d) for d in os.listdir(p)
                          if os.path.isfile(os.path.join(p, d, "params.txt")))
        else:
            out.append(p)  # reported as a failure below
    return out


def cmd_verify(paths):
    failed = 0
    dirs = case_dirs(paths)
    if not dirs:
        print("no cases found", file=sys.stderr)
        return 1
    for d in dirs:
        name = os.path.basename(os.path.normpath(d))
        try:
            ok, msg = verify_case(d)
        except Exception as exc:  # a malformed case is a failure, not a crash
            ok, msg = False, "%s: %s" % (type(exc).__name__, exc)
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, msg))
        failed += not ok
    print("%d of %d cases passed" % (len(dirs) - failed, len(dirs)))
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

PARAM_ORDER = ("mode", "Hq", "Hkv", "D", "budget", "window", "cur_len", "prompt", "steps",
               "n_large", "n_sink", "temperature", "rkv_lambda", "smooth_kernel", "sketch_rank",
               "protect_prompt")
DEFAULTS = dict(Hq=8, Hkv=2, D=64, budget=256, window=64, n_large=64, n_sink=4,
                temperature=1.0, rkv_lambda=0.5, smooth_kernel=5, sketch_rank=20)


def write_params(case_dir, prm):
    with open(os.path.join(case_dir, "params.txt"), "w") as f:
        for key in PARAM_ORDER:
            if key in prm:
                val = prm[key]
                f.write("%s=%s\n" % (key, repr(float(val)) if key in FLOAT_KEYS else val))


def save(case_dir, name, arr, dtype):
    arr = np.ascontiguousarray(arr, dtype=dtype)
    assert arr.dtype.str in ("<f4", "<i4")
    np.save(os.path.join(case_dir, name + ".npy"), arr, allow_pickle=False)


def exp_draws(rng, shape):
    """Exp(1) = -log(u), u in (0, 1]; never exactly 0, so keys stay finite."""
    u = 1.0 - rng.random(shape)  # (0, 1]
    return np.maximum(-np.log(u), 1e-6).astype(F32)


def value_rows(rng, shape, big_frac=0.035):
    """Normal value rows; about big_frac of the tokens get 1-3 channels of magnitude 8-45,
    the few abnormally large value vectors of real models (and of the shipped vectors)."""
    v = rng.standard_normal(shape).astype(F32)
    flat = v.reshape(-1, shape[-1])
    big = np.flatnonzero(rng.random(flat.shape[0]) < big_frac)
    for row in big:
        ch = rng.choice(shape[-1], size=rng.integers(1, 4), replace=False)
        flat[row, ch] = (rng.uniform(8, 45, size=len(ch)) * rng.choice([-1, 1], size=len(ch)))
    return v


def quantize(x, step):
    return (np.round(x / step) * step).astype(F32)


def make_single(rng, prm, variant):
    """Inputs of one eviction: dict of arrays (without keep)."""
    hq, hkv, d, w = prm["Hq"], prm["Hkv"], prm["D"], prm["window"]
    n = prm["cur_len"] - w
    k = rng.standard_normal((hkv, n, d)).astype(F32)
    q = rng.standard_normal((hq, w, d)).astype(F32)
    v = value_rows(rng, (hkv, n, d))
    if variant in ("hot", "hot_qv"):
        # Exact ties from the attention side: channel 0 makes a sparse set of "hot" keys
        # dominate; every other key's logit is >= 110 below the maximum, so its probability
        # underflows to exactly 0 in any float32 implementation. Q and K lie on a 1/8 grid so
        # every q.k is exact in any summation order. With smooth 5 the four neighbours of an
        # isolated hot key get exactly a[j] / 5 (ties); hot keys are >= 6 apart so that no
        # box window holds two of them and a sliding-sum filter gives the same exact values.
        # With smooth 1 only the hot keys are positive and sampling must fill with zeros.
        q = quantize(q, 0.125)
        k = quantize(k, 0.125)
        q[:, :, 0] = 32.0
        n_hot = prm.pop("_n_hot")
        for g in range(hkv):
            # n_hot sorted distinct draws from a shortened range, spread by 5 per rank:
            # consecutive hot keys end up at least 6 slots apart.
            base = np.sort(rng.choice(n - 5 * (n_hot - 1), size=n_hot, replace=False))
            hot = base + 5 * np.arange(n_hot)
            k[g, :, 0] = -32.0
            k[g, hot, 0] = 32.0
        if variant == "hot_qv":
            v = quantize(v, 0.5)  # half-integers: many exactly equal ranges
    elif variant == "qv":
        v = quantize(v, 0.5)
    elif variant == "dup_v":
        # Identical value rows at several slots: exact metric ties among large tokens.
        for g in range(hkv):
            m = value_metric(v[g], "range")
            src = np.argsort(-m, kind="stable")[:6]
            for j in src:
                for dst in rng.choice(n, size=2, replace=False):
                    if dst != j:
                        v[g, dst] = v[g, j]
    arrs = dict(k=k, v=v, q=q)
    if prm["mode"] in SAMPLING_MODES:
        arrs["exp_noise"] = exp_draws(rng, (hkv, n))
    if prm["mode"] in GAUSS_MODES:
        arrs["gauss"] = rng.standard_normal((d, prm["sketch_rank"])).astype(F32)
    return arrs


def check_underflow(arrs, prm):
    """For the hot/cold cases: cold logits must sit >= 110 below each query's maximum."""
    k, q = arrs["k"], arrs["q"]
    hkv = k.shape[0]
    group = q.shape[0] // hkv
    denom = math.sqrt(prm["D"]) * prm["temperature"]
    for g in range(hkv):
        for h in range(g * group, (g + 1) * group):
            lg = (q[h].astype(np.float64) @ k[g].T.astype(np.float64)) / denom
            gap = lg.max(axis=1, keepdims=True) - lg
            near = gap < 110
            far = gap > 40
            if not np.all(near | far):
                return False  # some logit could give a tiny denormal-range probability
            if not np.all(near == near[0]):
                return False  # hot set should be the same for every query
    return True


def gen_single(out, name, prm, seed, variant=None):
    allow_ties = variant is not None
    for attempt in range(50):
        rng = np.random.default_rng(seed + 1000 * attempt)
        p = dict(prm)
        arrs = make_single(rng, p, variant)
        if variant in ("hot", "hot_qv") and not check_underflow(arrs, p):
            continue
        guard = Guard(allow_ties)
        keep = plan(p["mode"], p, arrs["k"], arrs["v"], arrs["q"], arrs.get("exp_noise"),
                    arrs.get("gauss"), guard)
        if guard.problems:
            continue
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        write_params(d, p)
        for key, arr in arrs.items():
            save(d, key, arr, "<f4")
        save(d, "keep", keep, "<i4")
        extra = ""
        if variant in ("hot", "hot_qv"):
            ties = sum(int(np.sum(np.diff(np.sort(row)) == 0)) for row in
                       window_attention(arrs["k"], arrs["q"], p["temperature"],
                                        p["smooth_kernel"]))
            extra = " exact-tie pairs in s: %d" % ties
        print("wrote %s: mode=%s Hq=%d Hkv=%d D=%d budget=%d window=%d N=%d K=%d "
              "(seed %d, attempt %d, min gap %.1e)%s" % (
                  name, p["mode"], p["Hq"], p["Hkv"], p["D"], p["budget"], p["window"],
                  p["cur_len"] - p["window"], p["budget"] - p["window"], seed, attempt,
                  guard.min_gap, extra))
        return
    raise RuntimeError("%s: no robust draw in 50 attempts" % name)


def gen_trace(out, name, prm, seed):
    hq, hkv, d = prm["Hq"], prm["Hkv"], prm["D"]
    total = prm["prompt"] + prm["steps"]
    mode = prm["mode"]
    for attempt in range(50):
        rng = np.random.default_rng(seed + 1000 * attempt)
        ks = rng.standard_normal((total, hkv, d)).astype(F32)
        vs = value_rows(rng, (total, hkv, d))
        qs = rng.standard_normal((total, hq, d)).astype(F32)
        draws = {}

        def draw_exp(rnd, n):
            draws["exp_noise_%03d" % rnd] = exp_draws(rng, (hkv, n))
            return draws["exp_noise_%03d" % rnd]

        def draw_gauss(rnd):
            draws["gauss_%03d" % rnd] = rng.standard_normal((d, prm["sketch_rank"])).astype(F32)
            return draws["gauss_%03d" % rnd]

        guard = Guard()
        steps, final = run_trace(mode, prm, ks, vs, qs, draw_exp, draw_gauss, guard)
        if guard.problems:
            continue
        assert len(steps) > 0
        dd = os.path.join(out, name)
        os.makedirs(dd, exist_ok=True)
        write_params(dd, prm)
        save(dd, "k_stream", ks, "<f4")
        save(dd, "v_stream", vs, "<f4")
        save(dd, "q_stream", qs, "<f4")
        for key, arr in draws.items():
            save(dd, key, arr, "<f4")
        save(dd, "evict_steps", steps, "<i4")
        save(dd, "final_pos", final, "<i4")
        print("wrote %s: mode=%s Hq=%d Hkv=%d D=%d budget=%d window=%d prompt=%d steps=%d "
              "evictions at %s, final len %d (seed %d, attempt %d, min gap %.1e)" % (
                  name, mode, hq, hkv, d, prm["budget"], prm["window"], prm["prompt"],
                  prm["steps"], steps.tolist(), final.shape[1], seed, attempt, guard.min_gap))
        return
    raise RuntimeError("%s: no robust draw in 50 attempts" % name)


def P(**kw):
    prm = dict(DEFAULTS)
    prm.update(kw)
    return prm


# (name, params, variant) of every generated single case; the comment says what it adds.
SINGLES = [
    # G = 1, smaller budget and window.
    ("single_attn_g1", P(mode="attn", Hq=4, Hkv=4, budget=96, window=32, cur_len=128,
                         n_large=16), None),
    # G = 4, D = 32, 8 sinks, temperature 0.5.
    ("single_range_sink_sample_attn_g4_d32", P(mode="range_sink_sample_attn", Hq=12, Hkv=3,
                                               D=32, budget=96, window=32, cur_len=160,
                                               n_large=16, n_sink=8, temperature=0.5), None),
    # D = 128, lambda 0.3, smooth 3.
    ("single_attn_rkv_d128", P(mode="attn_rkv", Hq=8, Hkv=2, D=128, budget=128, window=32,
                               cur_len=192, rkv_lambda=0.3, smooth_kernel=3), None),
    # rank 8, no sinks, G = 2 with 3 KV heads.
    ("single_cur_resample_gauss_r8", P(mode="cur_resample_gauss", Hq=6, Hkv=3, budget=96,
                                       window=32, cur_len=160, n_sink=0, sketch_rank=8), None),
    # 8 sinks, D = 32, one KV head (G = 4).
    ("single_cur_fixed_gauss_sink8", P(mode="cur_fixed_gauss", Hq=4, Hkv=1, D=32, budget=128,
                                       window=32, cur_len=192, n_sink=8), None),
    # temperature 2, no smoothing.
    ("single_attn_sample_t2", P(mode="attn_sample", Hq=4, Hkv=2, budget=96, window=32,
                                cur_len=160, temperature=2.0, smooth_kernel=1), None),
    # n_large > K: keep = topk(m', K).
    ("single_l2_sink_sample_attn_nlarge_gt_k", P(mode="l2_sink_sample_attn", Hq=4, Hkv=2,
                                                 budget=96, window=32, cur_len=160,
                                                 n_large=80), None),
    # no sinks, smooth 3, D = 32.
    ("single_var_sink_sample_attn_nosink", P(mode="var_sink_sample_attn", Hq=8, Hkv=4, D=32,
                                             budget=128, window=64, cur_len=256, n_sink=0,
                                             n_large=12, smooth_kernel=3), None),
    # The absmax metric (kernels accept "absmax_sink_sample_attn"), temperature 2.
    ("single_absmax_sink_sample_attn", P(mode="absmax_sink_sample_attn", Hq=4, Hkv=2,
                                         budget=128, window=32, cur_len=192, n_large=24,
                                         temperature=2.0), None),
    # G = 1, temperature 0.5, few reserved slots.
    ("single_range_attn_g1_t05", P(mode="range_attn", Hq=4, Hkv=4, budget=96, window=32,
                                   cur_len=128, n_large=12, temperature=0.5), None),
    # n_large == K without the sink rule: keep = topk(m, K).
    ("single_range_sample_attn_nlarge_eq_k", P(mode="range_sample_attn", Hq=4, Hkv=2,
                                               budget=96, window=32, cur_len=192,
                                               n_large=64), None),
    ("single_range_sample_attn_d128", P(mode="range_sample_attn", Hq=8, Hkv=2, D=128,
                                        budget=128, window=32, cur_len=192, n_large=24), None),
    # D = 128, smooth 1 (m only, but the runner must ignore what it does not read).
    ("single_evict_large_range_d128", P(mode="evict_large_range", Hq=8, Hkv=2, D=128,
                                        budget=128, window=64, cur_len=256,
                                        smooth_kernel=1), None),
    ("single_streaming_sink8", P(mode="streaming", Hq=4, Hkv=2, budget=96, window=32,
                                 cur_len=224, n_sink=8), None),
    ("single_streaming_nosink", P(mode="streaming", Hq=4, Hkv=4, D=32, budget=64, window=32,
                                  cur_len=128, n_sink=0), None),
    ("single_random", P(mode="random", Hq=6, Hkv=3, D=32, budget=96, window=32,
                        cur_len=192), None),
    # Prompt much longer than budget + window: N = 512 candidates, K = 64.
    ("single_range_sink_sample_attn_longprompt_b96", P(mode="range_sink_sample_attn", Hq=4,
                                                       Hkv=2, budget=96, window=32,
                                                       cur_len=544, n_large=16), None),
    ("single_cur_resample_gauss_longprompt", P(mode="cur_resample_gauss", Hq=4, Hkv=2,
                                               budget=96, window=32, cur_len=480,
                                               sketch_rank=8), None),
    # budget 384, window 128 (default n_large = budget / 4).
    ("single_range_sink_sample_attn_b384_w128", P(mode="range_sink_sample_attn", Hq=8, Hkv=2,
                                                  budget=384, window=128, cur_len=512,
                                                  n_large=96), None),
    ("single_attn_b384_w128_t05", P(mode="attn", Hq=4, Hkv=2, budget=384, window=128,
                                    cur_len=512, n_large=96, temperature=0.5), None),
    # Exact ties, see make_single(). Smooth 5 neighbours of isolated hot keys tie in groups
    # of four; all other keys have s exactly 0 and fill K in ascending slot order.
    ("single_attn_ties", P(mode="attn", Hq=4, Hkv=2, budget=128, window=32, cur_len=160,
                           _n_hot=18), "hot"),
    # Half-integer values: ranges tie massively; keep the smallest in ascending slot order.
    ("single_evict_large_range_ties", P(mode="evict_large_range", Hq=4, Hkv=2, budget=96,
                                        window=32, cur_len=160), "qv"),
    # Ties in m at the n_large boundary, and fewer positive weights than the sample needs:
    # zeros fill in ascending slot order, never re-drawing a reserved slot.
    ("single_range_sink_sample_attn_ties", P(mode="range_sink_sample_attn", Hq=4, Hkv=2,
                                             budget=128, window=32, cur_len=160, n_large=20,
                                             smooth_kernel=1, _n_hot=10), "hot_qv"),
    ("single_attn_sample_zeros", P(mode="attn_sample", Hq=8, Hkv=2, budget=128, window=32,
                                   cur_len=160, smooth_kernel=1, _n_hot=12), "hot"),
    ("single_range_attn_ties", P(mode="range_attn", Hq=4, Hkv=2, budget=128, window=32,
                                 cur_len=160, n_large=20, _n_hot=16), "hot_qv"),
    # Duplicated large value rows: var ties inside the reserved set and at its boundary.
    ("single_var_sink_sample_attn_dups", P(mode="var_sink_sample_attn", Hq=4, Hkv=2, budget=96,
                                           window=32, cur_len=160, n_large=10, n_sink=0),
     "dup_v"),
    # Protected prompts (protect_prompt, tests/vectors/FORMAT.md): the first `prompt` candidates
    # lead the plan, the policy picks K - prompt among the rest. Random with the prompt kept.
    ("single_random_protect", P(mode="random", Hq=6, Hkv=3, D=32, budget=96, window=32,
                                cur_len=192, prompt=40, protect_prompt=1), None),
    # VaSE-AttnV with sinks past the prompt (slots 20 .. 23 keep the sink rule).
    ("single_range_sink_sample_attn_protect", P(mode="range_sink_sample_attn", Hq=8, Hkv=2,
                                                budget=128, window=32, cur_len=192, n_large=16,
                                                n_sink=24, prompt=20, protect_prompt=1), None),
    ("single_attn_protect", P(mode="attn", Hq=4, Hkv=2, budget=96, window=32, cur_len=160,
                              prompt=30, protect_prompt=1), None),
    # The prompt is the whole plan (prompt = K): only the prompt and the window stay.
    ("single_attn_rkv_protect_all", P(mode="attn_rkv", Hq=4, Hkv=2, budget=96, window=32,
                                      cur_len=160, prompt=64, protect_prompt=1), None),
    ("single_streaming_protect", P(mode="streaming", Hq=4, Hkv=2, budget=96, window=32,
                                   cur_len=224, n_sink=4, prompt=12, protect_prompt=1), None),
    ("single_cur_resample_gauss_protect", P(mode="cur_resample_gauss", Hq=4, Hkv=2,
                                            budget=96, window=32, cur_len=192, sketch_rank=8,
                                            n_sink=8, prompt=5, protect_prompt=1), None),
]

TRACES = [
    # Deterministic policy, prompt longer than the budget (first eviction at len 160, N 128).
    ("trace_attn_prompt_gt_budget", P(mode="attn", Hq=4, Hkv=2, D=32, budget=96, window=32,
                                      prompt=150, steps=200, n_large=24)),
    # Sampling policy, G = 4, 8 sinks, temperature 0.5.
    ("trace_range_sink_sample_attn_g4", P(mode="range_sink_sample_attn", Hq=12, Hkv=3, D=32,
                                          budget=128, window=32, prompt=40, steps=260,
                                          n_large=32, n_sink=8, temperature=0.5)),
    # CurDKV: one sketch for the whole trace, G = 1, rank 8; an odd number of rounds (5), so
    # a reversed sink order cannot cancel out.
    ("trace_cur_fixed_gauss_g1", P(mode="cur_fixed_gauss", Hq=4, Hkv=4, budget=96, window=32,
                                   prompt=64, steps=220, sketch_rank=8)),
    # VaSE-DKV, D = 128, no sinks, prompt longer than budget + window (first N = 384).
    ("trace_cur_resample_gauss_longprompt", P(mode="cur_resample_gauss", Hq=4, Hkv=2, D=128,
                                              budget=128, window=64, prompt=400, steps=200,
                                              n_sink=0)),
    ("trace_attn_rkv", P(mode="attn_rkv", Hq=4, Hkv=2, budget=96, window=32, prompt=32,
                         steps=220, rkv_lambda=0.3, smooth_kernel=3)),
    # Protected prompts: the prompt's tokens hold slots 0 .. prompt - 1 to the end.
    ("trace_random_protect", P(mode="random", Hq=4, Hkv=2, D=32, budget=96, window=32,
                               prompt=40, steps=220, protect_prompt=1)),
    ("trace_range_sink_sample_attn_protect", P(mode="range_sink_sample_attn", Hq=8, Hkv=2,
                                               D=32, budget=128, window=32, prompt=30,
                                               steps=240, n_large=24, protect_prompt=1)),
    ("trace_attn_protect", P(mode="attn", Hq=4, Hkv=2, D=32, budget=96, window=32, prompt=50,
                             steps=200, protect_prompt=1)),
]


def cmd_generate(out):
    os.makedirs(out, exist_ok=True)
    for i, (name, prm, variant) in enumerate(SINGLES):
        gen_single(out, name, prm, seed=1000003 + 17 * i, variant=variant)
    for i, (name, prm) in enumerate(TRACES):
        gen_trace(out, name, prm, seed=2000003 + 17 * i)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--verify", action="store_true",
                    help="verify the given case directories instead of generating")
    ap.add_argument("paths", nargs="+", metavar="DIR")
    args = ap.parse_args(argv)
    if args.verify:
        return cmd_verify(args.paths)
    if len(args.paths) != 1:
        ap.error("generation takes exactly one OUTDIR")
    return cmd_generate(args.paths[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
