/*
 * The one argument checker.  QEMU generates a visitor per type from its
 * QAPI schema; here a spec is data (schema.h) and one recursive walk checks
 * an object against it: required members present, no member the spec does
 * not know, each value of its type and range, enums by name, unions by
 * their tag.  Messages are QEMU's, with the member's dotted path, so a
 * script that matches qemu-storage-daemon's errors matches ours.
 *
 * Command-line option groups arrive as keyval strings ("cache.direct=on"):
 * with IOC_QMP_KEYVAL the walk converts each string in place to the type
 * the spec asks for, as QEMU's keyval input visitor does, so handlers and
 * drivers only ever see typed JSON.
 *
 * Rejected: jansson's json_unpack_ex format strings, which check types but
 * not ranges, enums or unions, and give messages in jansson's words.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema.h"

const char *ioc__qmp_type_name(enum ioc__qmp_type t)
{
	switch (t) {
	case IOC_QMP_STR: return "string";
	case IOC_QMP_BOOL: return "boolean";
	case IOC_QMP_UINT: return "integer";
	case IOC_QMP_ARRAY: return "array";
	case IOC_QMP_INT: return "integer";
	case IOC_QMP_SIZE: return "integer";
	case IOC_QMP_ENUM: return "string";
	case IOC_QMP_OBJECT: return "object";
	case IOC_QMP_REF: return "string or object";
	case IOC_QMP_ANY: return "any";
	}
	return "?";
}

static void path_join(char *out, size_t len, const char *prefix, const char *name)
{
	if (prefix && *prefix)
		snprintf(out, len, "%s.%s", prefix, name);
	else
		snprintf(out, len, "%s", name);
}

/* keyval's sizes: a number with an optional k/M/G/T/P/E suffix (powers
 * of 1024), as QEMU's qemu_strtosz(). */
static bool parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned shift = 0;
	double d;
	unsigned long long v;

	if (!*s || *s == '-')
		return false;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno)
		return false;
	if (*end == '.') {
		d = strtod(s, &end);
		if (d < 0)
			return false;
	} else {
		d = (double)v;
	}
	switch (*end) {
	case '\0': break;
	case 'b': case 'B': end++; break;
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	case 'p': case 'P': shift = 50; end++; break;
	case 'e': case 'E': shift = 60; end++; break;
	default: return false;
	}
	if (*end)
		return false;
	d *= (double)(1ull << shift);
	if (d >= 18446744073709551616.0)
		return false;
	if (shift == 0 && strchr(s, '.'))
		return false; /* fractions need a suffix */
	*out = shift ? (uint64_t)d : v;
	return true;
}

/* Convert a keyval string to the spec's scalar type; false when it does
 * not parse.  *nv is the new value (a new reference). */
static bool coerce(const struct ioc__qmp_arg *a, const char *s, json_t **nv)
{
	char *end;

	switch (a->type) {
	case IOC_QMP_BOOL:
		if (!strcmp(s, "on") || !strcmp(s, "yes") || !strcmp(s, "true"))
			*nv = json_true();
		else if (!strcmp(s, "off") || !strcmp(s, "no") || !strcmp(s, "false"))
			*nv = json_false();
		else
			return false;
		return true;
	case IOC_QMP_INT: {
		errno = 0;
		long long v = strtoll(s, &end, 0);

		if (errno || !*s || *end)
			return false;
		*nv = json_integer(v);
		return true;
	}
	case IOC_QMP_UINT: {
		errno = 0;
		unsigned long long v = strtoull(s, &end, 0);

		if (errno || !*s || *end || *s == '-' || v > INT64_MAX)
			return false;
		*nv = json_integer((json_int_t)v);
		return true;
	}
	case IOC_QMP_SIZE: {
		uint64_t v;

		if (!parse_size(s, &v) || v > INT64_MAX)
			return false;
		*nv = json_integer((json_int_t)v);
		return true;
	}
	default:
		return false;
	}
}

static bool check_obj(const struct ioc__qmp_arg *spec, const struct ioc__qmp_arg *spec2,
		      bool open, json_t *obj, unsigned flags, const char *prefix,
		      char *desc, size_t len);

