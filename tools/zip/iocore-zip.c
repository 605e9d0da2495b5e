/*
 * iocore-zip: parallel zstd/gzip compression with zstd's command line.
 *
 *   iocore-zip [-d] [-c] [-o FILE] [-f] [-k] [--rm] [-T N] [-1..-19]
 *              [--format=zstd|gzip] [--deflate=BACKEND] [--block-size SIZE]
 *              [-l] [-t]
 *              [--range=OFFSET:LENGTH] [-q] [-v] [FILE...]
 *
 * A thin shell around the library (include/iocore/zip.h): it reads the
 * input straight into the stream's block buffers (ioc_zip_buffer; through a
 * 1 MiB bounce buffer when blocks are small), writes the ordered output from
 * the callback (small frames gathered into 1 MiB writes), or, decompressing
 * into a regular file, lets each worker pwrite its frame at its offset
 * (write_at), leaving zero pages as holes when the file started empty.  A
 * regular input file is mapped for decompression and fed by reference
 * (ioc_zip_write_ref: no read(2) copy, no copy into the stream) when no
 * progress line is wanted.  Tried and dropped: mapping the output too
 * (ftruncate to the indexed size, MADV_POPULATE_WRITE + memcpy per run
 * instead of pwrite, to dodge the file lock pwrite takes): 0.8x of pwrite
 * on tmpfs, the page-table work cost more than the lock.  It owns file
 * handling: output goes
 * to a temporary name in the destination directory and is renamed into place
 * only after the stream finished cleanly, so an interrupted or failed run
 * never leaves a file that looks complete (the temporary is unlinked on
 * error and on SIGINT/SIGTERM/SIGHUP).  Source files are kept unless --rm,
 * as zstd does.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "iocore/zip.h"

#include "parse-size.h"

struct cli {
	bool decompress, to_stdout, force, rm_src, list, test, quiet, progress;
	int verbose;
	bool level_set;
	int level;
	unsigned threads;
	size_t block;
	enum ioc_zip_format format;
	enum ioc_zip_deflate deflate;
	const char *out_name;
	bool range_set;
	uint64_t range_off, range_len;
};

/* The temporary output being written, for the signal handler.  Written
 * only while signals are blocked (see set_tmp), so the handler never sees
 * a half-updated path. */
static char tmp_path[PATH_MAX];
static volatile sig_atomic_t tmp_active;

static void on_signal(int sig)
{
	if (tmp_active)
		unlink(tmp_path);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void set_tmp(const char *path)
{
	sigset_t all, old;

	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &old);
	if (path) {
		snprintf(tmp_path, sizeof(tmp_path), "%s", path);
		tmp_active = 1;
	} else {
		tmp_active = 0;
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
}

/* Create the temporary from its template and register it for the signal
 * handler, with signals blocked in between so an interrupt cannot land
 * after the file exists and before the handler knows its name. */
static int make_tmp(char *templ)
{
	sigset_t all, old;
	int fd, e;

	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &old);
	fd = mkostemp(templ, O_CLOEXEC);
	e = errno;
	if (fd >= 0) {
		snprintf(tmp_path, sizeof(tmp_path), "%s", templ);
		tmp_active = 1;
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	errno = e;
	return fd;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: iocore-zip [OPTIONS] [FILE...]\n"
		"Compress or decompress FILEs (stdin to stdout when none or '-').\n\n"
		"  -d, --decompress    decompress (format detected per frame)\n"
		"  -z, --compress      compress (default)\n"
		"  -c, --stdout        write to standard output\n"
		"  -o FILE             write to FILE (one input only)\n"
		"  -f, --force         overwrite outputs; write compressed data to a terminal\n"
		"  -k, --keep          keep source files (default)\n"
		"      --rm            remove source files after success\n"
		"  -T N, --threads=N   worker threads; 0 = all cores (default)\n"
		"  -1 .. -19           compression level (default 3 zstd, 6 gzip)\n"
		"      --format=F      zstd (default) or gzip; gzip -N aims at zlib's -N\n"
		"                      ratio (gzip -N, pigz -N) with the fastest backend\n"
		"                      setting measured to reach it\n"
		"      --deflate=B     gzip backend: auto (default), libdeflate, isal, zlib;\n"
		"                      auto's igzip (-1..-3) may differ by a few bytes\n"
		"                      between runs, the others repeat their bytes\n"
		"      --block-size=S  independent block size (default: zstd 4M, 8M from -6,\n"
		"                      16M from -13; gzip 1M; K/M suffixes)\n"
		"  -l, --list          list frames and ratio\n"
		"  -t, --test          test integrity\n"
		"      --range=OFF:LEN decompress only bytes [OFF, OFF+LEN) (seekable input)\n"
		"  -q, --quiet         no progress, fewer messages\n"
		"  -v, --verbose       more messages (worker busy times)\n"
		"  -V, --version       print the version\n");
}

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* ---- progress ------------------------------------------------------ */

