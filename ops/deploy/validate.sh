#!/usr/bin/env bash
# Offline checks of the deployment files in ops/deploy (run by `ops/test.sh --lint`, so by CI):
#
#   ops/deploy/validate.sh [VALIDATORS_BIN_DIR]
#
#   k8s/*.yaml      kubernetes-validate --strict against the Kubernetes $K8S_VERSION schemas it
#                   ships (unknown fields fail; a kind it has no schema for, e.g. a CRD, fails
#                   too instead of passing with a warning)
#   compose.yaml    check-jsonschema against its bundled compose-spec schema, plus: every bind
#                   mount's source exists
#   both            every ALLOCATOR_*, ROUTER_*, DATABASE_URL, REDIS_URL variable they set is the
#                   `env = "..."` of a flag in allocator/src or router/src
#   grafana/        the provisioning files parse as YAML with the expected top-level keys
#
# The Prometheus configs are checked by promtool in ops/test.sh. VALIDATORS_BIN_DIR is the bin
# directory of a virtualenv with kubernetes-validate and check-jsonschema (default: the pinned
# one from ops/lib.sh's validators_venv, created on first use).
set -euo pipefail

# shellcheck source=ops/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

case "${1:-}" in
    -h | --help) print_header_usage "${BASH_SOURCE[0]}"; exit 0 ;;
esac

# The oldest Kubernetes minor still widely run; the manifests use nothing newer.
K8S_VERSION="${K8S_VERSION:-1.30.0}"
bin="${1:-}"
[[ -n "$bin" ]] || bin="$(validators_venv)" || die "no validators"
deploy="$OPS_DIR/deploy"
rc=0

step "kubernetes-validate --strict -k $K8S_VERSION ops/deploy/k8s/*.yaml"
out="$("$bin/kubernetes-validate" --strict -k "$K8S_VERSION" "$deploy"/k8s/*.yaml 2>&1)" || rc=1
printf '%s\n' "$out" >&2
if grep -q '^WARN' <<<"$out"; then
    err "kubernetes-validate warned (a kind without a schema is not validated): treated as failure"
    rc=1
fi

step "check-jsonschema --builtin-schema vendor.compose-spec ops/deploy/compose.yaml"
"$bin/check-jsonschema" --builtin-schema vendor.compose-spec "$deploy/compose.yaml" >&2 || rc=1

step "environment variable names, bind mounts, Grafana provisioning"
# The validators' virtualenv has a YAML parser (ruamel.yaml, a check-jsonschema dependency).
"$bin/python" - "$REPO_ROOT" <<'PY' || rc=1
import pathlib, re, sys
from ruamel.yaml import YAML

root = pathlib.Path(sys.argv[1])
deploy = root / "ops" / "deploy"
yaml = YAML(typ="safe")
failures = []

known = set()
for service in ("allocator", "router"):
    for source in sorted((root / service / "src").rglob("*.rs")):
        known |= set(re.findall(r'env\s*=\s*"([A-Z0-9_]+)"', source.read_text()))
if not known:
    failures.append("no env = \"...\" found in the config sources")
checked = re.compile(r"^(ALLOCATOR_|ROUTER_)[A-Z0-9_]+$|^(DATABASE_URL|REDIS_URL)$")

def check_names(names, where):
    for name in names:
        if checked.match(name) and name not in known:
            failures.append(f"{where}: {name} is not a flag's environment variable")

compose = yaml.load((deploy / "compose.yaml").read_text())
for service, spec in compose["services"].items():
    env = spec.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    check_names(env, f"compose.yaml service {service}")
    for volume in spec.get("volumes") or []:
        source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
        if source.startswith(("./", "../")) and not (deploy / source).exists():
            failures.append(f"compose.yaml service {service}: bind mount {source} does not exist")

for manifest in sorted((deploy / "k8s").glob("*.yaml")):
    for doc in yaml.load_all(manifest.read_text()):
        if not doc:
            continue
        if doc.get("kind") == "ConfigMap" or doc.get("kind") == "Secret":
            check_names((doc.get("data") or {}) | (doc.get("stringData") or {}), manifest.name)
        pod = (doc.get("spec") or {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            check_names([e["name"] for e in container.get("env", [])], f"{manifest.name} {container['name']}")

for path, key in (("datasources/prometheus.yaml", "datasources"), ("dashboards/allocator.yaml", "providers")):
    doc = yaml.load((deploy / "grafana" / "provisioning" / path).read_text())
    if doc.get("apiVersion") != 1 or not doc.get(key):
        failures.append(f"grafana/provisioning/{path}: needs apiVersion 1 and a non-empty {key}")

for failure in failures:
    print(f"error: {failure}", file=sys.stderr)
sys.exit(1 if failures else 0)
PY

if ((rc == 0)); then
    ok "ops/deploy is valid"
else
    err "ops/deploy has errors (above)"
fi
exit "$rc"