static bool check_value(const struct ioc__qmp_arg *a, json_t *parent, const char *key,
			json_t *v, unsigned flags, const char *path, char *desc, size_t len)
{
	json_t *nv = NULL;

	if ((flags & IOC_QMP_KEYVAL) && json_is_string(v) &&
	    (a->type == IOC_QMP_BOOL || a->type == IOC_QMP_INT ||
	     a->type == IOC_QMP_UINT || a->type == IOC_QMP_SIZE)) {
		if (!coerce(a, json_string_value(v), &nv)) {
			snprintf(desc, len, "Parameter '%s' expects %s", path,
				 a->type == IOC_QMP_BOOL ? "'on' or 'off'" :
				 a->type == IOC_QMP_SIZE ? "a size value" :
				 a->type == IOC_QMP_UINT ? "uint64" : "int64");
			return false;
		}
		if (parent && json_is_object(parent))
			json_object_set_new(parent, key, nv);
		else if (parent)
			json_array_set_new(parent, (size_t)strtoul(key, NULL, 10), nv);
		v = nv;
	}
	switch (a->type) {
	case IOC_QMP_STR:
		if (!json_is_string(v))
			goto type;
		return true;
	case IOC_QMP_BOOL:
		if (!json_is_boolean(v))
			goto type;
		return true;
	case IOC_QMP_INT:
	case IOC_QMP_UINT:
	case IOC_QMP_SIZE:
		if (!json_is_integer(v))
			goto type;
		if (a->type != IOC_QMP_INT && json_integer_value(v) < 0) {
			snprintf(desc, len, "Parameter '%s' expects %s", path,
				 a->type == IOC_QMP_SIZE ? "size" : "uint64");
			return false;
		}
		if (a->max > a->min &&
		    (json_integer_value(v) < a->min || json_integer_value(v) > a->max)) {
			snprintf(desc, len, "Parameter '%s' expects a value between %" PRId64
				 " and %" PRId64, path, a->min, a->max);
			return false;
		}
		return true;
	case IOC_QMP_ENUM:
		if (!json_is_string(v))
			goto type;
		for (const char *const *e = a->values; e && *e; e++)
			if (strcmp(*e, json_string_value(v)) == 0)
				return true;
		snprintf(desc, len, "Parameter '%s' does not accept value '%s'", path,
			 json_string_value(v));
		return false;
	case IOC_QMP_OBJECT:
		if (!json_is_object(v))
			goto type;
		if (a->tag) {
			json_t *t = json_object_get(v, a->tag);
			const struct ioc__qmp_variant *var = a->variants;
			char tp[256];

			path_join(tp, sizeof(tp), path, a->tag);
			if (!t) {
				snprintf(desc, len, "Parameter '%s' is missing", tp);
				return false;
			}
			if (!json_is_string(t)) {
				snprintf(desc, len, "Invalid parameter type for '%s', expected: string",
					 tp);
				return false;
			}
			while (var && var->value && strcmp(var->value, json_string_value(t)))
				var++;
			if (!var || !var->value) {
				snprintf(desc, len, "Parameter '%s' does not accept value '%s'", tp,
					 json_string_value(t));
				return false;
			}
			return check_obj(a->members, var->members, a->open, v, flags, path,
					 desc, len);
		}
		return check_obj(a->members, NULL, a->open, v, flags, path, desc, len);
	case IOC_QMP_ARRAY: {
		struct ioc__qmp_arg el = { .name = a->name, .type = a->elem,
					   .members = a->members, .min = a->min, .max = a->max,
					   .values = a->values };
		size_t i;
		json_t *x;

		if (!json_is_array(v)) {
			/* keyval has no lists but a.0=x; one value is a list of one */
			goto type;
		}
		json_array_foreach(v, i, x) {
			char ip[256], k[24];

			snprintf(ip, sizeof(ip), "%s[%zu]", path, i);
			snprintf(k, sizeof(k), "%zu", i);
			if (!check_value(&el, v, k, x, flags, ip, desc, len))
				return false;
		}
		return true;
	}
	case IOC_QMP_REF:
		if (!json_is_string(v) && !json_is_object(v) && !json_is_null(v))
			goto type;
		return true;
	case IOC_QMP_ANY:
		return true;
	}
type:
	snprintf(desc, len, "Invalid parameter type for '%s', expected: %s", path,
		 ioc__qmp_type_name(a->type));
	return false;
}

static const struct ioc__qmp_arg *lookup(const struct ioc__qmp_arg *spec, const char *key)
{
	for (const struct ioc__qmp_arg *a = spec; a && a->name; a++)
		if (strcmp(a->name, key) == 0)
			return a;
	return NULL;
}

static bool check_members(const struct ioc__qmp_arg *spec, json_t *obj, unsigned flags,
			  const char *prefix, char *desc, size_t len)
{
	for (const struct ioc__qmp_arg *a = spec; a && a->name; a++) {
		json_t *v = json_object_get(obj, a->name);
		char p[256];

		path_join(p, sizeof(p), prefix, a->name);
		if (!v) {
			if (a->optional)
				continue;
			snprintf(desc, len, "Parameter '%s' is missing", p);
			return false;
		}
		if (!check_value(a, obj, a->name, v, flags, p, desc, len))
			return false;
	}
	return true;
}

static bool check_obj(const struct ioc__qmp_arg *spec, const struct ioc__qmp_arg *spec2,
		      bool open, json_t *obj, unsigned flags, const char *prefix,
		      char *desc, size_t len)
{
	const char *key;
	json_t *v;

	if (!check_members(spec, obj, flags, prefix, desc, len) ||
	    !check_members(spec2, obj, flags, prefix, desc, len))
		return false;
	if (open)
		return true;
	json_object_foreach(obj, key, v) {
		char p[256];

		if (lookup(spec, key) || lookup(spec2, key))
			continue;
		path_join(p, sizeof(p), prefix, key);
		snprintf(desc, len, "Parameter '%s' is unexpected", p);
		return false;
	}
	return true;
}

bool ioc__qmp_check_value(const struct ioc__qmp_arg *a, json_t *v, unsigned flags,
			  char *desc, size_t len)
{
	return check_value(a, NULL, NULL, v, flags, "", desc, len);
}

