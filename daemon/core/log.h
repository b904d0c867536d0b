/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The daemon's logger: one line per message on stderr. When stderr is journald's stream, each
 * line starts with "<N>" (the syslog priority) so that journald files it at the right level and
 * adds the time itself; anywhere else (a terminal, a file, a pipe) it starts with the local time
 * and the level, "2026-12-02 02:48:01.123 info: ". The logger is the one piece of process-wide
 * state besides the arg_* values of main.c.
 */

#include <errno.h>
#include <stdbool.h>
#include <syslog.h>

/* Sets the most verbose priority logged (LOG_EMERG .. LOG_DEBUG). */
void vase_log_set_max_level(int level);
int vase_log_get_max_level(void);
/* Parses "emerg" .. "debug" (or "0" .. "7"). Returns the priority, or -EINVAL. */
int vase_log_level_from_string(const char *s);
/* "emerg" .. "debug"; NULL outside 0..7. */
const char *vase_log_level_to_string(int level);
/* true: "<N>" priority prefixes (for journald); false (the default): a timestamp and the level. */
void vase_log_set_journal(bool on);
/*
 * Whether fd is the stream journald reads: systemd sets JOURNAL_STREAM="DEVICE:INODE" for a
 * service whose stderr goes to the journal, and only an fd whose fstat() has that device and
 * inode is that stream (the variable is inherited by children whose stderr may point elsewhere).
 * journal_stream is the variable's value, NULL when unset. false on any mismatch or malformed
 * value.
 */
bool vase_log_is_journal_stream(const char *journal_stream, int fd);

/*
 * Logs fmt at level. error is a negative or positive errno value or 0; when it is not 0,
 * "%m" in fmt prints its text. Returns -abs(error), so that error paths can
 * `return log_error_errno(r, ...)`.
 */
int vase_log_internal(int level, int error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * At most burst messages per interval seconds from one source; the rest are counted. A zeroed
 * struct with interval and burst set is ready to use. vase_ratelimit_pass() says whether this
 * message may be logged; when an interval ends, *ret_suppressed is how many the last one held
 * back (0 otherwise), for a one-line summary.
 */
struct vase_ratelimit {
    double interval;
    unsigned burst;
    double begin;
    unsigned passed, suppressed;
};
bool vase_ratelimit_pass(struct vase_ratelimit *rl, double now, unsigned *ret_suppressed);
/* For a timer: once the interval that held messages back has ended, returns how many it held
 * (and starts afresh), so the summary is logged even when no message follows; 0 otherwise. */
unsigned vase_ratelimit_flush(struct vase_ratelimit *rl, double now);

#define log_full_errno(level, error, ...) vase_log_internal((level), (error), __VA_ARGS__)
#define log_debug(...) vase_log_internal(LOG_DEBUG, 0, __VA_ARGS__)
#define log_info(...) vase_log_internal(LOG_INFO, 0, __VA_ARGS__)
#define log_notice(...) vase_log_internal(LOG_NOTICE, 0, __VA_ARGS__)
#define log_warning(...) vase_log_internal(LOG_WARNING, 0, __VA_ARGS__)
#define log_error(...) vase_log_internal(LOG_ERR, 0, __VA_ARGS__)
#define log_debug_errno(error, ...) vase_log_internal(LOG_DEBUG, (error), __VA_ARGS__)
#define log_info_errno(error, ...) vase_log_internal(LOG_INFO, (error), __VA_ARGS__)
#define log_warning_errno(error, ...) vase_log_internal(LOG_WARNING, (error), __VA_ARGS__)
#define log_error_errno(error, ...) vase_log_internal(LOG_ERR, (error), __VA_ARGS__)
#define log_oom() log_error_errno(-ENOMEM, "Out of memory.")
