/* SPDX-License-Identifier: MIT */

/*
 * The evictor thread pool. Invariants: a job belongs to the queue, then to one thread, then to
 * the results pipe, then to the main thread, which frees it; a run's fields that threads read
 * do not change while any of its jobs is queued or running, and each thread writes only the
 * keep lists and plan-page entries of its own layers. The queue (fairq.c: uids in turn, then
 * each uid's clients in turn, one run at a time) is the only shared structure and the only thing
 * the mutex guards; the count of runs in flight is the main thread's. Jobs travel back as a pointer
 * in a message over an inproc PUSH/PULL pair with unlimited high-water marks, so a thread never
 * blocks on the main thread.
 */

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>
#include <zmq.h>

#include "core/arena.h"
#include "evictor.h"
#include "core/log.h"
#include "planner.h"

struct job {
    struct vase_fairq_job node; /* its place in the queue */
    struct vase_plan_run *run;
    uint32_t l0, l1;
    int result;
    uint32_t bad_layer;
};

struct vase_evictor {
    void *zmq_ctx;
    void *pull;
    unsigned nthreads;
    struct worker *workers;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct vase_fairq queue; /* guarded by lock */
    bool stop;               /* guarded by lock */
    uint32_t runs_in_flight; /* main thread: submitted, not yet received whole */
};

static struct job *job_of(struct vase_fairq_job *node) {
    return (struct job *)((char *)node - offsetof(struct job, node));
}

/* Planner slots of a thread: one per device arena, by arena id (vased has at most 8 arenas),
 * and one shared by all host memory, whose planner state does not depend on the arena. */
#define MAX_DEVICE_ARENAS 8
#define HOST_SLOT MAX_DEVICE_ARENAS

struct worker {
    struct vase_evictor *ev;
    void *push; /* made by vase_evictor_new(), used only by this worker's thread until joined */
    pthread_t thread;
    bool started;
    /* This thread's planners, made on its first job for their slot (thread only). */
    struct vase_planner *planners[MAX_DEVICE_ARENAS + 1];
    const struct vase_planner_ops *planner_ops[MAX_DEVICE_ARENAS + 1];
};

/* One job on the calling worker, by the planner of the run's arena (planner.h). */
static int run_job(struct worker *w, struct job *j) {
    const struct vase_arena *a = j->run->arena;
    unsigned slot = HOST_SLOT;

    j->bad_layer = j->l0;
    if (a && vase_arena_on_device(a)) {
        if (a->id >= MAX_DEVICE_ARENAS)
            return log_error_errno(-EINVAL, "Arena %u: no planner slot for it.", a->id);
        slot = a->id;
    }
    if (!w->planners[slot]) {
        /* A failure is retried at the next job: the device may come back (logged each time). */
        const struct vase_planner_ops *ops = vase_planner_for(a);
        int r = ops->thread_new(a, &w->planners[slot]);
        if (r < 0)
            return r;
        w->planner_ops[slot] = ops;
    }
    return w->planner_ops[slot]->plan_layers(w->planners[slot], j->run, j->l0, j->l1,
                                             &j->bad_layer);
}

static void *thread_main(void *arg) {
    struct worker *w = arg;
    struct vase_evictor *ev = w->ev;

    for (;;) {
        struct vase_fairq_job *node;
        pthread_mutex_lock(&ev->lock);
        while (!ev->stop && vase_fairq_is_empty(&ev->queue))
            pthread_cond_wait(&ev->cond, &ev->lock);
        if (ev->stop) {
            pthread_mutex_unlock(&ev->lock);
            break;
        }
        vase_fairq_pop(&ev->queue, &node);
        pthread_mutex_unlock(&ev->lock);

        struct job *j = job_of(node);
        j->result = run_job(w, j);
        /* With no high-water mark an inproc send only fails on EINTR or a terminated
         * context; the main thread must not lose a job, or it never learns the run is done. */
        while (zmq_send(w->push, &j, sizeof(j), 0) < 0 && zmq_errno() == EINTR)
            ;
    }
    /* The arenas outlive the evictor (vased frees them last), so planners may still name them. */
    for (unsigned i = 0; i <= MAX_DEVICE_ARENAS; i++)
        if (w->planners[i])
            w->planner_ops[i]->thread_free(w->planners[i]);
    return NULL;
}

