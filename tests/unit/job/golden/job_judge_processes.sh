#!/usr/bin/env bash
# ckpteval job for invocation abcd1234: deploy once, run 1 task(s), stop.
JOB_DIR=/jobs/abcd1234
set -uo pipefail
cd "$JOB_DIR" || exit 2
mkdir -p state logs
signal_deployment() {
  kill -TERM -- "-$DEPLOY_PID" 2>/dev/null || kill -TERM "$DEPLOY_PID" 2>/dev/null
}
say() { printf '[ckpteval %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
mark() { printf '%s\n' "$2" > "$1.tmp.$$" && mv -f "$1.tmp.$$" "$1"; }
health_ok() {
  if command -v curl >/dev/null 2>&1; then curl -sf -o /dev/null --max-time 5 "$1"
  else python3 -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$1" >/dev/null 2>&1
  fi
}
fetch() {  # the body of a GET of $1 (any status), empty if nothing answers
  if command -v curl >/dev/null 2>&1; then curl -s --max-time 5 "$1"
  else python3 -c 'import sys,urllib.request,urllib.error
try: print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
except urllib.error.HTTPError as e: print(e.read().decode())
except Exception: pass' "$1" 2>/dev/null
  fi
}
DEPLOY_IDENTITY=""
IDENTITY_URL=""
identity_ok() {  # the endpoint reports this job's deployment identity (nothing to check when it has none)
  [ -z "$DEPLOY_IDENTITY" ] && return 0
  case "$(fetch "$IDENTITY_URL")" in *"$DEPLOY_IDENTITY"*) return 0 ;; esac
  return 1
}
# A deployment is marked ready and said healthy once, as one step, by whoever claims it first: its
# watcher (which ignores TERM from just before its claim: a stop cannot end it between the mark and the
# line) or the job's stop (the tasks ended before the watcher's next look). The other waits for the line.
# No `wait` on the watcher: in the EXIT trap after a TERM to the job's process group, bash can miss a child
# it already reaped and wait forever.
said_ready() {  # $1 the role's state file, $2 the line
  if ( set -C; : > "$1.said" ) 2>/dev/null; then mark "$1" ready; say "$2"; echo said > "$1.said"; return 0; fi
  settle_ready "$1"
}
settle_ready() {  # $1 the role's state file: once its watcher has claimed it, until it has said it (5 s at most)
  [ -e "$1.said" ] || return 0
  for _ in $(seq 1 50); do [ -s "$1.said" ] && return 0; sleep 0.1; done
}
verified() {  # health and identity both hold: the deployment is ready, and it is this job's
  [ -z "$DEPLOY_IDENTITY" ] || mark state/deployment_identity "$DEPLOY_IDENTITY"
  said_ready state/deployment "deployment healthy: $HEALTH_URL${DEPLOY_IDENTITY:+ (identity $DEPLOY_IDENTITY verified)}"
}
DEPLOY_PID=""
WATCH_PID=""
HEALTH_URL=""
stop_deployment() {
  if [ -n "$WATCH_PID" ]; then  # the tasks ended before the watcher's next look: have it now
    kill "$WATCH_PID" 2>/dev/null; WATCH_PID=""; settle_ready state/deployment
    if [ "$(cat state/deployment 2>/dev/null)" = starting ] && health_ok "$HEALTH_URL" && identity_ok; then
      verified
    fi
  fi
  if [ -n "$DEPLOY_PID" ] && kill -0 "$DEPLOY_PID" 2>/dev/null; then
    say "stopping the deployment"
    signal_deployment
    for _ in $(seq 1 30); do kill -0 "$DEPLOY_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$DEPLOY_PID" 2>/dev/null || kill -KILL "$DEPLOY_PID" 2>/dev/null
  fi
  DEPLOY_PID=""
}
TASK_PIDS=()
tasks_running() {
  local n=0 p
  for p in ${TASK_PIDS[@]+"${TASK_PIDS[@]}"}; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done
  echo "$n"
}
run_tasks() {  # each named task function in the background, at most $MAX_PARALLEL_TASKS at once
  local t p
  for t in "$@"; do
    while [ "$(tasks_running)" -ge "$MAX_PARALLEL_TASKS" ]; do sleep 1; done
    "$t" &
    TASK_PIDS+=("$!")
  done
  for p in ${TASK_PIDS[@]+"${TASK_PIDS[@]}"}; do wait "$p" || FAILED=$((FAILED + 1)); done
}
stop_tasks() {  # background jobs ignore INT, and a shell's death leaves its children running: stop them
  trap '' TERM INT
  if [ "$(cut -d' ' -f5 "/proc/$$/stat" 2>/dev/null)" = "$$" ]; then kill -TERM 0 2>/dev/null
  else
    # each task's shell before its client, so that it does not record the client's death as a failure
    for p in ${TASK_PIDS[@]+"${TASK_PIDS[@]}"}; do
      kids=$(pgrep -P "$p" 2>/dev/null); kill -TERM "$p" 2>/dev/null; [ -z "$kids" ] || kill -TERM $kids 2>/dev/null
    done
  fi
}
deployment_failed() {  # a watcher's signal: no client has sent a request yet; stop them, they did not run
  trap '' USR1  # once: another role's watcher giving up meanwhile must not cut the job's stop short
  # the model's watcher gave up (nothing left of it to stop); another role's did: the model's is stopped as usual
  [ "$(cat state/deployment 2>/dev/null)" != failed ] || WATCH_PID=""
  stop_tasks
  for d in ${TASK_DIRS[@]+"${TASK_DIRS[@]}"}; do [ "$(cat "$d/state" 2>/dev/null)" = running ] && rm -f "$d/state"; done
  JOB_RC=3; exit 3
}
JOB_RC=1
GATE_PID=""
STOPS=()  # the other roles' deployments' stop functions (a judge's: stop_judge)
stop_others() { local s; for s in ${STOPS[@]+"${STOPS[@]}"}; do "$s"; done; }
finish() {
  trap '' USR1  # a watcher that gives up now (its server stopped under it) must not cut the stop short
  [ -z "$GATE_PID" ] || kill "$GATE_PID" 2>/dev/null; stop_deployment; stop_others
  times > state/cpu_times 2>/dev/null  # the CPU time of the job's processes (results.usage)
  mark state/ended "$(date -u +%Y-%m-%dT%H:%M:%SZ)"; mark state/finished "$JOB_RC"
}
trap finish EXIT
trap 'say "interrupted"; stop_tasks; JOB_RC=143; exit 143' TERM INT
trap deployment_failed USR1
# a resubmitted job starts over; finished tasks keep .done
rm -f state/finished state/ended state/deployment state/deployment.said state/deployment_port state/deployment_moved \
  state/deployment_identity
