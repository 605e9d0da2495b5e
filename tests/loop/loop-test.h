/*
 * Shared helpers of the loop tests.  Every test executable runs once per
 * backend: meson sets IOC_FDMON=poll|epoll|io_uring, which the constructor
 * below turns into the backend that opts.fdmon = AUTO picks (a test hook
 * in src/loop/ablation.h; the library reads no environment variable).  A
 * backend the kernel refuses (io_uring denied) makes the case skip.
 */
#ifndef IOC_LOOP_TEST_H
#define IOC_LOOP_TEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/eventfd.h>

#include "iocore/loop.h"
#include "src/loop/ablation.h"
#include "tap.h"

static inline const char *test_backend(void)
{
	const char *s = getenv("IOC_FDMON");

	return s ? s : "auto";
}

__attribute__((constructor)) static void test_backend_select(void)
{
	const char *s = test_backend();

	if (!strcmp(s, "poll"))
		ioc__loop_auto_fdmon = IOC_FDMON_POLL;
	else if (!strcmp(s, "epoll"))
		ioc__loop_auto_fdmon = IOC_FDMON_EPOLL;
	else if (!strcmp(s, "io_uring"))
		ioc__loop_auto_fdmon = IOC_FDMON_IO_URING;
}

/* A loop on the backend under test, or skip. */
static inline struct ioc_loop *test_loop_new(struct ioc_loop_opts *opts)
{
	struct ioc_loop *loop = NULL;
	struct ioc_loop_stats st;
	int r = ioc_loop_new(&loop, opts);

	if (r < 0 && !strcmp(test_backend(), "io_uring"))
		IOC_SKIP("io_uring unavailable");
	ASSERT_OK(r);
	ioc_loop_get_stats(loop, &st);
	if (strcmp(test_backend(), "auto"))
		ASSERT_STR_EQ(st.backend, test_backend());
	return loop;
}

static inline void eventfd_kick(int fd)
{
	uint64_t one = 1;

	ASSERT_EQ(write(fd, &one, sizeof(one)), sizeof(one));
}

static inline uint64_t eventfd_drain(int fd)
{
	uint64_t v = 0;

	if (read(fd, &v, sizeof(v)) != sizeof(v))
		return 0;
	return v;
}

/* Poll until *flag is true or a generous deadline passes (then fail). */
#define POLL_UNTIL(loop, cond)                                            \
	do {                                                              \
		int64_t dl_ = ioc_now_ns() + 20ll * 1000000000;           \
		while (!(cond)) {                                         \
			ASSERT_LT(ioc_now_ns(), dl_);                     \
			ioc_loop_poll((loop), true);                      \
		}                                                         \
	} while (0)

#endif
