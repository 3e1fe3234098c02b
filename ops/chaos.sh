#!/usr/bin/env bash
# Chaos run: a seeded, randomized fault schedule against real processes (private PostgreSQL and
# Redis, 3 allocators each behind a TCP proxy to PostgreSQL, 2 routers) under a mixed workload
# through both routers; every operation and fault is recorded, the database dumped at the end,
# and an independent checker (chaos-check) judges the history. Exits 1 on any violation.
#
#   ops/chaos.sh [--seed N] [--duration SECONDS] [--faults LIST] [--shards N] [--out DIR]
#                [--negative-control] [--ha patroni]
#
#   --seed N              seed of the workload and the fault schedule (default 1)
#   --duration SECONDS    seconds of load under faults (default 60)
#   --faults LIST         comma-separated kinds to draw from (default all): kill, pause,
#                         partition, latency, pg-restart, redis-restart, clock-skew, router-kill,
#                         window-change, pg-failover; with --shards also shard-stop,
#                         shard-crash, shard-freeze, shard-blackhole, shard-move, move-abort,
#                         move-rerun, move-race, move-killed; with --ha patroni,
#                         patroni-failover instead of pg-restart and pg-failover
#   --shards N            spread the partitions over N PostgreSQL shards (default 1): the
#                         catalog shard is the replicated pair, every further shard a server of
#                         its own, two allocators serve each shard, and the shard faults (a shard
#                         stopped, crashed, frozen or cut off, a partition moved under load with
#                         the mover sometimes killed and run again; a move stopped after a
#                         recorded state and aborted or re-run, two movers at once) are drawn
#                         too; every shard's leases are sampled through the run (leases.jsonl)
#                         and the checker merges the shards' dumps
#   --out DIR             where history.jsonl, faults.jsonl, dump.json, summary.json,
#                         check.json and the process logs go (default
#                         $CARGO_TARGET_DIR/chaos/seed<N>-<time>, printed)
#   --negative-control    run the same schedule against an allocator built with the
#                         `negative-control` feature and fencing switched off
#                         (ALLOCATOR_UNSAFE_DISABLE_FENCE=1); every other fault is then a pause
#                         or a partition. The checker must find stale-epoch writes or oversells:
#                         the script then says the negative control failed as expected and exits
#                         1; it exits 3 if the checker found nothing.
#
#   --ha patroni          the database is a two-node Patroni cluster (three etcd members,
#                         synchronous mode, pg_rewind) instead of the replicated pair, and the
#                         fault patroni-failover (the leader's postmaster SIGKILLed, or a
#                         patronictl switchover, healed once the old leader streams again) is
#                         drawn; not in CI (ops/patroni-faults.sh and the integration tests
#                         cover Patroni there)
#
# Exit status: 0 no violations; 1 violations (or, with --negative-control, the expected
# failure); 2 the run or the checker could not complete; 3 the negative control went undetected.
# Knobs: CARGO_TARGET_DIR, ALLOCATOR_PG_BIN, ALLOCATOR_REDIS_SERVER, ALLOCATOR_LIBFAKETIME,
# OPS_NO_INSTALL=1.
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

seed=1
duration=60
faults=""
shards=1
out=""
negative=0
ha=""
while (($#)); do
    case "$1" in
        --seed) seed=${2:?--seed needs a value}; shift 2 ;;
        --duration) duration=${2:?--duration needs a value}; shift 2 ;;
        --faults) faults=${2:?--faults needs a value}; shift 2 ;;
        --shards) shards=${2:?--shards needs a value}; shift 2 ;;
        --out) out=${2:?--out needs a value}; shift 2 ;;
        --negative-control) negative=1; shift ;;
        --ha) ha=${2:?--ha needs a value}; shift 2 ;;
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ "$seed" =~ ^[0-9]+$ ]] || die "--seed must be a non-negative integer"
[[ "$shards" =~ ^[1-8]$ ]] || die "--shards must be 1 to 8"
[[ "$duration" =~ ^[1-9][0-9]*$ ]] || die "--duration must be a positive number of seconds"
[[ -z "$ha" || "$ha" == patroni ]] || die "--ha takes patroni"

