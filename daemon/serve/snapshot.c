/* SPDX-License-Identifier: MIT */

/*
 * The state snapshot of restore.h as bytes: writing a stop's snapshot into a sealed memfd and
 * reading one back, and a sequence's state as a SnapshotSeq both ways from one table of its
 * fields (SEQ_FIELDS), so that what is written is what is read. What it reads is input like any
 * message: its size is bounded before protobuf-c sees a byte, and its length and checksum must
 * be the ones written; restore.c decides what to keep of it.
 *
 * Format: "VASESNAP", u32 VASE_RESTORE_VERSION, u32 length of the rest, u64 FNV-1a of the rest
 * (host byte order: the same host writes and reads it), then the Snapshot message of
 * proto/vase.proto. A snapshot of another version (3 and older: the fields one after the other)
 * is discarded by that version; within one, a field added to the messages keeps the arenas
 * across an upgrade. The checksum stays although protobuf checks the message's framing: a
 * changed byte inside a page index or a budget still unpacks, and would give an engine pages
 * that are not its sequence's.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/registry.h"
#include "restore.h"
#include "snapshot.h"
#include "state.h"
#include "vase.pb-c.h"

#define MAGIC "VASESNAP"
#define HEADER_BYTES 24u
/* Largest snapshot read: far above what VASED_MAX_ARENAS arenas of sequences need. */
#define MAX_SNAPSHOT_BYTES (256u << 20)

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * UINT64_C(1099511628211);
    return h;
}

/* Reads all of the state memfd into rs->snap and checks its header. 0, or -errno with why. */
static int read_state(struct vase_restore *rs, char *why, size_t why_size) {
    struct stat st;
    int seals = fcntl(rs->state_fd, F_GET_SEALS);
    if (fstat(rs->state_fd, &st) < 0 || !S_ISREG(st.st_mode) || seals < 0 ||
        !(seals & F_SEAL_WRITE)) {
        snprintf(why, why_size, "it is not a sealed memfd");
        return -EBADFD;
    }
    if (st.st_size < (off_t)HEADER_BYTES || st.st_size > (off_t)MAX_SNAPSHOT_BYTES) {
        snprintf(why, why_size, "its size is out of bounds");
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
            snprintf(why, why_size, "it cannot be read");
            return n < 0 ? -errno : -EBADMSG;
        }
        got += (size_t)n;
    }
    uint32_t version, len;
    uint64_t sum;
    memcpy(&version, rs->snap + 8, sizeof(version));
    memcpy(&len, rs->snap + 12, sizeof(len));
    memcpy(&sum, rs->snap + 16, sizeof(sum));
    if (memcmp(rs->snap, MAGIC, 8) != 0) {
        snprintf(why, why_size, "it is not a vase snapshot");
        return -EBADMSG;
    }
    if (version != VASE_RESTORE_VERSION) {
        snprintf(why, why_size, "it has another format version (%u; this vased reads %u)", version,
                 VASE_RESTORE_VERSION);
        return -EPROTONOSUPPORT;
    }
    if (len != rs->snap_len - HEADER_BYTES ||
        fnv1a(rs->snap + HEADER_BYTES, rs->snap_len - HEADER_BYTES) != sum) {
        snprintf(why, why_size, "its length or checksum is wrong (corrupt)");
        return -EBADMSG;
    }
    return 0;
}

Vase__Snapshot *vase_snapshot_unpack(const struct vase_restore *rs) {
    return vase__snapshot__unpack(NULL, rs->snap_len - HEADER_BYTES, rs->snap + HEADER_BYTES);
}

