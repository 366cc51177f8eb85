#!/usr/bin/env bash
# Turns scripts/conformance.sh's Ginkgo JSON reports into one Markdown table: each upstream spec
# that ran (or skipped itself at run time, with its reason) → its state and time per proxy; then
# the counts per proxy, the specs upstream kube-proxy passes and splitproxy does not, and the
# lab's skip list (tests/cluster/e2e/skips.tsv) with reasons.
#
#   tests/cluster/e2e/results.sh DIR PROXY...     (reads DIR/PROXY/report.json)
set -euo pipefail
dir=$1
shift
here="$(dirname "${BASH_SOURCE[0]}")"

label() {
    case $1 in
        kube-proxy) echo "kube-proxy" ;;
        *) echo "splitproxy $1" ;;
    esac
}

# One JSON object per proxy: spec name → {state, seconds, reason}.
specs() {
    [[ -f $1 ]] || { echo '{}'; return; }
    jq '[.[].SpecReports[]
         | select(.LeafNodeType == "It")
         | select(.State != "skipped" or (.Failure.Message // "") != "")
         | { key: ((.ContainerHierarchyTexts + [.LeafNodeText]) | map(select(. != "")) | join(" ")),
             value: { state: .State, seconds: ((.RunTime // 0) / 1e9 | floor),
                      reason: (.Failure.Message // "" | split("\n")[0]) } }]
        | from_entries' "$1"
}

all='{}'
for proxy in "$@"; do
    all="$(jq --arg p "$proxy" --argjson s "$(specs "$dir/$proxy/report.json")" \
        '. + {($p): $s}' <<<"$all")"
done

header="| upstream spec |"
rule="| --- |"
for proxy in "$@"; do
    header+=" $(label "$proxy") |"
    rule+=" --- |"
done
echo "$header"
echo "$rule"
jq -r --argjson proxies "$(printf '%s\n' "$@" | jq -R . | jq -s .)" '
    . as $all
    | ([$proxies[] as $p | $all[$p] | keys[]] | unique)[] as $spec
    | "| \($spec | gsub("\\|"; "\\|")) | "
      + ([$proxies[] as $p | $all[$p][$spec]
          | if . == null then "–"
            elif .state == "skipped" then "skipped"
            else "\(.state) \(.seconds) s" end] | join(" | "))
      + " |"' <<<"$all"

echo
echo "| proxy | passed | failed | skipped at run time |"
echo "| --- | --- | --- | --- |"
for proxy in "$@"; do
    jq -r --arg p "$proxy" --arg l "$(label "$proxy")" '.[$p] | [.[] | .state] as $s
        | "| \($l) | \([$s[] | select(. == "passed")] | length) | \([$s[] | select(. != "passed" and . != "skipped")] | length) | \([$s[] | select(. == "skipped")] | length) |"' <<<"$all"
done

if jq -e 'has("kube-proxy")' <<<"$all" >/dev/null; then
    echo
    echo "Specs upstream kube-proxy passes here and splitproxy does not:"
    regressions="$(jq -r '. as $all
        | ($all["kube-proxy"] | to_entries[] | select(.value.state == "passed") | .key) as $spec
        | $all | to_entries[] | select(.key != "kube-proxy") | .key as $p | .value[$spec]
        | select(. != null and .state != "passed" and .state != "skipped")
        | "- \($spec): \($p) \(.state): \(.reason)"' <<<"$all")"
    echo "${regressions:-- none}"
fi

echo
echo "Specs skipped at run time, with their reasons:"
skipped="$(jq -r '[to_entries[] | .key as $p | .value | to_entries[] | select(.value.state == "skipped")
        | "- \(.key) (\($p)): \(.value.reason)"] | unique[]' <<<"$all")"
echo "${skipped:-- none}"
echo
echo "Specs the lab skips, for every proxy (tests/cluster/e2e/skips.tsv):"
grep -v '^#' "$here/skips.tsv" | awk -F'\t' '{ printf "- `%s`: %s\n", $1, $2 }'
