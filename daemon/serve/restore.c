/* SPDX-License-Identifier: MIT */

/*
 * Arenas and sequences kept across a restart (restore.h). The snapshot is input like any
 * message (snapshot.c checks its size, length and checksum), and each sequence is checked again
 * by the registry against what an open of its request holds before any page is claimed; one bad
 * sequence discards the whole snapshot, since its pages might overlap another's.
 * A snapshot is used once: it is removed from the store as soon as it is read, so that a crash
 * after this start does not bring back sequences that moved on. It is also bound to the memory
 * it describes: the stop that writes it draws a random stop id and stamps it, with the stopping
 * vased's incarnation, into each kept arena's stamp page (arena.h); an arena is taken back only
 * when its stamp names the snapshot's stop, and the stamp is cleared as it is, so that a
 * snapshot of an earlier stop, a memfd that is not the arena's (a blank one of the right size)
 * or a second replay of one pair is discarded. Only the main thread calls in.
 *
 * The snapshot's format (its header, checksum and message) is snapshot.c's.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/registry.h"
#include "restore.h"
#include "snapshot.h"
#include "state.h"
#include "vase.pb-c.h"

/* ---- the store ---- */

static void store_remove(const char *name) {
    sd_notifyf(0, "FDSTOREREMOVE=1\nFDNAME=%s", name);
}

/* Gives fd to the store as name. 1 if sent, 0 without a notification socket, -errno. */
static int store_add(const char *name, int fd) {
    char msg[64];
    snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
    return sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
}

static int restore_get(struct vased *d, struct vase_restore **ret) {
    if (!d->restore) {
        struct vase_restore *r = calloc(1, sizeof(*r));
        if (!r)
            return -ENOMEM;
        for (uint32_t i = 0; i < VASED_MAX_ARENAS; i++)
            r->arena_fd[i] = -1;
        r->state_fd = -1;
        d->restore = r;
    }
    *ret = d->restore;
    return 0;
}

int vase_restore_take_fd(struct vased *d, int fd, const char *name) {
    struct vase_restore *rs;
    unsigned i;
    char tail;
    bool arena = sscanf(name, "arena-%u%c", &i, &tail) == 1;
    if (!arena && strcmp(name, "state") != 0)
        return 0;
    int r = restore_get(d, &rs);
    if (r < 0)
        return r;
    int *slot = arena ? (i < VASED_MAX_ARENAS ? &rs->arena_fd[i] : NULL) : &rs->state_fd;
    if (!slot || *slot >= 0) {
        log_warning("systemd kept %s%s; removing it from the store.", name,
                    slot ? " twice" : ", an arena this vased cannot have");
        store_remove(name);
        close(fd);
        return 1;
    }
    *slot = fd;
    return 1;
}

/* ---- reading ---- */

int vase_restore_load(struct vased *d) {
    struct vase_restore *rs = d->restore;
    if (!rs)
        return 0;
    bool any_arena = false;
    for (uint32_t i = 0; i < VASED_MAX_ARENAS; i++)
        any_arena |= rs->arena_fd[i] >= 0;
    if (rs->state_fd < 0) {
        if (any_arena)
            log_warning("systemd kept the host arenas but no state snapshot (the previous vased "
                        "did not stop cleanly): their sequences are lost; starting empty.");
        return 0;
    }
    char why[128] = "";
    int r = vase_snapshot_read(rs, why, sizeof(why));
    if (r == -ENOMEM)
        return log_oom();
    /* Used once, whatever it holds. */
    store_remove("state");
    close(rs->state_fd);
    rs->state_fd = -1;
    if (r < 0) {
        log_error_errno(r, "Discarding the state snapshot systemd kept: %s; starting empty.", why);
        free(rs->snap);
        rs->snap = NULL;
        rs->n_arenas = rs->n_seqs = 0;
        return 0;
    }
    log_info("State snapshot of the previous vased (incarnation %016llx): %u arenas, %u sequences.",
             (unsigned long long)rs->incarnation, rs->n_arenas, rs->n_seqs);
    return 0;
}

