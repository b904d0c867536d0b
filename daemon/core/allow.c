/* SPDX-License-Identifier: MIT */

/*
 * Allow-lists: who may open a session, use an arena or change settings, as lists of users and
 * groups. Invariants: names that do not resolve are left out (denying more, never less); the
 * decision (vase_allow_check) is a pure function of ids, so that it can be tested
 * exhaustively; the groups of a peer come from the system's user database, its ids from the
 * kernel (SO_PEERCRED), never from the peer.
 */

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>

#include "allow.h"
#include "parse.h"
#include "log.h"

static bool is_separator(char c) {
    return c == ',' || c == ' ' || c == '\t' || c == '\n';
}

/* Calls fn for each name of a separated list. */
static int for_each_name(const char *list, int (*fn)(const char *name, void *user), void *user) {
    char name[256];
    const char *p = list ? list : "";
    while (*p) {
        while (is_separator(*p))
            p++;
        size_t n = 0;
        while (p[n] && !is_separator(p[n]))
            n++;
        if (n == 0)
            break;
        if (n >= sizeof(name)) {
            log_warning("Allow-list entry too long, ignored: %.*s...", 32, p);
        } else {
            memcpy(name, p, n);
            name[n] = '\0';
            int r = fn(name, user);
            if (r < 0)
                return r;
        }
        p += n;
    }
    return 0;
}

static int add_id(uint32_t **ids, size_t *n, uint32_t id) {
    uint32_t *a = realloc(*ids, (*n + 1) * sizeof(uint32_t));
    if (!a)
        return -ENOMEM;
    a[(*n)++] = id;
    *ids = a;
    return 0;
}

static int add_user(const char *name, void *user) {
    struct vase_allow *a = user;
    uint64_t id;
    if (vase_parse_u64(name, &id) == 0 && id < UINT32_MAX)
        return add_id((uint32_t **)&a->uids, &a->n_uids, (uint32_t)id);
    struct passwd *pw = getpwnam(name);
    if (!pw) {
        log_warning("allow_users: no user \"%s\"; ignored.", name);
        return 0;
    }
    return add_id((uint32_t **)&a->uids, &a->n_uids, pw->pw_uid);
}

static int add_group(const char *name, void *user) {
    struct vase_allow *a = user;
    uint64_t id;
    if (vase_parse_u64(name, &id) == 0 && id < UINT32_MAX)
        return add_id((uint32_t **)&a->gids, &a->n_gids, (uint32_t)id);
    struct group *gr = getgrnam(name);
    if (!gr) {
        log_warning("allow_groups: no group \"%s\"; ignored.", name);
        return 0;
    }
    return add_id((uint32_t **)&a->gids, &a->n_gids, gr->gr_gid);
}

_Static_assert(sizeof(uid_t) == sizeof(uint32_t) && sizeof(gid_t) == sizeof(uint32_t),
               "uid_t and gid_t are 32-bit");

int vase_allow_parse(const char *users, const char *groups, struct vase_allow *ret) {
    struct vase_allow a = {0};
    int r = for_each_name(users, add_user, &a);
    if (r >= 0)
        r = for_each_name(groups, add_group, &a);
    if (r < 0) {
        vase_allow_done(&a);
        return r;
    }
    *ret = a;
    return 0;
}

void vase_allow_done(struct vase_allow *a) {
    if (!a)
        return;
    free(a->uids);
    free(a->gids);
    *a = (struct vase_allow){0};
}

static bool has_gid(const struct vase_allow *a, gid_t g) {
    for (size_t i = 0; i < a->n_gids; i++)
        if (a->gids[i] == g)
            return true;
    return false;
}

int vase_allow_check(const struct vase_allow *a, uid_t self_uid, uid_t uid, gid_t gid,
                     const gid_t *groups, size_t n_groups) {
    /* Root could take the memory anyway, and the daemon's own user owns it. */
    if (uid == 0 || uid == self_uid)
        return 0;
    for (size_t i = 0; i < a->n_uids; i++)
        if (a->uids[i] == uid)
            return 0;
    if (has_gid(a, gid))
        return 0;
    for (size_t i = 0; i < n_groups; i++)
        if (has_gid(a, groups[i]))
            return 0;
    return -EPERM;
}

int vase_allow_peer_groups(uid_t uid, gid_t gid, gid_t **ret, size_t *ret_n) {
    struct passwd *pw = getpwuid(uid);
    *ret = NULL;
    *ret_n = 0;
    if (!pw)
        return 0;
    int n = 32;
    for (int tries = 0; tries < 8; tries++) {
        gid_t *g = malloc((size_t)n * sizeof(gid_t));
        if (!g)
            return -ENOMEM;
        int want = n;
        if (getgrouplist(pw->pw_name, gid, g, &want) >= 0) {
            *ret = g;
            *ret_n = (size_t)want;
            return 0;
        }
        free(g);
        n = want > n ? want : n * 2;
    }
    return 0;
}
