#!/usr/bin/env bash
# Build and run distributed_testing in containers with podman (docs/operations.md, "Containers").
#   bash scripts/containers.sh setup    install podman, runc, mmdebstrap (apt-get, as root) and
#                                       podman-compose (PyPI, into build/containers/tools)
#   bash scripts/containers.sh base     a Debian bookworm base with Python (mmdebstrap, podman
#                                       import): localhost/dt-base:bookworm, for where no registry is reachable
#   bash scripts/containers.sh image [--local-base]
#                                       build deploy/Containerfile as localhost/distributed-testing
#                                       (BASE: python:3.12-slim, or the local base); with this
#                                       machine's pip settings mounted into the build
#   bash scripts/containers.sh postgres a stand-in for the postgres image, from the local base
#   bash scripts/containers.sh up       bring the HA group of deploy/compose.yaml up: secrets, the
#                                       first admin key, a worker key, then the workers; prints the
#                                       group's address and where the admin key is
#   bash scripts/containers.sh down     stop the group and remove its containers and volumes
#   bash scripts/containers.sh compose ARGS...   podman-compose on the group, e.g. `compose logs worker-1`
# Host ports: DT_PUBLISH_A (8080), DT_PUBLISH_B (8082), DT_PUBLISH_DASHBOARD (8081).
# DT_IMAGE_BASE overrides the build's BASE; DT_POSTGRES_IMAGE the group's PostgreSQL image.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$ROOT/build/containers
TOOLS=$BUILD/tools
IMAGE=${DT_IMAGE:-localhost/distributed-testing:latest}
LOCAL_BASE=localhost/dt-base:bookworm
STANDIN_PG=localhost/dt-postgres-standin:15
PROJECT=${DT_COMPOSE_PROJECT:-dt}
mkdir -p "$BUILD"
# This machine's podman (Debian's 4.3) runs containers with runc (crun refuses cgroups in hybrid
# mode) and without setting ulimits (setrlimit RLIMIT_NOFILE is refused here); a config of our
# own keeps /etc/containers as it is.
cat > "$BUILD/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF=$BUILD/containers.conf
export DT_IMAGE=$IMAGE

log() { printf '[containers %s] %s\n' "$(date +%T)" "$*" >&2; }

setup() {
  if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v mmdebstrap >/dev/null; then
    log "installing podman, runc, mmdebstrap"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap) >/dev/null
  fi
  if [ ! -x "$TOOLS/bin/podman-compose" ]; then
    log "installing podman-compose into $TOOLS"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q "podman-compose>=1.0.6"
  fi
}

base() {
  local t=$SECONDS
  log "mmdebstrap: Debian bookworm, minbase, python3"
  rm -f "$BUILD/base.tar"
  # documentation and translations are of no use in an image
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$BUILD/base.tar"
  podman import --quiet --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' "$BUILD/base.tar" "$LOCAL_BASE" >/dev/null
  rm -f "$BUILD/base.tar"
  log "base: $LOCAL_BASE in $((SECONDS - t)) s"
}

build_opts() {
  # this machine's pip settings (registries, CA bundle, the CPU torch wheel), mounted read-only
  python3 scripts/pip_build_config.py "$BUILD/pip.conf"
}

image() {
  local base=${DT_IMAGE_BASE:-}
  if [ "${1:-}" = --local-base ]; then
    podman image exists "$LOCAL_BASE" || base
    base=$LOCAL_BASE
  fi
  local args=(--format docker --network host -f deploy/Containerfile --ignorefile deploy/Containerfile.dockerignore
              -t "$IMAGE")
  [ -n "$base" ] && args+=(--build-arg "BASE=$base")
  mapfile -t mounts < <(build_opts)
  log "building $IMAGE${base:+ on $base}"
  local t=$SECONDS
  podman build "${args[@]}" "${mounts[@]}" .
  log "built $IMAGE in $((SECONDS - t)) s: $(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
}

postgres() {
  podman image exists "$LOCAL_BASE" || base
  local t=$SECONDS
  podman build --network host -f deploy/postgres/Containerfile --build-arg "BASE=$LOCAL_BASE" -t "$STANDIN_PG" .
  log "built $STANDIN_PG in $((SECONDS - t)) s"
}

compose() {
  # podman-compose applies stop_grace_period to `compose stop` and `down` only: every container
  # gets the workers' (130 s) as its own stop timeout, so `podman stop NAME` lets a worker drain too
  (cd deploy && "$TOOLS/bin/podman-compose" -p "$PROJECT" --podman-run-args=--stop-timeout=130 \
     -f compose.yaml -f compose.podman.yaml "$@")
}

secret() {  # secret NAME: write stdin to deploy/secrets/NAME, readable by the image's user alone
  local f=deploy/secrets/$1
  (umask 077; cat > "$f")
  chown 10001:10001 "$f" 2>/dev/null || true
  chmod 0600 "$f"
}

addresses() {
  echo "http://127.0.0.1:${DT_PUBLISH_A:-8080},http://127.0.0.1:${DT_PUBLISH_B:-8082}"
}

up() {
  local dt=${DT_CLI:-dt}
  if [ ! -s deploy/secrets/postgres_password ]; then
    python3 -c 'import secrets; print(secrets.token_urlsafe(24), end="")' | secret postgres_password
    printf 'postgres:5432:dt:dt:%s\n' "$(cat deploy/secrets/postgres_password)" | secret pgpass
  fi
  [ -s deploy/secrets/worker_key ] || : | secret worker_key  # made below, once a coordinator leads
  log "starting PostgreSQL, two coordinators and the dashboard"
  compose up -d postgres coordinator-a coordinator-b dashboard
  export DT_COORDINATOR_URL; DT_COORDINATOR_URL=$(addresses)
  local admin=/var/lib/dt/state/admin.key
  for _ in $(seq 300); do  # the member that first leads writes it (to the volume both share)
    if podman exec "${PROJECT}_coordinator-a_1" test -s "$admin" 2>/dev/null \
       && DT_API_KEY=$(podman exec "${PROJECT}_coordinator-a_1" cat "$admin") "$dt" workers >/dev/null 2>&1; then
      break
    fi
    sleep 0.5
  done
  DT_API_KEY=$(podman exec "${PROJECT}_coordinator-a_1" cat "$admin")
  export DT_API_KEY
  if [ ! -s deploy/secrets/worker_key ]; then
    "$dt" keys create --role worker --name compose-workers | secret worker_key
  fi
  log "starting two workers"
  compose up -d worker-1 worker-2
  echo "group: DT_COORDINATOR_URL=$DT_COORDINATOR_URL"
  echo "admin key: podman exec ${PROJECT}_coordinator-a_1 cat $admin"
  echo "dashboard: http://127.0.0.1:${DT_PUBLISH_DASHBOARD:-8081}/"
}

down() {
  compose down -v >/dev/null 2>&1 || true
  rm -f deploy/secrets/postgres_password deploy/secrets/pgpass deploy/secrets/worker_key
}

cmd=${1:-}; [ "$#" -gt 0 ] && shift
case "$cmd" in
  setup) setup ;;
  base) base ;;
  image) image "$@" ;;
  postgres) postgres ;;
  up) up ;;
  down) down ;;
  compose) compose "$@" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