/* ---- arenas ---- */

static void arena_name(uint32_t i, char *buf, size_t len) {
    snprintf(buf, len, "arena-%u", i);
}

/* Why kept arena i cannot be arena i as configured now, or NULL if it can. */
static const char *arena_mismatch(const struct vase_restore *rs, uint32_t i, const char *name,
                                  const char *spec, uint64_t bytes, uint64_t granule_bytes) {
    if (!rs->snap)
        return "there is no valid state snapshot";
    if (i >= rs->n_arenas)
        return "the snapshot does not have it";
    if (strcmp(spec, "host") != 0)
        return "it is no longer a host arena";
    if (strcmp(rs->arenas[i].name, name) != 0)
        return "the configuration names another arena at its place";
    if (rs->arenas[i].bytes != bytes || rs->arenas[i].granule_bytes != granule_bytes)
        return "its arena_bytes or granule_bytes changed";
    return NULL;
}

/*
 * Why adopted arena a, at place i, is not the memory the snapshot describes (its stamp names
 * another stop, or none), or NULL if it is; then its stamp is cleared, so that the same pair
 * cannot be taken back again. buf holds a reason that needs formatting.
 */
static const char *stamp_mismatch(const struct vase_restore *rs, uint32_t i,
                                  const struct vase_arena *a, char *buf, size_t len) {
    struct vase_arena_stamp st;
    int r = vase_arena_read_stamp(a, &st);
    if (r == -ENOMSG)
        return "its memfd carries no stamp of a stop (a blank or foreign memfd, or memory already "
               "taken back once)";
    if (r < 0) {
        snprintf(buf, len, "its stamp cannot be read (%s)", strerror(-r));
        return buf;
    }
    if (st.arena_id != i) {
        snprintf(buf, len, "its memfd is stamped as arena %u's", st.arena_id);
        return buf;
    }
    if (st.incarnation != rs->incarnation ||
        memcmp(st.stop_id, rs->stop_id, sizeof(st.stop_id)) != 0) {
        snprintf(buf, len,
                 "the snapshot is of another stop than the one that stamped this memory (the "
                 "snapshot's vased %016llx, the memory's %016llx): a stale or foreign pair",
                 (unsigned long long)rs->incarnation, (unsigned long long)st.incarnation);
        return buf;
    }
    r = vase_arena_clear_stamp(a);
    if (r < 0) {
        snprintf(buf, len, "its stamp cannot be cleared (%s)", strerror(-r));
        return buf;
    }
    return NULL;
}

int vase_restore_arena(struct vased *d, uint32_t i, const char *name, const char *spec,
                       enum vase_cuda_share share, uint64_t bytes, uint64_t granule_bytes,
                       struct vase_arena **ret) {
    struct vase_restore *rs = d->restore;
    char fdname[32];
    arena_name(i, fdname, sizeof(fdname));
    if (rs && rs->arena_fd[i] >= 0) {
        char buf[256];
        struct vase_arena *a = NULL;
        const char *why = arena_mismatch(rs, i, name, spec, bytes, granule_bytes);
        int r = why ? 0 : vase_arena_adopt_host(i, rs->arena_fd[i], bytes, granule_bytes, &a);
        if (!why && r == 0) {
            rs->arena_fd[i] = -1; /* the arena's now */
            why = stamp_mismatch(rs, i, a, buf, sizeof(buf));
            if (!why) {
                rs->kept[i] = rs->stored[i] = true;
                log_info("Arena %u \"%s\": kept across the restart (%llu bytes, contents intact).",
                         i, name, (unsigned long long)bytes);
                *ret = a;
                return 0;
            }
            a = vase_arena_free(a); /* closes the memfd */
        } else if (!why)
            why = r == -EMEDIUMTYPE ? "its memfd has another size"
                                    : "its memfd is not one vased made";
        log_warning("Discarding the kept memory of arena %u \"%s\": %s.", i, name, why);
        store_remove(fdname);
        if (rs->arena_fd[i] >= 0)
            close(rs->arena_fd[i]);
        rs->arena_fd[i] = -1;
    }
    int r = vase_arena_new(i, spec, share, bytes, granule_bytes, ret);
    if (r < 0 || strcmp(spec, "host") != 0)
        return r;
    int s = store_add(fdname, (*ret)->fd);
    if (s < 0)
        log_warning_errno(s, "Cannot give arena %u to systemd's file descriptor store: %m", i);
    if (s > 0 && restore_get(d, &rs) == 0)
        rs->stored[i] = true;
    return 0;
}