int vase_evictor_new(void *zmq_ctx, unsigned nthreads, struct vase_evictor **ret) {
    int zero = 0, r;

    if (!zmq_ctx || nthreads == 0 || !ret)
        return -EINVAL;
    struct vase_evictor *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return -ENOMEM;
    ev->zmq_ctx = zmq_ctx;
    ev->nthreads = nthreads;
    pthread_mutex_init(&ev->lock, NULL);
    pthread_cond_init(&ev->cond, NULL);

    ev->pull = zmq_socket(zmq_ctx, ZMQ_PULL);
    if (!ev->pull) {
        r = log_error_errno(-zmq_errno(), "Failed to create the evictor results socket: %m");
        goto free_evictor;
    }
    zmq_setsockopt(ev->pull, ZMQ_RCVHWM, &zero, sizeof(zero));
    zmq_setsockopt(ev->pull, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(ev->pull, VASE_EVICTOR_ENDPOINT) < 0) {
        r = log_error_errno(-zmq_errno(), "Failed to bind %s: %m", VASE_EVICTOR_ENDPOINT);
        goto free_evictor;
    }
    ev->workers = calloc(nthreads, sizeof(struct worker));
    if (!ev->workers) {
        r = log_oom();
        goto free_evictor;
    }
    for (unsigned i = 0; i < nthreads; i++) {
        struct worker *w = &ev->workers[i];
        w->ev = ev;
        w->push = zmq_socket(zmq_ctx, ZMQ_PUSH);
        if (!w->push) {
            r = log_error_errno(-zmq_errno(), "Failed to create an evictor socket: %m");
            goto free_evictor;
        }
        zmq_setsockopt(w->push, ZMQ_SNDHWM, &zero, sizeof(zero));
        zmq_setsockopt(w->push, ZMQ_LINGER, &zero, sizeof(zero));
        if (zmq_connect(w->push, VASE_EVICTOR_ENDPOINT) < 0) {
            r = log_error_errno(-zmq_errno(), "Failed to connect %s: %m", VASE_EVICTOR_ENDPOINT);
            goto free_evictor;
        }
    }
    /* Sockets first, threads second: pthread_create() is the memory barrier ZeroMQ asks for
     * when a socket moves to another thread. */
    for (unsigned i = 0; i < nthreads; i++) {
        r = pthread_create(&ev->workers[i].thread, NULL, thread_main, &ev->workers[i]);
        if (r != 0) {
            r = log_error_errno(-r, "Failed to start evictor thread %u: %m", i);
            goto free_evictor;
        }
        ev->workers[i].started = true;
    }
    *ret = ev;
    return 0;

free_evictor:
    vase_evictor_free(ev);
    return r;
}

struct vase_evictor *vase_evictor_free(struct vase_evictor *ev) {
    if (!ev)
        return NULL;
    pthread_mutex_lock(&ev->lock);
    ev->stop = true;
    pthread_cond_broadcast(&ev->cond);
    pthread_mutex_unlock(&ev->lock);
    for (unsigned i = 0; ev->workers && i < ev->nthreads; i++) {
        if (ev->workers[i].started)
            pthread_join(ev->workers[i].thread, NULL);
        if (ev->workers[i].push)
            zmq_close(ev->workers[i].push);
    }
    free(ev->workers);

    /* Jobs nobody started, then jobs finished but not yet received. */
    struct vase_fairq_job *node;
    while (vase_fairq_pop(&ev->queue, &node) > 0)
        free(job_of(node));
    if (ev->pull) {
        struct job *j;
        while (zmq_recv(ev->pull, &j, sizeof(j), ZMQ_DONTWAIT) == (int)sizeof(j))
            free(j);
        zmq_close(ev->pull);
    }
    pthread_cond_destroy(&ev->cond);
    pthread_mutex_destroy(&ev->lock);
    free(ev);
    return NULL;
}