bool ioc__qmp_check(const struct ioc__qmp_arg *spec, json_t *obj, unsigned flags,
		    char *desc, size_t len)
{
	if (!json_is_object(obj)) {
		snprintf(desc, len, "Invalid parameter type, expected: object");
		return false;
	}
	return check_obj(spec, NULL, false, obj, flags, "", desc, len);
}

/* ---- keyval ---------------------------------------------------------------- */

/* The dot that ends the key fragment at seg, or NULL.  A fragment that
 * starts with QEMU's downstream prefix "__RFQDN_" keeps the dots of its
 * domain ("__org.iocore_lock" is one name), as QEMU's keyval parses it. */
static char *fragment_end(char *seg)
{
	char *p = seg;

	if (p[0] == '_' && p[1] == '_') {
		for (p += 2; isalnum((unsigned char)*p) || *p == '-' || *p == '.'; p++)
			;
		if (*p != '_')
			p = seg;   /* not the prefix: dots split as anywhere */
	}
	return strchr(p, '.');
}

/* Store value at the dotted key inside root, making the objects on the way. */
static bool keyval_put(json_t *root, const char *key, const char *value, char *desc,
		       size_t len)
{
	char buf[256], *seg, *dot;
	json_t *o = root;

	if (strlen(key) >= sizeof(buf) || !*key) {
		snprintf(desc, len, "Invalid parameter '%s'", key);
		return false;
	}
	strcpy(buf, key);
	seg = buf;
	while ((dot = fragment_end(seg))) {
		json_t *next;

		*dot = '\0';
		if (!*seg) {
			snprintf(desc, len, "Invalid parameter '%s'", key);
			return false;
		}
		next = json_object_get(o, seg);
		if (!next) {
			next = json_object();
			if (!next || json_object_set_new(o, seg, next) < 0) {
				snprintf(desc, len, "Parameter '%.200s' is not valid UTF-8 text", key);
				return false;
			}
		} else if (!json_is_object(next)) {
			snprintf(desc, len, "Parameter '%.*s' used inconsistently",
				 (int)(dot - buf), buf);
			return false;
		}
		o = next;
		seg = dot + 1;
	}
	if (!*seg) {
		snprintf(desc, len, "Invalid parameter '%s'", key);
		return false;
	}
	if (json_object_get(o, seg)) {
		/* QEMU: the last one wins for scalars */
		if (json_is_object(json_object_get(o, seg))) {
			snprintf(desc, len, "Parameter '%s' used inconsistently", key);
			return false;
		}
	}
	/* JSON strings are UTF-8: a name or value that is not cannot be kept. */
	if (json_object_set_new(o, seg, json_string(value)) < 0) {
		snprintf(desc, len, "Parameter '%.200s' is not valid UTF-8 text", key);
		return false;
	}
	return true;
}

json_t *ioc__qmp_keyval_parse(const char *s, const char *implied_key, bool *is_json,
			      char *desc, size_t len)
{
	json_t *root;
	const char *p = s;
	bool first = true;

	if (is_json)
		*is_json = false;
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p == '{') {
		json_error_t je;

		root = json_loads(p, JSON_REJECT_DUPLICATES, &je);
		if (!root || !json_is_object(root)) {
			snprintf(desc, len, "JSON parse error, %s", root ? "expected an object" :
				 je.text);
			json_decref(root);
			return NULL;
		}
		if (is_json)
			*is_json = true;
		return root;
	}
	root = json_object();
	if (!root) {
		snprintf(desc, len, "Out of memory");
		return NULL;
	}
	p = s;
	while (*p) {
		char key[256], *val;
		size_t kl = 0, vl = 0, vcap = strlen(p) + 1;
		const char *q = p;

		/* The key runs to '=' or ','; a bare first element is the
		 * implied key's value. */
		while (*q && *q != '=' && *q != ',')
			q++;
		if (*q != '=') {
			if (!first || !implied_key) {
				snprintf(desc, len, "Expected '=' after parameter '%.*s'",
					 (int)(q - p), p);
				goto fail;
			}
			snprintf(key, sizeof(key), "%s", implied_key);
			q = p; /* the value starts here */
		} else {
			kl = (size_t)(q - p);
			if (kl >= sizeof(key)) {
				snprintf(desc, len, "Parameter name too long");
				goto fail;
			}
			memcpy(key, p, kl);
			key[kl] = '\0';
			q++;
		}
		val = malloc(vcap);
		if (!val) {
			snprintf(desc, len, "Out of memory");
			goto fail;
		}
		/* ",," is a literal comma. */
		while (*q) {
			if (*q == ',') {
				if (q[1] == ',') {
					val[vl++] = ',';
					q += 2;
					continue;
				}
				break;
			}
			val[vl++] = *q++;
		}
		val[vl] = '\0';
		if (!keyval_put(root, key, val, desc, len)) {
			free(val);
			goto fail;
		}
		free(val);
		first = false;
		p = *q == ',' ? q + 1 : q;
	}
	return root;
fail:
	json_decref(root);
	return NULL;
}
