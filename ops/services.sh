#!/usr/bin/env bash
# PostgreSQL and Redis for a local allocator cluster, from the cluster launcher
# (`cluster up --services-only`: no migration, no service process).
#
#   ops/services.sh up       provide both, write .cluster/env (DATABASE_URL, REDIS_URL,
#                            CLUSTER_PG_MODE, CLUSTER_REDIS_MODE: system or private)
#   ops/services.sh down     stop what `up` started (never a system service)
#   ops/services.sh env      print the env file (eval "$(ops/services.sh env)")
#   ops/services.sh status   say what is in use and whether it answers
#
# PostgreSQL: when a server answers on 127.0.0.1:5432 and its user may create databases, it is
# used with a dedicated database ($CLUSTER_DB_NAME, default allocator_demo) that `up` drops and
# recreates, so every demo starts fresh. Nothing else on that server is touched. Otherwise (or with
# CLUSTER_PRIVATE=1 / CLUSTER_PRIVATE_PG=1) a private, disposable instance (testkit's PgServer) is
# initdb'ed and started on a free port; as root it runs as the `postgres` user.
#
# Redis: 127.0.0.1:6379 when it answers PING, else (or with CLUSTER_PRIVATE=1 /
# CLUSTER_PRIVATE_REDIS=1) a private redis-server on a free port, no persistence.
# The other knobs are ops/cluster.sh's (CLUSTER_PG_DURABLE, CLUSTER_PG_OPTIONS, CLUSTER_PG_STANDBY,
# CLUSTER_SYSTEM_PG_HOST, ...). A cluster and its services share CLUSTER_DIR: `up` here stops a
# cluster running there.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ENV_FILE="$CLUSTER_DIR/env"

cmd_up() {
    ensure_packages postgresql redis
    cluster_launcher up --services-only
    ok "services up (env: $ENV_FILE)"
}

cmd_down() {
    if [[ ! -e "$CLUSTER_DIR/run/cluster.pid" ]]; then
        info "services: nothing recorded as started in $CLUSTER_DIR"
        return 0
    fi
    cluster_launcher down
    ok "services down"
}

cmd_env() {
    [[ -r "$ENV_FILE" ]] || die "no $ENV_FILE; run ops/services.sh up first"
    grep -v '^#' "$ENV_FILE"
}

usage() { print_header_usage "${BASH_SOURCE[0]}"; }

case "${1:-}" in
    up) with_cluster_lock cmd_up ;;
    down) with_cluster_lock cmd_down ;;
    env) cmd_env ;;
    status) cluster_launcher status --services ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
esac
