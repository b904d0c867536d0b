/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * What registry.c and registry_restore.c share and nothing else uses: how a sequence is made,
 * given its state, linked, has its pages released and is freed. Main thread only.
 */

#include <stdint.h>

#include "registry.h"

/* A sequence with room for the page lists of footprint most (its largest: the ring and plan
 * pages never change) and for the window scores of the model's layers; NULL when out of
 * memory. */
struct vased_seq *vase_registry_seq_new(const struct vase_registry *reg,
                                        const struct vase_layout *l,
                                        const struct vased_seq_footprint *most);
/* The state of s as request req of a model of layout l opens it, with the pages of fp (its
 * footprint at budget, the budget its plans keep now); most is the footprint of its whole
 * budget. The one place a sequence's state is derived from its request: an open and a restore
 * both come through here. */
void vase_registry_seq_init(struct vased_seq *s, const struct vase_layout *l,
                            const struct vased_seq_request *req, uint32_t budget,
                            const struct vased_seq_footprint *most,
                            const struct vased_seq_footprint *fp);
/* Puts s on client c's list and in the id table, and counts it live. */
void vase_registry_seq_link(struct vase_registry *reg, struct vased_client *c, struct vased_seq *s);
/* Returns every page of s to alloc (uncharging client_bytes, when not NULL). Cannot fail. */
void vase_registry_seq_release_pages(struct vased_seq *s, struct vase_alloc *alloc,
                                     uint64_t *client_bytes);
/* Frees s and what it holds (its run through reg->free_run), not its pages; accepts NULL. */
void vase_registry_seq_free(const struct vase_registry *reg, struct vased_seq *s);
