#!/usr/bin/env bash
# Stop what setup.sh started, each daemon by its pid file (never by process name, so nothing
# else on the machine is touched). Packages, users, keys and configs are left in place, so the
# next setup.sh only starts daemons again.
set -uo pipefail
INFRA=${CI_INFRA_DIR:-/tmp/ci-infra}

stop() { # stop PIDFILE
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    echo "stopped $(basename "$1" .pid) (pid $pid)"
  fi
  rm -f "$1"
}

stop "$INFRA/sshd.pid"
for f in /run/slurm/slurmd-*.pid; do [ -e "$f" ] && stop "$f"; done
stop /run/slurm/slurmctld.pid
stop /run/slurm/slurmdbd.pid
stop "$INFRA/mariadbd.pid"
stop /run/munge/munged.pid
exit 0