/* The stop and the arenas of the snapshot into rs. 0, or -errno with why. */
static int read_stop(struct vase_restore *rs, char *why, size_t why_size) {
    Vase__Snapshot *m = vase_snapshot_unpack(rs);
    if (!m) {
        snprintf(why, why_size, "it does not unpack (corrupt)");
        return -EBADMSG;
    }
    int r = -EBADMSG;
    if (m->stop_id.len != sizeof(rs->stop_id))
        snprintf(why, why_size, "its stop id is not %zu bytes", sizeof(rs->stop_id));
    else if (m->n_arenas > VASED_MAX_ARENAS)
        snprintf(why, why_size, "it names too many arenas");
    else
        r = 0;
    for (size_t i = 0; r == 0 && i < m->n_arenas; i++) {
        struct saved_arena *a = &rs->arenas[i];
        if (strlen(m->arenas[i]->name) > VASE_MAX_NAME) {
            snprintf(why, why_size, "the name of arena %zu is too long", i);
            r = -EBADMSG;
            break;
        }
        strcpy(a->name, m->arenas[i]->name);
        a->bytes = m->arenas[i]->bytes;
        a->granule_bytes = m->arenas[i]->granule_bytes;
    }
    if (r == 0) {
        rs->incarnation = m->incarnation;
        memcpy(rs->stop_id, m->stop_id.data, sizeof(rs->stop_id));
        rs->n_arenas = (uint32_t)m->n_arenas;
        rs->n_seqs = (uint32_t)m->n_seqs; /* at most a byte each */
    }
    vase__snapshot__free_unpacked(m, NULL);
    return r;
}

int vase_snapshot_read(struct vase_restore *rs, char *why, size_t why_size) {
    int r = read_state(rs, why, why_size);
    return r < 0 ? r : read_stop(rs, why, why_size);
}

/*
 * A sequence's state in the snapshot, one row a field: its SnapshotSeq field, where a live
 * sequence holds it (struct vased_seq: the writer's side) and where the one read back does
 * (struct kept_seq: the reader's). The token, the model's name, the label and the page lists
 * are copied by hand: they are not scalars.
 */
#define SEQ_FIELDS(X)                                                                              \
    X(id, id, sv.id)                                                                               \
    X(arena_id, arena_id, sv.arena_id)                                                             \
    X(uid, owner_uid, sv.uid)                                                                      \
    X(layers, layout.layers, geo.layers)                                                           \
    X(q_heads, layout.q_heads, geo.q_heads)                                                        \
    X(kv_heads, layout.kv_heads, geo.kv_heads)                                                     \
    X(head_dim, layout.head_dim, geo.head_dim)                                                     \
    X(dtype, layout.dtype, geo.dtype)                                                              \
    X(block_tokens, layout.block_tokens, geo.block_tokens)                                         \
    X(policy, policy, sv.req.policy)                                                               \
    X(max_budget, max_params.budget, sv.req.params.budget)                                         \
    X(window, max_params.window, sv.req.params.window)                                             \
    X(n_sink, max_params.n_sink, sv.req.params.n_sink)                                             \
    X(n_large, max_params.n_large, sv.req.params.n_large)                                          \
    X(temperature, max_params.temperature, sv.req.params.temperature)                              \
    X(rank, max_params.rank, sv.req.params.rank)                                                   \
    X(lambda, max_params.lambda, sv.req.params.lambda)                                             \
    X(smooth, max_params.smooth, sv.req.params.smooth)                                             \
    X(metric, max_params.metric, sv.req.params.metric)                                             \
    X(protect_prompt, max_params.protect_prompt, sv.req.params.protect_prompt)                     \
    X(prompt_len, prompt_len, sv.req.prompt_len)                                                   \
    X(seed, seed, sv.req.seed)                                                                     \
    X(mode, mode, sv.req.mode)                                                                     \
    X(slack, slack, sv.req.slack)                                                                  \
    X(min_budget, min_budget, sv.req.min_budget)                                                   \
    X(weight, weight, sv.req.weight)                                                               \
    X(budget, params.budget, sv.budget)                                                            \
    X(cap_budget, cap_budget, sv.cap_budget)                                                       \
    X(target_budget, target_budget, sv.target_budget)                                              \
    X(budget_changes, budget_changes, sv.budget_changes)                                           \
    X(len, len, sv.len)                                                                            \
    X(rounds, rounds, sv.rounds)                                                                   \
    X(position, position, sv.position)