struct job {
	const struct cli *cli;
	const char *name;
	int in_fd, out_fd;
	bool discard;
	bool sparse;            /* write_at into a file that started empty:
				   zero pages are left as holes */
	uint64_t in_size;       /* 0 when unknown */
	uint64_t in_done, out_done;
	int64_t start_ns, last_ns;
	/* Small outputs (frames of small blocks, range pieces) are gathered
	 * here so the file sees 1 MiB writes, not one write(2) per frame. */
	uint8_t *obuf;
	size_t olen;
};

#define OBUF_SIZE (1u << 20)

static void progress(struct job *j, bool final)
{
	int64_t now = ioc_now_ns();
	double secs, mbps;

	if (!j->cli->progress)
		return;
	if (!final && now - j->last_ns < 200000000)
		return;
	j->last_ns = now;
	secs = (double)(now - j->start_ns) / 1e9;
	mbps = secs > 0 ? (double)j->in_done / secs / 1e6 : 0;
	fprintf(stderr, "\r\033[K%s: %.1f MB -> %.1f MB", j->name, (double)j->in_done / 1e6,
		(double)j->out_done / 1e6);
	if (j->in_done && !j->cli->decompress)
		fprintf(stderr, " (%.2f%%)", 100.0 * (double)j->out_done / (double)j->in_done);
	fprintf(stderr, " %.0f MB/s", mbps);
	if (j->in_size && mbps > 0 && !final)
		fprintf(stderr, " ETA %.0fs",
			(double)(j->in_size - (j->in_done < j->in_size ? j->in_done : j->in_size)) /
				(mbps * 1e6));
	if (final)
		fputs("\r\033[K", stderr);
}

static int out_flush(struct job *j)
{
	int r = j->olen ? write_all(j->out_fd, j->obuf, j->olen) : 0;

	j->olen = 0;
	return r;
}

static int out_write(void *opaque, const void *buf, size_t len)
{
	struct job *j = opaque;
	int r;

	if (j->discard)
		return 0;
	/* Whatever is gathered goes out first: a big piece written past the
	 * buffer must not overtake it. */
	if (j->olen + len > OBUF_SIZE || len >= OBUF_SIZE / 4) {
		r = out_flush(j);
		if (r < 0)
			return r;
	}
	if (len >= OBUF_SIZE / 4 || !j->obuf)
		return write_all(j->out_fd, buf, len);
	memcpy(j->obuf + j->olen, buf, len);
	j->olen += len;
	return 0;
}

