/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The daemon's life: run() starts it in stages (setup.c: runtime directory, arenas, sockets,
 * evictor), each with its own unwind, then runs the main loop until SIGTERM/SIGINT, then shuts
 * down in reverse. The loop calls down into the other modules; nothing calls back into it.
 */

#include "config/config.h"
#include "state.h"

/* The exit status after a sticky CUDA error (EX_SOFTWARE of sysexits.h). */
#define VASED_EXIT_DEVICE_LOST 70

/* Runs the daemon with a loaded configuration until it is told to stop. Returns 0 after a
 * clean shutdown, -errno if start-up failed (logged), -ENOTRECOVERABLE if it stopped because
 * its CUDA context on a device was lost (a sticky error: only a new process can use the GPU). */
int vased_run(struct vase_config *cfg, const struct vase_cmdline *cmdline);
/* The process's exit status for what vased_run() (or start-up before it) returned:
 * VASED_EXIT_DEVICE_LOST for -ENOTRECOVERABLE, EXIT_FAILURE for another -errno, else 0. */
int vased_exit_status(int r);
