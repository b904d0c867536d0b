/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The daemon's start-up stages and their teardown: incarnation, signals, the runtime directory
 * and its sockets, access lists, arenas, registry, evictor, timer.
 */

struct vased;

/* Runs the start-up stages in order on d (initialised by vased_run(): fds -1, config in place),
 * stopping at the first that fails. 0, or -errno (logged); either way vase_setup_teardown()
 * releases whatever was set up. */
int vase_setup_start(struct vased *d);

/* Releases everything the stages set up, in reverse order, arenas last; safe after a partial
 * start. The configuration is released too. */
void vase_setup_teardown(struct vased *d);
