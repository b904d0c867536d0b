/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The daemon's half of the eviction cycle (docs/ARCHITECTURE.md, "The eviction cycle"),
 * mirroring lib/cycle.c: an EvictRequest becomes a plan run for the evictor, a finished run
 * becomes an EvictPlan, an EvictCommit compacts the sequence's statistics and releases its
 * surplus pages; AttnStats feed the statistics the plans read.
 */

#include "vase.pb-c.h"

struct vased;
struct vased_client;
struct vase_plan_run;
struct vase_reply_to;

/* Answers EvictRequest, EvictCommit or AttnStats e of client c, whose session control.c has
 * checked. Replies itself (AttnStats only when refused); 0 or the -code of the Error sent. */
int vase_cycle_handle(struct vased *d, struct vased_client *c, const struct vase_reply_to *to,
                      const Vase__Envelope *e);

/* Handles a run the evictor finished: EvictPlan or Error to the client that asked, or, for a
 * sequence that closed meanwhile, frees it and its pages. Takes the run over. */
void vase_cycle_plan_done(struct vased *d, struct vase_plan_run *run);
