#!/usr/bin/env bash
# README command 1: bring up a local cluster and walk through the API.
#
#   ops/run-local.sh          cluster up + demo; the cluster keeps running afterwards
#   ops/run-local.sh --stop   the same, then tear everything down (also when a step fails)
#
# Stop a running cluster with: ops/cluster.sh down
# Knobs: everything ops/cluster.sh takes (CLUSTER_PARTITIONS, CLUSTER_PRIVATE=1, ...), and
# AUTH=1: turn bearer-token authentication on. Writes fresh tokens and auth files under
# .cluster/auth/ (a client `demo` with scopes reserve,admin for the routers; a `router` token the
# allocators accept, and allocators that answer routers only), and runs the demo with the token.
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

# random_token: 32 random bytes as 64 hex digits.
random_token() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
sha256_hex() { printf %s "$1" | sha256sum | cut -d' ' -f1; }

if [[ "${AUTH:-0}" == 1 ]]; then
    auth_dir="$CLUSTER_DIR/auth"
    mkdir -p "$auth_dir"
    chmod 700 "$auth_dir"
    demo_token="$(random_token)"
    router_token="$(random_token)"
    (
        umask 077
        printf '%s\n' "$demo_token" >"$auth_dir/demo.token"
        printf '%s\n' "$router_token" >"$auth_dir/router.token"
        printf '# name scopes sha256(token)\ndemo reserve,admin %s\n' "$(sha256_hex "$demo_token")" \
            >"$auth_dir/router-clients"
        printf '# name scopes sha256(token)\nrouters router %s\n' "$(sha256_hex "$router_token")" \
            >"$auth_dir/allocator-clients"
    )
    export CLUSTER_ALLOCATOR_ARGS="${CLUSTER_ALLOCATOR_ARGS:-} --auth-file $auth_dir/allocator-clients --require-router"
    export CLUSTER_ROUTER_ARGS="${CLUSTER_ROUTER_ARGS:-} --auth-file $auth_dir/router-clients --upstream-token-file $auth_dir/router.token"
    export CLUSTER_TOKEN="$demo_token"
    info "AUTH=1: tokens and auth files in ${auth_dir#"$REPO_ROOT"/}/ (client token: demo.token)"
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
    if [[ "${AUTH:-0}" == 1 ]]; then
        echo "  source .cluster/cluster.env && curl -s -H \"authorization: Bearer \$(cat .cluster/auth/demo.token)\" \"\$ROUTER_URL/v1/partitions\" | jq ."
        echo "  (ops/cluster.sh map|status|demo need CLUSTER_TOKEN=\$(cat .cluster/auth/demo.token))"
    else
        echo "  source .cluster/cluster.env && curl -s \"\$ROUTER_URL/v1/partitions\" | jq ."
    fi
    echo "Stop it with:"
    echo "  ops/cluster.sh down"
fi
exit "$rc"
