/* SPDX-License-Identifier: MIT */

/*
 * The ZAP handler's socket. Invariants: every request read gets exactly one reply (a REP
 * socket cannot read the next one otherwise); nothing here blocks; frames longer than their
 * buffers are cut and make the request ill-formed, never overflow.
 */

#include <errno.h>
#include <string.h>
#include <zmq.h>

#include "log.h"
#include "zap.h"

int vase_zap_open(void *zmq_ctx, void **ret) {
    int zero = 0;
    void *s = zmq_socket(zmq_ctx, ZMQ_REP);
    if (!s)
        return log_error_errno(-zmq_errno(), "Failed to create the ZAP socket: %m");
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(s, VASE_ZAP_ENDPOINT) < 0) {
        int r = log_error_errno(-zmq_errno(), "Failed to bind %s: %m", VASE_ZAP_ENDPOINT);
        zmq_close(s);
        return r;
    }
    *ret = s;
    return 0;
}

/* Copies frame i of a request into the field it fills, as a string; false if it was cut. */
static bool take_frame(struct vase_zap_request *req, int i, const void *data, size_t len) {
    char *dst = NULL;
    size_t cap = 0;
    switch (i) {
    case 1:
        dst = req->request_id;
        cap = sizeof(req->request_id);
        break;
    case 2:
        dst = req->domain;
        cap = sizeof(req->domain);
        break;
    case 3:
        dst = req->address;
        cap = sizeof(req->address);
        break;
    default:
        return true;
    }
    if (len >= cap)
        return false;
    memcpy(dst, data, len);
    dst[len] = '\0';
    if (i == 1)
        req->request_id_len = len;
    return true;
}

int vase_zap_recv(void *zap, struct vase_zap_request *ret) {
    *ret = (struct vase_zap_request){.well_formed = true};
    int more = 1, i = 0;
    size_t more_len = sizeof(more);
    for (; more; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, zap, i == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&m);
            if (i == 0)
                return e == EAGAIN ? -EAGAIN : -e;
            ret->well_formed = false;
            break;
        }
        if (i == 0 && (zmq_msg_size(&m) != 3 || memcmp(zmq_msg_data(&m), "1.0", 3) != 0))
            ret->well_formed = false;
        if (!take_frame(ret, i, zmq_msg_data(&m), zmq_msg_size(&m)))
            ret->well_formed = false;
        zmq_msg_close(&m);
        if (zmq_getsockopt(zap, ZMQ_RCVMORE, &more, &more_len) < 0)
            more = 0;
    }
    if (i < 6) /* version, request id, domain, address, routing id, mechanism */
        ret->well_formed = false;
    return 0;
}

void vase_zap_reply(void *zap, const struct vase_zap_request *req, bool allow) {
    const char *status = !req->well_formed ? "500" : allow ? "200" : "400";
    const char *text = !req->well_formed ? "malformed request" : allow ? "OK" : "not allowed";
    if (zmq_send(zap, "1.0", 3, ZMQ_SNDMORE) < 0 ||
        zmq_send(zap, req->request_id, req->request_id_len, ZMQ_SNDMORE) < 0 ||
        zmq_send(zap, status, 3, ZMQ_SNDMORE) < 0 ||
        zmq_send(zap, text, strlen(text), ZMQ_SNDMORE) < 0 ||
        zmq_send(zap, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(zap, "", 0, 0) < 0)
        log_warning_errno(-zmq_errno(), "Cannot answer a ZAP request: %m");
}
