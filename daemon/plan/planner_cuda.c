/* SPDX-License-Identifier: MIT */

/*
 * The CUDA planner: plans runs over a device arena on that arena's device. Each evictor thread
 * keeps, per device arena, its own stream, kernel workspace and device scratch, grown to the
 * largest job seen. A job copies its block table, ring pages, statistics and draws into the
 * scratch, plans layer by layer into device scratch with vase_plan_cuda(), then, only once every
 * layer has planned, copies the keep lists into the plan pages (device to device) and back for
 * the main thread (h2o's commit reads it), and synchronises the stream, so the plan is complete
 * before the job is posted back. CUDA failures become -errno here, with the runtime's message
 * logged once. planner_nocuda.c replaces this file in a build without CUDA.
 */

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "cuda/device_cuda.h"
#include "evictor.h"
#include "core/log.h"
#include "planner.h"

/* Alignment of the regions of the planner's device scratch. */
#define SCRATCH_ALIGN 256

const bool vase_planner_have_cuda = true;

struct vase_planner {
    const struct vase_arena *arena;
    cudaStream_t stream;
    bool stream_made;
    struct vase_cuda_workspace *ws;
    char *scratch; /* device */
    size_t scratch_bytes;
};

/*
 * Logs a failed runtime call while planning over arena a and returns its -errno. A sticky error
 * (vase_cuda_sticky()) means this process's context on the device is lost: every later call
 * would fail the same way, so it returns -ENOTRECOVERABLE, on which vased exits to be restarted.
 */
static int log_rt(const struct vase_arena *a, cudaError_t e, const char *what) {
    if (vase_cuda_sticky(e))
        return log_error_errno(-ENOTRECOVERABLE,
                               "Arena \"%s\": %s failed: %s (%s), a sticky error: the CUDA "
                               "context of vased on %s is lost.",
                               a->kind, what, cudaGetErrorString(e), cudaGetErrorName(e),
                               a->device_uuid);
    return log_error_errno(vase_cuda_errno(e), "Arena \"%s\": %s failed: %s (%s).", a->kind, what,
                           cudaGetErrorString(e), cudaGetErrorName(e));
}

static void cuda_free(struct vase_planner *p) {
    if (!p)
        return;
    /* Made on this thread's current device, which the planner keeps set. */
    (void)cudaSetDevice(p->arena->device);
    if (p->scratch)
        (void)cudaFree(p->scratch);
    vase_cuda_workspace_free(p->ws);
    if (p->stream_made)
        (void)cudaStreamDestroy(p->stream);
    free(p);
}

static int cuda_new(const struct vase_arena *a, struct vase_planner **ret) {
    cudaError_t e;
    int r;

    if (!a)
        return -EINVAL; /* device memory always belongs to an arena */
    struct vase_planner *p = calloc(1, sizeof(*p));
    if (!p)
        return log_oom();
    p->arena = a;
    e = cudaSetDevice(a->device);
    if (e != cudaSuccess) {
        r = log_rt(a, e, "cudaSetDevice() on an evictor thread");
        goto free_planner;
    }
    e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        r = log_rt(a, e, "cudaStreamCreateWithFlags()");
        goto free_planner;
    }
    p->stream_made = true;
    r = vase_cuda_workspace_new(&p->ws);
    if (r < 0) {
        const char *m = vase_cuda_last_error();
        r = log_error_errno(r, "Arena \"%s\": cannot make a device workspace: %s", a->kind,
                            m ? m : strerror(-r));
        goto free_planner;
    }
    *ret = p;
    return 0;

free_planner:
    cuda_free(p);
    return r;
}

