# shellcheck shell=bash
# Sourced by scripts/test.sh: runs the test command's phases one by one and keeps each one's wall
# time, so that the run ends with a table of where its minutes went (docs/testing.md keeps the
# latest cold and warm tables).
#
#   phase NAME COMMAND...   runs COMMAND and records NAME, its seconds and its exit status;
#                           returns that status (so `set -e` stops the run at a failed phase)
#   phase_beside NAME COMMAND...
#                           starts COMMAND in the background at the lowest CPU priority, so it
#                           takes only what the phases after it leave idle (the end-to-end tests
#                           mostly wait); its output goes to a log shown if it fails
#   phase_join              waits for every phase started beside; returns non-zero if one failed
#   phase_table             prints the table of the phases recorded so far, with the run's total

PHASE_NAMES=()
PHASE_SECONDS=()
PHASE_STATUS=()
PHASE_START=$SECONDS

phase() {
    local name=$1 started=$SECONDS status=0
    shift
    echo "==> $name" >&2
    "$@" || status=$?
    PHASE_NAMES+=("$name")
    PHASE_SECONDS+=($((SECONDS - started)))
    PHASE_STATUS+=("$status")
    return "$status"
}

PHASES_BESIDE=()

phase_beside() {
    local name=$1 log
    shift
    log="$(mktemp -t splitproxy-phase.XXXXXX)"
    echo "==> $name (beside what follows)" >&2
    (
        started=$SECONDS
        status=0
        nice -n 19 "$@" >"$log" 2>&1 || status=$?
        echo "$((SECONDS - started)) $status" >"$log.done"
    ) &
    PHASES_BESIDE+=("$name"$'\t'"$!"$'\t'"$log")
}

phase_join() {
    local entry name pid log seconds status failed=0
    for entry in "${PHASES_BESIDE[@]}"; do
        IFS=$'\t' read -r name pid log <<<"$entry"
        wait "$pid" || true
        read -r seconds status <"$log.done" || { seconds=0 status=1; }
        PHASE_NAMES+=("$name (beside)")
        PHASE_SECONDS+=("$seconds")
        PHASE_STATUS+=("$status")
        if ((status != 0)); then
            echo "==> $name failed ($status):" >&2
            tail -n 80 "$log" >&2
            failed=1
        else
            cat "$log" >&2
        fi
        rm -f "$log" "$log.done"
    done
    PHASES_BESIDE=()
    return "$failed"
}

phase_table() {
    local i
    echo
    echo "| phase | wall time | result |"
    echo "| --- | ---: | --- |"
    for i in "${!PHASE_NAMES[@]}"; do
        printf '| %s | %s | %s |\n' "${PHASE_NAMES[$i]}" "$(phase_duration "${PHASE_SECONDS[$i]}")" \
            "$( ((PHASE_STATUS[i] == 0)) && echo ok || echo "failed (${PHASE_STATUS[$i]})")"
    done
    printf '| **total** | **%s** | |\n' "$(phase_duration $((SECONDS - PHASE_START)))"
}

# phase_duration SECONDS: "1 min 05 s" or "42 s".
phase_duration() {
    if (($1 >= 60)); then
        printf '%d min %02d s' $(($1 / 60)) $(($1 % 60))
    else
        printf '%d s' "$1"
    fi
}
