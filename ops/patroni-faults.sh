#!/usr/bin/env bash
# Failover under Patroni, the faults CI does not run: an allocator on a two-node Patroni cluster
# (three etcd members, synchronous mode, pg_rewind; testkit's PatroniCluster) under a stream of
# reserves, through
#
#   freeze     SIGSTOP of the leader's Patroni agent: its PostgreSQL runs on, writable, until
#              the leader key expires (ttl) and the standby is promoted; the agent is thawed
#              3 s later and rejoins its node as a standby (pg_rewind when needed)
#   etcd-cut   the leader's agent cut off from every etcd member: it demotes itself after
#              retry_timeout, the standby is promoted once the key expires; reconnected 3 s
#              later, the node rejoins
#   kill       SIGKILL of the leader's postmaster (also in CI)
#   switchover patronictl switchover --force (also in CI)
#
#   ops/patroni-faults.sh [--runs N] [freeze|etcd-cut|kill|switchover|all]
#                                        (default: freeze and etcd-cut, once each)
#
# With --runs N each fault runs N times and a table follows: per fault kind, p50 and max over the
# runs of the seconds from the fault to the promotion, to the first successful reserve sent
# after the fault, and to the old primary streaming again, and the longest time without a 2xx;
# and how many runs failed their checks (times of failed runs count when they were printed).
#
# Each run checks what the CI tests check (allocator/tests/integration/patroni_failover.rs: no
# acknowledged hold or confirmation lost, every SKU balanced, the old primary streaming again,
# the storage fence never taking the old primary after the promotion) and prints the times from
# the fault to the promotion, to service and to the rejoin, the longest time without a 2xx, and
# the allocator's storage fence series. About a minute per fault; installs patroni and etcd when
# missing.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

runs=1
if [[ "${1:-}" == --runs ]]; then
    runs="${2:-}"
    shift 2 || true
fi
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || die "--runs takes a positive number of runs"

case "${1:-default}" in
    freeze | etcd-cut | kill | switchover) kinds=("$1") ;;
    default) kinds=(freeze etcd-cut) ;;
    all) kinds=(freeze etcd-cut kill switchover) ;;
    -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
    *) print_header_usage "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac

step "packages"
ensure_packages postgresql patroni etcd
command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust with rustup)"
cd "$REPO_ROOT"
rc=0
times="$(mktemp)"
trap 'rm -f "$times"' EXIT
for kind in "${kinds[@]}"; do
    case "$kind" in
        freeze) name=a_frozen_leader_agent ;;
        etcd-cut) name=a_leader_cut_off_from_etcd ;;
        kill) name=a_killed_leader_postmaster ;;
        switchover) name=a_patronictl_switchover ;;
    esac
    for ((run = 1; run <= runs; run++)); do
        step "patroni_failover::$name (run $run of $runs)"
        out="$(mktemp)"
        if cargo test -p allocator --test integration "patroni_failover::$name" -- --include-ignored \
            --nocapture </dev/null 2>&1 | tee "$out"; then
            status=ok
        else
            status=failed
            rc=1
        fi
        grep -o 'failover-times .*' "$out" | sed -E "s/fault=[^ ]+/fault=$kind/; s/\$/ status=$status/" >>"$times" \
            || echo "failover-times fault=$kind status=$status" >>"$times"
        rm -f "$out"
    done
done
if ((runs > 1)); then
    echo
    echo "Failover times over $runs runs per fault (seconds from the fault; p50 / max):"
    echo
    awk -f "$OPS_DIR/patroni-times.awk" "$times"
fi
if ((rc == 0)); then
    ok "every fault kept every acknowledged write"
else
    err "a fault failed (see above)"
fi
exit "$rc"
