/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The daemon's life: run() starts it in stages (setup.c: runtime directory, arenas, sockets,
 * evictor), each with its own unwind, then runs the main loop until SIGTERM/SIGINT, then shuts
 * down in reverse. The loop calls down into the other modules; nothing calls back into it.
 */

#include "config.h"
#include "state.h"

/* Runs the daemon with a loaded configuration until it is told to stop. Returns 0 after a
 * clean shutdown, -errno if start-up failed (logged). */
int vased_run(struct vase_config *cfg, const struct vase_cmdline *cmdline);
