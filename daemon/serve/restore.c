/* SPDX-License-Identifier: MIT */

/*
 * Arenas and sequences kept across a restart (restore.h). The snapshot is input like any
 * message: it is read with bounds on every count, its checksum is checked, and each sequence is
 * checked again by the registry against what an open of its request holds before any page is
 * claimed; one bad sequence discards the whole snapshot, since its pages might overlap another's.
 * A snapshot is used once: it is removed from the store as soon as it is read, so that a crash
 * after this start does not bring back sequences that moved on. It is also bound to the memory
 * it describes: the stop that writes it draws a random stop id and stamps it, with the stopping
 * vased's incarnation, into each kept arena's stamp page (arena.h); an arena is taken back only
 * when its stamp names the snapshot's stop, and the stamp is cleared as it is, so that a
 * snapshot of an earlier stop, a memfd that is not the arena's (a blank one of the right size)
 * or a second replay of one pair is discarded. Only the main thread calls in.
 *
 * Format (native byte order: the same host writes and reads it), all integers unsigned:
 *   magic "VASESNAP", u32 version, u32 n_arenas, u32 n_seqs, u32 0, u64 payload bytes,
 *   u64 FNV-1a of the payload; then the stop: u64 incarnation of the vased that wrote it and
 *   its 16-byte stop id (both also in each kept arena's stamp); per arena: u32 name length,
 *   name, u64 bytes, u64 granule_bytes; per sequence: u32 id, arena, uid, 16-byte token,
 *   geometry (u32 layers, q_heads, kv_heads, head_dim, dtype, block_tokens), u32 name length,
 *   model name, u32 policy, params (u32 budget, window, n_sink, n_large, f32 temperature,
 *   u32 rank, f32 lambda, u32 smooth, metric, protect_prompt), u32 prompt_len, u64 seed,
 *   u32 mode, slack, min_budget, weight, budget, cap_budget, target_budget, budget_changes, len,
 *   rounds, u64 position, u32 n_pages, n_ring_pages, n_plan_pages, then those page indices.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/registry.h"
#include "restore.h"
#include "state.h"
#include "vase.pb-c.h"

#define MAGIC "VASESNAP"
#define HEADER_BYTES 40u
/* Largest snapshot read: far above what VASED_MAX_ARENAS arenas of sequences need. */
#define MAX_SNAPSHOT_BYTES (256u << 20)

struct saved_arena {
    char name[VASE_MAX_NAME + 1];
    uint64_t bytes, granule_bytes;
};

struct vase_restore {
    int arena_fd[VASED_MAX_ARENAS]; /* kept by the store, passed at start; -1 */
    int state_fd;
    bool kept[VASED_MAX_ARENAS];   /* arena i runs on the kept memfd */
    bool stored[VASED_MAX_ARENAS]; /* arena i's memfd is in the store */
    /* The snapshot read at start, when it is valid: its bytes and arenas. */
    uint8_t *snap;
    size_t snap_len;
    uint32_t n_arenas, n_seqs;
    uint64_t incarnation; /* of the vased that wrote it, and its stop id: the arenas' stamps */
    uint8_t stop_id[VASE_ARENA_STOP_ID_BYTES];
    struct saved_arena arenas[VASED_MAX_ARENAS];
    size_t seqs_at;     /* offset of the first sequence */
    double restored_at; /* when the sequences were kept: restore_grace counts from it */
};

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

struct reader {
    const uint8_t *p, *end;
};

static bool get(struct reader *rd, void *out, size_t n) {
    if ((size_t)(rd->end - rd->p) < n)
        return false;
    memcpy(out, rd->p, n);
    rd->p += n;
    return true;
}

static bool get_u32(struct reader *rd, uint32_t *v) {
    return get(rd, v, sizeof(*v));
}

static bool get_u64(struct reader *rd, uint64_t *v) {
    return get(rd, v, sizeof(*v));
}

/* A name of at most VASE_MAX_NAME bytes (and its padding), NUL-terminated into out. */
static bool get_name(struct reader *rd, char *out) {
    uint32_t n;
    uint8_t pad[4];
    if (!get_u32(rd, &n) || n > VASE_MAX_NAME || !get(rd, out, n) || !get(rd, pad, (4 - n % 4) % 4))
        return false;
    out[n] = '\0';
    return strlen(out) == n;
}

/* n page indices, pointing into the snapshot. */
static bool get_pages(struct reader *rd, uint32_t n, const uint32_t **ret) {
    if (n > VASE_ALLOC_MAX_UNITS || (size_t)(rd->end - rd->p) / sizeof(uint32_t) < n)
        return false;
    *ret = (const uint32_t *)rd->p; /* the buffer is malloc()ed and records are 4-aligned */
    rd->p += (size_t)n * sizeof(uint32_t);
    return true;
}

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * UINT64_C(1099511628211);
    return h;
}

