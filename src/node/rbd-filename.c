/*
 * QEMU's "rbd:" file names, for --blockdev's filename shorthand, the
 * backing file names stored in image headers, and iocore-nbd's image
 * argument.
 *
 * The problem: the syntax is older than blockdev options and irregular.
 * "rbd:pool/image@snap:conf=/etc/ceph/ceph.conf:id=admin" puts the pool,
 * an optional namespace ("pool/ns/image"), the image and a snapshot in
 * one path, then any number of ':'-separated key=value pairs, two of
 * which (conf, id) are options and the rest Ceph settings; a backslash
 * escapes any character, so a monitor address is "mon_host=1.2.3.4\:6789".
 * A name that QEMU accepts must mean the same image here, or a backing
 * chain written by QEMU opens a different image.
 *
 * The design: the same two scanners QEMU uses -- find the next unescaped
 * delimiter, then remove the escapes from the piece -- applied in QEMU's
 * order (pool up to '/', then image up to '@' or ':', the snapshot up to
 * ':', the namespace split off the image at its first unescaped '/'),
 * on a private copy, producing the BlockdevOptionsRbd members as JSON.
 * Errors are QEMU's messages.  Stricter than QEMU in one place: an empty
 * pool or image name is refused here rather than by librbd at open.
 *
 * Rejected: a general tokenizer with a grammar (the syntax has none; it
 * is defined by QEMU's code), and sharing keyval's parser (its ',' and
 * '=' rules differ).  The cost is O(n) per scan, a few scans per name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/rbd.h"

/* The next unescaped delim in src, or NULL. */
static char *next_delim(char *src, char delim)
{
	for (; *src; src++) {
		if (*src == delim)
			return src;
		if (*src == '\\' && src[1])
			src++;
	}
	return NULL;
}

/* Cut src at its next unescaped delim: *rest is what follows it, or NULL
 * when there is none (src then runs to the end). */
static char *next_tok(char *src, char delim, char **rest)
{
	char *end = next_delim(src, delim);

	*rest = NULL;
	if (end) {
		*end = '\0';
		*rest = end + 1;
	}
	return src;
}

/* Drop the escapes in place ("\x" is "x"; a trailing '\' stays). */
static void unescape(char *s)
{
	char *d = s;

	for (; *s; s++, d++) {
		if (*s == '\\' && s[1])
			s++;
		*d = *s;
	}
	*d = '\0';
}

bool ioc__rbd_is_filename(const char *filename)
{
	return filename && strncmp(filename, "rbd:", 4) == 0;
}

static int put_str(json_t *o, const char *key, const char *val)
{
	json_t *v = json_string(val);

	/* json_string() refuses invalid UTF-8; so does QEMU's JSON output,
	 * but a name is bytes to Ceph: keep them. */
	if (!v)
		v = json_stringn_nocheck(val, strlen(val));
	return v ? json_object_set_new(o, key, v) : -1;
}

/* A name of the image's path, unescaped, at key; an empty one is refused
 * with if_empty.  0, or -errno with err set. */
static int put_name(json_t *o, const char *key, char *tok, const char *if_empty,
		    char *err, size_t errlen)
{
	unescape(tok);
	if (!*tok) {
		snprintf(err, errlen, "%s", if_empty);
		return -EINVAL;
	}
	if (put_str(o, key, tok)) {
		snprintf(err, errlen, "%s", strerror(ENOMEM));
		return -ENOMEM;
	}
	return 0;
}

json_t *ioc__rbd_parse_filename(const char *filename, char *err, size_t errlen)
{
	char *buf = NULL, *p, *tok, *image;
	json_t *o = NULL, *conf = NULL;

	if (!ioc__rbd_is_filename(filename)) {
		snprintf(err, errlen, "File name must start with 'rbd:'");
		return NULL;
	}
	buf = strdup(filename + 4);
	o = json_object();
	if (!buf || !o || put_str(o, "driver", "rbd"))
		goto nomem;

	tok = next_tok(buf, '/', &p);
	if (!p) {
		snprintf(err, errlen, "Pool name is required");
		goto fail;
	}
	if (put_name(o, "pool", tok, "Pool name is required", err, errlen))
		goto fail;

	if (next_delim(p, '@')) {
		image = next_tok(p, '@', &p);
		tok = next_tok(p, ':', &p);
		if (put_name(o, "snapshot", tok, "Snapshot name is empty", err, errlen))
			goto fail;
	} else {
		image = next_tok(p, ':', &p);
	}
	if (next_delim(image, '/')) {
		char *ns = next_tok(image, '/', &image);

		unescape(ns);
		if (put_str(o, "namespace", ns))
			goto nomem;
	}
	if (put_name(o, "image", image, "Image name is required", err, errlen))
		goto fail;

	while (p) {
		char *name = next_tok(p, '=', &p), *value;

		if (!p) {
			unescape(name);
			snprintf(err, errlen, "conf option %.200s has no value", name);
			goto fail;
		}
		unescape(name);
		value = next_tok(p, ':', &p);
		unescape(value);
		if (!*name) {
			snprintf(err, errlen, "conf option with an empty name");
			goto fail;
		}
		if (!strcmp(name, "conf")) {
			if (put_str(o, "conf", value))
				goto nomem;
		} else if (!strcmp(name, "id")) {
			if (put_str(o, "user", value))
				goto nomem;
		} else {
			if (!conf) {
				conf = json_object();
				if (!conf || json_object_set_new(o, "__org.iocore_conf", conf)) {
					json_decref(conf);
					goto nomem;
				}
			}
			if (put_str(conf, name, value))
				goto nomem;
		}
	}
	free(buf);
	return o;

nomem:
	snprintf(err, errlen, "%s", strerror(ENOMEM));
fail:
	json_decref(o);
	free(buf);
	return NULL;
}