/* ---- sequences ---- */

/* Drops every restored sequence (a bad snapshot: nothing of it is trusted). */
static void drop_all(struct vased *d) {
    while (d->reg->restored) {
        struct vased_seq *s = d->reg->restored;
        vase_registry_drop_restored(d->reg, d->allocs[s->arena_id], s);
    }
}

static int restore_seqs(struct vased *d);

/* The kept sequences, then, in each arena that kept its memory, every byte none of them holds
 * zeroed: the previous daemon stopped with sequences whose pages it never released, and the
 * next sequence given those bytes must not read them. */
int vase_restore_seqs(struct vased *d) {
    int r = restore_seqs(d);
    if (r < 0 || !d->restore)
        return r;
    for (uint32_t i = 0; i < d->n_arenas; i++)
        if (d->restore->kept[i])
            vase_alloc_each_unheld(d->allocs[i], vase_arena_zero, d->arenas[i]);
    return r;
}

static int restore_seqs(struct vased *d) {
    struct vase_restore *rs = d->restore;
    if (!rs)
        return 0;
    /* Kept fds no arena took (fewer arenas now). */
    for (uint32_t i = 0; i < VASED_MAX_ARENAS; i++)
        if (rs->arena_fd[i] >= 0) {
            char fdname[32];
            arena_name(i, fdname, sizeof(fdname));
            log_warning("Discarding the kept memory of arena %u: the configuration has no such "
                        "arena any more.",
                        i);
            store_remove(fdname);
            close(rs->arena_fd[i]);
            rs->arena_fd[i] = -1;
        }
    if (!rs->snap)
        return 0;
    /* It unpacked once already (vase_restore_load()): only memory can fail it now. */
    Vase__Snapshot *m = vase_snapshot_unpack(rs);
    char msg[384] = "";
    uint32_t kept = 0, lost = 0;
    int r = m ? 0 : -ENOMEM;
    for (size_t i = 0; m && i < m->n_seqs && r == 0; i++) {
        struct kept_seq k;
        bool on_kept;
        if (!vase_snapshot_seq_from_msg(m->seqs[i], d, &k, &on_kept, msg, sizeof(msg))) {
            r = -EBADMSG;
            break;
        }
        if (!on_kept) {
            lost++; /* its arena was discarded */
            continue;
        }
        r = vase_registry_restore_seq(d->reg, d->allocs[k.sv.arena_id], &k.sv, msg, sizeof(msg));
        if (r == 0) {
            kept++;
            log_debug("Sequence %u of model \"%s\" (uid %u) kept: %u pages, len %u.", k.sv.id,
                      m->seqs[i]->model_name, (unsigned)k.sv.uid, k.sv.n_pages, k.sv.len);
        }
    }
    if (m)
        vase__snapshot__free_unpacked(m, NULL);
    free(rs->snap);
    rs->snap = NULL;
    if (r == -ENOMEM) {
        drop_all(d);
        return log_oom();
    }
    if (r < 0) {
        drop_all(d);
        log_error_errno(r, "Discarding the sequences of the state snapshot: %s.", msg);
        return 0;
    }
    if (lost)
        log_notice("%u sequences of the previous vased were on arenas not kept: lost.", lost);
    if (kept) {
        rs->restored_at = vased_now();
        log_notice("%u sequences of the previous vased kept with their pages; engines may reopen "
                   "them within %u s (restore_grace).",
                   kept, d->cfg.restore_grace);
    }
    return 0;
}