/* Reads all of the state memfd into rs->snap. 0, or -errno with why. */
static int read_state(struct vase_restore *rs, const char **why) {
    struct stat st;
    int seals = fcntl(rs->state_fd, F_GET_SEALS);
    if (fstat(rs->state_fd, &st) < 0 || !S_ISREG(st.st_mode) || seals < 0 ||
        !(seals & F_SEAL_WRITE)) {
        *why = "it is not a sealed memfd";
        return -EBADFD;
    }
    if (st.st_size < (off_t)HEADER_BYTES || st.st_size > (off_t)MAX_SNAPSHOT_BYTES) {
        *why = "its size is out of bounds";
        return -EBADMSG;
    }
    rs->snap_len = (size_t)st.st_size;
    rs->snap = malloc(rs->snap_len);
    if (!rs->snap)
        return -ENOMEM;
    size_t got = 0;
    while (got < rs->snap_len) {
        ssize_t n = pread(rs->state_fd, rs->snap + got, rs->snap_len - got, (off_t)got);
        if (n <= 0) {
            *why = "it cannot be read";
            return n < 0 ? -errno : -EBADMSG;
        }
        got += (size_t)n;
    }
    return 0;
}

/* Checks the header and the arenas; leaves rs->seqs_at at the first sequence. */
static int parse_header(struct vase_restore *rs, const char **why) {
    struct reader rd = {rs->snap, rs->snap + rs->snap_len};
    char magic[8];
    uint32_t version = 0, zero = 0;
    uint64_t payload = 0, sum = 0;
    if (!get(&rd, magic, sizeof(magic)) || memcmp(magic, MAGIC, sizeof(magic)) != 0) {
        *why = "it is not a vase snapshot";
        return -EBADMSG;
    }
    get_u32(&rd, &version);
    get_u32(&rd, &rs->n_arenas);
    get_u32(&rd, &rs->n_seqs);
    get_u32(&rd, &zero);
    get_u64(&rd, &payload);
    get_u64(&rd, &sum);
    if (version != VASE_RESTORE_VERSION) {
        *why = "it has another format version";
        return -EPROTONOSUPPORT;
    }
    if (zero != 0 || payload != rs->snap_len - HEADER_BYTES ||
        fnv1a(rd.p, rs->snap_len - HEADER_BYTES) != sum) {
        *why = "its length or checksum is wrong (corrupt)";
        return -EBADMSG;
    }
    if (!get_u64(&rd, &rs->incarnation) || !get(&rd, rs->stop_id, sizeof(rs->stop_id))) {
        *why = "its stop record is cut short";
        return -EBADMSG;
    }
    if (rs->n_arenas > VASED_MAX_ARENAS) {
        *why = "it names too many arenas";
        return -EBADMSG;
    }
    for (uint32_t i = 0; i < rs->n_arenas; i++) {
        struct saved_arena *a = &rs->arenas[i];
        if (!get_name(&rd, a->name) || !get_u64(&rd, &a->bytes) ||
            !get_u64(&rd, &a->granule_bytes)) {
            *why = "an arena record is cut short";
            return -EBADMSG;
        }
    }
    rs->seqs_at = (size_t)(rd.p - rs->snap);
    return 0;
}

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
    const char *why = "";
    int r = read_state(rs, &why);
    if (r == 0)
        r = parse_header(rs, &why);
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

