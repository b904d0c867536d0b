/* SPDX-License-Identifier: MIT */

/*
 * vased's entry point: parse the command line, load the configuration (defaults, file, flags),
 * run the daemon. Everything else lives in the other files of daemon/.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "vased.h"

int main(int argc, char **argv) {
    struct vase_cmdline cmd = {0};
    struct vase_config cfg = {0};
    int r;

    /* journald (and any non-terminal) reads the <N> priority prefixes. */
    vase_log_set_prefix(!isatty(STDERR_FILENO));

    r = vase_cmdline_parse(argc, argv, &cmd);
    if (r < 0)
        return EXIT_FAILURE;
    if (r > 0) {
        if (cmd.help)
            vase_config_help(stdout, program_invocation_short_name);
        else if (cmd.version)
            printf("vased %s\n", VASED_VERSION);
        else if (vase_config_init(&cfg) < 0 || vase_config_dump(&cfg, stdout) < 0)
            r = -EIO;
        vase_config_done(&cfg);
        vase_cmdline_done(&cmd);
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
    }

    r = vase_config_load(&cfg, &cmd);
    if (r >= 0)
        r = vased_run(&cfg, &cmd);
    vase_config_done(&cfg);
    vase_cmdline_done(&cmd);
    return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
