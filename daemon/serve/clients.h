/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Clients arriving and leaving over the session socket: connections admitted or refused by the
 * allow-list, pending sessions waiting for their hello, the welcome, and the end of a client
 * whose session closed.
 */

#include <stdbool.h>

struct vased;
struct vased_client;

/* Accepts the connections waiting on the session listener (a bounded number per call): each is
 * refused at once or becomes a pending session, whose hello is read right away if it came. */
void vase_clients_accept(struct vased *d);
/* The pending session on fd said something (if it is still pending): its hello makes it a
 * client, anything else refuses it. */
void vase_clients_on_pending(struct vased *d, int fd);
/* Logs the summaries of session lines held back (begun and ended, refused) once their
 * interval has ended, even if no session follows. For the timer. */
void vase_clients_flush_logs(struct vased *d, double now);
/* Closes the pending sessions whose hello is overdue at now. */
void vase_clients_expire_pending(struct vased *d, double now);
/* Closes every pending session (shutdown). */
void vase_clients_close_pending(struct vased *d);

/* Client c's session socket (fd) became readable or closed, with poll events revents: a packet
 * is ignored, an end of file or error ends the client (its sequences close or wait for their
 * plan, its pages return, a client_leave event goes out). Nothing happens if c is no longer
 * registered on fd. */
void vase_clients_on_session(struct vased *d, struct vased_client *c, int fd, short revents);

/* Whether a message about client c may be logged now (its rate limit); when an interval of
 * suppressed messages ended, logs how many were held back first. */
bool vase_clients_log_ok(struct vased_client *c);
