/*
 * Ceph RBD block nodes: the driver (rbd.c, built only with librbd) and
 * the parser of QEMU's "rbd:" file names (rbd-filename.c, always built:
 * the daemon and iocore-nbd accept the syntax, and it has a fuzz target,
 * whether or not the driver is there).  Private to the daemon layers.
 */
#ifndef IOC_NODE_RBD_H
#define IOC_NODE_RBD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * Parse "rbd:pool[/namespace]/image[@snapshot][:key=value...]" as QEMU's
 * qemu_rbd_parse_filename() does: '\' escapes the next character (so
 * "\:", "\@", "\/" are literal), the keys "conf" and "id" become the
 * "conf" and "user" options, any other key=value is a Ceph configuration
 * setting, collected in the object "__org.iocore_conf" (QEMU's hidden
 * "=keyvalue-pairs").  Returns the BlockdevOptionsRbd members (plus
 * "driver": "rbd") as a new object, or NULL with err set in QEMU's words
 * ("Pool name is required", "conf option %s has no value"...).
 */
json_t *ioc__rbd_parse_filename(const char *filename, char *err, size_t errlen);

/* True when filename starts with "rbd:" (the protocol prefix). */
bool ioc__rbd_is_filename(const char *filename);

#ifdef IOC_HAVE_RBD_DRIVER
struct ioc_node_drv;
/* driver "rbd" (rbd.c): the node layer's table lists it. */
extern const struct ioc_node_drv ioc__node_rbd_drv;
#define IOC_NODE_RBD_DRV_ENTRY &ioc__node_rbd_drv,
#else
#define IOC_NODE_RBD_DRV_ENTRY
#endif

#endif /* IOC_NODE_RBD_H */