/* One sequence record into sv (pages pointing into the snapshot), its model name into name. */
static bool read_seq(struct reader *rd, const struct vased *d, struct vased_seq_saved *sv,
                     bool *ret_kept, char *name, char *msg, size_t msg_size) {
    uint32_t uid, geo[6], policy, f[10], mode, slack, min_budget, weight;
    uint32_t prompt_len;
    uint64_t seed;
    *sv = (struct vased_seq_saved){0};
    if (!get_u32(rd, &sv->id) || !get_u32(rd, &sv->arena_id) || !get_u32(rd, &uid) ||
        !get(rd, sv->token, sizeof(sv->token)) || !get(rd, geo, sizeof(geo)) ||
        !get_name(rd, name) || !get_u32(rd, &policy) || !get(rd, f, sizeof(f)) ||
        !get_u32(rd, &prompt_len) || !get_u64(rd, &seed) || !get_u32(rd, &mode) ||
        !get_u32(rd, &slack) || !get_u32(rd, &min_budget) || !get_u32(rd, &weight) ||
        !get_u32(rd, &sv->budget) || !get_u32(rd, &sv->cap_budget) ||
        !get_u32(rd, &sv->target_budget) || !get_u32(rd, &sv->budget_changes) ||
        !get_u32(rd, &sv->len) || !get_u32(rd, &sv->rounds) || !get_u64(rd, &sv->position) ||
        !get_u32(rd, &sv->n_pages) || !get_u32(rd, &sv->n_ring_pages) ||
        !get_u32(rd, &sv->n_plan_pages) || !get_pages(rd, sv->n_pages, &sv->pages) ||
        !get_pages(rd, sv->n_ring_pages, &sv->ring_pages) ||
        !get_pages(rd, sv->n_plan_pages, &sv->plan_pages)) {
        snprintf(msg, msg_size, "a sequence record is cut short");
        return false;
    }
    sv->uid = (uid_t)uid;
    const struct vase_restore *rs = d->restore;
    if (sv->arena_id >= rs->n_arenas || policy >= _VASE_POLICY_MAX || f[8] >= _VASE_METRIC_MAX ||
        geo[4] >= _VASE_DTYPE_MAX ||
        (mode != VASE__MODE__MODE_ASYNC && mode != VASE__MODE__MODE_SYNC)) {
        snprintf(msg, msg_size, "sequence %u names an unknown arena, policy, metric, dtype or mode",
                 sv->id);
        return false;
    }
    /* A sequence of an arena not kept (gone, or configured otherwise now) is read past: only
     * its own arena's size can tell whether its layout is valid. */
    *ret_kept = rs->kept[sv->arena_id];
    if (!*ret_kept)
        return true;
    struct vase_layout_geometry g = {.layers = geo[0],
                                     .q_heads = geo[1],
                                     .kv_heads = geo[2],
                                     .head_dim = geo[3],
                                     .dtype = (enum vase_dtype)geo[4],
                                     .block_tokens = geo[5]};
    char why[192];
    if (vase_layout_compute(&g, d->arenas[sv->arena_id]->size, &sv->layout, why, sizeof(why)) < 0) {
        snprintf(msg, msg_size, "sequence %u: %s", sv->id, why);
        return false;
    }
    float temperature, lambda;
    memcpy(&temperature, &f[4], sizeof(float));
    memcpy(&lambda, &f[6], sizeof(float));
    sv->req = (struct vased_seq_request){
        .policy = (enum vase_policy)policy,
        .params = {.budget = f[0],
                   .window = f[1],
                   .n_sink = f[2],
                   .n_large = f[3],
                   .temperature = temperature,
                   .rank = f[5],
                   .lambda = lambda,
                   .smooth = f[7],
                   .metric = (enum vase_metric)f[8],
                   .protect_prompt = f[9]},
        .prompt_len = prompt_len,
        .seed = seed,
        .mode = mode,
        .slack = slack,
        .min_budget = min_budget,
        .weight = weight,
    };
    return true;
}

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
    struct reader rd = {rs->snap + rs->seqs_at, rs->snap + rs->snap_len};
    char msg[384] = "", name[VASE_MAX_NAME + 1];
    uint32_t kept = 0, lost = 0;
    int r = 0;
    for (uint32_t k = 0; k < rs->n_seqs && r == 0; k++) {
        struct vased_seq_saved sv;
        bool on_kept;
        if (!read_seq(&rd, d, &sv, &on_kept, name, msg, sizeof(msg))) {
            r = -EBADMSG;
            break;
        }
        if (!on_kept) {
            lost++; /* its arena was discarded */
            continue;
        }
        r = vase_registry_restore_seq(d->reg, d->allocs[sv.arena_id], &sv, msg, sizeof(msg));
        if (r == 0) {
            kept++;
            log_debug("Sequence %u of model \"%s\" (uid %u) kept: %u pages, len %u.", sv.id, name,
                      (unsigned)sv.uid, sv.n_pages, sv.len);
        }
    }
    if (r == 0 && rd.p != rd.end) {
        snprintf(msg, sizeof(msg), "%zu bytes follow the last sequence", (size_t)(rd.end - rd.p));
        r = -EBADMSG;
    }
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

struct writer {
    uint8_t *buf;
    size_t len, cap;
    bool failed;
};

