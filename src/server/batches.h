/*
 * batches.h - the OpenAI Files and Batch APIs of the server (batches.c):
 * POST/GET /v1/files, GET /v1/files/{id}[/content], DELETE /v1/files/{id},
 * POST/GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel,
 * and the worker thread that runs the batches through the batch runner
 * (src/batch/) at the batch priority, on the same scheduler as interactive
 * requests, which it never delays.
 *
 * Everything lives under sb_srv_params.state_dir (batch.db and files/), so
 * a batch survives a restart: sb_srv_load reopens it and the worker
 * continues whatever was validating, in progress, finalizing or cancelling.
 */
#ifndef SB_SRV_BATCHES_H
#define SB_SRV_BATCHES_H

#include "server/server-impl.h"

/* At the end of sb_srv_load: opens the store and starts the worker (a
 * no-op without state_dir). */
sb_status sb__srv_batches_open(sb_srv *srv, sb_error *err);
/* First thing in sb_srv_stop: the worker takes no more requests and
 * records no answer that comes after this (they are being cancelled). */
void sb__srv_batches_interrupt(sb_srv *srv);
/* After the connections ended: joins the worker, closes the store. */
void sb__srv_batches_close(sb_srv *srv);

/* Route handlers (server.c's table). */
bool sb__srv_files_upload(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *data, size_t n);
enum MHD_Result sb__srv_files_create(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url);
enum MHD_Result sb__srv_files_list(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url);
enum MHD_Result sb__srv_files_get(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url);
enum MHD_Result sb__srv_files_delete(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url);
enum MHD_Result sb__srv_batches_create(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url);
enum MHD_Result sb__srv_batches_list(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url);
enum MHD_Result sb__srv_batches_get(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url);
enum MHD_Result sb__srv_batches_cancel(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url);

#endif