static int pwrite_all(int fd, const uint8_t *p, size_t len, uint64_t off)
{
	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

#define SPARSE_PAGE 4096u

/* All zero?  The first 16 bytes by hand, then the rest against itself
 * shifted by 16 (memcmp is vectorised; zero at p[0..16) and p[i] ==
 * p[i + 16] everywhere means zero throughout). */
static bool all_zero(const uint8_t *p, size_t n)
{
	static const uint8_t z16[16];

	if (n <= 16)
		return memcmp(p, z16, n) == 0;
	return memcmp(p, z16, 16) == 0 && memcmp(p, p + 16, n - 16) == 0;
}

/* Decompression into a regular file (or nowhere, for -t): each worker
 * writes its frame at its offset, so the feeding thread never copies
 * decoded data.  Called from worker threads: touches nothing shared.
 * Sparse (the file started empty, so every byte not written reads back as
 * zero): all-zero pages of the file are not written at all, only the
 * non-zero runs between them; run_stream() sets the final size with
 * ftruncate, so trailing zeros exist too.  zstd -d does the same for files
 * (--sparse, its default), in 32 KiB units.  For a memory image (mostly
 * zero pages) that skips most of the kernel's page allocation and copying,
 * which is most of the time; for data it costs one scan of each decoded
 * page while it is still in cache. */
static int out_write_at(void *opaque, const void *buf, size_t len, uint64_t off)
{
	const struct job *j = opaque;
	const uint8_t *p = buf, *run = NULL;
	size_t i = 0;
	int r;

	if (j->discard)
		return 0;
	if (!j->sparse)
		return pwrite_all(j->out_fd, p, len, off);
	while (i < len) {
		/* Up to the next page boundary of the file. */
		size_t n = SPARSE_PAGE - (size_t)((off + i) % SPARSE_PAGE);

		if (n > len - i)
			n = len - i;
		if (all_zero(p + i, n)) {
			if (run) {
				r = pwrite_all(j->out_fd, run, (size_t)(p + i - run),
					       off + (uint64_t)(run - p));
				if (r < 0)
					return r;
				run = NULL;
			}
		} else if (!run) {
			run = p + i;
		}
		i += n;
	}
	return run ? pwrite_all(j->out_fd, run, (size_t)(p + len - run), off + (uint64_t)(run - p))
		   : 0;
}

static void print_busy(struct ioc_zip *z, const struct cli *cli)
{
	struct ioc_zip_worker_stats ws[256];
	int n = ioc_zip_get_worker_stats(z, ws, 256);
	uint64_t lo = UINT64_MAX, hi = 0;

	if (cli->verbose < 1 || n <= 0)
		return;
	fprintf(stderr, "iocore-zip: worker busy ms:");
	for (int i = 0; i < n && i < 256; i++) {
		fprintf(stderr, " %.1f", (double)ws[i].cpu_ns / 1e6);
		lo = ws[i].cpu_ns < lo ? ws[i].cpu_ns : lo;
		hi = ws[i].cpu_ns > hi ? ws[i].cpu_ns : hi;
	}
	fprintf(stderr, " spread %.1f%% (jobs:", hi ? 100.0 * (double)(hi - lo) / (double)hi : 0.0);
	for (int i = 0; i < n && i < 256; i++)
		fprintf(stderr, " %" PRIu64, ws[i].jobs);
	fprintf(stderr, ")\n");
}

/* Map a regular input file read from its start: the workers then read
 * frames (decompression) or blocks (compression) in place through
 * ioc_zip_write_ref, with no read(2) copy and no copy into the stream.
 * Caveat of any mapping: a file truncated by someone else while we read
 * it raises SIGBUS. */
static void *map_input(const struct job *j, size_t *len)
{
	struct stat st;
	void *m;

	if (fstat(j->in_fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
	    (uint64_t)st.st_size > SIZE_MAX / 2 || lseek(j->in_fd, 0, SEEK_CUR) != 0)
		return NULL;
	m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, j->in_fd, 0);
	if (m == MAP_FAILED)
		return NULL;
	madvise(m, (size_t)st.st_size, MADV_SEQUENTIAL);
	*len = (size_t)st.st_size;
	return m;
}

/* Run one stream from j->in_fd to the callback. */
static int run_stream(struct job *j, char *err, size_t errlen)
{
	const struct cli *cli = j->cli;
	/* Compressed output is written by the workers (write_from_workers):
	 * on the memory image, whose blocks compress fast, the feeding
	 * thread's writes took 10-15% of one core from the worker sharing
	 * it (see src/zip/pipeline.c).  A run of zero blocks is one frame
	 * (zero_runs): the seek table says where each frame is, so readers
	 * (ours, or any of zstd's seekable format) need no fixed size. */
	struct ioc_zip_opts o = {
		.format = cli->format, .level = cli->level, .block_size = cli->block,
		.deflate = cli->deflate, .zero_runs = true,
		.workers = cli->threads, .write = out_write, .opaque = j,
		.write_from_workers = !cli->decompress,
	};
	struct ioc_zip_stats st;
	struct ioc_zip *z;
	struct stat stb;
	int r;

	/* Pipes: 1 MiB of pipe buffer instead of 64 KiB, so a 4 MiB frame
	 * crosses in 4 writes/wakeups, not 64 (measured, -dc of the 200 MB
	 * usr tar into `| cat`: 6500 -> 1100-2000 context switches, CPU
	 * 196 -> 184 ms).  Best effort (capped by /proc/sys/fs/pipe-max-size
	 * for unprivileged users). */
	if (!j->discard && fstat(j->out_fd, &stb) == 0 && S_ISFIFO(stb.st_mode))
		fcntl(j->out_fd, F_SETPIPE_SZ, 1 << 20);
	if (fstat(j->in_fd, &stb) == 0 && S_ISFIFO(stb.st_mode))
		fcntl(j->in_fd, F_SETPIPE_SZ, 1 << 20);
	/* Positional writes only where they are safe: a regular file we
	 * write from its start, not in append mode (pwrite would append). */
	if (cli->decompress &&
	    (j->discard || (fstat(j->out_fd, &stb) == 0 && S_ISREG(stb.st_mode) &&
			    lseek(j->out_fd, 0, SEEK_CUR) == 0 &&
			    !(fcntl(j->out_fd, F_GETFL) & O_APPEND)))) {
		o.write = NULL;
		o.write_at = out_write_at;
		j->sparse = !j->discard && stb.st_size == 0;
	}
	r = cli->decompress ? ioc_zip_decompressor_new(&z, &o) : ioc_zip_compressor_new(&z, &o);
	if (r < 0) {
		snprintf(err, errlen, "%s", ioc_strerror(r));
		return r;
	}
	/* Read straight into the stream's block buffer, unless its room is
	 * small (blocks below 1 MiB): then one 1 MiB read and a copy beat a
	 * read(2) per block. */
	uint8_t *bounce = NULL;
	void *imap = NULL;
	size_t ilen = 0;

	if (!cli->decompress && cli->block && cli->block < (1u << 20)) {
		bounce = malloc(1u << 20);
		if (!bounce) {
			r = -ENOMEM;
			snprintf(err, errlen, "%s", ioc_strerror(r));
			goto out;
		}
	}
	j->start_ns = j->last_ns = ioc_now_ns();
	/* One call over the whole mapping, so only without a progress line
	 * (which wants the loop below).  Compression too: workers read
	 * whole blocks in place (ioc_zip_write_ref), no read(2) copy on this
	 * thread. */
	if (!cli->progress)
		imap = map_input(j, &ilen);
	if (imap) {
		r = ioc_zip_write_ref(z, imap, ilen, 0);
		if (r == 0)
			r = ioc_zip_finish(z);
		j->in_done = ilen;
	}
	while (!imap) {
		void *buf;
		size_t room;
		ssize_t n;

		if (bounce) {
			buf = bounce;
			room = 1u << 20;
		} else {
			r = ioc_zip_buffer(z, &buf, &room);
			if (r < 0)
				break;
		}
		n = read(j->in_fd, buf, room);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			snprintf(err, errlen, "read: %s", strerror(errno));
			goto out;
		}
		if (n == 0) {
			r = ioc_zip_finish(z);
			break;
		}
		j->in_done += (uint64_t)n;
		r = bounce ? ioc_zip_write(z, bounce, (size_t)n, 0) : ioc_zip_commit(z, (size_t)n, 0);
		if (r < 0)
			break;
		ioc_zip_get_stats(z, &st);
		j->out_done = st.out_bytes;
		progress(j, false);
	}
	if (r < 0)
		snprintf(err, errlen, "%s", ioc_zip_error(z));
	ioc_zip_get_stats(z, &st);
	j->out_done = st.out_bytes;
	/* pwrite leaves the file offset alone; put it after the data, as
	 * write(2) would have, for whoever writes to this fd next (a shell
	 * redirection shared with other commands). */
	if (r == 0 && j->sparse && ftruncate(j->out_fd, (off_t)st.out_bytes) < 0) {
		r = -errno;
		snprintf(err, errlen, "ftruncate: %s", strerror(errno));
	}
	if (r == 0 && o.write_at && !j->discard)
		lseek(j->out_fd, (off_t)st.out_bytes, SEEK_SET);
	progress(j, true);
	print_busy(z, cli);
out:
	free(bounce);
	ioc_zip_free(z);
	if (imap)
		munmap(imap, ilen);
	return r;
}

