/* io_uring operations on the loop's ring: placeholder until the backend lands. */
#include <errno.h>

#include "loop-int.h"

void ioc__uring_enable(struct ioc_loop *loop)
{
	loop->ring_enabled = true;
}

void ioc__loop_thread_exit(struct ioc_loop *loop)
{
	(void)loop;
}

void ioc__uring_private_fini(struct ioc_loop *loop)
{
	(void)loop;
}

struct io_uring_sqe *ioc_loop_get_sqe(struct ioc_loop *loop,
				      struct ioc_uring_op *op)
{
	(void)loop;
	(void)op;
	return NULL;
}

bool ioc_loop_has_uring(struct ioc_loop *loop)
{
	(void)loop;
	return false;
}

int ioc_loop_flush_sqes(struct ioc_loop *loop)
{
	(void)loop;
	return 0;
}

static int stub_init(struct ioc_loop *loop)
{
	(void)loop;
	return -ENOSYS;
}

const struct ioc_fdmon_ops ioc__fdmon_uring_ops = {
	.name = "io_uring",
	.init = stub_init,
};
