#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers of untrusted input with cargo-fuzz (libFuzzer): the auth
# file, the client policy grammar (also the header allocators read from routers), the request
# values of schema::wire and the canonical form of request paths (against actix's own decoding). The targets live in allocator/access/fuzz (a crate of its own, outside
# the workspace) and assert more than "no panic": what a parser accepts is within its documented
# rules and survives a round trip.
#
#   ops/fuzz-targets.sh                 every target for 30 s
#   ops/fuzz-targets.sh --seconds 300   longer
#   ops/fuzz-targets.sh --target auth_file
#
# Runs on the stable toolchain with `--sanitizer none` (AddressSanitizer needs nightly's -Z
# flags; the code under test is safe Rust, so the findings that matter are panics, overflows —
# debug assertions are on — and failed assertions). cargo-fuzz is installed (pinned, from
# crates.io) when missing. A finding fails the run; libFuzzer leaves the input under
# allocator/access/fuzz/artifacts/<target>/ (replay: cargo fuzz run -s none <target> <file>).
# The corpus grows under allocator/access/fuzz/corpus/ (not committed).
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SECONDS_EACH=30
TARGETS=(auth_file client_policy wire_requests paths)
only=""
while (($#)); do
    case "$1" in
        --seconds) SECONDS_EACH="${2:?--seconds needs a number}"; shift 2 ;;
        --target) only="${2:?--target needs a name}"; shift 2 ;;
        -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$1' (try --help)" ;;
    esac
done
[[ "$SECONDS_EACH" =~ ^[1-9][0-9]*$ ]] || die "--seconds must be a positive number"
if [[ -n "$only" ]]; then
    [[ " ${TARGETS[*]} " == *" $only "* ]] || die "unknown target '$only' (known: ${TARGETS[*]})"
    TARGETS=("$only")
fi

CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    step "cargo-fuzz $CARGO_FUZZ_VERSION (cargo install, once)"
    cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi

cd "$REPO_ROOT/allocator/access/fuzz"
log_dir="$PWD/target/logs"
mkdir -p "$log_dir"
step "build the fuzz targets"
cargo fuzz build --sanitizer none
for target in "${TARGETS[@]}"; do
    step "fuzz $target for ${SECONDS_EACH}s"
    mkdir -p "corpus/$target"
    # -timeout: one input taking a second is a finding (the parsers are linear).
    # libFuzzer's progress goes to a log; its final statistics and any finding are shown.
    log_file="$log_dir/$target.log"
    if ! cargo fuzz run --sanitizer none "$target" -- \
        -max_total_time="$SECONDS_EACH" -timeout=1 -max_len=4096 -print_final_stats=1 \
        >"$log_file" 2>&1; then
        tail -n 60 "$log_file" >&2
        die "$target: finding (input under allocator/access/fuzz/artifacts/$target/, log $log_file)"
    fi
    grep -E '^(Done|stat::(number_of_executed_units|new_units_added))' "$log_file" >&2 || true
    ok "$target: no finding in ${SECONDS_EACH}s"
done
