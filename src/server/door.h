/*
 * door.h - the listening socket and the connections still sending their
 * first request head (see door.c): header deadline, connection cap, and
 * JSON refusals of heads libmicrohttpd would answer in HTML.
 */
#ifndef SB_SRV_DOOR_H
#define SB_SRV_DOOR_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "switchboard.h"

typedef struct sb_srv sb_srv;
typedef struct sb_srv_door sb_srv_door;

/* Binds and listens on addr (srv->p gives the limits). */
sb_status sb_srv_door_open(sb_srv *srv, const struct sockaddr *addr, socklen_t len, sb_srv_door **out, sb_error *err);
/* Starts accepting; complete heads go to daemon (started with
 * MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC and sb_srv_door_on_connection). */
sb_status sb_srv_door_run(sb_srv_door *d, struct MHD_Daemon *daemon, sb_error *err);
uint16_t sb_srv_door_port(const sb_srv_door *d);
/* Half the connection cap or more in use: answers should close their connection. */
bool sb_srv_door_busy(const sb_srv_door *d);
/* MHD_OPTION_NOTIFY_CONNECTION callback (cls: the door): counts connections. */
void sb_srv_door_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                               enum MHD_ConnectionNotificationCode toe);
/* Stops accepting and closes what waits at the door (before MHD_stop_daemon). NULL is a no-op. */
void sb_srv_door_stop(sb_srv_door *d);
/* Stops (if still running) and frees, after MHD_stop_daemon: libmicrohttpd
 * reports closed connections to sb_srv_door_on_connection until then. */
void sb_srv_door_free(sb_srv_door *d);

#endif
