/*
 * Test helper: the receiver writes through a node; a test keeps an fd of
 * its image (a memfd, a temporary file) to check it, and wraps the same
 * file in a file node (reopened through /proc/self/fd) for the receiver.
 */
#ifndef IOC_MIG_TEST_NODE_H
#define IOC_MIG_TEST_NODE_H

#include <stdio.h>

#include "iocore/blk.h"
#include "node/node.h"

struct mt_node {
	struct ioc_node_graph *g;
	struct ioc_blk *blk;
	struct ioc_node *n;
};

/* 0 or -errno. */
static inline int mt_node_open(struct mt_node *t, int fd)
{
	struct ioc_blk_opts bo = { 0 };
	char path[64];
	int r;

	memset(t, 0, sizeof(*t));
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if ((r = ioc_node_graph_new(&t->g)) < 0)
		return r;
	if ((r = ioc_blk_open(&t->blk, path, &bo)) < 0 ||
	    (r = ioc_node_wrap_blk(t->g, t->blk, "image", &t->n)) < 0) {
		if (t->blk)
			ioc_blk_close(t->blk);
		ioc_node_graph_free(t->g);
		return r;
	}
	return 0;
}

static inline void mt_node_close(struct mt_node *t)
{
	ioc_node_unref(t->n);
	ioc_blk_close(t->blk);
	ioc_node_graph_free(t->g);
}

#endif