mark state/started "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
export HF_HUB_OFFLINE=1
TASK_DIRS=(tasks/mtbench)
say 'starting the deployment (megatron/builtin)'
setsid bash -c 'export HITS=/jobs/abcd1234/hits.log; exec python server.py 8000' > logs/deployment.log 2>&1 &
DEPLOY_PID=$!
mark state/deployment starting
HEALTH_URL="http://127.0.0.1:8000/v1/health"
watch_deployment() {
  local deadline=$((SECONDS + 30))
  gave_up() {  # say why with the log's tail, and have the job stop (deployment_failed)
    say "$1; last lines of logs/deployment.log:"
    tail -n 40 logs/deployment.log; mark state/deployment failed; kill -USR1 $$
  }
  until health_ok "$HEALTH_URL"; do
    if ! kill -0 "$DEPLOY_PID" 2>/dev/null; then
      gave_up "the deployment exited before it became healthy"; return 3
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      gave_up "the deployment did not become healthy within 30 s"; return 3
    fi
    sleep 1
  done
  if ! identity_ok; then
    gave_up "${HEALTH_URL%/v1/*} answers for another deployment: it does not report this job's identity $DEPLOY_IDENTITY ($IDENTITY_URL)"; return 3
  fi
  trap '' TERM
  verified
}
watch_deployment &
WATCH_PID=$!
export CKPTEVAL_DEPLOYMENT_HEALTH="$HEALTH_URL" CKPTEVAL_DEPLOYMENT_WAIT_S=30
# the judge's deployment (megatron/builtin): its own process group, port, identity and log
JUDGE_PID=""
JUDGE_WATCH_PID=""
signal_judge() { kill -TERM -- "-$JUDGE_PID" 2>/dev/null || kill -TERM "$JUDGE_PID" 2>/dev/null; }
judge_check_now() { :; }  # redefined below once it has a health check
stop_judge() {
  [ -z "$JUDGE_WATCH_PID" ] || { kill "$JUDGE_WATCH_PID" 2>/dev/null; JUDGE_WATCH_PID=""; settle_ready state/judge; judge_check_now; }
  if [ -n "$JUDGE_PID" ] && kill -0 "$JUDGE_PID" 2>/dev/null; then
    say 'stopping the judge'
    signal_judge
    for _ in $(seq 1 30); do kill -0 "$JUDGE_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$JUDGE_PID" 2>/dev/null || kill -KILL "$JUDGE_PID" 2>/dev/null
  fi
  JUDGE_PID=""
}
STOPS+=(stop_judge)
rm -f state/judge state/judge.said state/judge_port state/judge_identity
say 'starting the judge (megatron/builtin)'
setsid bash -c 'exec python -m ckpteval.server serve --port 8001' > logs/judge.log 2>&1 &
JUDGE_PID=$!
mark state/judge starting
port_deadline=$((SECONDS + 600))
until [ -s /jobs/abcd1234/state/judge_port ]; do
  if ! kill -0 "$JUDGE_PID" 2>/dev/null || [ "$SECONDS" -ge "$port_deadline" ]; then
    say "the judge did not take a port; last lines of logs/judge.log:"
    tail -n 40 logs/judge.log; mark state/judge failed; JOB_RC=3; exit 3
  fi
  sleep 0.2
