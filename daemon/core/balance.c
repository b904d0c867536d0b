/* SPDX-License-Identifier: MIT */

/*
 * The targets of elastic budgets (balance.h). Both policies search a level: a sequence's target
 * falls as the level falls, and so does nothing else, so the bytes released rise as the level
 * falls and a bisection finds the highest level that releases enough. Sixty-four halvings of
 * [0, 1] resolve far below one window of any budget the kernels accept.
 */

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "balance.h"

static const char *const policy_names[_VASE_ELASTIC_POLICY_MAX] = {
    [VASE_ELASTIC_PROPORTIONAL] = "proportional",
    [VASE_ELASTIC_PRIORITY] = "priority",
};

const char *vase_elastic_policy_to_string(int policy) {
    return policy >= 0 && policy < _VASE_ELASTIC_POLICY_MAX ? policy_names[policy] : NULL;
}

int vase_elastic_policy_from_string(const char *s) {
    for (int i = 0; s && i < _VASE_ELASTIC_POLICY_MAX; i++)
        if (strcmp(s, policy_names[i]) == 0)
            return i;
    return -EINVAL;
}

uint64_t vase_balance_release(const struct vase_balance_seq *s, uint32_t t) {
    uint64_t slots = (uint64_t)t + s->window + s->slack;
    uint64_t keep = (slots + s->block_tokens - 1) / s->block_tokens;
    return keep >= s->n_pages ? 0 : (s->n_pages - keep) * s->page_bytes;
}

/* The target of s at level x (x * weight * max slots, whole windows, within [min, cap]). */
static uint32_t target_at(const struct vase_balance_seq *s, double x, uint32_t weight) {
    double want = x * weight * s->max;
    uint32_t t = want >= s->cap ? s->cap : (uint32_t)(want / s->window) * s->window;
    return t < s->min ? s->min : t > s->cap ? s->cap : t;
}

/* What choosing the targets at level x releases: sequences of weight below `level` at their
 * minimum, above it at their cap, of weight `level` at level x (weight counted as 1). level 0:
 * every sequence at level x with its own weight (proportional). Writes the targets when set. */
static uint64_t release_at(struct vase_balance_seq *seqs, size_t n, double x, uint32_t level,
                           bool set) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        struct vase_balance_seq *s = &seqs[i];
        uint32_t t;
        if (level == 0)
            t = target_at(s, x, s->weight);
        else if (s->weight < level)
            t = s->min;
        else if (s->weight > level)
            t = s->cap;
        else
            t = target_at(s, x, 1);
        total += vase_balance_release(s, t);
        if (set)
            s->target = t;
    }
    return total;
}

/* The targets at the highest level in [0, hi] that releases deficit; release_at(0) does. */
static void search(struct vase_balance_seq *seqs, size_t n, uint64_t deficit, uint32_t level,
                   double hi) {
    double lo = 0;
    if (release_at(seqs, n, hi, level, false) >= deficit) {
        release_at(seqs, n, hi, level, true);
        return;
    }
    for (int i = 0; i < 64; i++) {
        double mid = (lo + hi) / 2;
        if (release_at(seqs, n, mid, level, false) >= deficit)
            lo = mid;
        else
            hi = mid;
    }
    release_at(seqs, n, lo, level, true);
}

/* The smallest weight above `above` (0: the smallest), or 0 if none. */
static uint32_t next_weight(const struct vase_balance_seq *seqs, size_t n, uint32_t above) {
    uint32_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (seqs[i].weight > above && (w == 0 || seqs[i].weight < w))
            w = seqs[i].weight;
    return w;
}

int vase_balance(struct vase_balance_seq *seqs, size_t n, uint64_t deficit,
                 enum vase_elastic_policy policy) {
    uint64_t most = 0;
    for (size_t i = 0; i < n; i++) {
        seqs[i].target = seqs[i].cap;
        if (seqs[i].weight == 0)
            seqs[i].weight = 1;
        most += vase_balance_release(&seqs[i], seqs[i].min);
    }
    if (deficit == 0)
        return 0;
    if (most < deficit)
        return -ENOSPC;
    if (policy == VASE_ELASTIC_PROPORTIONAL) {
        /* At level 1 / weight every sequence of that weight or more is at its cap. */
        search(seqs, n, deficit, 0, 1.0);
        return 1;
    }
    for (uint32_t w = next_weight(seqs, n, 0); w; w = next_weight(seqs, n, w)) {
        /* Everything of weight w at its minimum: enough, or on to the next weight. */
        uint32_t above = next_weight(seqs, n, w);
        if (above == 0 || release_at(seqs, n, 0, w, false) >= deficit) {
            search(seqs, n, deficit, w, 1.0);
            return 1;
        }
    }
    return 1; /* not reached: the last weight always searches */
}
