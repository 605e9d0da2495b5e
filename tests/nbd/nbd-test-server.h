/*
 * Starting and stopping a real iocore-nbd for the C tests (the shell tests
 * have nbd-test-lib.sh's source_start and dest_start).  The server runs with
 * --fork --pid-file: its parent exits 0 only after the child listens,
 * has started serving and has written the pid file, so waitpid() on the
 * parent is the readiness signal.
 */
#ifndef IOC_TEST_NBD_TEST_SERVER_H
#define IOC_TEST_NBD_TEST_SERVER_H

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tap.h"
#include "nbd-client.h"

struct ts_srv {
	char dir[200], img[256], sock[256], pidf[256];
	pid_t pid;
	rlim_t nofile;          /* nonzero: the server's limit on open files */
};

static inline const char *ts_server_bin(void)
{
	static char path[512];
	const char *root = getenv("IOC_BUILD_ROOT");

	snprintf(path, sizeof(path), "%s/tools/nbd/iocore-nbd", root ? root : "build");
	return path;
}

/* A fresh directory for one server under base (NULL: the test's tmpdir),
 * with an image of size bytes (0: the caller makes s->img itself). */
static inline void ts_prepare(struct ts_srv *s, const char *base, uint64_t size)
{
	static int seq;

	memset(s, 0, sizeof(*s));
	snprintf(s->dir, sizeof(s->dir), "%.150s/s%d", base ? base : ioc_test_tmpdir(),
		 seq++);
	ASSERT_OK(mkdir(s->dir, 0700));
	snprintf(s->img, sizeof(s->img), "%s/img", s->dir);
	snprintf(s->sock, sizeof(s->sock), "%s/sock", s->dir);
	snprintf(s->pidf, sizeof(s->pidf), "%s/pid", s->dir);
	if (size) {
		int fd = open(s->img, O_CREAT | O_RDWR | O_TRUNC, 0644);

		ASSERT_GE(fd, 0);
		ASSERT_OK(ftruncate(fd, (off_t)size));
		close(fd);
	}
}

/* Start the server on s->img; extra is a NULL-terminated option list.  It
 * listens on s->sock unless extra has -p (TCP instead). */
static inline void ts_start(struct ts_srv *s, const char *const *extra)
{
	const char *argv[48];
	int n = 0, st;
	bool tcp = false;

	for (const char *const *e = extra; e && *e; e++)
		tcp |= strcmp(*e, "-p") == 0;
	argv[n++] = ts_server_bin();
	argv[n++] = "--fork";
	argv[n++] = "--pid-file";
	argv[n++] = s->pidf;
	if (!tcp) {
		argv[n++] = "-U";
		argv[n++] = s->sock;
	}
	for (; extra && *extra && n < 44; extra++)
		argv[n++] = *extra;
	argv[n++] = s->img;
	argv[n] = NULL;
	if (access(argv[0], X_OK) != 0)
		IOC_SKIP("iocore-nbd not built");
	pid_t p = fork();
	ASSERT_GE(p, 0);
	if (p == 0) {
		if (s->nofile) {
			struct rlimit rl = { s->nofile, s->nofile };

			setrlimit(RLIMIT_NOFILE, &rl);
		}
		ioc_test_exec_tool(argv);
		_exit(127);
	}
	ASSERT_EQ(waitpid(p, &st, 0), p);
	ASSERT_TRUE(WIFEXITED(st));
	ASSERT_EQ(WEXITSTATUS(st), 0);
	FILE *f = fopen(s->pidf, "r");
	ASSERT_NOT_NULL(f);
	int pid = 0;
	ASSERT_EQ(fscanf(f, "%d", &pid), 1);
	fclose(f);
	s->pid = pid;
	ioc_test_daemon_started(pid);
}

/* A bounded wait for an exit we caused (see ioc_test_daemon_wait_gone()). */
static inline bool ts_wait_gone(const struct ts_srv *s, int timeout_ms)
{
	return ioc_test_daemon_wait_gone(s->pid, timeout_ms);
}

/* Remove the server's files and directory. */
static inline void ts_stop_files(struct ts_srv *s)
{
	unlink(s->img);
	unlink(s->sock);
	unlink(s->pidf);
	rmdir(s->dir);
}

/* SIGTERM; the server must exit by itself.  Removes the image and dir. */
static inline void ts_stop(struct ts_srv *s)
{
	ASSERT_OK(kill(s->pid, SIGTERM));
	ASSERT_TRUE(ts_wait_gone(s, 10000));
	ts_stop_files(s);
}

static inline void ts_connect(const struct ts_srv *s, struct cl_conn *c,
			      bool structured)
{
	memset(c, 0, sizeof(*c));
	c->fd = cl_connect_unix(s->sock);
	ASSERT_GE(c->fd, 0);
	c->structured = structured;
	ASSERT_EQ(cl_go(c, ""), 0);
}

#endif /* IOC_TEST_NBD_TEST_SERVER_H */