static int run_range(struct job *j, char *err, size_t errlen)
{
	const struct cli *cli = j->cli;
	struct ioc_zip_opts o = { .workers = cli->threads, .write = out_write, .opaque = j };
	struct ioc_zip_index *ix;
	int r = ioc_zip_index_read(j->in_fd, &ix, err, errlen);

	if (r < 0)
		return r;
	r = ioc_zip_extract(j->in_fd, ix, cli->range_off, cli->range_len, &o, err, errlen);
	ioc_zip_index_free(ix);
	return r;
}

/* ---- listing ------------------------------------------------------- */

static int list_file(const struct cli *cli, const char *name, int fd)
{
	struct ioc_zip_index *ix;
	char msg[256];
	int r = ioc_zip_index_read(fd, &ix, msg, sizeof(msg));

	if (r == 0) {
		printf("%s: %s, %zu %s, %" PRIu64 " -> %" PRIu64 " bytes, ratio %.3f%s%s\n", name,
		       ix->format == IOC_ZIP_GZIP ? "gzip" : "zstd", ix->nframes,
		       ix->format == IOC_ZIP_GZIP ? "members" : "frames", ix->csize, ix->dsize,
		       ix->dsize ? (double)ix->csize / (double)ix->dsize : 0.0,
		       ix->nframes && ix->frames[0].has_sum ? ", checksums" : "",
		       ix->pck_len ? ", page checks" : "");
		if (cli->verbose)
			for (size_t i = 0; i < ix->nframes; i++)
				printf("  %6zu  at %12" PRIu64 "  %10u -> %10u  data at %12" PRIu64
				       "\n", i, ix->frames[i].coff, ix->frames[i].csize,
				       ix->frames[i].dsize, ix->frames[i].doff);
		ioc_zip_index_free(ix);
		return 0;
	}
	if (r != -ENOENT && r != -ESPIPE) {
		fprintf(stderr, "iocore-zip: %s: %s\n", name, msg);
		return r;
	}
	/* No index: decode to count. */
	struct cli c2 = *cli;
	struct job j = { .cli = &c2, .name = name, .in_fd = fd, .discard = true };
	char err[256];

	c2.decompress = true;
	c2.progress = false;
	r = run_stream(&j, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "iocore-zip: %s: %s\n", name, err);
		return r;
	}
	printf("%s: no index (%s), %" PRIu64 " -> %" PRIu64 " bytes, ratio %.3f\n", name, msg,
	       j.in_done, j.out_done, j.out_done ? (double)j.in_done / (double)j.out_done : 0.0);
	return 0;
}

