/*
 * Shared helpers for iocore's benchmark programs (header only).
 *
 * Every bench/<mod>/run.sh prints one JSON object per line, the row format
 * scripts/bench.sh collects (see bench/README.md):
 *   {"suite","case","params","impl","peer","metric","value","better","cmd"[,"error"]}
 * A C benchmark can print its rows with ioc_bench_row() instead of hand-written
 * printf formats, and time itself with ioc_bench_now_ns().  Include it as
 *   #include "common/bench.h"
 * with `include_directories : [inc, bench_inc]` (bench_inc is bench/).
 *
 * Using it is optional: the runner only reads the rows on stdout.
 */
#ifndef IOC_BENCH_COMMON_H
#define IOC_BENCH_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t ioc_bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Per-thread CPU time in nanoseconds (busy time of a worker). */
static inline uint64_t ioc_bench_thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One row.  `value_ok` false prints "value":null; then say why in `error`. */
struct ioc_bench_row {
	const char *suite;
	const char *case_name;
	const char *params;	/* "key=value,key=value"; see bench/README.md */
	const char *impl;	/* "iocore" for ours, the peer's name otherwise */
	bool peer;
	const char *metric;	/* unit included: "ns/op", "IOPS", "MB/s" */
	double value;
	bool value_ok;
	bool lower_is_better;
	const char *cmd;	/* the exact command that reproduces the row */
	const char *error;	/* NULL, or why there is no value */
};

/* A JSON string with the escapes RFC 8259 requires. */
static inline void ioc_bench_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", f);
		else if (*p == '\t')
			fputs("\\t", f);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

/* Print one row as one line and flush, so a crash later keeps it. */
static inline void ioc_bench_row(FILE *f, const struct ioc_bench_row *r)
{
	fputs("{\"suite\":", f);
	ioc_bench_json_str(f, r->suite);
	fputs(",\"case\":", f);
	ioc_bench_json_str(f, r->case_name);
	fputs(",\"params\":", f);
	ioc_bench_json_str(f, r->params);
	fputs(",\"impl\":", f);
	ioc_bench_json_str(f, r->impl);
	fprintf(f, ",\"peer\":%s,\"metric\":", r->peer ? "true" : "false");
	ioc_bench_json_str(f, r->metric);
	/* JSON has no NaN or infinity: those become null. */
	if (r->value_ok && r->value == r->value && r->value - r->value == 0)
		fprintf(f, ",\"value\":%.17g", r->value);
	else
		fputs(",\"value\":null", f);
	fprintf(f, ",\"better\":\"%s\",\"cmd\":", r->lower_is_better ? "lower" : "higher");
	ioc_bench_json_str(f, r->cmd);
	if (r->error) {
		fputs(",\"error\":", f);
		ioc_bench_json_str(f, r->error);
	}
	fputs("}\n", f);
	fflush(f);
}

/*
 * The command line that produced this process, shell-quoted, for "cmd".
 * Truncates (with "...") rather than overflow `buf`.
 */
static inline const char *ioc_bench_cmdline(int argc, char **argv, char *buf, size_t len)
{
	size_t n = 0;

	if (len == 0)
		return "";
	buf[0] = '\0';
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		bool plain = *a != '\0' && strspn(a, "abcdefghijklmnopqrstuvwxyz"
					       "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
					       "-_=.,/:+@%") == strlen(a);
		int w;

		if (plain) {
			w = snprintf(buf + n, len - n, "%s%s", i ? " " : "", a);
		} else {
			/* Single quotes; a ' inside becomes '\'' */
			w = snprintf(buf + n, len - n, "%s'", i ? " " : "");
			for (const char *p = a; w >= 0 && (size_t)w < len - n && *p; p++) {
				int k = *p == '\'' ? snprintf(buf + n + w, len - n - w, "'\\''")
						   : snprintf(buf + n + w, len - n - w, "%c", *p);
				w = k < 0 ? k : w + k;
			}
			if (w >= 0 && (size_t)w < len - n)
				w += snprintf(buf + n + w, len - n - w, "'");
		}
		if (w < 0 || (size_t)w >= len - n) {
			if (len >= 4)
				memcpy(buf + len - 4, "...", 4);
			return buf;
		}
		n += (size_t)w;
	}
	return buf;
}

#endif /* IOC_BENCH_COMMON_H */
