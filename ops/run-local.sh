#!/usr/bin/env bash
# README command 1: bring up a local cluster and walk through the API.
#
#   ops/run-local.sh          cluster up + demo; the cluster keeps running afterwards
#   ops/run-local.sh --stop   the same, then tear everything down (also when a step fails)
#
# Stop a running cluster with: ops/cluster.sh down
# Knobs: everything ops/cluster.sh takes (CLUSTER_PARTITIONS, CLUSTER_PRIVATE=1, ...).
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stop=0
for arg in "$@"; do
    case "$arg" in
        --stop) stop=1 ;;
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

if ((stop)); then
    trap '"$OPS_DIR/cluster.sh" down || warn "ops/cluster.sh down failed"' EXIT
fi

rc=0
if "$OPS_DIR/cluster.sh" up; then
    "$OPS_DIR/cluster.sh" demo || rc=$?
else
    rc=$?
    err "cluster up failed (logs in ${CLUSTER_DIR#"$REPO_ROOT"/}/logs/)"
fi

echo
if ((stop)); then
    info "--stop: tearing the cluster down"
else
    echo "The cluster keeps running. Look around with:"
    echo "  ops/cluster.sh status                 # processes, services, ownership map"
    echo "  source .cluster/cluster.env && curl -s \"\$ROUTER_URL/v1/partitions\" | jq ."
    echo "Stop it with:"
    echo "  ops/cluster.sh down"
fi
exit "$rc"
