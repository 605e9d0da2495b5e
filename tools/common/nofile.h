/* Servers hold an fd per client, and a vhost-user device several (its
 * socket, guest memory, two eventfds a queue): raise the soft limit on
 * open files to the hard one, as far as the system lets (not part of
 * libiocore). */
#ifndef IOC_TOOLS_NOFILE_H
#define IOC_TOOLS_NOFILE_H

void ioc_tool_raise_nofile(void);

#endif
