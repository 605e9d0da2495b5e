/* iocore-bench vhost-blk: the command (vhost-blk.c). */
#ifndef IOC_TOOLS_BENCH_VHOST_BLK_H
#define IOC_TOOLS_BENCH_VHOST_BLK_H

/* argv[0] is "vhost-blk"; returns the exit status. */
int ioc_bench_vhost_blk(int argc, char **argv);

#endif
