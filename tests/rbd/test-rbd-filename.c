/*
 * The "rbd:" file-name parser against the names QEMU accepts and
 * refuses, compared member by member with what qemu_rbd_parse_filename()
 * makes of them.
 */
#include <jansson.h>

#include "tap.h"
#include "node/rbd.h"

static void expect(const char *name, const char *json)
{
	char err[256] = "";
	json_error_t je;
	json_t *got = ioc__rbd_parse_filename(name, err, sizeof(err));
	json_t *want = json_loads(json, 0, &je);

	ASSERT_NOT_NULL(want);
	if (!got)
		ioc_test_fail(__FILE__, __LINE__, "%s: %s", name, err);
	if (!json_equal(got, want)) {
		char *g = json_dumps(got, JSON_SORT_KEYS);

		ioc_test_fail(__FILE__, __LINE__, "%s: got %s, want %s", name, g, json);
	}
	json_decref(got);
	json_decref(want);
}

static void refused(const char *name, const char *msg)
{
	char err[256] = "";
	json_t *got = ioc__rbd_parse_filename(name, err, sizeof(err));

	ASSERT_NULL(got);
	ASSERT_STR_EQ(err, msg);
}

static void test_accepted(void)
{
	expect("rbd:rbd/img", "{\"driver\":\"rbd\",\"pool\":\"rbd\",\"image\":\"img\"}");
	expect("rbd:rbd/img@snap1",
	       "{\"driver\":\"rbd\",\"pool\":\"rbd\",\"image\":\"img\",\"snapshot\":\"snap1\"}");
	expect("rbd:p/ns/img@s:conf=/etc/ceph/c.conf:id=admin",
	       "{\"driver\":\"rbd\",\"pool\":\"p\",\"namespace\":\"ns\",\"image\":\"img\","
	       "\"snapshot\":\"s\",\"conf\":\"/etc/ceph/c.conf\",\"user\":\"admin\"}");
	/* Escapes: a literal ':' '@' '/' in names and values. */
	expect("rbd:p\\/q/i\\:m\\@g:mon_host=127.0.0.1\\:6789:rbd_cache=false",
	       "{\"driver\":\"rbd\",\"pool\":\"p/q\",\"image\":\"i:m@g\","
	       "\"__org.iocore_conf\":{\"mon_host\":\"127.0.0.1:6789\",\"rbd_cache\":\"false\"}}");
	/* Only the first '/' of the image splits off a namespace. */
	expect("rbd:p/a/b/c", "{\"driver\":\"rbd\",\"pool\":\"p\",\"namespace\":\"a\","
	       "\"image\":\"b/c\"}");
	/* A key given twice: the last one counts. */
	expect("rbd:p/i:conf=a:conf=b",
	       "{\"driver\":\"rbd\",\"pool\":\"p\",\"image\":\"i\",\"conf\":\"b\"}");
	ASSERT_TRUE(ioc__rbd_is_filename("rbd:x"));
	ASSERT_FALSE(ioc__rbd_is_filename("nbd:x"));
}

static void test_refused(void)
{
	refused("file:x", "File name must start with 'rbd:'");
	refused("rbd:pool", "Pool name is required");
	refused("rbd:/img", "Pool name is required");
	refused("rbd:p\\/img", "Pool name is required");
	refused("rbd:pool/", "Image name is required");
	refused("rbd:pool/img@", "Snapshot name is empty");
	refused("rbd:pool/img:conf", "conf option conf has no value");
	refused("rbd:pool/img:=x", "conf option with an empty name");
}

IOC_TEST_MAIN(
	IOC_TEST(test_accepted),
	IOC_TEST(test_refused),
)
