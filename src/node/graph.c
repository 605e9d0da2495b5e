/*
 * The graph: every node of a daemon by name, its children, who uses it.
 *
 * A node lives while something holds a reference: the graph (for a node
 * added by name), a parent (for its file or backing child), an export.
 * blockdev-del drops the graph's reference, refused while an export or a
 * job uses the node (ioc_node_use) or a named parent holds it, so a node
 * never disappears under a request.  Children opened inline get QEMU's
 * implicit names ("#block123") and are not in the graph's list of named
 * nodes, but are found by name like QEMU's.  Everything here runs on the
 * main thread; only the I/O path (node.c) and the drain (drain.c) run
 * elsewhere.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node-int.h"

int ioc_node_graph_new(struct ioc_node_graph **out)
{
	struct ioc_node_graph *g = calloc(1, sizeof(*g));

	static _Atomic uint64_t gens;

	if (!g)
		return -ENOMEM;
	/* Relaxed: only uniqueness matters. */
	g->gen = atomic_fetch_add_explicit(&gens, 1, memory_order_relaxed) + 1;
	pthread_mutex_init(&g->lock, NULL);
	*out = g;
	return 0;
}

static void graph_forget(struct ioc_node_graph *g, struct ioc_node *n)
{
	for (unsigned i = 0; i < g->nnodes; i++) {
		if (g->nodes[i] == n) {
			memmove(&g->nodes[i], &g->nodes[i + 1],
				(g->nnodes - i - 1) * sizeof(*g->nodes));
			g->nnodes--;
			return;
		}
	}
}

void ioc_node_graph_free(struct ioc_node_graph *g)
{
	if (!g)
		return;
	/* Newest first: a node added later may hold an older one. */
	while (g->nnodes) {
		struct ioc_node *n = g->nodes[g->nnodes - 1];

		n->in_graph = false;
		g->nnodes--;
		ioc_node_unref(n);
	}
	free(g->nodes);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

static struct ioc_node *find_in(struct ioc_node *n, const char *name)
{
	struct ioc_node *r;

	if (!n)
		return NULL;
	if (strcmp(n->name, name) == 0)
		return n;
	if ((r = find_in(n->file, name)))
		return r;
	return find_in(n->backing, name);
}

struct ioc_node *ioc_node_find(struct ioc_node_graph *g, const char *name)
{
	for (unsigned i = 0; name && i < g->nnodes; i++) {
		struct ioc_node *r = find_in(g->nodes[i], name);

		if (r)
			return r;
	}
	return NULL;
}

unsigned ioc_node_list(struct ioc_node_graph *g, struct ioc_node **out, unsigned max)
{
	for (unsigned i = 0; i < g->nnodes && i < max; i++)
		out[i] = g->nodes[i];
	return g->nnodes;
}

/* QEMU's id_wellformed(): a letter, then letters, digits, '-', '.', '_'. */
static bool name_ok(const char *s)
{
	if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
		return false;
	for (s++; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || *s == '-' || *s == '.' || *s == '_'))
			return false;
	return true;
}

void ioc__node_set_filename(struct ioc_node *n, const char *path)
{
	n->filename_buf = strdup(path);
	n->filename = n->filename_buf;
}

const char *ioc__node_opt_str(json_t *opts, const char *key, const char *dflt)
{
	json_t *v = json_object_get(opts, key);

	return json_is_string(v) ? json_string_value(v) : dflt;
}

