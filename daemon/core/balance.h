/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Elastic budgets, the arithmetic (elastic.h is the daemon's use of it): given the sequences of
 * one arena and the bytes waiting opens need beyond what is free, the budget each sequence should
 * keep after its next eviction. A sequence releases, at the commit of a plan for budget t, every
 * KV page beyond the steady state of t, ceil((t + window + slack) / block_tokens) pages; the
 * targets are chosen so that those releases add up to the deficit, with no target below the
 * sequence's min_budget or above its cap, and the losses shared as the policy says:
 *
 *   proportional: the targets are t_i = clamp(window_i * floor(x * weight_i * max_i /
 *                 window_i), min_i, cap_i) for the highest level x in [0, 1] that releases
 *                 enough: every elastic sequence keeps the same fraction x of its budget, times
 *                 its weight (water-filling);
 *   priority:     the weights in increasing order: the sequences of the lowest weight give
 *                 everything down to their minimums first, those of the next weight only if that
 *                 was not enough, and within one weight, proportionally.
 *
 * Pure functions of their arguments: no daemon state, no allocation.
 */

#include <stddef.h>
#include <stdint.h>

#define VASE_MAX_WEIGHT 1000u

enum vase_elastic_policy {
    VASE_ELASTIC_PROPORTIONAL,
    VASE_ELASTIC_PRIORITY,
    _VASE_ELASTIC_POLICY_MAX,
};

/* "proportional", "priority"; NULL for anything else. */
const char *vase_elastic_policy_to_string(int policy);
/* The policy named, or -EINVAL. */
int vase_elastic_policy_from_string(const char *s);

/* One sequence as the balancer sees it. */
struct vase_balance_seq {
    uint32_t min, cap, max; /* min_budget <= cap <= max_budget */
    uint32_t window, slack, block_tokens, weight;
    uint32_t n_pages;    /* KV pages it holds now */
    uint64_t page_bytes; /* bytes of one */
    uint32_t target;     /* out: the budget its next plan should keep */
};

/* Bytes s releases at the commit of a plan for budget t. */
uint64_t vase_balance_release(const struct vase_balance_seq *s, uint32_t t);

/*
 * Sets every seqs[i].target. deficit 0: all at their cap (returns 0). Else the policy's targets
 * that release at least deficit bytes in all (returns 1); when even every sequence at its
 * minimum would not release deficit, all stay at their cap and -ENOSPC is returned: a room
 * that cannot be made is not made at anyone's expense.
 */
int vase_balance(struct vase_balance_seq *seqs, size_t n, uint64_t deficit,
                 enum vase_elastic_policy policy);
