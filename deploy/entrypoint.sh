#!/bin/sh
# The image's entry point (under tini): its first argument names the program.
#   coordinator [FLAGS]   dt-coordinator        worker [FLAGS]   dt-worker
#   dashboard [FLAGS]     dt-dashboard          dt ARGS          the CLI
# anything else runs as given. `exec`: the program is tini's only child, so SIGTERM from
# `podman stop` / `docker stop` reaches it and nothing else (a worker's tasks finish while it drains).
set -eu
role="${1:-coordinator}"
[ "$#" -gt 0 ] && shift
case "$role" in
  coordinator) exec dt-coordinator "$@" ;;
  worker)
    # the health check reads GET /metrics here (127.0.0.1 unless DT_METRICS_HOST says otherwise);
    # only the worker gets it: the coordinator's DT_METRICS_PORT would serve metrics without a key
    export DT_METRICS_PORT="${DT_METRICS_PORT:-9100}"
    exec dt-worker "$@" ;;
  dashboard) exec dt-dashboard "$@" ;;
  dt) exec dt "$@" ;;
  *) exec "$role" "$@" ;;
esac