/* Compares without an early exit, so the time taken says nothing about the token. */
static bool token_equal(const uint8_t *a, const uint8_t *b, size_t n) {
    uint8_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}

static bool geometry_equal(const struct vase_layout *a, const struct vase_layout *b) {
    return a->layers == b->layers && a->q_heads == b->q_heads && a->kv_heads == b->kv_heads &&
           a->head_dim == b->head_dim && a->dtype == b->dtype &&
           a->block_tokens == b->block_tokens && a->page_bytes == b->page_bytes;
}

int vase_restore_reopen(struct vased *d, struct vased_client *c, struct vased_model *m, uint32_t id,
                        const uint8_t *token, size_t token_len, enum vase_policy policy,
                        uint32_t budget, uint32_t window, struct vased_seq **ret, char *msg,
                        size_t msg_size) {
    struct vased_seq *s = vase_registry_find_restored(d->reg, id);
    /* A wrong token or another uid's sequence is answered as no sequence at all: the reply
     * tells a prober nothing of which ids other tenants had kept. */
    if (!s || token_len != sizeof(s->resume_token) ||
        !token_equal(token, s->resume_token, token_len) || c->uid != s->owner_uid) {
        snprintf(msg, msg_size, "no sequence %u of this client's uid waits to be reopened", id);
        return -ENOENT;
    }
    if (m->arena_id != s->arena_id || !geometry_equal(&m->layout, &s->layout)) {
        snprintf(msg, msg_size, "model %u is not the geometry or arena sequence %u was opened with",
                 m->id, id);
        return -EINVAL;
    }
    if (policy != s->policy || budget != s->max_budget || window != s->params.window) {
        snprintf(msg, msg_size,
                 "sequence %u was opened with policy %s, budget %u, window %u; the reopen asks "
                 "for another",
                 id, vase_policy_to_string(s->policy), s->max_budget, s->params.window);
        return -EINVAL;
    }
    vase_registry_adopt_restored(d->reg, c, m, s);
    *ret = s;
    return 0;
}

/* ---- the snapshot ---- */

/* Whether s is worth keeping: it is on an arena whose memfd the store has. */
static bool seq_kept(const struct vased *d, const struct vased_seq *s) {
    return d->restore->stored[s->arena_id];
}

/* The sequences worth keeping into snap->seqs (pointing into them); free with free_seqs().
 * 0 or -ENOMEM. */