/* ---- one file ------------------------------------------------------ */

static const char *suffix(const struct cli *cli)
{
	return cli->format == IOC_ZIP_GZIP ? ".gz" : ".zst";
}

static char *output_name(const struct cli *cli, const char *in)
{
	static const char *const sfx[][2] = {
		{ ".zst", "" }, { ".gz", "" }, { ".tzst", ".tar" }, { ".tgz", ".tar" },
		{ ".zstd", "" },
	};
	size_t n = strlen(in);
	char *out;

	if (!cli->decompress) {
		if (asprintf(&out, "%s%s", in, suffix(cli)) < 0)
			return NULL;
		return out;
	}
	for (size_t i = 0; i < IOC_ARRAY_SIZE(sfx); i++) {
		size_t l = strlen(sfx[i][0]);

		if (n > l && strcmp(in + n - l, sfx[i][0]) == 0) {
			if (asprintf(&out, "%.*s%s", (int)(n - l), in, sfx[i][1]) < 0)
				return NULL;
			return out;
		}
	}
	errno = EINVAL;
	return NULL;
}

static int process(const struct cli *cli, const char *in_name, bool many)
{
	bool from_stdin = !in_name || strcmp(in_name, "-") == 0;
	const char *shown = from_stdin ? "stdin" : in_name;
	struct job j = { .cli = cli, .name = shown, .in_fd = 0, .out_fd = 1 };
	char *out_name = NULL, *tmp = NULL;
	char err[512] = "";
	struct stat st = { 0 };
	int r = -1;

	if (!from_stdin) {
		j.in_fd = open(in_name, O_RDONLY | O_CLOEXEC);
		if (j.in_fd < 0) {
			fprintf(stderr, "iocore-zip: %s: %s\n", in_name, strerror(errno));
			return -1;
		}
		if (fstat(j.in_fd, &st) == 0 && S_ISREG(st.st_mode))
			j.in_size = (uint64_t)st.st_size;
		if (S_ISDIR(st.st_mode)) {
			fprintf(stderr, "iocore-zip: %s is a directory -- ignored\n", in_name);
			goto out;
		}
	}
	if (cli->list) {
		r = list_file(cli, shown, j.in_fd);
		goto out;
	}
	if (cli->test) {
		j.discard = true;
	} else if (cli->to_stdout || (from_stdin && !cli->out_name)) {
		if (!cli->decompress && isatty(1) && !cli->force) {
			fprintf(stderr, "iocore-zip: stdout is a terminal, aborting (use -f)\n");
			goto out;
		}
	} else {
		int fd;

		out_name = cli->out_name ? strdup(cli->out_name) : output_name(cli, in_name);
		if (!out_name) {
			fprintf(stderr, "iocore-zip: %s: unknown suffix -- ignored\n", in_name);
			goto out;
		}
		if (!cli->force && access(out_name, F_OK) == 0) {
			fprintf(stderr, "iocore-zip: %s already exists; not overwritten (use -f)\n",
				out_name);
			goto out;
		}
		{
			const char *slash = strrchr(out_name, '/');
			int dl = slash ? (int)(slash - out_name + 1) : 0;

			if (asprintf(&tmp, "%.*s.%s.iocore-zip-XXXXXX", dl, out_name,
				     out_name + dl) < 0) {
				tmp = NULL;
				goto out;
			}
		}
		fd = make_tmp(tmp);
		if (fd < 0) {
			fprintf(stderr, "iocore-zip: %s: %s\n", out_name, strerror(errno));
			free(tmp);
			tmp = NULL;
			goto out;
		}
		j.out_fd = fd;
	}
	j.obuf = malloc(OBUF_SIZE);     /* NULL: unbuffered, still correct */
	if (cli->range_set)
		r = run_range(&j, err, sizeof(err));
	else
		r = run_stream(&j, err, sizeof(err));
	if (r == 0) {
		r = out_flush(&j);
		if (r < 0)
			snprintf(err, sizeof(err), "write: %s", ioc_strerror(r));
	}
	free(j.obuf);
	j.obuf = NULL;
	if (r < 0) {
		fprintf(stderr, "iocore-zip: %s: %s\n", shown, err[0] ? err : ioc_strerror(r));
		goto out;
	}
	if (tmp) {
		if (!from_stdin) {
			(void)!fchmod(j.out_fd, st.st_mode & 07777);
			struct timespec ts[2] = { st.st_atim, st.st_mtim };
			futimens(j.out_fd, ts);
		}
		if (close(j.out_fd) < 0) {
			r = -errno;
			j.out_fd = -1;
			fprintf(stderr, "iocore-zip: %s: %s\n", out_name, strerror(errno));
			goto out;
		}
		j.out_fd = -1;
		if (rename(tmp, out_name) < 0) {
			r = -errno;
			fprintf(stderr, "iocore-zip: %s: %s\n", out_name, strerror(errno));
			goto out;
		}
		set_tmp(NULL);
		free(tmp);
		tmp = NULL;
	}
	if (cli->test && !cli->quiet)
		fprintf(stderr, "%s: OK\n", shown);
	else if (cli->verbose || (many && !cli->quiet && !cli->to_stdout && !cli->test))
		fprintf(stderr, "%s: %" PRIu64 " -> %" PRIu64 " bytes%s%s\n", shown, j.in_done,
			j.out_done, out_name ? " => " : "", out_name ? out_name : "");
	if (cli->rm_src && !from_stdin && !cli->test && !cli->to_stdout && unlink(in_name) < 0)
		fprintf(stderr, "iocore-zip: %s: %s\n", in_name, strerror(errno));
	r = 0;
out:
	if (tmp) {
		if (j.out_fd > 1)
			close(j.out_fd);
		unlink(tmp);
		set_tmp(NULL);
		free(tmp);
	}
	if (j.in_fd > 0)
		close(j.in_fd);
	free(out_name);
	return r;
}