void *vase_evictor_socket(struct vase_evictor *ev) {
    return ev->pull;
}

unsigned vase_evictor_threads(const struct vase_evictor *ev) {
    return ev->nthreads;
}

static double now_monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int vase_evictor_submit(struct vase_evictor *ev, struct vase_plan_run *run) {
    /* One job per thread, but never fewer than a few layers per job: a job has a fixed cost
     * (a message, a wake-up) that a single small layer would not repay. */
    uint32_t layers = run->layers;
    uint32_t njobs = ev->nthreads < layers ? ev->nthreads : layers;
    struct vase_fairq_job *first = NULL, **link = &first;

    if (njobs == 0)
        return -EINVAL;
    for (uint32_t i = 0; i < njobs; i++) {
        struct job *j = calloc(1, sizeof(*j));
        if (!j) {
            while (first) {
                struct vase_fairq_job *n = first->next;
                free(job_of(first));
                first = n;
            }
            return -ENOMEM;
        }
        j->run = run;
        j->l0 = (uint32_t)((uint64_t)layers * i / njobs);
        j->l1 = (uint32_t)((uint64_t)layers * (i + 1) / njobs);
        *link = &j->node;
        link = &j->node.next;
    }
    run->jobs_total = njobs;
    run->jobs_done = 0;
    run->error = 0;
    run->started = now_monotonic();

    pthread_mutex_lock(&ev->lock);
    /* Cannot fail: the run has at least one job. */
    vase_fairq_push(&ev->queue, &run->queued, run->uid, run->tenant, first);
    /* One wake-up per job: a broadcast for a one-job run would wake every thread to find the
     * queue empty again, and on a small machine those wake-ups delay the one that matters. */
    for (uint32_t i = 0; i < njobs; i++)
        pthread_cond_signal(&ev->cond);
    pthread_mutex_unlock(&ev->lock);
    ev->runs_in_flight++;
    return 0;
}

void vase_evictor_get_counts(struct vase_evictor *ev, struct vase_evictor_counts *ret) {
    struct vase_fairq_counts c;

    pthread_mutex_lock(&ev->lock);
    vase_fairq_get_counts(&ev->queue, &c);
    pthread_mutex_unlock(&ev->lock);
    /* Every queued run is in flight, and only this thread changes runs_in_flight. */
    *ret = (struct vase_evictor_counts){
        .plans_queued = c.runs_queued,
        .plans_running = ev->runs_in_flight - c.runs_queued,
        .clients_waiting = c.tenants_waiting,
    };
}

uint32_t vase_evictor_count_queued(struct vase_evictor *ev, uint32_t tenant) {
    pthread_mutex_lock(&ev->lock);
    uint32_t n = vase_fairq_count_tenant(&ev->queue, tenant);
    pthread_mutex_unlock(&ev->lock);
    return n;
}

int vase_evictor_receive(struct vase_evictor *ev, struct vase_plan_run **ret_run) {
    struct job *j;
    int n = zmq_recv(ev->pull, &j, sizeof(j), ZMQ_DONTWAIT);
    if (n < 0)
        return zmq_errno() == EAGAIN ? -EAGAIN : -zmq_errno();
    if (n != (int)sizeof(j))
        return 0; /* Not ours: only evictor threads connect to this inproc endpoint. */

    struct vase_plan_run *run = j->run;
    if (j->result < 0 && (!run->error || j->bad_layer < run->error_layer)) {
        run->error = j->result;
        run->error_layer = j->bad_layer;
    }
    free(j);
    if (++run->jobs_done < run->jobs_total)
        return 0;
    ev->runs_in_flight--;
    run->seconds = now_monotonic() - run->started;
    *ret_run = run;
    return 1;
}
