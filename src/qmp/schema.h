/*
 * Typed argument specs, QAPI's schema in a table: every QMP command, every
 * --blockdev/--export/--object option group and every block driver's
 * options is a NULL-name-terminated array of struct ioc__qmp_arg, checked
 * by ioc__qmp_check() in one place before a handler or driver sees it.
 */
#ifndef IOC_QMP_SCHEMA_H
#define IOC_QMP_SCHEMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ioc__qmp_type {
	IOC_QMP_STR,
	IOC_QMP_BOOL,
	IOC_QMP_UINT,      /* a non-negative integer ("uint64") */
	IOC_QMP_ARRAY,     /* of .elem (with .members when objects; .elem
			    * IOC_QMP_ANY leaves elements to the handler) */
	IOC_QMP_INT,       /* "int" */
	IOC_QMP_SIZE,      /* "size": keyval takes suffixes (64k, 1G) */
	IOC_QMP_ENUM,      /* a string out of .values */
	IOC_QMP_OBJECT,    /* .members; with .tag, a union (.variants) */
	IOC_QMP_REF,       /* a string, or an object the caller checks
			    * itself (BlockdevRef: a node name or inline
			    * BlockdevOptions) */
	IOC_QMP_ANY,       /* unchecked (left to the handler) */
};

struct ioc__qmp_arg;

/* One branch of a union: when the tag member is value, members apply. */
struct ioc__qmp_variant {
	const char *value;
	const struct ioc__qmp_arg *members;
};

struct ioc__qmp_arg {
	const char *name;
	enum ioc__qmp_type type;
	bool optional;
	/* INT, UINT, SIZE: the accepted range when max > min. */
	int64_t min, max;
	const char *const *values;             /* ENUM: NULL-terminated */
	const struct ioc__qmp_arg *members;    /* OBJECT, ARRAY of OBJECT */
	enum ioc__qmp_type elem;               /* ARRAY */
	/* OBJECT as a union: the member named tag (an ENUM among members,
	 * or any string) picks one of variants (NULL-value terminated);
	 * a value with no variant is refused as QEMU refuses it. */
	const char *tag;
	const struct ioc__qmp_variant *variants;
	/* REF and ANY, and an OBJECT with open members (QEMU's "props" of
	 * object-add): members the spec does not list are allowed. */
	bool open;
};

enum {
	/* Values came from a key=value command line: strings are coerced
	 * in place into the integers, booleans (on/off, yes/no, true/false)
	 * and sizes the spec asks for, as QEMU's keyval visitor does. */
	IOC_QMP_KEYVAL = 1u << 0,
};

/*
 * Check obj (an object) against spec, members of nested objects named by
 * their dotted path in messages ("Parameter 'addr.path' is missing"), in
 * QEMU's words for each failure.  Returns true, or false with desc set
 * (the error class is always GenericError for these).
 */
bool ioc__qmp_check(const struct ioc__qmp_arg *spec, json_t *obj, unsigned flags,
		    char *desc, size_t len);

/* Check one value against one spec (an OBJECT spec with a tag checks a
 * whole union, as blockdev-add's arguments); paths start at its members. */
bool ioc__qmp_check_value(const struct ioc__qmp_arg *a, json_t *v, unsigned flags,
			  char *desc, size_t len);

/* QEMU's names for a type in "Invalid parameter type" messages. */
const char *ioc__qmp_type_name(enum ioc__qmp_type t);

/*
 * Parse QEMU's keyval syntax ("driver=file,node-name=n0,cache.direct=on",
 * ",," for a literal comma; implied_key names the member a leading
 * value without '=' belongs to, or NULL) into a nested object of strings
 * (a.b=c makes {"a": {"b": "c"}}).  A value starting with '{' is parsed
 * as JSON instead, as QEMU's --blockdev and --export accept.  Returns the
 * object, or NULL with desc set.
 */
json_t *ioc__qmp_keyval_parse(const char *s, const char *implied_key, bool *is_json,
			      char *desc, size_t len);

#endif /* IOC_QMP_SCHEMA_H */
