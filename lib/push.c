/* SPDX-License-Identifier: MIT */

/*
 * What an engine gives the daemon for a sequence's next plan besides its tokens: the random
 * draws of the sampling policies (vase_seq_set_draws(), kept here and sent with the next
 * EvictRequest by cycle.c) and the attention statistics it computed itself
 * (vase_seq_push_stats(), sent at once as AttnStats). Both are checked here before they leave:
 * draws finite (Exp(1) ones non-negative), statistics probabilities of the sequence's filled
 * slots, so that a bad value is the caller's error at once rather than a refusal later. The
 * daemon refuses a push only asynchronously; that refusal comes back through
 * vase__seq_precheck() on a later call.
 */

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The index of the first NaN or Inf of x[0 .. n), n if none. */
static size_t first_nonfinite(const float *x, size_t n) {
    size_t i = 0;
    while (i < n && isfinite(x[i]))
        i++;
    return i;
}

/* The index of the first value of x[0 .. n) that is NaN, Inf or negative, n if none. */
static size_t first_not_weight(const float *x, size_t n) {
    size_t i = 0;
    while (i < n && isfinite(x[i]) && x[i] >= 0.0f)
        i++;
    return i;
}

int vase_seq_set_draws(struct vase_seq *s, const float *exp_draws, size_t n_exp, const float *gauss,
                       size_t n_gauss) {
    float *e = NULL, *g = NULL;
    int r = 0;

    if (!s)
        return -EINVAL;
    struct vase_client *c = s->client;
    vase__client_lock(c);
    if ((!exp_draws && n_exp) || (!gauss && n_gauss)) {
        r = vase__client_fail(c, -EINVAL, "vase_seq_set_draws: a count without its draws");
        goto out;
    }
    /* Stream order: the draws already set belong to the request still queued. */
    if (s->request_queued) {
        r = vase__client_fail(c, -EBUSY,
                              "vase_seq_set_draws: the request of sequence %u waits for the "
                              "engine's stream, with the draws set before it",
                              s->id);
        goto out;
    }
    /* Exp(1) draws are -log(u) with u in (0, 1]: finite and non-negative (0 when u is 1);
     * normals are merely finite. */
    for (size_t i = 0; i < n_exp; i++)
        if (!(exp_draws[i] >= 0.0f) || !isfinite(exp_draws[i])) {
            r = vase__client_fail(c, -EINVAL, "vase_seq_set_draws: Exp(1) draw %zu is %g", i,
                                  (double)exp_draws[i]);
            goto out;
        }
    size_t bad = first_nonfinite(gauss, n_gauss);
    if (bad < n_gauss) {
        r = vase__client_fail(c, -EINVAL, "vase_seq_set_draws: normal draw %zu is %g", bad,
                              (double)gauss[bad]);
        goto out;
    }
    if ((n_exp && !(e = malloc(n_exp * sizeof(*e)))) ||
        (n_gauss && !(g = malloc(n_gauss * sizeof(*g))))) {
        free(e);
        r = -ENOMEM;
        goto out;
    }
    if (n_exp)
        memcpy(e, exp_draws, n_exp * sizeof(*e));
    if (n_gauss)
        memcpy(g, gauss, n_gauss * sizeof(*g));
    vase__seq_clear_draws(s);
    s->exp_draws = e;
    s->n_exp = n_exp;
    s->gauss = g;
    s->n_gauss = n_gauss;
out:
    pthread_mutex_unlock(&c->lock);
    return r;
}

int vase_seq_push_stats(struct vase_seq *s, uint32_t layer, enum vase_stats_kind kind,
                        const float *values, uint32_t len) {
    Vase__AttnStats st = VASE__ATTN_STATS__INIT;
    Vase__Envelope e = VASE__ENVELOPE__INIT;
    uint64_t id;
    int r;

    if (!s)
        return -EINVAL;
    const struct vase_layout *l = &s->model->layout;
    size_t count = (size_t)l->kv_heads * len;
    vase__client_lock(s->client);
    if (!values || len == 0 || (kind != VASE_STATS_ACC_ADD && kind != VASE_STATS_WINDOW_SCORES) ||
        layer >= l->layers) {
        r = vase__client_fail(s->client, -EINVAL,
                              "vase_seq_push_stats: layer %u of %u, kind %d, len %u%s", layer,
                              l->layers, (int)kind, len, values ? "" : ", no values");
        goto out;
    }
    /* Attention received and window scores are means of probabilities (the daemon refuses
     * others too, later, as a deferred error). */
    size_t bad = first_not_weight(values, count);
    if (bad < count) {
        r = vase__client_fail(s->client, -EINVAL,
                              "vase_seq_push_stats: the value of KV head %zu, slot %zu is %g",
                              bad / len, bad % len, (double)values[bad]);
        goto out;
    }
    r = vase__seq_precheck(s);
    if (r < 0)
        goto out;
    if (len > s->len) {
        r = vase__client_fail(s->client, -EINVAL,
                              "vase_seq_push_stats: len %u, but sequence %u has %u slots filled",
                              len, s->id, s->len);
        goto out;
    }
    /* Sorting what has arrived keeps refusals of earlier pushes flowing back even when the
     * engine never polls. */
    r = vase__client_check(s->client, vase__chan_drain(s->client->chan));
    if (r < 0)
        goto out;
    r = vase__seq_precheck(s);
    if (r < 0)
        goto out;
    st.seq_id = s->id;
    st.layer = layer;
    st.kind = kind == VASE_STATS_ACC_ADD ? VASE__STATS_KIND__STATS_ACC_ADD
                                         : VASE__STATS_KIND__STATS_WINDOW_SCORES;
    st.len = len;
    st.n_values = count;
    st.values = (float *)values;
    e.body_case = VASE__ENVELOPE__BODY_ATTN_STATS;
    e.attn_stats = &st;
    r = vase__client_check(s->client, vase__chan_send(s->client->chan, &e, &id));
    if (r == 0) {
        vase__client_note_stats(s->client, id, s->id);
        s->last_sent_id = id;
    }
out:
    pthread_mutex_unlock(&s->client->lock);
    return r;
}
