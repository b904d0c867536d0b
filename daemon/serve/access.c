/* SPDX-License-Identifier: MIT */

/*
 * Access decisions. The allow-list admits users and groups to the daemon, admin_group (with root
 * and the daemon's own user) may change it, and each arena names who may use it: an arena is a
 * trust domain, since whoever maps it can read and write all of it. A peer's groups are looked
 * up afresh for each decision, so a changed allow-list or group membership applies from the next
 * connection or request.
 */

#include <stdlib.h>

#include "access.h"
#include "core/allow.h"
#include "core/registry.h"
#include "state.h"

int vase_access_lookup(const struct vased *d, const struct ucred *cred, struct vased_peer *ret) {
    gid_t *groups = NULL;
    size_t n = 0;
    int r = vase_allow_peer_groups(cred->uid, cred->gid, &groups, &n);
    if (r < 0)
        return r;
    struct vased_peer p = {.uid = cred->uid};
    p.allowed = vase_allow_check(&d->allow, d->self_uid, cred->uid, cred->gid, groups, n) == 0;
    p.admin = vase_allow_check(&d->admins, d->self_uid, cred->uid, cred->gid, groups, n) == 0;
    for (uint32_t i = 0; p.allowed && i < d->n_arenas; i++)
        if (d->arena_open[i] ||
            vase_allow_check(&d->arena_allow[i], d->self_uid, cred->uid, cred->gid, groups, n) == 0)
            p.arenas |= 1u << i;
    free(groups);
    *ret = p;
    return 0;
}

bool vase_access_uid_capped(const struct vased *d, uid_t uid) {
    return uid != 0 && uid != d->self_uid;
}

bool vase_access_client_visible(const struct vased_peer *who, const struct vased_client *c) {
    if (who->admin || c->uid == who->uid)
        return true;
    for (const struct vased_model *m = c->models; m; m = m->next)
        if (who->arenas & (1u << m->arena_id))
            return true;
    return false;
}

bool vase_access_seq_visible(const struct vased_peer *who, const struct vased_seq *s) {
    return who->admin || (s->client && s->client->uid == who->uid) ||
           (who->arenas & (1u << s->arena_id));
}
