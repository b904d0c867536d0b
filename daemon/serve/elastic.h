/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Elastic budgets in the daemon (PROTOCOL.md "Elastic budgets"). A sequence opened with a
 * min_budget below its budget is elastic: while opens wait for room in its arena, the daemon
 * lowers its target budget (balance.h decides by how much), its next plan keeps that budget, and
 * the commit of that plan releases the pages it no longer needs; once no open waits, targets go
 * back to each sequence's cap and a sequence below it grows at a commit, by reserving pages
 * first. Budgets only change at eviction boundaries, so between two of them every footprint is
 * static. Main thread only.
 */

#include <stdbool.h>
#include <stdint.h>

#include "vase_kernels.h"

struct vased;
struct vased_seq;

/* The budget the next plan of s keeps: its target when that is lower than its budget now. */
uint32_t vase_elastic_plan_budget(const struct vased_seq *s);

/* The commit of a plan of round `round` that kept budget: makes it the budget of s (reason
 * "make-room" or "cap", published with the old one). Nothing happens if it is the same. */
void vase_elastic_committed(struct vased *d, struct vased_seq *s, uint32_t budget, uint32_t round);

/* After that commit: grows s toward its target when no open waits in its arena and its pages
 * can be reserved (all of one step or none; several smaller steps are tried). */
void vase_elastic_grow(struct vased *d, struct vased_seq *s);

/* The engine's cap on s (SetBudget): min_budget <= cap <= max_budget, a multiple of window. */
void vase_elastic_set_cap(struct vased *d, struct vased_seq *s, uint32_t cap);

/* Sets the targets of every arena whose waiting opens or used memory changed since the last
 * call (main loop): lowered to make room for the waiting opens, or back to the caps when none
 * waits. */
void vase_elastic_rebalance(struct vased *d);

/* Bytes the live sequences will release at their next commit, and how many run below the budget
 * they opened with. */
uint64_t vase_elastic_reclaiming(const struct vased *d, uint32_t *ret_shrunk);