enum {
	OPT_RM = 256,
	OPT_FORMAT,
	OPT_DEFLATE,
	OPT_BLOCK_SIZE,
	OPT_RANGE,
};

static const struct option longopts[] = {
	{ "decompress", no_argument, NULL, 'd' },
	{ "uncompress", no_argument, NULL, 'd' },
	{ "compress", no_argument, NULL, 'z' },
	{ "stdout", no_argument, NULL, 'c' },
	{ "force", no_argument, NULL, 'f' },
	{ "keep", no_argument, NULL, 'k' },
	{ "rm", no_argument, NULL, OPT_RM },
	{ "list", no_argument, NULL, 'l' },
	{ "test", no_argument, NULL, 't' },
	{ "quiet", no_argument, NULL, 'q' },
	{ "verbose", no_argument, NULL, 'v' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ "threads", required_argument, NULL, 'T' },
	{ "format", required_argument, NULL, OPT_FORMAT },
	{ "deflate", required_argument, NULL, OPT_DEFLATE },
	{ "block-size", required_argument, NULL, OPT_BLOCK_SIZE },
	{ "range", required_argument, NULL, OPT_RANGE },
	{ NULL, 0, NULL, 0 },
};

/* The option's value; 0, or -1 after printing why it is bad. */
static int parse_value(struct cli *cli, int opt, const char *val)
{
	uint64_t v;

	switch (opt) {
	case 'T':
		cli->threads = (unsigned)atoi(val);
		return 0;
	case 'o':
		cli->out_name = val;
		return 0;
	case OPT_FORMAT:
		if (strcmp(val, "zstd") == 0) {
			cli->format = IOC_ZIP_ZSTD;
		} else if (strcmp(val, "gzip") == 0 || strcmp(val, "gz") == 0) {
			cli->format = IOC_ZIP_GZIP;
		} else {
			fprintf(stderr, "iocore-zip: unknown format %s\n", val);
			return -1;
		}
		return 0;
	case OPT_DEFLATE:
		if (strcmp(val, "auto") == 0) {
			cli->deflate = IOC_ZIP_DEFLATE_DEFAULT;
		} else if (strcmp(val, "libdeflate") == 0) {
			cli->deflate = IOC_ZIP_DEFLATE_LIBDEFLATE;
		} else if (strcmp(val, "isal") == 0 || strcmp(val, "igzip") == 0) {
			cli->deflate = IOC_ZIP_DEFLATE_ISAL;
		} else if (strcmp(val, "zlib") == 0) {
			cli->deflate = IOC_ZIP_DEFLATE_ZLIB;
		} else {
			fprintf(stderr, "iocore-zip: unknown deflate backend %s "
				"(auto, libdeflate, isal, zlib)\n", val);
			return -1;
		}
		return 0;
	case OPT_BLOCK_SIZE:
		if (ioc_tool_parse_size(val, &v) < 0 || v < IOC_ZIP_MIN_BLOCK ||
		    v > IOC_ZIP_MAX_BLOCK) {
			fprintf(stderr, "iocore-zip: --block-size must be 4K..64M\n");
			return -1;
		}
		cli->block = (size_t)v;
		return 0;
	case OPT_RANGE: {
		const char *colon = strchr(val, ':');
		char offs[64];

		if (!colon || (size_t)(colon - val) >= sizeof(offs)) {
			fprintf(stderr, "iocore-zip: --range=OFFSET:LENGTH\n");
			return -1;
		}
		memcpy(offs, val, (size_t)(colon - val));
		offs[colon - val] = 0;
		if (ioc_tool_parse_size(offs, &cli->range_off) < 0 ||
		    ioc_tool_parse_size(colon + 1, &cli->range_len) < 0) {
			fprintf(stderr, "iocore-zip: bad --range %s\n", val);
			return -1;
		}
		cli->range_set = true;
		cli->decompress = true;
		return 0;
	}
	}
	return 0;
}

