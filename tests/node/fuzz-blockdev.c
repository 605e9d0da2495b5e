/*
 * Fuzz target: a --blockdev option group, as the daemon's command line
 * takes it: QEMU's keyval syntax (or JSON) parsed, then checked against
 * BlockdevOptions (the common members and every driver's, a union on
 * "driver") with keyval coercion.  Checks: the parser and checker never
 * crash; a refusal always says why; what the checker accepted, now typed,
 * is accepted again unchanged without coercion (the coercion is complete
 * and idempotent).  No node is opened.
 *
 * A libFuzzer binary with -Dfuzz=true and clang, and always an ordinary
 * test (IOC_FUZZ_STANDALONE) over the seeds below, each truncated at
 * every length and with the syntax's characters put at many places.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/node.h"
#include "qmp/schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[512] = "", err2[512] = "", *s = malloc(size + 1);
	bool is_json;
	json_t *o, *again;

	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	o = ioc__qmp_keyval_parse(s, "driver", &is_json, err, sizeof(err));
	if (!o) {
		if (!err[0])
			abort(); /* a refusal says why */
		free(s);
		return 0;
	}
	if (ioc_node_check_opts(o, is_json ? 0 : IOC_QMP_KEYVAL, err, sizeof(err))) {
		again = json_deep_copy(o);
		if (!again || !ioc_node_check_opts(again, 0, err2, sizeof(err2)) ||
		    !json_equal(again, o))
			abort(); /* accepted once: accepted as it is */
		json_decref(again);
	} else if (!err[0]) {
		abort();
	}
	json_decref(o);
	free(s);
	return 0;
}

#ifdef IOC_FUZZ_STANDALONE
#include "tap.h"

static const char *const seeds[] = {
	"driver=file,node-name=n0,filename=/x,aio=io_uring,cache.direct=on,read-only=off",
	"file,node-name=n,filename=a,,b,discard=unmap,detect-zeroes=unmap",
	"driver=raw,node-name=r,file.driver=file,file.filename=/x,offset=1M,size=64k",
	"driver=qcow2,node-name=q,file=f0,backing=null,l2-cache-size=1M",
	"driver=null-co,node-name=z,size=1G,read-zeroes=yes",
	"driver=rbd,node-name=r,pool=p,image=i,server.0.host=a,server.0.port=1",
	"{\"driver\": \"file\", \"node-name\": \"n\", \"filename\": \"/x\", \"cache\": {\"direct\": true}}",
	("driver=__org.iocore_zip-overlay,node-name=o,filename=/y,backing.driver=__org.iocore_zip,"
	 "backing.filename=/z"),
	"driver=file,node-name=n,filename=/x,cache.direct=maybe,read-only=2,size=-1",
	"\x8c\n",         /* not UTF-8: refused, saying so (a fuzzer's find) */
	"a.\xff=1,b=\xc3",
};

static unsigned long runs;

static void run(const char *p, size_t n)
{
	char *c = malloc(n ? n : 1);

	ASSERT_NOT_NULL(c);
	memcpy(c, p, n);
	LLVMFuzzerTestOneInput((const uint8_t *)c, n);
	free(c);
	runs++;
}

static void test_seeds(void)
{
	static const char special[] = { ',', '=', '.', '{', '"', 0, '0', ':' };

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
		size_t n = strlen(seeds[i]);
		char *m = malloc(n + 1);
		uint64_t x = 0x9e3779b97f4a7c15ull * (i + 1);

		ASSERT_NOT_NULL(m);
		for (size_t k = 0; k <= n; k++)
			run(seeds[i], k);
		for (unsigned long r = 0; r < ioc_test_scaled(400); r++) {
			memcpy(m, seeds[i], n);
			for (int j = 0; j < 3; j++) {
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				m[x % n] = special[(x >> 32) % sizeof(special)];
			}
			run(m, n);
		}
		free(m);
	}
	ASSERT_GT(runs, 1000);
}

IOC_TEST_MAIN(IOC_TEST(test_seeds))
#endif