static size_t align_up(size_t n) {
    return (n + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

/*
 * Grows the device scratch to at least bytes (its old contents are not kept). Nothing is
 * allocated or freed per plan or per sequence: the scratch only grows, by half again each time,
 * so a thread reallocates it a few times over the daemon's life (cudaFree() waits for the
 * daemon's own work on the device, never for an engine's), and no plan of this thread is in
 * flight here (publish() synchronised the stream).
 */
static int reserve_scratch(struct vase_planner *p, size_t bytes) {
    if (bytes <= p->scratch_bytes)
        return 0;
    if (p->scratch)
        (void)cudaFree(p->scratch);
    p->scratch = NULL;
    p->scratch_bytes = 0;
    void *s = NULL;
    size_t want = align_up(bytes + bytes / 2);
    cudaError_t e = cudaMalloc(&s, want);
    if (e != cudaSuccess)
        return log_rt(p->arena, e, "cudaMalloc() of plan scratch");
    p->scratch = s;
    p->scratch_bytes = want;
    return 0;
}

/* The regions of one job's device scratch (byte offsets; SIZE_MAX: absent), for layers
 * [l0, l0 + nl) of a run: per_layer floats of statistics or draws per layer. */
struct job_layout {
    size_t pages, ring, acc, scores, exp, gauss, keep, total;
    size_t n_ring;
    uint32_t l0, nl;
    size_t per_layer;
};

static size_t take(struct job_layout *jl, size_t bytes) {
    size_t at = jl->total;
    jl->total += align_up(bytes ? bytes : 1);
    return at;
}

static void layout_job(const struct vase_plan_run *run, uint32_t l0, uint32_t l1,
                       struct job_layout *jl) {
    uint32_t nl = l1 - l0;
    size_t per_layer = (size_t)run->kv_heads * run->n;

    *jl = (struct job_layout){.ring = SIZE_MAX,
                              .acc = SIZE_MAX,
                              .scores = SIZE_MAX,
                              .exp = SIZE_MAX,
                              .gauss = SIZE_MAX,
                              .l0 = l0,
                              .nl = nl,
                              .per_layer = per_layer};
    jl->pages = take(jl, (size_t)run->n_pages * sizeof(uint32_t));
    if (run->ring_pages && run->layout.ring_rows_per_page) {
        jl->n_ring = (2 * (size_t)run->params.window + run->layout.ring_rows_per_page - 1) /
                     run->layout.ring_rows_per_page;
        jl->ring = take(jl, jl->n_ring * sizeof(uint32_t));
    }
    if (run->acc)
        jl->acc = take(jl, nl * per_layer * sizeof(float));
    if (run->scores)
        jl->scores = take(jl, nl * per_layer * sizeof(float));
    if (run->exp_draws)
        jl->exp = take(jl, nl * per_layer * sizeof(float));
    if (run->gauss)
        jl->gauss = take(jl, (size_t)run->head_dim * run->params.rank * sizeof(float));
    jl->keep = take(jl, (size_t)nl * run->kv_heads * run->keep * sizeof(uint32_t));
}

/* Queues a copy of bytes at src to offset at of the scratch; absent regions copy nothing. */
static int h2d(struct vase_planner *p, size_t at, const void *src, size_t bytes) {
    if (at == SIZE_MAX)
        return 0;
    cudaError_t e = cudaMemcpyAsync(p->scratch + at, src, bytes, cudaMemcpyHostToDevice, p->stream);
    return e == cudaSuccess ? 0 : log_rt(p->arena, e, "copying plan inputs to the device");
}

/* Layers [l0, ...) of a [layers][per_layer] host array, or NULL where the run has none. */
static const float *host_range(const float *all, const struct job_layout *jl) {
    return all ? all + jl->l0 * jl->per_layer : NULL;
}

/* Queues the job's inputs on the stream the plans run on (so ordered before them). */
static int copy_inputs(struct vase_planner *p, const struct vase_plan_run *run,
                       const struct job_layout *jl) {
    size_t layer_bytes = jl->per_layer * sizeof(float);
    int r;

    if ((r = h2d(p, jl->pages, run->pages, (size_t)run->n_pages * sizeof(uint32_t))) < 0 ||
        (r = h2d(p, jl->ring, run->ring_pages, jl->n_ring * sizeof(uint32_t))) < 0 ||
        (r = h2d(p, jl->acc, host_range(run->acc, jl), jl->nl * layer_bytes)) < 0)
        return r;
    for (uint32_t i = 0; jl->scores != SIZE_MAX && i < jl->nl; i++)
        if (run->scores[jl->l0 + i] &&
            (r = h2d(p, jl->scores + i * layer_bytes, run->scores[jl->l0 + i], layer_bytes)) < 0)
            return r;
    if ((r = h2d(p, jl->exp, host_range(run->exp_draws, jl), jl->nl * layer_bytes)) < 0 ||
        (r = h2d(p, jl->gauss, run->gauss,
                 (size_t)run->head_dim * run->params.rank * sizeof(float))) < 0)
        return r;
    return 0;
}

/* Where region at of the scratch holds layer l's slice of per-layer floats; NULL: absent. */
static const float *layer_slice(const struct vase_planner *p, const struct job_layout *jl,
                                size_t at, uint32_t l) {
    if (at == SIZE_MAX)
        return NULL;
    return (const float *)(p->scratch + at + (size_t)(l - jl->l0) * jl->per_layer * sizeof(float));
}

/* Layer l's plan input with every pointer into the device copies of the job's inputs. */
static void device_input(const struct vase_planner *p, const struct vase_plan_run *run,
                         const struct job_layout *jl, uint32_t l, struct vase_plan_input *in) {
    uint32_t *d_pages = (uint32_t *)(p->scratch + jl->pages);

    vase_plan_run_input(run, l, in);
    in->k.pages = d_pages;
    in->v.pages = d_pages;
    if (jl->ring != SIZE_MAX)
        in->q.pages = (uint32_t *)(p->scratch + jl->ring);
    if (jl->acc != SIZE_MAX)
        in->acc = layer_slice(p, jl, jl->acc, l);
    if (jl->scores != SIZE_MAX)
        in->scores = run->scores[l] ? layer_slice(p, jl, jl->scores, l) : NULL;
    if (jl->exp != SIZE_MAX)
        in->exp_draws = layer_slice(p, jl, jl->exp, l);
    if (jl->gauss != SIZE_MAX)
        in->gauss = (const float *)(p->scratch + jl->gauss);
}

/* Plans every layer of the job into the scratch's keep region; stops at the first failure. */
static int plan_range(struct vase_planner *p, const struct vase_plan_run *run,
                      const struct job_layout *jl, uint32_t *ret_bad_layer) {
    const struct vase_arena *a = p->arena;
    uint32_t *d_keep = (uint32_t *)(p->scratch + jl->keep);
    size_t lists = (size_t)run->kv_heads * run->keep;

    for (uint32_t l = jl->l0; l < jl->l0 + jl->nl; l++) {
        struct vase_plan_input in;
        device_input(p, run, jl, l, &in);
        int r = vase_plan_cuda(&in, p->ws, p->stream, d_keep + (size_t)(l - jl->l0) * lists);
        if (r < 0) {
            *ret_bad_layer = l;
            /* Bad data (NaN, Inf) is the engine's, reported to it; anything else is ours. */
            if (r == -EINVAL)
                return r;
            const char *m = vase_cuda_last_error();
            log_error_errno(r, "Arena \"%s\": planning layer %u of sequence %u on %s: %s", a->kind,
                            l, run->seq_id, a->device_uuid, m ? m : strerror(-r));
            /* The kernels map every failure to an errno: whether the context survived is
             * asked of the stream, which reports a sticky error to any later call. */
            cudaError_t e = cudaStreamSynchronize(p->stream);
            return vase_cuda_sticky(e) ? log_rt(a, e, "the plan kernels") : r;
        }
    }
    return 0;
}

/* Every layer of the job is planned: publishes the keep lists in the plan pages (device to
 * device), hands the main thread its copy, and waits for both. */
static int publish(struct vase_planner *p, struct vase_plan_run *run, const struct job_layout *jl) {
    const struct vase_arena *a = p->arena;
    const uint32_t *d_keep = (const uint32_t *)(p->scratch + jl->keep);
    uint32_t H = run->kv_heads;
    size_t list = (size_t)run->keep * sizeof(uint32_t);
    cudaError_t e;

    for (uint32_t l = jl->l0; l < jl->l0 + jl->nl; l++)
        for (uint32_t h = 0; h < H; h++) {
            uint32_t i = l * H + h;
            e = cudaMemcpyAsync((char *)run->arena_base + vase_plan_run_list_offset(run, i),
                                d_keep + ((size_t)(l - jl->l0) * H + h) * run->keep, list,
                                cudaMemcpyDeviceToDevice, p->stream);
            if (e != cudaSuccess)
                return log_rt(a, e, "writing plan pages");
        }
    e = cudaMemcpyAsync(run->keep_lists + (size_t)jl->l0 * H * run->keep, d_keep,
                        (size_t)jl->nl * H * list, cudaMemcpyDeviceToHost, p->stream);
    if (e != cudaSuccess)
        return log_rt(a, e, "copying plans to the host");
    /* The reply goes out when the job is posted back: the plan must be complete by then. */
    e = cudaStreamSynchronize(p->stream);
    if (e != cudaSuccess)
        return log_rt(a, e, "cudaStreamSynchronize() after a plan");
    return 0;
}

static int cuda_plan_layers(struct vase_planner *p, struct vase_plan_run *run, uint32_t l0,
                            uint32_t l1, uint32_t *ret_bad_layer) {
    struct job_layout jl;
    int r;

    *ret_bad_layer = l0;
    if (l1 <= l0)
        return 0;
    cudaError_t e = cudaSetDevice(p->arena->device);
    if (e != cudaSuccess)
        return log_rt(p->arena, e, "cudaSetDevice()");
    layout_job(run, l0, l1, &jl);
    r = reserve_scratch(p, jl.total);
    if (r < 0)
        return r;
    r = copy_inputs(p, run, &jl);
    if (r < 0)
        return r;
    r = plan_range(p, run, &jl, ret_bad_layer);
    if (r < 0)
        return r;
    return publish(p, run, &jl);
}

const struct vase_planner_ops vase_planner_cuda_ops = {
    .name = "cuda",
    .thread_new = cuda_new,
    .thread_free = cuda_free,
    .plan_layers = cuda_plan_layers,
};
