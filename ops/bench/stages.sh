# shellcheck shell=bash
# The stage table of ops/bench.sh: where an open-loop row's time went, read from the services'
# stage histograms (allocator_stage_duration_seconds, router_stage_duration_seconds) as the
# difference of two /metrics scrapes around the row. Source it from ops/bench.sh; do not run it.
#
#   stages_scrape FILE         both services' stage series (and the allocator's reserve latency) now
#   stages_record ROW BEFORE AFTER CLIENT_MEAN_MS
#                              one results line per stage of the row into $STAGES: count, mean,
#                              p50 and p99 (ms, interpolated in the fixed buckets), and the totals
#   stages_table               the Markdown table of every recorded row
#
# The stages tile a request (DESIGN.md §10), so a service's stage means add up to its mean request
# time; the table prints that sum beside the total measured outside the stages (the allocator's
# request histogram, and the load generator's mean for the whole request).

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "ops/bench/stages.sh holds the stage table of ops/bench.sh; source it, do not run it" >&2
    exit 2
fi

stages_scrape() {
    {
        curl -fsS "$ALLOCATOR_URL/metrics" || true
        curl -fsS "$ROUTER_URL/metrics" || true
    } | grep -E '^(allocator|router)_stage_duration_seconds|^allocator_http_request_duration_seconds_(sum|count)\{[^}]*route="/v1/reservations"' >"$1" || true
}

stages_record() {
    local row=$1 before=$2 after=$3 client_mean=$4
    awk -v row="$row" -v client="$client_mean" '
        function key(line,   name, labels) {
            name = line; sub(/\{.*/, "", name)
            stage = ""; le = ""
            if (match(line, /stage="[^"]*"/)) stage = substr(line, RSTART + 7, RLENGTH - 8)
            if (match(line, /le="[^"]*"/)) le = substr(line, RSTART + 4, RLENGTH - 5)
            return name
        }
        FNR == NR { k = $1; before[k] = $2; next }
        {
            d = $2 - before[$1] + 0
            name = key($0)
            service = name; sub(/_.*/, "", service)
            if (name ~ /_stage_duration_seconds_bucket$/) {
                id = service SUBSEP stage
                if (!(id in order)) { order[id] = ++n; ids[n] = id }
                nb[id]++; les[id, nb[id]] = le; cum[id, nb[id]] = d
            } else if (name ~ /_stage_duration_seconds_sum$/) { sum[service SUBSEP stage] = d }
            else if (name ~ /_stage_duration_seconds_count$/) { cnt[service SUBSEP stage] = d }
            else if (name ~ /request_duration_seconds_sum$/) { rsum += d }
            else if (name ~ /request_duration_seconds_count$/) { rcnt += d }
        }
        function quantile(id, q,   total, target, i, lo, hi, prev, c) {
            total = cnt[id]; if (total <= 0) return 0
            target = q * total; lo = 0; prev = 0
            for (i = 1; i <= nb[id]; i++) {
                hi = les[id, i]; c = cum[id, i]
                if (hi == "+Inf") return lo * 1000
                if (c >= target) return (c == prev ? hi : lo + (hi - lo) * (target - prev) / (c - prev)) * 1000
                lo = hi; prev = c
            }
            return lo * 1000
        }
        END {
            for (i = 1; i <= n; i++) {
                id = ids[i]; split(id, p, SUBSEP)
                if (cnt[id] <= 0) continue
                mean = sum[id] / cnt[id] * 1000
                stagesum[p[1]] += mean
                printf "%s\t%s\t%s\t%d\t%.3f\t%.3f\t%.3f\n", row, p[1], p[2], cnt[id], mean, quantile(id, 0.5), quantile(id, 0.99)
            }
            for (s in stagesum) printf "%s\t%s\tsum of stage means\t-\t%.3f\t-\t-\n", row, s, stagesum[s]
            if (rcnt > 0) printf "%s\tallocator\trequest (its histogram)\t%d\t%.3f\t-\t-\n", row, rcnt, rsum / rcnt * 1000
            if (client != "") printf "%s\tclient\trequest (load generator)\t-\t%.3f\t-\t-\n", row, client
        }' "$before" "$after" >>"$STAGES"
}

stages_table() {
    [[ -s "$STAGES" ]] || return 0
    echo
    echo "Stages of the open-loop rows (ms; p50 and p99 interpolated in the histograms' fixed buckets):"
    echo
    echo "| row | service | stage | requests | mean | p50 | p99 |"
    echo "| --- | --- | --- | ---: | ---: | ---: | ---: |"
    awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }' "$STAGES"
}
