/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Lists of users and groups (allow_users/allow_groups, an arena's users/groups, admin_group) and
 * the decision whether a peer, by the ids the kernel reported, is on one.
 */

#include <stddef.h>
#include <sys/types.h>

struct vase_allow {
    uid_t *uids;
    size_t n_uids;
    gid_t *gids;
    size_t n_gids;
};

/*
 * Parses allow_users and allow_groups (names or numeric ids, separated by commas or blanks)
 * into *ret. Names that do not resolve are logged and left out (denying more, never less).
 * 0 or -ENOMEM.
 */
int vase_allow_parse(const char *users, const char *groups, struct vase_allow *ret);
void vase_allow_done(struct vase_allow *a);

/*
 * The access decision, with no system calls: 0 if a peer with uid, primary gid and
 * supplementary groups[0..n_groups) may open a session, -EPERM otherwise. Root and self_uid
 * (the daemon's own user) are always admitted; with both lists empty no one else is.
 */
int vase_allow_check(const struct vase_allow *a, uid_t self_uid, uid_t uid, gid_t gid,
                     const gid_t *groups, size_t n_groups);

/* The supplementary groups of uid (getgrouplist of its user name), malloc'd into *ret.
 * 0 (possibly with *ret_n 0 for a uid with no passwd entry) or -ENOMEM. */
int vase_allow_peer_groups(uid_t uid, gid_t gid, gid_t **ret, size_t *ret_n);
