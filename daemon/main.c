/* SPDX-License-Identifier: MIT */

/*
 * vased's entry point: parse the command line, load the configuration (defaults, file, flags),
 * check that the host arenas fit in this machine's memory, run the daemon. Everything else
 * lives in the other files of daemon/.
 */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "config/config.h"
#include "core/log.h"
#include "vased.h"

/* Refuses host arenas larger than the machine's memory and warns above 3/4 of it: a memfd
 * arena is only backed as it is touched, so an oversized one would start fine and fail much
 * later, taking other processes down with it. */
static int check_memory(const struct vase_config *cfg) {
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_size <= 0) {
        log_warning("Cannot tell this machine's memory size; host arenas are not checked "
                    "against it.");
        return 0;
    }
    uint64_t phys = (uint64_t)pages * (uint64_t)page_size;
    double need_gib = (double)vase_config_host_arena_bytes(cfg) / (1u << 30),
           phys_gib = (double)phys / (1u << 30);

    int r = vase_config_check_memory(cfg, phys);
    if (r == -ERANGE)
        return log_error_errno(r,
                               "Host arenas (arena=host) take %.1f GiB in all, more than the "
                               "%.1f GiB of memory of this machine; lower arena_bytes.",
                               need_gib, phys_gib);
    if (r < 0)
        return log_error_errno(r, "Cannot check the host arenas against memory: %m");
    if (r > 0)
        log_warning("Host arenas (arena=host) take %.1f GiB in all, more than 3/4 of the %.1f "
                    "GiB of memory of this machine; the rest of the system may run short.",
                    need_gib, phys_gib);
    return 0;
}

int main(int argc, char **argv) {
    struct vase_cmdline cmd = {0};
    struct vase_config cfg = {0};
    int r;

    /* journald reads <N> priority prefixes and stamps the time; elsewhere the logger does. */
    vase_log_set_journal(vase_log_is_journal_stream(getenv("JOURNAL_STREAM"), STDERR_FILENO));

    r = vase_cmdline_parse(argc, argv, &cmd);
    if (r < 0)
        return EXIT_FAILURE;
    if (cmd.help)
        vase_config_help(stdout, program_invocation_short_name);
    else if (cmd.version)
        printf("vased %s\n", VASED_VERSION);
    else {
        r = vase_config_load(&cfg, &cmd);
        /* A dump is the configuration in effect, which may be meant for another machine. */
        if (r >= 0 && cmd.dump_config && vase_config_dump(&cfg, stdout) < 0)
            r = log_error_errno(-EIO, "Failed to write the configuration: %m");
        else if (r >= 0 && !cmd.dump_config && (r = check_memory(&cfg)) >= 0)
            r = vased_run(&cfg, &cmd);
    }
    vase_config_done(&cfg);
    vase_cmdline_done(&cmd);
    return vased_exit_status(r);
}
