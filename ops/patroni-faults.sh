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
#   ops/patroni-faults.sh [freeze|etcd-cut|kill|switchover|all]   (default: freeze and etcd-cut)
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

case "${1:-default}" in
    freeze) tests=(a_frozen_leader_agent) ;;
    etcd-cut) tests=(a_leader_cut_off_from_etcd) ;;
    kill) tests=(a_killed_leader_postmaster) ;;
    switchover) tests=(a_patronictl_switchover) ;;
    default) tests=(a_frozen_leader_agent a_leader_cut_off_from_etcd) ;;
    all) tests=(a_frozen_leader_agent a_leader_cut_off_from_etcd a_killed_leader_postmaster a_patronictl_switchover) ;;
    -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
    *) print_header_usage "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac

step "packages"
ensure_packages postgresql patroni etcd
command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust with rustup)"
cd "$REPO_ROOT"
rc=0
for name in "${tests[@]}"; do
    step "patroni_failover::$name"
    cargo test -p allocator --test integration "patroni_failover::$name" -- --include-ignored \
        --nocapture </dev/null || rc=1
done
if ((rc == 0)); then
    ok "every fault kept every acknowledged write"
else
    err "a fault failed (see above)"
fi
exit "$rc"