bool ioc__node_opt_bool(json_t *opts, const char *key, bool dflt)
{
	json_t *v = json_object_get(opts, key);

	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

int64_t ioc__node_opt_int(json_t *opts, const char *key, int64_t dflt)
{
	json_t *v = json_object_get(opts, key);

	return json_is_integer(v) ? json_integer_value(v) : dflt;
}

struct ioc_node *ioc__node_new(struct ioc_node_graph *g, const struct ioc_node_drv *drv,
			       const char *name)
{
	struct ioc_node *n = aligned_alloc(IOC_CACHELINE, (sizeof(*n) + IOC_CACHELINE - 1) &
					   ~(size_t)(IOC_CACHELINE - 1));

	if (!n)
		return NULL;
	memset(n, 0, sizeof(*n));
	if (name) {
		snprintf(n->name, sizeof(n->name), "%s", name);
		n->explicit_name = true;
	} else {
		snprintf(n->name, sizeof(n->name), "#block%03u", g->implicit++);
	}
	n->drv = drv;
	n->graph = g;
	n->refs = 1;
	n->min_align = n->opt_align = 1;
	n->multi_conn = true;
	ioc__node_gate_init(n);
	return n;
}

/* Make and open a node from checked options; name may be NULL (implicit). */
static int node_open(struct ioc_node_graph *g, json_t *opts, const char *name,
		     struct ioc_node *parent, struct ioc_node **out, char *err, size_t errlen)
{
	const char *drvname = ioc__node_opt_str(opts, "driver", NULL);
	const struct ioc_node_drv *drv = ioc_node_drv_find(drvname);
	json_t *cache = json_object_get(opts, "cache");
	/* A child inherits its parent's discard and cache modes (QEMU's
	 * bdrv_inherited_options()). */
	const char *discard = ioc__node_opt_str(opts, "discard",
						parent && parent->discard_unmap ? "unmap" : "ignore");
	const char *dz = ioc__node_opt_str(opts, "detect-zeroes", "off");
	struct ioc_node *n;
	int ret;

	if (!drv) {
		snprintf(err, errlen, "Unknown driver '%s'", drvname ? drvname : "");
		return -EINVAL;
	}
	n = ioc__node_new(g, drv, name);
	if (!n)
		return -ENOMEM;
	n->read_only = ioc__node_opt_bool(opts, "read-only", parent && parent->read_only);
	n->discard_unmap = !strcmp(discard, "unmap") || !strcmp(discard, "on");
	n->detect_zeroes = strcmp(dz, "off") != 0;
	n->detect_zeroes_unmap = !strcmp(dz, "unmap");
	n->direct = ioc__node_opt_bool(cache, "direct", parent && parent->direct);
	n->no_flush = ioc__node_opt_bool(cache, "no-flush", parent && parent->no_flush);
	n->opts = json_incref(opts);
	ret = drv->open(n, opts, err, errlen);
	if (ret < 0) {
		ioc__node_gate_destroy(n);
		json_decref(n->opts);
		free(n->filename_buf);
		free(n);
		return ret;
	}
	*out = n;
	return 0;
}

int ioc_node_add(struct ioc_node_graph *g, json_t *opts, struct ioc_node **out,
		 const char **cls, char *err, size_t errlen)
{
	const char *name = ioc__node_opt_str(opts, "node-name", NULL);
	struct ioc_node *n;
	int ret;

	*cls = "GenericError";
	if (!ioc_node_check_opts(opts, 0, err, errlen))
		return -EINVAL;
	if (!name) {
		snprintf(err, errlen, "'node-name' must be specified for the root node");
		return -EINVAL;
	}
	if (!name_ok(name)) {
		snprintf(err, errlen, "Invalid node-name: '%s'", name);
		return -EINVAL;
	}
	if (strlen(name) >= 32) {
		snprintf(err, errlen, "Node name too long");
		return -EINVAL;
	}
	if (ioc_node_find(g, name)) {
		snprintf(err, errlen, "Duplicate nodes with node-name='%s'", name);
		return -EEXIST;
	}
	if (g->nnodes == g->cap) {
		unsigned cap = g->cap ? 2 * g->cap : 16;
		struct ioc_node **nn = realloc(g->nodes, cap * sizeof(*nn));

		if (!nn)
			return -ENOMEM;
		g->nodes = nn;
		g->cap = cap;
	}
	ret = node_open(g, opts, name, NULL, &n, err, errlen);
	if (ret < 0)
		return ret;
	n->in_graph = true;
	g->nodes[g->nnodes++] = n;
	if (out)
		*out = n;
	return 0;
}

/* A named parent in the graph that holds n as a child. */
static struct ioc_node *parent_of(struct ioc_node_graph *g, struct ioc_node *n)
{
	for (unsigned i = 0; i < g->nnodes; i++) {
		struct ioc_node *p = g->nodes[i];

		for (struct ioc_node *c = p->file; c; c = c->file)
			if (c == n)
				return p;
		for (struct ioc_node *c = p->backing; c; c = c->backing)
			if (c == n)
				return p;
	}
	return NULL;
}

int ioc_node_del(struct ioc_node_graph *g, const char *name, const char **cls,
		 char *err, size_t errlen)
{
	struct ioc_node *n = ioc_node_find(g, name);

	*cls = "GenericError";
	if (!n) {
		snprintf(err, errlen, "Failed to find node with node-name='%s'", name);
		return -ENOENT;
	}
	if (!n->in_graph) {
		snprintf(err, errlen, "Node %s is not owned by the monitor", name);
		return -EBUSY;
	}
	if (n->users) {
		snprintf(err, errlen, "Node %s is in use", name);
		return -EBUSY;
	}
	if (parent_of(g, n)) {
		snprintf(err, errlen, "Block device %s is in use", name);
		return -EBUSY;
	}
	graph_forget(g, n);
	n->in_graph = false;
	ioc_node_unref(n);
	return 0;
}

int ioc_node_open_child(struct ioc_node *parent, json_t *ref, const char *role,
			struct ioc_node **out, char *err, size_t errlen)
{
	struct ioc_node *c;
	int ret;

	if (json_is_string(ref)) {
		c = ioc_node_find(parent->graph, json_string_value(ref));
		if (!c) {
			snprintf(err, errlen, "Cannot find device='%s' nor node-name='%s'",
				 json_string_value(ref), json_string_value(ref));
			return -ENOENT;
		}
		if (!c->read_only || parent->read_only) {
			ioc_node_ref(c);
			*out = c;
			return 0;
		}
		snprintf(err, errlen, "Block node is read-only");
		return -EPERM;
	}
	if (!json_is_object(ref)) {
		snprintf(err, errlen, "Invalid parameter type for '%s', expected: string or "
			 "object", role);
		return -EINVAL;
	}
	if (!ioc_node_check_opts(ref, 0, err, errlen))
		return -EINVAL;
	ret = node_open(parent->graph, ref, ioc__node_opt_str(ref, "node-name", NULL),
			parent, &c, err, errlen);
	if (ret < 0)
		return ret;
	*out = c;
	return 0;
}

/* Format probing as qemu-nbd's: an image names its format by its magic;
 * everything else is raw (and raw is never probed as anything else). */
static const char *probe(const char *path)
{
	unsigned char m[4];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t r;

	if (fd < 0)
		return "raw";
	r = pread(fd, m, sizeof(m), 0);
	close(fd);
	if (r == 4 && m[0] == 'Q' && m[1] == 'F' && m[2] == 'I' && m[3] == 0xfb)
		return "qcow2";
	return "raw";
}

int ioc_node_open_file(struct ioc_node *parent, const char *path, const char *format,
		       bool read_only, struct ioc_node **out, char *err, size_t errlen)
{
	json_t *o;
	int ret;

	if (!format)
		format = probe(path);
	if (strcmp(format, "raw") == 0)
		o = json_pack("{s:s,s:s,s:b}", "driver", "file", "filename", path,
			      "read-only", read_only);
	else
		o = json_pack("{s:s,s:{s:s,s:s},s:b}", "driver", format, "file",
			      "driver", "file", "filename", path, "read-only", read_only);
	if (!o)
		return -ENOMEM;
	if (!ioc_node_drv_find(format)) {
		snprintf(err, errlen, "Unknown driver '%s'", format);
		json_decref(o);
		return -ENOTSUP;
	}
	ret = ioc_node_open_child(parent, o, "backing", out, err, errlen);
	json_decref(o);
	return ret;
}

void ioc_node_ref(struct ioc_node *n)
{
	n->refs++;
}

void ioc_node_unref(struct ioc_node *n)
{
	if (!n || --n->refs)
		return;
	if (n->drv->close && !n->borrowed)
		n->drv->close(n);
	ioc_node_unref(n->file);
	ioc_node_unref(n->backing);
	ioc__node_gate_destroy(n);
	json_decref(n->opts);
	free(n->filename_buf);
	free(n);
}

void ioc_node_use(struct ioc_node *n, const char *desc)
{
	n->users++;
	snprintf(n->user_desc, sizeof(n->user_desc), "%s", desc ? desc : "");
	ioc_node_ref(n);
}

void ioc_node_unuse(struct ioc_node *n)
{
	n->users--;
	ioc_node_unref(n);
}
