#!/bin/sh
# The main job: serve a default image with iocore-nbd (or the demo until it exists).
set -eu
dir=${1:-build}
if [ -x "$dir/tools/nbd/iocore-nbd" ]; then
	exec "$dir/tools/nbd/iocore-nbd" --default-run "$dir"
fi
exec "$dir/tools/demo/iocore-demo"