static void put(struct writer *w, const void *p, size_t n) {
    if (w->failed)
        return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 4096;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *b = realloc(w->buf, cap);
        if (!b) {
            w->failed = true;
            return;
        }
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void put_u32(struct writer *w, uint32_t v) {
    put(w, &v, sizeof(v));
}

static void put_u64(struct writer *w, uint64_t v) {
    put(w, &v, sizeof(v));
}

/* Padded with zeros to 4 bytes, so that the page lists after it stay aligned. */
static void put_name(struct writer *w, const char *s) {
    static const uint8_t zeros[4];
    size_t n = strnlen(s, VASE_MAX_NAME);
    put_u32(w, (uint32_t)n);
    put(w, s, n);
    put(w, zeros, (4 - n % 4) % 4);
}

static void put_seq(struct writer *w, const struct vased_seq *s, const char *model) {
    const struct vase_layout *l = &s->layout;
    const struct vase_params *p = &s->max_params;
    uint32_t geo[6] = {l->layers,   l->q_heads,         l->kv_heads,
                       l->head_dim, (uint32_t)l->dtype, l->block_tokens};
    uint32_t f[10] = {p->budget, p->window, p->n_sink, p->n_large,          0,
                      p->rank,   0,         p->smooth, (uint32_t)p->metric, p->protect_prompt};
    memcpy(&f[4], &p->temperature, sizeof(float));
    memcpy(&f[6], &p->lambda, sizeof(float));
    put_u32(w, s->id);
    put_u32(w, s->arena_id);
    put_u32(w, (uint32_t)s->owner_uid);
    put(w, s->resume_token, sizeof(s->resume_token));
    put(w, geo, sizeof(geo));
    put_name(w, model);
    put_u32(w, (uint32_t)s->policy);
    put(w, f, sizeof(f));
    put_u32(w, s->prompt_len);
    put_u64(w, s->seed);
    put_u32(w, s->mode);
    put_u32(w, s->slack);
    put_u32(w, s->min_budget);
    put_u32(w, s->weight);
    put_u32(w, s->params.budget);
    put_u32(w, s->cap_budget);
    put_u32(w, s->target_budget);
    put_u32(w, s->budget_changes);
    put_u32(w, s->len);
    put_u32(w, s->rounds);
    put_u64(w, s->position);
    put_u32(w, s->n_pages);
    put_u32(w, s->n_ring_pages);
    put_u32(w, s->n_plan_pages);
    put(w, s->pages, (size_t)s->n_pages * sizeof(uint32_t));
    put(w, s->ring_pages, (size_t)s->n_ring_pages * sizeof(uint32_t));
    put(w, s->plan_pages, (size_t)s->n_plan_pages * sizeof(uint32_t));
}

/* The sequences worth keeping: those on an arena whose memfd the store has. */
static uint32_t put_seqs(struct writer *w, const struct vased *d) {
    const struct vase_restore *rs = d->restore;
    uint32_t n = 0;
    for (const struct vased_client *c = d->reg->clients; c; c = c->next)
        for (const struct vased_seq *s = c->seqs; s; s = s->next)
            if (rs->stored[s->arena_id]) {
                put_seq(w, s, s->model ? s->model->name : "");
                n++;
            }
    for (const struct vased_seq *s = d->reg->restored; s; s = s->next)
        if (rs->stored[s->arena_id]) {
            put_seq(w, s, "");
            n++;
        }
    return n;
}

/* A sealed memfd holding buf. */
static int sealed_memfd(const uint8_t *buf, size_t len, int *ret_fd) {
    int fd = memfd_create("vase-state", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, buf + done, len - done);
        if (n < 0) {
            int r = -errno;
            close(fd);
            return r;
        }
        done += (size_t)n;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int r = -errno;
        close(fd);
        return r;
    }
    *ret_fd = fd;
    return 0;
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
    struct writer w = {0};
    uint8_t header[HEADER_BYTES] = {0};
    put(&w, header, sizeof(header));
    put_u64(&w, st.incarnation);
    put(&w, st.stop_id, sizeof(st.stop_id));
    for (uint32_t i = 0; i < d->n_arenas; i++) {
        put_name(&w, d->arena_names[i]);
        put_u64(&w, rs->stored[i] ? d->arenas[i]->size : 0);
        put_u64(&w, d->arenas[i]->granule_bytes);
    }
    uint32_t n_seqs = put_seqs(&w, d);
    if (w.failed) {
        free(w.buf);
        log_oom();
        return;
    }
    uint32_t version = VASE_RESTORE_VERSION, n_arenas = d->n_arenas;
    uint64_t payload = w.len - HEADER_BYTES, sum = fnv1a(w.buf + HEADER_BYTES, payload);
    memcpy(w.buf, MAGIC, 8);
    memcpy(w.buf + 8, &version, 4);
    memcpy(w.buf + 12, &n_arenas, 4);
    memcpy(w.buf + 16, &n_seqs, 4);
    memcpy(w.buf + 24, &payload, 8);
    memcpy(w.buf + 32, &sum, 8);
    int fd = -1;
    int r = sealed_memfd(w.buf, w.len, &fd);
    free(w.buf);
    if (r == 0) {
        r = store_add("state", fd);
        close(fd);
    }
    if (r < 0)
        log_error_errno(r, "Cannot store the state snapshot: the sequences will not survive the "
                           "restart: %m");
    else if (r > 0)
        log_info("State snapshot stored: %u sequences on kept arenas.", n_seqs);
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
