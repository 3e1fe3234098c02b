# Summary of ops/patroni-faults.sh --runs: lines "failover-times fault=K promoted=S service=S
# gap=S rejoined=S status=ok|failed" in, one Markdown row per fault kind out (p50 and max of each
# time over the runs that printed it, and failed runs of all runs).
function median(list, n,    i, j, t, a) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function maximum(list,    n, i, a, m) {
    n = split(list, a, " ")
    m = a[1]
    for (i = 2; i <= n; i++) if (a[i] + 0 > m + 0) m = a[i]
    return m
}
{
    delete f
    for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    k = f["fault"]
    if (!(k in runs)) order[++kinds] = k
    runs[k]++
    if (f["status"] != "ok") failed[k]++
    for (m = 1; m <= 4; m++) {
        name = (m == 1 ? "promoted" : m == 2 ? "service" : m == 3 ? "gap" : "rejoined")
        if (name in f) { v[k, name] = v[k, name] " " f[name]; seen[k, name]++ }
    }
}
END {
    print "| fault | runs | failed | promotion | first reserve | longest gap | rejoined |"
    print "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    for (i = 1; i <= kinds; i++) {
        k = order[i]
        row = sprintf("| %s | %d | %d", k, runs[k], failed[k] + 0)
        for (m = 1; m <= 4; m++) {
            name = (m == 1 ? "promoted" : m == 2 ? "service" : m == 3 ? "gap" : "rejoined")
            row = row (seen[k, name] ? sprintf(" | %.2f / %.2f", median(v[k, name]), maximum(v[k, name])) : " | -")
        }
        print row " |"
    }
}