cd "$REPO_ROOT"
step "packages (PostgreSQL server, redis-server, libfaketime)"
ensure_packages postgresql redis faketime jq
[[ -z "$ha" ]] || ensure_packages patroni etcd
ALLOCATOR_PG_BIN="$(pg_bin_dir)" || die "no PostgreSQL server binaries"
ALLOCATOR_REDIS_SERVER="$(redis_server_bin)" || die "no redis-server"
ALLOCATOR_LIBFAKETIME="$(libfaketime_path)" || die "no libfaketime"
export ALLOCATOR_PG_BIN ALLOCATOR_REDIS_SERVER ALLOCATOR_LIBFAKETIME
command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust with rustup)"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

target_dir="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
bin_dir="$target_dir/debug"
allocator_bin="$bin_dir/allocator"
if ((negative)); then
    # Same package set as the default build below, so dependencies resolve to the same features
    # and only the allocator crate is compiled again; the
    # binary is copied aside and the default build below puts the normal one back in place.
    step "build the negative-control allocator"
    # (`--features negative-control` applies to the selected package that has it; the
    # `allocator/negative-control` form would name the allocator's dev-dependency on itself.)
    cargo build -q -p allocator -p router -p chaos -p loadtest --features negative-control,fault-hooks
    cp "$bin_dir/allocator" "$bin_dir/allocator-negative-control"
    allocator_bin="$bin_dir/allocator-negative-control"
    # A default binary here would make the control test nothing; its log line only exists in
    # the feature build.
    grep -q "negative control armed" "$allocator_bin" \
        || die "$allocator_bin was not built with the negative-control feature"
fi
step "build allocator, router, chaos, loadtest"
# The allocator with its fault hooks, which stay inert unless their environment variable is set:
# the move faults stop a mover right after a recorded state (ALLOCATOR_FAULT_MOVE_STOP_AFTER).
cargo build -q -p allocator -p router -p chaos -p loadtest --features fault-hooks

suffix=""
label=""
if ((negative)); then
    suffix="-nc"
    label=", negative control"
fi
[[ -n "$out" ]] || out="$target_dir/chaos/seed$seed-$(date -u +%Y%m%dT%H%M%SZ)$suffix"
mkdir -p "$out"
info "output directory: $out"

args=(--seed "$seed" --duration "$duration" --out "$out" --allocator-bin "$allocator_bin")
if [[ -n "$faults" ]]; then args+=(--faults "$faults"); fi
if ((shards > 1)); then args+=(--shards "$shards"); label="$label, $shards shards"; fi
if ((negative)); then args+=(--negative-control); fi
if [[ -n "$ha" ]]; then args+=(--ha "$ha"); label="$label, $ha"; fi
step "chaos run: seed $seed, ${duration}s$label"
t0=$SECONDS
if ! "$bin_dir/chaos" "${args[@]}" 2>"$out/harness.log"; then
    err "the chaos harness failed; last lines of $out/harness.log:"
    tail -n 30 "$out/harness.log" >&2
    exit 2
fi
info "run took $((SECONDS - t0))s"

step "check"
rc=0
"$bin_dir/chaos-check" "$out" || rc=$?
((rc == 2)) && { err "the checker could not read the run in $out"; exit 2; }
if ((negative)); then
    stale="$(jq '.violations["stale-epoch-write"]' "$out/check.json")"
    oversell="$(jq '.violations["oversell"]' "$out/check.json")"
    if ((rc == 1 && (stale > 0 || oversell > 0))); then
        ok "negative control failed as expected: $stale stale-epoch writes, $oversell oversells found ($out)"
        exit 1
    fi
    err "negative control NOT detected: the checker found no stale-epoch write or oversell in a run with fencing disabled ($out)"
    exit 3
fi
if ((rc == 0)); then
    ok "chaos run passed: 0 violations ($out)"
else
    err "chaos run found violations ($out)"
fi
exit "$rc"
