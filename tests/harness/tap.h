/*
 * iocore's test harness: one executable per test file, TAP on stdout.
 *
 *   static void test_thing(void) { ASSERT_EQ(f(1), 2); }
 *   IOC_TEST_MAIN(
 *       IOC_TEST(test_thing),
 *   )
 *
 * Every ASSERT_* prints both operands with their source text and stops the
 * executable with status 1; they are not assert(3), so NDEBUG leaves them
 * on.  IOC_SKIP("why") ends the current case as skipped; when every case of
 * a file is skipped the executable exits 77 (liburing's convention for a
 * kernel that lacks a feature).  Meson 1.0's TAP parser calls any non-zero
 * exit an error and reads the skip from the TAP stream instead, so under
 * meson (test_env sets IOC_TAP_ONLY=1) the skip exits 0.
 * IOC_SKIP_ALL("why") skips the whole file before any case runs.
 *
 * Never synchronise on sleep(): use joins, eventfds or barriers.
 */
#ifndef IOC_TEST_TAP_H
#define IOC_TEST_TAP_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ioc_test {
	const char *name;
	void (*fn)(void);
};

#define IOC_TEST(f) { #f, f }

/* State of the running case (one test file is one process). */
static jmp_buf ioc_test_skip_jmp;
static const char *ioc_test_skip_reason;
static int ioc_test_index;
static const char *ioc_test_name;

static inline void ioc_test_diag(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));
static inline void ioc_test_diag(const char *fmt, ...)
{
	va_list ap;

	fputs("# ", stdout);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
}

/* Daemons a test started (servers run with --fork): a failing ASSERT ends
 * the executable with _exit(), so nothing else would stop them, and one
 * failed case would leave servers holding memory and sockets while the
 * rest of the suite runs.  ioc_test_fail() kills those still registered,
 * in the process that registered them (a forked child that fails leaves
 * them to its parent, which fails in turn).  A daemon is registered once
 * started and forgotten once seen gone. */
#define IOC_TEST_MAX_DAEMONS 32
static pid_t ioc_test_daemons[IOC_TEST_MAX_DAEMONS];
static pid_t ioc_test_daemons_owner;

static inline void ioc_test_daemon_started(pid_t pid)
{
	ioc_test_daemons_owner = getpid();
	for (int i = 0; i < IOC_TEST_MAX_DAEMONS; i++) {
		if (!ioc_test_daemons[i]) {
			ioc_test_daemons[i] = pid;
			return;
		}
	}
}

static inline void ioc_test_daemon_gone(pid_t pid)
{
	for (int i = 0; i < IOC_TEST_MAX_DAEMONS; i++)
		if (ioc_test_daemons[i] == pid)
			ioc_test_daemons[i] = 0;
}

/* Whether a daemon is gone: exited, or a zombie not yet reaped by init
 * whose other threads are gone too.  It is not our child (its parent
 * was), so it cannot be waited for.  A leader shows Z while the rest of
 * its thread group is still exiting, and the files they share stay open
 * until the last of them is released (out of /proc/PID/task). */