static int snapshot_seqs(const struct vased *d, Vase__Snapshot *snap) {
    size_t n = 0;
    for (const struct vased_client *c = d->reg->clients; c; c = c->next)
        for (const struct vased_seq *s = c->seqs; s; s = s->next)
            n += seq_kept(d, s);
    for (const struct vased_seq *s = d->reg->restored; s; s = s->next)
        n += seq_kept(d, s);
    if (n == 0)
        return 0;
    Vase__SnapshotSeq *msgs = calloc(n, sizeof(*msgs));
    snap->seqs = calloc(n, sizeof(*snap->seqs));
    if (!msgs || !snap->seqs) {
        free(msgs);
        free(snap->seqs);
        snap->seqs = NULL;
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        snap->seqs[i] = &msgs[i];
    for (const struct vased_client *c = d->reg->clients; c; c = c->next)
        for (const struct vased_seq *s = c->seqs; s; s = s->next)
            if (seq_kept(d, s))
                vase_snapshot_seq_to_msg(s, snap->seqs[snap->n_seqs++]);
    for (const struct vased_seq *s = d->reg->restored; s; s = s->next)
        if (seq_kept(d, s))
            vase_snapshot_seq_to_msg(s, snap->seqs[snap->n_seqs++]);
    return 0;
}

static void free_seqs(Vase__Snapshot *snap) {
    if (snap->n_seqs)
        free(snap->seqs[0]); /* the array of every message */
    free(snap->seqs);
}

void vase_restore_save(struct vased *d) {
    struct vase_restore *rs = d->restore;
    bool any = false;
    for (uint32_t i = 0; rs && i < d->n_arenas; i++)
        any |= rs->stored[i];
    if (!any || !d->reg)
        return;
    /* This stop's identity, stamped into each kept arena before the snapshot naming it is
     * stored: nothing a client could read before now predicts it. */
    struct vase_arena_stamp st = {.incarnation = d->incarnation};
    if (getrandom(st.stop_id, sizeof(st.stop_id), 0) != (ssize_t)sizeof(st.stop_id)) {
        log_error_errno(-errno, "Cannot draw the stop's identity: the sequences will not survive "
                                "the restart: %m");
        return;
    }
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        if (!rs->stored[i])
            continue;
        st.arena_id = i;
        int r = vase_arena_write_stamp(d->arenas[i], &st);
        if (r < 0) {
            log_warning_errno(r,
                              "Cannot stamp arena %u for the restart: its sequences will not "
                              "survive it: %m",
                              i);
            char fdname[32];
            arena_name(i, fdname, sizeof(fdname));
            store_remove(fdname);
            rs->stored[i] = false;
        }
    }
    Vase__Snapshot snap = VASE__SNAPSHOT__INIT;
    Vase__SnapshotArena arenas[VASED_MAX_ARENAS], *arena_msgs[VASED_MAX_ARENAS];
    snap.incarnation = st.incarnation;
    snap.stop_id = (ProtobufCBinaryData){.len = sizeof(st.stop_id), .data = st.stop_id};
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        vase__snapshot_arena__init(&arenas[i]);
        arenas[i].name = (char *)d->arena_names[i];
        arenas[i].bytes = rs->stored[i] ? d->arenas[i]->size : 0;
        arenas[i].granule_bytes = d->arenas[i]->granule_bytes;
        arena_msgs[i] = &arenas[i];
    }
    snap.n_arenas = d->n_arenas;
    snap.arenas = arena_msgs;
    uint8_t *buf = NULL;
    size_t len = 0;
    int r = snapshot_seqs(d, &snap);
    if (r == 0)
        r = vase_snapshot_pack(&snap, &buf, &len);
    size_t n_seqs = snap.n_seqs;
    free_seqs(&snap);
    if (r == -ENOMEM) {
        log_oom();
        return;
    }
    int fd = -1;
    if (r == 0)
        r = vase_snapshot_memfd(buf, len, &fd);
    free(buf);
    if (r == 0) {
        r = store_add("state", fd);
        close(fd);
    }
    if (r < 0)
        log_error_errno(r, "Cannot store the state snapshot: the sequences will not survive the "
                           "restart: %m");
    else if (r > 0)
        log_info("State snapshot stored: %zu sequences on kept arenas.", n_seqs);
}

void vase_restore_tick(struct vased *d, double now) {
    /* restore_grace as it is now: a change at run time applies to the sequences waiting. */
    if (!d->reg || !d->reg->n_restored || !d->restore ||
        now < d->restore->restored_at + d->cfg.restore_grace)
        return;
    uint32_t n = d->reg->n_restored;
    uint64_t bytes = vase_restore_bytes(d);
    drop_all(d);
    log_notice("%u kept sequences were not reopened within restore_grace (%u s): freed %llu "
               "bytes.",
               n, d->cfg.restore_grace, (unsigned long long)bytes);
}

uint64_t vase_restore_bytes(const struct vased *d) {
    uint64_t bytes = 0;
    for (const struct vased_seq *s = d->reg ? d->reg->restored : NULL; s; s = s->next)
        bytes += vase_registry_seq_bytes(s);
    return bytes;
}

void vase_restore_done(struct vased *d) {
    struct vase_restore *rs = d->restore;
    if (!rs)
        return;
    for (uint32_t i = 0; i < VASED_MAX_ARENAS; i++)
        if (rs->arena_fd[i] >= 0)
            close(rs->arena_fd[i]);
    if (rs->state_fd >= 0)
        close(rs->state_fd);
    free(rs->snap);
    free(rs);
    d->restore = NULL;
}
