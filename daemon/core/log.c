/* SPDX-License-Identifier: MIT */

/*
 * Logging to stderr: with syslog priority prefixes when stderr is journald's stream (which
 * stamps the time itself), with the local time to the millisecond and the level word anywhere
 * else, "2026-12-02 02:48:01.123 warning: message". Messages above the maximum level are
 * dropped before they are formatted; the errno of the caller is preserved, so logging never
 * changes the error a caller is about to return. Lines are written with one write(2)-sized
 * fprintf each, so the evictor threads and the main thread do not interleave within a line.
 * A line never carries a control character: whatever a message quotes (a client's name, a
 * setting's value, an error text a peer sent) is escaped as \xNN, so no peer can end a line
 * and forge another, priority prefix included, or send escape sequences to a terminal.
 */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "wire.h"

static int log_max_level = LOG_INFO;
static bool log_journal = false;

static const char *const level_names[] = {
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
};

void vase_log_set_max_level(int level) {
    if (level < LOG_EMERG)
        level = LOG_EMERG;
    if (level > LOG_DEBUG)
        level = LOG_DEBUG;
    log_max_level = level;
}

int vase_log_get_max_level(void) {
    return log_max_level;
}

void vase_log_set_journal(bool on) {
    log_journal = on;
}

/* A decimal number ending at stop; NULL when s does not start with one. */
static const char *parse_u64(const char *s, char stop, unsigned long long *ret) {
    char *end;
    if (*s < '0' || *s > '9')
        return NULL;
    errno = 0;
    *ret = strtoull(s, &end, 10);
    if (errno != 0 || *end != stop)
        return NULL;
    return end;
}

bool vase_log_is_journal_stream(const char *journal_stream, int fd) {
    unsigned long long dev, ino;
    struct stat st;
    int saved = errno;
    bool r = false;

    if (journal_stream) {
        const char *colon = parse_u64(journal_stream, ':', &dev);
        r = colon && parse_u64(colon + 1, '\0', &ino) && fstat(fd, &st) == 0 &&
            (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
    }
    errno = saved;
    return r;
}

/* "2026-12-02 02:48:01.123", local time; empty if the clock cannot be read. */
static void format_time(char *buf, size_t size) {
    struct timespec ts;
    struct tm tm;
    char secs[32];

    buf[0] = '\0';
    if (clock_gettime(CLOCK_REALTIME, &ts) < 0 || !localtime_r(&ts.tv_sec, &tm) ||
        strftime(secs, sizeof(secs), "%Y-%m-%d %H:%M:%S", &tm) == 0)
        return;
    snprintf(buf, size, "%s.%03ld", secs, ts.tv_nsec / 1000000);
}

int vase_log_level_from_string(const char *s) {
    if (!s)
        return -EINVAL;
    for (int i = 0; i <= LOG_DEBUG; i++)
        if (strcmp(s, level_names[i]) == 0)
            return i;
    if (strcmp(s, "error") == 0)
        return LOG_ERR;
    if (s[0] >= '0' && s[0] <= '7' && s[1] == '\0')
        return s[0] - '0';
    return -EINVAL;
}

const char *vase_log_level_to_string(int level) {
    if (level < LOG_EMERG || level > LOG_DEBUG)
        return NULL;
    return level_names[level];
}

int vase_log_internal(int level, int error, const char *fmt, ...) {
    int saved = errno;
    int e = error < 0 ? -error : error;

    if (level <= log_max_level) {
        char line[2048], clean[2048];
        va_list ap;
        /* %m in fmt prints strerror(errno): make it the error we were given. */
        errno = e;
        va_start(ap, fmt);
        vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        vase_wire_escape(line, clean, sizeof(clean));
        if (log_journal) {
            fprintf(stderr, "<%d>%s\n", level, clean);
        } else {
            const char *name = vase_log_level_to_string(level);
            char when[48];
            format_time(when, sizeof(when));
            fprintf(stderr, "%s %s: %s\n", when, name ? name : "log", clean);
        }
    }
    errno = saved;
    return -e;
}

bool vase_ratelimit_pass(struct vase_ratelimit *rl, double now, unsigned *ret_suppressed) {
    *ret_suppressed = 0;
    if (rl->begin == 0.0 || now - rl->begin >= rl->interval) {
        /* A new interval: report what the last one held back. */
        *ret_suppressed = rl->suppressed;
        rl->begin = now;
        rl->passed = 0;
        rl->suppressed = 0;
    }
    if (rl->passed < rl->burst) {
        rl->passed++;
        return true;
    }
    rl->suppressed++;
    return false;
}

unsigned vase_ratelimit_flush(struct vase_ratelimit *rl, double now) {
    if (rl->suppressed == 0 || now - rl->begin < rl->interval)
        return 0;
    unsigned n = rl->suppressed;
    rl->begin = 0.0; /* the next line starts an interval of its own */
    rl->passed = 0;
    rl->suppressed = 0;
    return n;
}
