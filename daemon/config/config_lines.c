/* SPDX-License-Identifier: MIT */

/*
 * INI text one line at a time, read by libinih: the one INI reader of vased, for the
 * configuration files (config_ini.c) and for the drop-in vased writes itself (config_dropin.c).
 * It hands its caller each key with its line, and the end of each line with the section that
 * line opened, if any, so that the caller can refuse a line with its number.
 *
 * The format is libinih's: lines starting with '#' or ';' are comments; "[vased]" opens the
 * daemon's section and "[arena NAME]" one more arena; "key = value" (libinih also takes
 * "key: value") sets a key of the section above it. Blanks around keys, values and names are
 * dropped, a CR before the newline too, and a ';' after a blank starts a comment. Multi-line
 * values are off: an indented line is a line like any other, not the continuation of the
 * value above it.
 *
 * An operator's slips are refused with the line they are on rather than half applied: a key
 * before any section, a key or section given twice (both lines named), a line that is none of
 * the above, text after a section's ']'. libinih stops at the first bad line. Its handler is
 * told neither line numbers nor section lines (Debian's build does not call it for a new
 * section), so the reader that hands it the text line by line counts the lines, and after each
 * one hands it two lines of its own: "=", a key whose handler call (recognised by the reader's
 * flag) reports the section libinih holds after that line, and "[\n]", a section no line of a
 * text can name, so that the next report tells whether the line in between opened a section.
 * That is how an empty section, or one given twice, is seen. libinih looks for a UTF-8 byte
 * order mark on its first line only, which is the reader's "[\n]": the reader drops the mark.
 *
 * libinih's switches are process-wide globals. They are set once, in ini_setup(); nothing else
 * in vased parses INI text, and code that does must want the same settings.
 */

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include <ini.h>

#include "config_internal.h"

/* The section the reader sets between two lines of the text. */
#define NO_SECTION "\n"

/* What libinih is handed next: the reader's "[\n]", a line of the text, the reader's "=". */
enum feed { FEED_RESET, FEED_LINE, FEED_REPORT };

/* One walk: the reader's position in the text and the handler's view of it. */
struct walk {
    const char *next; /* the rest of the text; NULL: all of it handed out */
    const char *line; /* the line libinih parses (not NUL-terminated), its length */
    size_t line_len;
    unsigned line_no; /* of line; 0 before the first */
    enum feed feed;
    bool reporting; /* the handler's next call is for the reader's "=" */
    bool too_long;  /* the reader stopped at a line longer than libinih's buffer */

    int (*take)(void *user, const struct vase_ini_line *line);
    void *user;
    int r; /* take's failure, or 0 */
};

static void ini_setup_once(void) {
    static char comment_prefixes[] = ";#", inline_comment_prefixes[] = ";";
    ini_allow_multiline = false; /* the reader's "[\n]" before each line also ends one */
    ini_allow_bom = false;       /* the reader drops it */
    ini_start_comment_prefixes = comment_prefixes;
    ini_allow_inline_comments = true;
    ini_inline_comment_prefixes = inline_comment_prefixes;
    /* One buffer of VASE_CONFIG_LINE_MAX + 1 bytes on the heap, never grown: the reader refuses
     * longer lines rather than have libinih read their rest as lines of their own. */
    ini_use_stack = false;
    ini_allow_realloc = false;
    ini_initial_alloc = VASE_CONFIG_LINE_MAX + 1;
    ini_max_line = VASE_CONFIG_LINE_MAX + 1;
    ini_stop_on_first_error = true;
    ini_allow_no_value = false;
}

static void ini_setup(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, ini_setup_once);
}

/* libinih's ini_reader: the next line into buf (size bytes, room for the NUL included), NULL
 * at the end. The lines between the text's are the reader's own (above). */
static char *read_line(char *buf, int size, void *stream) {
    struct walk *p = stream;
    const char *text;
    size_t len;

    switch (p->feed) {
    case FEED_RESET:
        if (!p->next)
            return NULL;
        text = "[" NO_SECTION "]";
        len = strlen(text);
        p->feed = FEED_LINE;
        break;
    case FEED_LINE: {
        const char *nl = strchr(p->next, '\n');
        text = p->line = p->next;
        len = p->line_len = nl ? (size_t)(nl - p->next) : strlen(p->next);
        p->line_no++;
        p->next = nl && nl[1] ? nl + 1 : NULL;
        p->feed = FEED_REPORT;
        break;
    }
    case FEED_REPORT:
    default:
        text = "=";
        len = 1;
        p->reporting = true;
        p->feed = FEED_RESET;
        break;
    }
    if (len >= (size_t)size) {
        p->too_long = true;
        return NULL;
    }
    memcpy(buf, text, len);
    buf[len] = '\0';
    return buf;
}

/* libinih's ini_handler: a key of the text, or the reader's report after a line. Nonzero to go
 * on; take's failure is kept in w->r. */
static int handle_ini(void *user, const char *section, const char *name, const char *value) {
    struct walk *w = user;
    struct vase_ini_line l = {.no = w->line_no, .text = w->line, .len = w->line_len};

    if (w->reporting) {
        w->reporting = false;
        if (strcmp(section, NO_SECTION) != 0)
            l.section = section;
    } else {
        l.key = name;
        l.value = value;
    }
    int r = w->take(w->user, &l);
    if (r < 0)
        w->r = r;
    return r >= 0;
}

int vase_config_ini_walk(const char *text,
                         int (*take)(void *user, const struct vase_ini_line *line), void *user,
                         unsigned *ret_line_no) {
    struct walk w = {.next = text, .take = take, .user = user};

    ini_setup();
    if (strncmp(w.next, "\xEF\xBB\xBF", 3) == 0)
        w.next += 3; /* a UTF-8 byte order mark */
    if (!*w.next)
        w.next = NULL;
    int e = ini_parse_stream(read_line, &w, handle_ini, &w);
    *ret_line_no = w.line_no;
    if (w.r < 0)
        return w.r;
    if (e < 0) /* -2: libinih could not allocate its line buffer */
        return -ENOMEM;
    if (w.too_long)
        return -E2BIG;
    return e > 0 ? -EBADMSG : 0;
}