done
JUDGE_PORT=$(cat /jobs/abcd1234/state/judge_port); export JUDGE_PORT
if [ "$JUDGE_PORT" = 8001 ]; then say "the judge holds port $JUDGE_PORT"
else say "port 8001 was taken: the judge serves on port $JUDGE_PORT instead"; fi
JUDGE_HEALTH_URL="http://127.0.0.1:${JUDGE_PORT}/v1/health"
JUDGE_IDENTITY=abcd1234-judge0123456
JUDGE_IDENTITY_URL="http://127.0.0.1:${JUDGE_PORT}/v1/health"
judge_identity_ok() { case "$(fetch "$JUDGE_IDENTITY_URL")" in *"$JUDGE_IDENTITY"*) return 0 ;; esac; return 1; }
judge_verified() { mark state/judge_identity "$JUDGE_IDENTITY"; said_ready state/judge "judge healthy: $JUDGE_HEALTH_URL (identity $JUDGE_IDENTITY verified)"; }
judge_check_now() {  # the tasks ended before the watcher's next look: have it now
  if [ "$(cat state/judge 2>/dev/null)" = starting ] && health_ok "$JUDGE_HEALTH_URL" && judge_identity_ok; then
    judge_verified
  fi
}
watch_judge() {
  local deadline=$((SECONDS + 600))
  judge_gave_up() {
    say "$1; last lines of logs/judge.log:"
    tail -n 40 logs/judge.log; mark state/judge failed; kill -USR1 $$
  }
  until health_ok "$JUDGE_HEALTH_URL"; do
    if ! kill -0 "$JUDGE_PID" 2>/dev/null; then
      judge_gave_up "the judge exited before it became healthy"; return 3
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      judge_gave_up "the judge did not become healthy within 600 s"; return 3
    fi
    sleep 1
  done
  if ! judge_identity_ok; then
    judge_gave_up "${JUDGE_HEALTH_URL%/v1/*} answers for another deployment: it does not report this job's judge identity $JUDGE_IDENTITY"; return 3
  fi
  trap '' TERM
  judge_verified
}
watch_judge &
JUDGE_WATCH_PID=$!
task_0() {  # mtbench
  if [ -f tasks/mtbench/.done ]; then
    say 'task mtbench: already done, skipped'
  else
    say 'task mtbench: running'
    mark tasks/mtbench/state running
    bash -c 'export TASK=mtbench; until curl -sf -o /dev/null "$CKPTEVAL_DEPLOYMENT_HEALTH"; do sleep 0.2; done; if [ -n "${CKPTEVAL_DEPLOYMENT_IDENTITY:-}" ]; then curl -s "$CKPTEVAL_DEPLOYMENT_IDENTITY_URL" | grep -qF "$CKPTEVAL_DEPLOYMENT_IDENTITY" || { echo "refusing: $CKPTEVAL_DEPLOYMENT_IDENTITY_URL answers for another deployment" >&2; exit 3; }; fi; echo judged' > tasks/mtbench/client.log 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
      touch tasks/mtbench/.done; mark tasks/mtbench/state succeeded; say mtbench': succeeded'
    else
      mark tasks/mtbench/state "failed $rc"
      say mtbench": failed (exit $rc); last lines of tasks/mtbench/client.log:"
      tail -n 20 tasks/mtbench/client.log; return 1
    fi
  fi
}
FAILED=0
MAX_PARALLEL_TASKS=1
run_tasks task_0
stop_deployment
stop_others
if [ "$FAILED" -eq 0 ]; then JOB_RC=0; say "all tasks succeeded"; else JOB_RC=1; say "$FAILED task(s) failed"; fi
exit "$JOB_RC"
