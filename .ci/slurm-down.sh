#!/usr/bin/env bash
# Stop the one-node CI SLURM cluster started by .ci/slurm-up.sh.
# Only the daemons whose PIDs slurm-up.sh recorded in $STATE/*.pid are signalled
# (TERM, bounded wait, then KILL). Safe to run when nothing is running.
set -uo pipefail

STATE=${INCOFL_SLURM_STATE:-/tmp/incofl-slurm}
T0=$(date +%s.%N)
log() { echo "[slurm-down] $*"; }
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

# pid_of NAME: the recorded PID if it is still a running NAME process, else nothing
pid_of() {
    local f="$STATE/$1.pid" pid
    [ -s "$f" ] || return 1
    pid=$(cat "$f")
    [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] || return 1
    echo "$pid"
}

# Cancel whatever is still queued or running, so no slurmstepd outlives slurmd.
if pid_of slurmctld >/dev/null && command -v squeue >/dev/null; then
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
        log "cancelling jobs: $jobs"
        # shellcheck disable=SC2086
        timeout 10 scancel $jobs 2>/dev/null || true
        for _ in $(seq 30); do
            [ -z "$(timeout 5 squeue -h -t R,CG,PD -o %i 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
fi

status=0
for name in slurmd slurmctld munged; do
    f="$STATE/$name.pid"
    if ! pid=$(pid_of "$name"); then
        [ -e "$f" ] && log "$name (pid $(cat "$f")) already stopped"
        rm -f "$f"
        continue
    fi
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do            # up to 10 s
        [ -d "/proc/$pid" ] || break
        sleep 0.1
    done
    if [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
        log "$name (pid $pid) ignored TERM, sending KILL"
        kill -KILL "$pid" 2>/dev/null
        for _ in $(seq 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    fi
    if [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
        log "ERROR: $name (pid $pid) is still running"
        status=1
    else
        log "stopped $name (pid $pid) at $(elapsed) s"
        rm -f "$f"
    fi
done

left=$(pgrep -a -x slurmstepd || true)
[ -z "$left" ] || log "WARNING: slurmstepd processes left (not signalled): $left"
log "done after $(elapsed) s (logs kept in $STATE/log)"
exit $status