bool vase_snapshot_seq_from_msg(const Vase__SnapshotSeq *m, const struct vased *d,
                                struct kept_seq *k, bool *ret_kept, char *msg, size_t msg_size) {
    *k = (struct kept_seq){0};
#define FROM_MSG(field, live, kept) k->kept = m->field;
    SEQ_FIELDS(FROM_MSG)
#undef FROM_MSG
    struct vased_seq_saved *sv = &k->sv;
    const struct vase_restore *rs = d->restore;
    if (sv->arena_id >= rs->n_arenas || m->policy >= _VASE_POLICY_MAX ||
        m->metric >= _VASE_METRIC_MAX || m->dtype >= _VASE_DTYPE_MAX ||
        (m->mode != VASE__MODE__MODE_ASYNC && m->mode != VASE__MODE__MODE_SYNC)) {
        snprintf(msg, msg_size, "sequence %u names an unknown arena, policy, metric, dtype or mode",
                 sv->id);
        return false;
    }
    if (m->resume_token.len != sizeof(sv->token) || strlen(m->model_name) > VASE_MAX_NAME ||
        strlen(m->label) > VASE_WIRE_LABEL_MAX || m->n_pages > VASE_ALLOC_MAX_UNITS ||
        m->n_ring_pages > VASE_ALLOC_MAX_UNITS || m->n_plan_pages > VASE_ALLOC_MAX_UNITS) {
        snprintf(msg, msg_size,
                 "sequence %u: its token, model name, label or page lists are not valid", sv->id);
        return false;
    }
    memcpy(sv->token, m->resume_token.data, sizeof(sv->token));
    /* Its bytes are checked with the rest of the request (vase_registry_restore_seq()). */
    memcpy(sv->req.label, m->label, strlen(m->label) + 1);
    sv->n_pages = (uint32_t)m->n_pages;
    sv->pages = m->pages;
    sv->n_ring_pages = (uint32_t)m->n_ring_pages;
    sv->ring_pages = m->ring_pages;
    sv->n_plan_pages = (uint32_t)m->n_plan_pages;
    sv->plan_pages = m->plan_pages;
    /* A sequence of an arena not kept (gone, or configured otherwise now) is passed over: only
     * its own arena's size can tell whether its layout is valid. */
    *ret_kept = rs->kept[sv->arena_id];
    if (!*ret_kept)
        return true;
    char why[192];
    if (vase_layout_compute(&k->geo, d->arenas[sv->arena_id]->size, &sv->layout, why, sizeof(why)) <
        0) {
        snprintf(msg, msg_size, "sequence %u: %s", sv->id, why);
        return false;
    }
    return true;
}

void vase_snapshot_seq_to_msg(const struct vased_seq *s, Vase__SnapshotSeq *m) {
    vase__snapshot_seq__init(m);
#define TO_MSG(field, live, kept) m->field = s->live;
    SEQ_FIELDS(TO_MSG)
#undef TO_MSG
    m->resume_token =
        (ProtobufCBinaryData){.len = sizeof(s->resume_token), .data = (uint8_t *)s->resume_token};
    /* A restored sequence, or an orphan, has no model (nor name) of its own. */
    m->model_name = s->model && s->model->name ? s->model->name : (char *)"";
    m->label = (char *)s->label;
    m->n_pages = s->n_pages;
    m->pages = s->pages;
    m->n_ring_pages = s->n_ring_pages;
    m->ring_pages = s->ring_pages;
    m->n_plan_pages = s->n_plan_pages;
    m->plan_pages = s->plan_pages;
}

int vase_snapshot_pack(const Vase__Snapshot *snap, uint8_t **ret_buf, size_t *ret_len) {
    size_t len = vase__snapshot__get_packed_size(snap);
    if (len > MAX_SNAPSHOT_BYTES - HEADER_BYTES)
        return -EFBIG; /* the reader would refuse it */
    uint8_t *buf = malloc(HEADER_BYTES + len);
    if (!buf)
        return -ENOMEM;
    uint32_t version = VASE_RESTORE_VERSION, len32 = (uint32_t)len;
    vase__snapshot__pack(snap, buf + HEADER_BYTES);
    uint64_t sum = fnv1a(buf + HEADER_BYTES, len);
    memcpy(buf, MAGIC, 8);
    memcpy(buf + 8, &version, sizeof(version));
    memcpy(buf + 12, &len32, sizeof(len32));
    memcpy(buf + 16, &sum, sizeof(sum));
    *ret_buf = buf;
    *ret_len = HEADER_BYTES + len;
    return 0;
}

int vase_snapshot_memfd(const uint8_t *buf, size_t len, int *ret_fd) {
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
