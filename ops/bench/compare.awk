# The A/B table of `ops/bench.sh --compare`, from its results.tsv (columns as in table.awk; the
# label ends in " [baseline]" or " [current]"). Every figure is the mean over the rounds; the
# ratio line divides current by baseline (below 1 for CPU: cheaper).
# Variables: skus (the spread workloads' SKU count); names (optional, "baseline,current"): what
# the two variants are called in the table.

function workload(w) {
    if (w == "uniform") return "uniform over " skus " SKUs"
    if (w == "zipf") return "zipf:1.1 over " skus " SKUs"
    return w
}
function num(x) { return x ~ /^[0-9.]+$/ }

{
    variant = ($2 ~ /\[current\]$/) ? "current" : "baseline"
    key = $1 "|" $3 "|" $4
    if (!(key in seen)) { seen[key] = 1; keys[++nk] = key; name[key] = $1 " " workload($3) ", " $4 }
    k = key SUBSEP variant
    rounds[k]++
    for (c = 6; c <= 13; c++) if (num($c)) { sum[k, c] += $c; cnt[k, c]++ }
    if ($14 != "OK") bad[k] = 1
}

function mean(k, c) { return cnt[k, c] ? sum[k, c] / cnt[k, c] : -1 }
function show(v, fmt) { return v < 0 ? "-" : sprintf(fmt, v) }

END {
    if (names == "") names = "baseline,current"
    split(names, shown, ",")
    print "| row | build | /s | p50 ms | p99 ms | PostgreSQL µs/op | allocator µs/op | router µs/op | load generator µs/op | invariants |"
    print "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    split("6 7 8 10 11 12 13", cols, " ")
    split("%.0f %.2f %.2f %.1f %.1f %.1f %.1f", fmts, " ")
    for (i = 1; i <= nk; i++) {
        key = keys[i]
        for (j = 1; j <= 2; j++) {
            v = (j == 1) ? "baseline" : "current"
            k = key SUBSEP v
            line = "| " name[key] " | " shown[j] " (" rounds[k] "x)"
            for (c = 1; c <= 7; c++) line = line " | " show(mean(k, cols[c]), fmts[c])
            print line " | " ((k in bad) ? "FAILED" : "OK") " |"
        }
        line = "| " name[key] " | **" shown[2] " / " shown[1] "** "
        for (c = 1; c <= 7; c++) {
            a = mean(key SUBSEP "current", cols[c]); b = mean(key SUBSEP "baseline", cols[c])
            line = line " | " ((a >= 0 && b > 0) ? sprintf("%.2fx", a / b) : "-")
        }
        print line " | |"
    }
}