/* A run of level digits ended: 0, or -1 after saying why it is bad. */
static int end_level(struct cli *cli, int *lv)
{
	if (*lv < 1 || *lv > 19) {
		fprintf(stderr, "iocore-zip: level must be 1..19\n");
		return -1;
	}
	cli->level = *lv;
	*lv = -1;
	return 0;
}

int main(int argc, char **argv)
{
	struct cli cli = { .format = IOC_ZIP_ZSTD };
	const char **files = calloc((size_t)argc + 1, sizeof(*files));
	int nfiles = 0, failed = 0;
	/* The level is the digits of one run (-19, or -d19), as zstd reads
	 * them: each digit is an option to getopt, and a run ends when its
	 * argument ends or a letter follows. */
	int lv = -1;

	if (!files)
		return 1;
	/* "-": file names come back in order as option 1, so argv[before]
	 * is always the argument getopt is in; ":": our own messages. */
	opterr = 0;
	for (;;) {
		int before = optind;
		int c = getopt_long(argc, argv, "-:dzcfkltqvhVT:o:0123456789", longopts, NULL);
		const char *cur = before < argc ? argv[before] : "";
		bool is_long = strncmp(cur, "--", 2) == 0;

		/* A run of digits ended with a letter after it. */
		if (lv >= 0 && (c < '0' || c > '9') && end_level(&cli, &lv) < 0)
			goto fail;
		if (c == -1)
			break;
		switch (c) {
		case 1:
			files[nfiles++] = optarg;
			break;
		case '0': case '1': case '2': case '3': case '4':
		case '5': case '6': case '7': case '8': case '9':
			lv = (lv < 0 ? 0 : lv * 10) + (c - '0');
			if (lv > 1000)
				lv = 1000;      /* out of range anyway; no overflow */
			/* The argument ended with this digit. */
			if (optind != before && end_level(&cli, &lv) < 0)
				goto fail;
			break;
		case 'd': cli.decompress = true; break;
		case 'z': cli.decompress = false; break;
		case 'c': cli.to_stdout = true; break;
		case 'f': cli.force = true; break;
		case 'k': cli.rm_src = false; break;
		case OPT_RM: cli.rm_src = true; break;
		case 'l': cli.list = true; break;
		case 't': cli.test = true; cli.decompress = true; break;
		case 'q': cli.quiet = true; break;
		case 'v': cli.verbose++; break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("iocore-zip %s\n", ioc_version()); return 0;
		case ':':
			if (is_long)
				fprintf(stderr, "iocore-zip: %s needs a value\n", cur);
			else
				fprintf(stderr, "iocore-zip: -%c needs a value\n", optopt);
			return 1;
		case '?':
			if (is_long)
				fprintf(stderr, "iocore-zip: unknown option %s\n", cur);
			else
				fprintf(stderr, "iocore-zip: unknown option -%c\n", optopt);
			usage(stderr);
			return 1;
		default:
			if (parse_value(&cli, c, optarg) < 0)
				return 1;
			break;
		}
	}
	/* After "--" everything is a file. */
	while (optind < argc)
		files[nfiles++] = argv[optind++];
	if (cli.test)
		cli.decompress = true;
	if (cli.range_set && !cli.out_name)
		cli.to_stdout = true;
	if (cli.out_name && nfiles > 1) {
		fprintf(stderr, "iocore-zip: -o takes one input\n");
		return 1;
	}
	cli.progress = !cli.quiet && isatty(2) && !cli.list;
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	signal(SIGPIPE, SIG_IGN);
	if (nfiles == 0)
		failed |= process(&cli, NULL, false) < 0;
	for (int i = 0; i < nfiles; i++)
		failed |= process(&cli, files[i], nfiles > 1) < 0;
	free(files);
	return failed ? 1 : 0;

fail:
	free(files);
	return 1;
}