static inline bool ioc_test_daemon_exited(pid_t pid)
{
	char path[64], st[256] = "";
	FILE *f;

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return true;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (f) {
		if (!fgets(st, sizeof(st), f))
			st[0] = 0;
		fclose(f);
	}
	char *rp = strrchr(st, ')');
	if (!(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X')))
		return false;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	int threads = 0;

	if (!d)
		return true;
	for (struct dirent *de; (de = readdir(d));)
		threads += de->d_name[0] != '.';
	closedir(d);
	return threads <= 1;
}

/* Poll for a daemon's exit (and forget it): a bounded wait for an exit the
 * test caused, not synchronisation.  False after timeout_ms. */
static inline bool ioc_test_daemon_wait_gone(pid_t pid, int timeout_ms)
{
	for (int i = 0; i < timeout_ms; i++) {
		if (ioc_test_daemon_exited(pid)) {
			ioc_test_daemon_gone(pid);
			return true;
		}
		usleep(1000);
	}
	return false;
}

static inline void ioc_test_kill_daemons(void)
{
	if (getpid() != ioc_test_daemons_owner)
		return;
	for (int i = 0; i < IOC_TEST_MAX_DAEMONS; i++)
		if (ioc_test_daemons[i] > 0)
			kill(ioc_test_daemons[i], SIGKILL);
}

/* The scratch directory of ioc_test_tmpdir(), in the process that made it. */
static char ioc_test_tmpdir_path[256];
static pid_t ioc_test_tmpdir_owner;

/* name under dfd and all below it; links are removed, never followed. */
static inline void ioc_test_rm_tree(int dfd, const char *name)
{
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

	if (d) {
		for (struct dirent *de; (de = readdir(d));) {
			if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
				continue;
			if (unlinkat(fd, de->d_name, 0) < 0 && (errno == EISDIR || errno == EPERM))
				ioc_test_rm_tree(fd, de->d_name);
		}
		closedir(d);
	} else if (fd >= 0) {
		close(fd);
	}
	unlinkat(dfd, name, AT_REMOVEDIR);
}

static inline __attribute__((noreturn)) void
ioc_test_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	printf("not ok %d - %s\n", ioc_test_index, ioc_test_name ? ioc_test_name : "?");
	printf("# %s:%d: ", file, line);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
	fflush(stderr);
	ioc_test_kill_daemons();
	/* _exit() runs no atexit handler: the scratch files go here. */
	if (ioc_test_tmpdir_path[0] && getpid() == ioc_test_tmpdir_owner)
		ioc_test_rm_tree(AT_FDCWD, ioc_test_tmpdir_path);
	_exit(1);
}

#define IOC_SKIP(reason)                                                  \
	do {                                                              \
		ioc_test_skip_reason = (reason);                          \
		longjmp(ioc_test_skip_jmp, 1);                            \
	} while (0)

#define IOC_ASSERT_OP_(type, fmt, a, op, b)                               \
	do {                                                              \
		type ioc_a_ = (type)(a);                                  \
		type ioc_b_ = (type)(b);                                  \
		if (!(ioc_a_ op ioc_b_))                                  \
			ioc_test_fail(__FILE__, __LINE__,                 \
				"%s %s %s: %" fmt " %s %" fmt,            \
				#a, #op, #b, ioc_a_, #op, ioc_b_);        \
	} while (0)

/* Signed integers (including -errno results). */
#define ASSERT_EQ(a, b) IOC_ASSERT_OP_(intmax_t, PRIdMAX, a, ==, b)
#define ASSERT_NE(a, b) IOC_ASSERT_OP_(intmax_t, PRIdMAX, a, !=, b)
#define ASSERT_LT(a, b) IOC_ASSERT_OP_(intmax_t, PRIdMAX, a, <, b)
#define ASSERT_LE(a, b) IOC_ASSERT_OP_(intmax_t, PRIdMAX, a, <=, b)
#define ASSERT_GT(a, b) IOC_ASSERT_OP_(intmax_t, PRIdMAX, a, >, b)
#define ASSERT_GE(a, b) IOC_ASSERT_OP_(intmax_t, PRIdMAX, a, >=, b)
/* Unsigned integers (sizes, offsets, counters). */
#define ASSERT_UEQ(a, b) IOC_ASSERT_OP_(uintmax_t, PRIuMAX, a, ==, b)
#define ASSERT_ULE(a, b) IOC_ASSERT_OP_(uintmax_t, PRIuMAX, a, <=, b)
#define ASSERT_UGE(a, b) IOC_ASSERT_OP_(uintmax_t, PRIuMAX, a, >=, b)
#define ASSERT_ULT(a, b) IOC_ASSERT_OP_(uintmax_t, PRIuMAX, a, <, b)
#define ASSERT_UGT(a, b) IOC_ASSERT_OP_(uintmax_t, PRIuMAX, a, >, b)
#define ASSERT_PTR_EQ(a, b) IOC_ASSERT_OP_(const void *, "p", a, ==, b)
#define ASSERT_PTR_NE(a, b) IOC_ASSERT_OP_(const void *, "p", a, !=, b)
#define ASSERT_NULL(a) ASSERT_PTR_EQ(a, NULL)
#define ASSERT_NOT_NULL(a) ASSERT_PTR_NE(a, NULL)

#define ASSERT_TRUE(x)                                                    \
	do {                                                              \
		if (!(x))                                                 \
			ioc_test_fail(__FILE__, __LINE__,                 \
				"expected true: %s", #x);                 \
	} while (0)
#define ASSERT_FALSE(x)                                                   \
	do {                                                              \
		if (x)                                                    \
			ioc_test_fail(__FILE__, __LINE__,                 \
				"expected false: %s", #x);                \
	} while (0)

/* A 0-or-negative-errno result that must be success. */
#define ASSERT_OK(x)                                                      \
	do {                                                              \
		errno = 0;                                                \
		long long ioc_r_ = (long long)(x);                        \
		int ioc_e_ = errno;                                       \
		if (ioc_r_ < 0)                                           \
			ioc_test_fail(__FILE__, __LINE__,                 \
				"%s failed: %lld (%s as -errno; errno %s)", \
				#x, ioc_r_, strerror((int)-ioc_r_),       \
				strerror(ioc_e_));                        \
	} while (0)

#define ASSERT_STR_EQ(a, b)                                               \
	do {                                                              \
		const char *ioc_a_ = (a), *ioc_b_ = (b);                  \
		if (!ioc_a_ || !ioc_b_ || strcmp(ioc_a_, ioc_b_) != 0)    \
			ioc_test_fail(__FILE__, __LINE__,                 \
				"%s == %s: \"%s\" vs \"%s\"", #a, #b,     \
				ioc_a_ ? ioc_a_ : "(null)",               \
				ioc_b_ ? ioc_b_ : "(null)");              \
	} while (0)

/* Compares n bytes and names the first offset that differs. */
#define ASSERT_MEM_EQ(a, b, n)                                            \
	do {                                                              \
		const unsigned char *ioc_a_ = (const void *)(a);          \
		const unsigned char *ioc_b_ = (const void *)(b);          \
		size_t ioc_n_ = (n);                                      \
		for (size_t ioc_i_ = 0; ioc_i_ < ioc_n_; ioc_i_++)        \
			if (ioc_a_[ioc_i_] != ioc_b_[ioc_i_])             \
				ioc_test_fail(__FILE__, __LINE__,         \
					"%s and %s differ at byte %zu " \
					"of %zu: 0x%02x vs 0x%02x",      \
					#a, #b, ioc_i_, ioc_n_,           \
					ioc_a_[ioc_i_], ioc_b_[ioc_i_]);  \
	} while (0)

/* At exit of the process that made it: the directory goes if it is empty
 * (a forked child that exits leaves it to its parent). */
static inline void ioc_test_tmpdir_rmdir(void)
{
	if (getpid() == ioc_test_tmpdir_owner)
		rmdir(ioc_test_tmpdir_path);
}

/* A directory for scratch files: $IOC_TEST_TMPDIR, else /dev/shm when it
 * exists (tmpfs), else /tmp.  Returns a new directory; the caller removes
 * what it creates in it, and the directory itself is removed at exit. */
static inline const char *ioc_test_tmpdir(void)
{
	char *dir = ioc_test_tmpdir_path;
	const char *base = getenv("IOC_TEST_TMPDIR");

	if (dir[0])
		return dir;
	if (!base)
		base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(dir, sizeof(ioc_test_tmpdir_path), "%s/ioc-test-XXXXXX", base);
	if (!mkdtemp(dir))
		ioc_test_fail(__FILE__, __LINE__, "mkdtemp(%s): %s", dir, strerror(errno));
	ioc_test_tmpdir_owner = getpid();
	atexit(ioc_test_tmpdir_rmdir);
	return dir;
}

/* An upper bound for stress loops, so a sanitizer build (10-20x slower)
 * does the same kind of work in bounded time.  IOC_TEST_SCALE=0.1 shrinks;
 * make check-aarch64 raises it under emulation.  The stress tests scale
 * their time caps (deadlines, in ms) with it too, so a larger scale runs
 * longer instead of stopping at the same deadline. */
static inline unsigned long ioc_test_scaled(unsigned long n)
{
	const char *s = getenv("IOC_TEST_SCALE");
	double f = s ? atof(s) : 1.0;
	unsigned long r = (unsigned long)((double)n * f);

	return r ? r : 1;
}

/* The command prefix that runs the project's own binaries ("" natively):
 * in a cross build meson runs each test under the cross file's exe_wrapper
 * (qemu-aarch64) and passes it in MESON_EXE_WRAPPER, and a test that starts
 * a tool (iocore-nbd, iocore-zip) must start it the same way. */
static inline const char *ioc_test_exe_wrapper(void)
{
	const char *w = getenv("MESON_EXE_WRAPPER");

	return w ? w : "";
}

/* In a forked child: exec one of the project's own binaries, argv[0] its
 * path, through the exe_wrapper in a cross build.  Returns only on error. */
static inline void ioc_test_exec_tool(const char *const *argv)
{
	if (*ioc_test_exe_wrapper()) {
		/* The shell splits the wrapper into words. */
		const char *wargv[64] = { "sh", "-c",
			"exec $MESON_EXE_WRAPPER \"$@\"", "sh" };

		for (int i = 0; argv[i] && i < 59; i++)
			wargv[4 + i] = argv[i];
		execv("/bin/sh", (char **)wargv);
	} else {
		execv(argv[0], (char **)argv);
	}
}

static inline int ioc_test_skip_status(void)
{
	return getenv("IOC_TAP_ONLY") ? 0 : 77;
}

#define IOC_SKIP_ALL(reason)                                              \
	do {                                                              \
		printf("1..0 # SKIP %s\n", (reason));                     \
		fflush(stdout);                                           \
		exit(ioc_test_skip_status());                             \
	} while (0)

static inline int ioc_test_run(const struct ioc_test *tests, int n)
{
	volatile int skipped = 0; /* modified between setjmp and longjmp */

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("1..%d\n", n);
	for (int i = 0; i < n; i++) {
		ioc_test_index = i + 1;
		ioc_test_name = tests[i].name;
		ioc_test_skip_reason = NULL;
		if (setjmp(ioc_test_skip_jmp) == 0) {
			tests[i].fn();
			printf("ok %d - %s\n", i + 1, tests[i].name);
		} else {
			printf("ok %d - %s # SKIP %s\n", i + 1, tests[i].name,
			       ioc_test_skip_reason);
			skipped++;
		}
		fflush(stdout);
	}
	return (n > 0 && skipped == n) ? ioc_test_skip_status() : 0;
}

#define IOC_TEST_MAIN(...)                                                \
	int main(void)                                                    \
	{                                                                 \
		static const struct ioc_test ioc_tests_[] = { __VA_ARGS__ }; \
		return ioc_test_run(ioc_tests_,                           \
				    (int)(sizeof(ioc_tests_) / sizeof(ioc_tests_[0])));     \
	}

#endif /* IOC_TEST_TAP_H */
