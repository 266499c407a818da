"""Render a `JobPlan` into the bash script that runs one invocation's job.

Pure functions of the plan (golden-file tested). The script:
1. starts the deployment once (its own process group, so it can be stopped as a whole),
2. starts the tasks' clients at once, so that they prepare (imports, data, requests) while the model
   loads: their first request waits until the deployment is healthy (the harness hook's
   `ckpteval_wait_ready`, told the health URL by `CKPTEVAL_DEPLOYMENT_HEALTH`); a background watcher marks
   the deployment ready, or, when it dies or misses the readiness timeout, prints its log tail and stops
   the job (exit 3; the clients, which sent nothing yet, go back to pending),
3. runs the tasks' clients side by side, at most `max_parallel_tasks` at once (1: one after another),
   each in the background as its own shell function, skipping tasks already marked done (a resubmitted
   job resumes), recording each task's state in its own directory; one task failing does not stop the
   others; a task with k repeats runs its k clients in turn, skipping repeats already marked done,
4. stops the deployment on every exit path (trap), and records when the job ended and its exit code
   (`state/ended`, then `state/finished`; when it started is `state/started`). Interrupted (TERM or
   INT: `evaluate cancel`, Ctrl-C, scancel), it stops every task client first: the whole process group
   when the job leads one (here it does; a Slurm step's task too), else each task's processes.

State files (`state/*`, `tasks/<dir>/state`) are written to a temporary name and renamed, so a reader
(the CLI following the job, locally or over SSH) never sees half a word.

On Slurm the script runs inside the allocation as one task on its first node (nemo-run starts it with
`srun --nodes=1 --ntasks=1 --overlap`, see `ckpteval.cluster.sbatch`) and starts every step itself with
`srun --overlap`: the steps share the allocation with it and with each other (the task clients' steps run
side by side against the one deployment), each pinned to nodes
beginning with this one (`--nodelist`), because the health check and the task clients reach the
deployment at 127.0.0.1. `--ntasks` is always given: a step started from inside a step inherits
SLURM_NTASKS=1, which would otherwise squeeze a multi-node deployment onto one node. The script writes
its own output to `logs/job.log`, where `evaluate logs` finds it.
"""

from __future__ import annotations

import shlex

from ckpteval.config.executors import Launcher
from ckpteval.invocation.jobdir import JobDir
from ckpteval.job.plan import DeploymentPlan, JobPlan, RequestGroups, Step, TaskPlan
from ckpteval.job.roles import Role, role

_PRELUDE = r"""set -uo pipefail
cd "$JOB_DIR" || exit 2
mkdir -p state logs
"""

# Slurm: the job's output goes to its own log in the job dir; steps start on nodes from this one on.
_SLURM_PRELUDE = r"""exec >> logs/job.log 2>&1
export PRIMARY_NODE="${SLURMD_NODENAME:-$(hostname)}"
step_nodes() {  # $1 nodes of the job after its first ${2:-0}, this one first (the deployment's rank 0 is local)
  { echo "$PRIMARY_NODE"
    scontrol show hostnames "${SLURM_JOB_NODELIST:-$PRIMARY_NODE}" | grep -vxF "$PRIMARY_NODE"
  } | tail -n "+$((${2:-0} + 1))" | head -n "$1" | paste -sd, -
}
"""

# How the deployment is asked to stop. Here: TERM to its process group. On Slurm: TERM to the step's tasks
# through Slurm (`scancel --signal`); a TERM to `srun` itself would make it SIGKILL them at once ("forcing
# job termination"), leaving no rank time to clean up (a Ray node's daemons outlive a SIGKILLed rank).
_LOCAL_SIGNAL = r"""signal_deployment() {
  kill -TERM -- "-$DEPLOY_PID" 2>/dev/null || kill -TERM "$DEPLOY_PID" 2>/dev/null
}
"""
_SLURM_SIGNAL = r"""signal_deployment() {
  local step
  step=$(squeue -h -s -j "${SLURM_JOB_ID:-0}" -o '%i %j' 2>/dev/null | awk '$2 == "deployment" {print $1; exit}')
  if [ -n "$step" ] && scancel --signal=TERM "$step" 2>/dev/null; then return; fi
  kill -TERM "$DEPLOY_PID" 2>/dev/null
}
"""

_FUNCTIONS = r"""say() { printf '[ckpteval %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
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
"""


def _env_prefix(env: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))


def _launch(step: Step, launcher: Launcher, *, name: str) -> str:
    """The command line that runs a step: directly here, through `srun` (with its container) on Slurm."""
    inner = step.command
    if step.env:
        exports = "; ".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(step.env.items()))
        inner = f"{exports}; {inner}"
    if launcher == "processes":
        return f"bash -c {shlex.quote(inner)}"
    ranks = step.nodes * step.ntasks_per_node
    args = [
        "srun",
        f"--job-name={name}",
        "--export=ALL",
        "--overlap",
        f"--nodes={step.nodes}",
        f"--ntasks={ranks}",
        f"--ntasks-per-node={step.ntasks_per_node}",
    ]
    if ranks > 1:
        # the ranks are one server: one failing (rank 0's script, a worker's `ray start`) ends the step, so
        # the job sees the deployment exit instead of waiting out its readiness timeout on the others
        args.append("--kill-on-bad-exit=1")
    if step.image:
        args.append(f"--container-image={step.image}")
        if step.mounts:
            args.append("--container-mounts=" + ",".join(step.mounts))
        args.append("--no-container-mount-home")
    offset = f" {int(step.node_offset)}" if step.node_offset else ""
    nodelist = f'--nodelist="$(step_nodes {int(step.nodes)}{offset})"'
    return f"{shlex.join(args)} {nodelist} bash -c {shlex.quote(inner)}"


def _deployment_section(plan: JobPlan, launcher: Launcher) -> str:
    dep = plan.deployment
    if dep.step is None:
        return f"say {shlex.quote('no deployment: evaluating ' + (plan.tasks[0].endpoint_url if plan.tasks else ''))}\n"
    timeout = int(dep.readiness_timeout)
    lines = [
        *_pinned_tracker_check(dep.pinned_tracker, dep.pinned_iteration),
        *_export_lines(dep.export_step, launcher),
        f"say {shlex.quote('starting the deployment (' + dep.kind + ')')}",
        # setsid: the deployment and everything it spawns form one process group we can stop as a whole
        f"setsid {_launch(dep.step, launcher, name='deployment')} > logs/deployment.log 2>&1 &",
        "DEPLOY_PID=$!",
        "mark state/deployment starting",
    ]
    if dep.port_file:
        lines += _published_port(dep.port_file, timeout, dep.port)
    if dep.health_url:
        url = dep.on_published_port(dep.health_url)
        lines += [f'HEALTH_URL="{url}"']
        if dep.identity and dep.identity_url:
            lines += [
                f"DEPLOY_IDENTITY={shlex.quote(dep.identity)}",
                f'IDENTITY_URL="{dep.on_published_port(dep.identity_url)}"',
            ]
        lines += [
            # the tasks' clients start now and prepare while the model loads (their first request waits for
            # health: the hook's ckpteval_wait_ready); this watcher marks the deployment ready, or stops the job
            "watch_deployment() {",
            f"  local deadline=$((SECONDS + {timeout}))",
            "  gave_up() {  # say why with the log's tail, and have the job stop (deployment_failed)",
            '    say "$1; last lines of logs/deployment.log:"',
            "    tail -n 40 logs/deployment.log; mark state/deployment failed; kill -USR1 $$",
            "  }",
            '  until health_ok "$HEALTH_URL"; do',
            '    if ! kill -0 "$DEPLOY_PID" 2>/dev/null; then',
            '      gave_up "the deployment exited before it became healthy"; return 3',
            "    fi",
            '    if [ "$SECONDS" -ge "$deadline" ]; then',
            f'      gave_up "the deployment did not become healthy within {timeout} s"; return 3',
            "    fi",
            "    sleep 1",
            "  done",
            "  if ! identity_ok; then",
            "    gave_up \"${HEALTH_URL%/v1/*} answers for another deployment: it does not report this job's "
            'identity $DEPLOY_IDENTITY ($IDENTITY_URL)"; return 3',
            "  fi",
            "  trap '' TERM",
            "  verified",
            "}",
            "watch_deployment &",
            "WATCH_PID=$!",
            'export CKPTEVAL_DEPLOYMENT_HEALTH="$HEALTH_URL" ' + f"CKPTEVAL_DEPLOYMENT_WAIT_S={timeout}",
        ]
        if dep.identity:
            lines.append(
                'export CKPTEVAL_DEPLOYMENT_IDENTITY="$DEPLOY_IDENTITY" '
                'CKPTEVAL_DEPLOYMENT_IDENTITY_URL="$IDENTITY_URL"'
                + (" CKPTEVAL_ANSWERS_NAMED=1" if dep.names_answers else "")
            )
        if not plan.prepare_during_load:  # the clients start once the deployment is healthy
            lines.append('wait "$WATCH_PID"; WATCH_PID=""')
        return "\n".join(lines) + "\n"
    lines += ["mark state/deployment ready", f"say {shlex.quote('deployment healthy: ' + (dep.health_url or ''))}"]
    return "\n".join(lines) + "\n"


def _pinned_tracker_check(tracker: str | None, pinned: str | None) -> list[str]:
    """A deployment that reads the checkpoint's tracker itself starts only while the tracker still names the
    iteration the job pinned (a training that saved while the job waited moved it: the job fails, saying so)."""
    if tracker is None or pinned is None:
        return []
    path = shlex.quote(tracker)
    before = f"{tracker} now names iteration "
    after = (
        f", not {pinned}, the one this job was planned for (the checkpoint was described before submission); "
        "this deployment reads the tracker itself and would serve another iteration than the one recorded. "
        "Submit again to evaluate the new one."
    )
    return [
        f"now=$(tr -d '[:space:]' < {path} 2>/dev/null || echo missing)",
        f'if [ "$now" != {shlex.quote(pinned)} ]; then',
        f'  say {shlex.quote(before)}"$now"{shlex.quote(after)}; mark state/deployment failed; JOB_RC=3; exit 3',
        "fi",
    ]


def _export_lines(step: Step | None, launcher: Launcher) -> list[str]:
    """The export step before the engine (`ckpteval.job.hf_export`): its notes in the job's log; when it
    fails (a parity mismatch names what differs in its `error:` line), the job stops before the engine starts."""
    if step is None:
        return []
    return [
        "say 'exporting the checkpoint to Hugging Face for the engine (or finding its export in the cache)'",
        f"{_launch(step, launcher, name='export')} > {JobDir.EXPORT_LOG} 2>&1",
        "rc=$?",
        f"grep -E '^(export|error): ' {JobDir.EXPORT_LOG} | while IFS= read -r line; do say \"$line\"; done",
        'if [ "$rc" -ne 0 ]; then',
        f'  say "the export step failed (exit $rc): the engine is not started; last lines of {JobDir.EXPORT_LOG}:"',
        f"  tail -n 20 {JobDir.EXPORT_LOG}; mark state/deployment failed; JOB_RC=3; exit 3",
        "fi",
    ]


def _published_port(port_file: str, timeout: int, planned: int | None, role: Role | None = None) -> list[str]:
    """Wait (bounded) for the port the deployment (of `role`; the model's by default) holds; it writes it once
    it listens, before it loads anything, so this takes the server's start-up (a second), not the model's load.
    Another port than the `planned` one (it was taken) is said in the job's log and, for the model's, marked
    for `evaluate status`."""
    path = shlex.quote(port_file)
    label, var, log, state = ("deployment", "DEPLOY", JobDir.DEPLOYMENT_LOG, JobDir.DEPLOYMENT_STATE)
    if role is not None:
        label, var, log, state = role.label, role.var, role.log, role.state_file
    moved = f"port {planned} was taken: the {label} serves on port ${var}_PORT instead"
    held = f'say "the {label} holds port ${var}_PORT"'
    mark_moved = f'mark {JobDir.DEPLOYMENT_MOVED} "{moved}"; ' if role is None else ""
    said = (  # a planned port 0 is any port the kernel assigns
        [held]
        if not planned
        else [
            f'if [ "${var}_PORT" = {planned} ]; then {held}',
            f'else {mark_moved}say "{moved}"; fi',
        ]
    )
    return [
        f"port_deadline=$((SECONDS + {timeout}))",
        f"until [ -s {path} ]; do",
        f'  if ! kill -0 "${var}_PID" 2>/dev/null || [ "$SECONDS" -ge "$port_deadline" ]; then',
        f'    say "the {label} did not take a port; last lines of {log}:"',
        f"    tail -n 40 {log}; mark {state} failed; JOB_RC=3; exit 3",
        "  fi",
        "  sleep 0.2",
        "done",
        f"{var}_PORT=$(cat {path}); export {var}_PORT",
        *said,
    ]


def _other_section(dep: DeploymentPlan, launcher: Launcher) -> str:
    """Another role's deployment (a judge beside the model): started, its port published, watched until it is
    healthy and reports the identity it was given, stopped on every exit path, each in its own names (its
    variables, functions, state, port, identity and log files: `ckpteval.job.roles`). Its failure stops the
    job as the model's does (USR1)."""
    if dep.step is None:
        return ""
    r = role(dep.role)
    v, q = r.var, shlex.quote
    fn = r.stem
    timeout = int(dep.readiness_timeout)
    if launcher == "srun-containers":
        signal = [
            f"signal_{fn}() {{",
            "  local step",
            "  step=$(squeue -h -s -j \"${SLURM_JOB_ID:-0}\" -o '%i %j' 2>/dev/null | "
            f"awk '$2 == \"{r.step_name}\" {{print $1; exit}}')",
            '  if [ -n "$step" ] && scancel --signal=TERM "$step" 2>/dev/null; then return; fi',
            f'  kill -TERM "${v}_PID" 2>/dev/null',
            "}",
        ]
    else:
        signal = [f'signal_{fn}() {{ kill -TERM -- "-${v}_PID" 2>/dev/null || kill -TERM "${v}_PID" 2>/dev/null; }}']
    lines = [
        f"# the {r.name}'s deployment ({dep.kind}): its own process group, port, identity and log",
        f'{v}_PID=""',
        f'{v}_WATCH_PID=""',
        *signal,
        f"{fn}_check_now() {{ :; }}  # redefined below once it has a health check",
        f"stop_{fn}() {{",
        f'  [ -z "${v}_WATCH_PID" ] || {{ kill "${v}_WATCH_PID" 2>/dev/null; {v}_WATCH_PID=""; '
        f"settle_ready {r.state_file}; {fn}_check_now; }}",
        f'  if [ -n "${v}_PID" ] && kill -0 "${v}_PID" 2>/dev/null; then',
        f"    say {q('stopping the ' + r.label)}",
        f"    signal_{fn}",
        f'    for _ in $(seq 1 30); do kill -0 "${v}_PID" 2>/dev/null || break; sleep 1; done',
        f'    kill -KILL -- "-${v}_PID" 2>/dev/null || kill -KILL "${v}_PID" 2>/dev/null',
        "  fi",
        f'  {v}_PID=""',
        "}",
        f"STOPS+=(stop_{fn})",
        f"rm -f {r.state_file} {r.state_file}.said {r.port_file} {r.identity_file}",
    ]
    if dep.host_var and dep.step.node_offset:  # on nodes of its own: the job reaches it at its first node's name
        first = int(dep.step.node_offset)
        no_node = f"the {r.label} runs on a node of its own, and this allocation has no node after its first {first}"
        lines += [
            f'{dep.host_var}="$(step_nodes 1 {first})"; export {dep.host_var}',
            f'if [ -z "${dep.host_var}" ]; then',
            f"  say {q(no_node)}",
            f"  mark {r.state_file} failed; JOB_RC=3; exit 3",
            "fi",
            f'say "the {r.label} runs on its own node(s) from ${dep.host_var} on"',
        ]
    lines += [
        f"say {q('starting the ' + r.label + ' (' + dep.kind + ')')}",
        f"setsid {_launch(dep.step, launcher, name=r.step_name)} > {r.log} 2>&1 &",
        f"{v}_PID=$!",
        f"mark {r.state_file} starting",
    ]
    if dep.port_file:
        lines += _published_port(dep.port_file, timeout, dep.port, r)
    if not dep.health_url:
        return "\n".join([*lines, f"mark {r.state_file} ready"]) + "\n"
    lines += [f'{v}_HEALTH_URL="{dep.on_published_port(dep.health_url)}"']
    check = []
    healthy = f'said_ready {r.state_file} "{r.label} healthy: ${v}_HEALTH_URL'
    if dep.identity and dep.identity_url:
        lines += [
            f"{v}_IDENTITY={q(dep.identity)}",
            f'{v}_IDENTITY_URL="{dep.on_published_port(dep.identity_url)}"',
            f'{fn}_identity_ok() {{ case "$(fetch "${v}_IDENTITY_URL")" in *"${v}_IDENTITY"*) return 0 ;; esac; '
            "return 1; }",
            f'{fn}_verified() {{ mark {r.identity_file} "${v}_IDENTITY"; '
            f'{healthy} (identity ${v}_IDENTITY verified)"; }}',
        ]
        check = [
            f"  if ! {fn}_identity_ok; then",
            f'    {fn}_gave_up "${{{v}_HEALTH_URL%/v1/*}} answers for another deployment: it does not report '
            f"this job's {r.label} identity ${v}_IDENTITY\"; return 3",
            "  fi",
        ]
    else:
        lines += [f"{fn}_identity_ok() {{ :; }}", f'{fn}_verified() {{ {healthy}"; }}']
    lines += [
        f"{fn}_check_now() {{  # the tasks ended before the watcher's next look: have it now",
        f'  if [ "$(cat {r.state_file} 2>/dev/null)" = starting ] && health_ok "${v}_HEALTH_URL" '
        f"&& {fn}_identity_ok; then",
        f"    {fn}_verified",
        "  fi",
        "}",
    ]
    lines += [
        f"watch_{fn}() {{",
        f"  local deadline=$((SECONDS + {timeout}))",
        f"  {fn}_gave_up() {{",
        f'    say "$1; last lines of {r.log}:"',
        f"    tail -n 40 {r.log}; mark {r.state_file} failed; kill -USR1 $$",
        "  }",
        f'  until health_ok "${v}_HEALTH_URL"; do',
        f'    if ! kill -0 "${v}_PID" 2>/dev/null; then',
        f'      {fn}_gave_up "the {r.label} exited before it became healthy"; return 3',
        "    fi",
        '    if [ "$SECONDS" -ge "$deadline" ]; then',
        f'      {fn}_gave_up "the {r.label} did not become healthy within {timeout} s"; return 3',
        "    fi",
        "    sleep 1",
        "  done",
        *check,
        "  trap '' TERM",
        f"  {fn}_verified",
        "}",
        f"watch_{fn} &",
        f"{v}_WATCH_PID=$!",
    ]
    return "\n".join(lines) + "\n"


def _clients_need(plan: JobPlan) -> str:
    """Clients starting during the model's load first wait for what the deployment prepares for them (the
    watcher stops the job if the deployment fails meanwhile)."""
    if not (plan.prepare_during_load and plan.clients_need and plan.tasks and plan.deployment.step):
        return ""
    paths = " ".join(shlex.quote(p) for p in plan.clients_need)
    return (
        f"for p in {paths}; do\n"
        '  [ -e "$p" ] || say "the task clients start once the deployment has prepared $p"\n'
        '  until [ -e "$p" ]; do sleep 1; done\n'
        "done\n"
    )


def _task_section(task: TaskPlan, launcher: Launcher) -> str:
    if task.repeats:
        return _repeated_task_section(task, launcher)
    d = shlex.quote(task.dir)
    name = shlex.quote(task.name)
    (run,) = task.runs
    return (
        "\n".join(
            [
                f"if [ -f {d}/.done ]; then",
                f"  say {shlex.quote('task ' + task.name + ': already done, skipped')}",
                "else",
                f"  say {shlex.quote('task ' + task.name + ': running')}",
                f"  mark {d}/state running",
                f"  {_launch(run.step, launcher, name='task-' + task.dir_name)} > {d}/client.log 2>&1",
                "  rc=$?",
                '  if [ "$rc" -eq 0 ]; then',
                f"    touch {d}/.done; mark {d}/state succeeded; say {name}': succeeded'",
                "  else",
                f'    mark {d}/state "failed $rc"',
                f'    say {name}": failed (exit $rc); last lines of {task.dir}/client.log:"',
                f"    tail -n 20 {d}/client.log; return 1",
                "  fi",
                "fi",
            ]
        )
        + "\n"
    )


def _repeated_task_section(task: TaskPlan, launcher: Launcher) -> str:
    """k client runs, one after the other; a finished repeat (its `.done`) is never run again, and the
    first failing repeat stops the task (the rest would fail the same way)."""
    d = shlex.quote(task.dir)
    name = shlex.quote(task.name)
    k = len(task.runs)
    lines = [
        f"if [ -f {d}/.done ]; then",
        f"  say {shlex.quote('task ' + task.name + ': already done, skipped')}",
        "else",
        f"  say {shlex.quote(f'task {task.name}: running, {k} samples per problem')}",
        f"  mark {d}/state running",
        f"  rc=0; log={d}/client-rs0.log",
    ]
    for run in task.runs:
        layout = run.layout
        done = shlex.quote(f"{task.dir}/{layout.done}")
        output = shlex.quote(f"{task.dir}/{layout.output}")
        log = shlex.quote(f"{task.dir}/{layout.log}")
        lines += [
            f'  if [ "$rc" -eq 0 ] && [ ! -f {done} ]; then',
            f"    say {shlex.quote(f'task {task.name}: repeat {layout.repeat} of {k} (seed {layout.seed})')}",
            f"    log={log}",
            f'    {_launch(run.step, launcher, name=f"task-{task.dir_name}-rs{layout.repeat}")} > "$log" 2>&1',
            "    rc=$?",
            f'    if [ "$rc" -eq 0 ]; then mkdir -p {output} && touch {done}; fi',
            "  fi",
        ]
    lines += [
        '  if [ "$rc" -eq 0 ]; then',
        f"    touch {d}/.done; mark {d}/state succeeded; say {name}': succeeded'",
        "  else",
        f'    mark {d}/state "failed $rc"',
        f'    say {name}": failed (exit $rc); last lines of $log:"',
        '    tail -n 20 "$log"; return 1',
        "  fi",
        "fi",
    ]
    return "\n".join(lines) + "\n"


def _task_function(index: int, task: TaskPlan, launcher: Launcher, turn: str | None = None) -> str:
    """A task as a shell function (`run_tasks` starts it in the background): 0 succeeded or done, 1 failed.
    `turn`: the file whose existence lets its client send (the harness hook waits for it)."""
    body = _task_section(task, launcher)
    if turn:
        body = f"export CKPTEVAL_REQUEST_TURN={shlex.quote(turn)}\n{body}"
    indented = "".join(f"  {line}\n" for line in body.splitlines())
    return f"task_{index}() {{  # {task.name}\n{indented}}}\n"


def _gated(plan: JobPlan) -> RequestGroups | None:
    """The plan's request groups when they may have to take turns (a probe decides)."""
    return plan.requests if plan.requests is not None and plan.requests.probe else None


def _turn_of(plan: JobPlan, index: int) -> str | None:
    requests = _gated(plan)
    if requests is None:
        return None
    group = next(g for g, members in enumerate(requests.groups, 1) if index in members)
    return JobDir(plan.job_dir).join(JobDir.turn(group))


def _requests_section(plan: JobPlan) -> str:
    """Before any task's first request: probe the endpoint, then open the groups' turns, all at once when
    it answers each request with its own settings, else one group after another (each once the group before
    has ended). In the background: the clients start meanwhile, and prepare."""
    requests = _gated(plan)
    if requests is None:
        return ""
    q = shlex.quote
    n = len(requests.groups)
    waits_for_deployment = plan.deployment.step is not None
    lines = [
        "group_done() {  # every task dir given has ended (or was done before this job)",
        "  local d",
        '  for d in "$@"; do',
        '    [ -f "$d/.done" ] && continue',
        '    case "$(cat "$d/state" 2>/dev/null)" in succeeded|failed*) ;; *) return 1 ;; esac',
        "  done",
        "}",
        "settle_requests() {  # may tasks whose request settings differ send side by side? (job/request_groups.py)",
        "  local line",
    ]
    if waits_for_deployment:
        lines.append('  until [ "$(cat state/deployment 2>/dev/null)" = ready ]; do sleep 0.5; done')
    lines += [
        '  say "probing the endpoint: concurrent requests of different settings, each against the same request alone"',
        f"  line=$({requests.probe} 2>>{JobDir.REQUEST_PROBE_LOG} | tail -n 1)",
        f'  [ -n "$line" ] || line="unknown: the probe did not run (see {JobDir.REQUEST_PROBE_LOG})"',
        '  say "request settings probe: $line"',
    ]
    opens = [f"mark {q(JobDir.turn(g))} open" for g in range(1, n + 1)]
    if n == 1:  # an endpoint the job does not own: probed for the record, nothing to take turns
        lines += [
            f'  mark {JobDir.REQUESTS} "one group of identical request settings (a shared endpoint): $line"',
            f"  {opens[0]}",
            "}",
            f"rm -f state/turn-* {JobDir.REQUESTS}",
            "settle_requests &",
            "GATE_PID=$!",
        ]
        return "\n".join(lines) + "\n"
    if requests.known_mixing:
        lines.append(f"  local why={q(requests.known_mixing)}")
    else:
        lines += [
            '  if [ "${line%%:*}" = honoured ]; then',
            f'    mark {JobDir.REQUESTS} "side by side: $line"',
            *(f"    {o}" for o in opens),
            "    return 0",
            "  fi",
            '  local why="the probe found: $line"',
        ]
    lines += [
        f'  mark {JobDir.REQUESTS} "in {n} groups, one after another: $why"',
        f'  say "the tasks run in {n} groups of identical request settings, one group after another: $why"',
    ]
    names = [t.name for t in plan.tasks]
    for g, (members, words) in enumerate(zip(requests.groups, requests.words, strict=True), 1):
        if g > 1:
            before = " ".join(q(plan.tasks[i].dir) for i in requests.groups[g - 2])
            lines.append(f"  until group_done {before}; do sleep 1; done")
        listing = ", ".join(names[i] for i in members)
        lines += [f"  say {q(f'request group {g} of {n}: {listing} ({words})')}", f"  {opens[g - 1]}"]
    lines += [
        "}",
        "# a task's state from an earlier run of this job would end its group at once: it is pending again",
        'for d in ${TASK_DIRS[@]+"${TASK_DIRS[@]}"}; do [ -f "$d/.done" ] || rm -f "$d/state"; done',
        f"rm -f state/turn-* {JobDir.REQUESTS}",
        "settle_requests &",
        "GATE_PID=$!",
    ]
    return "\n".join(lines) + "\n"


def _run_order(plan: JobPlan) -> tuple[int, ...]:
    """Group by group when groups may take turns (a waiting client of a later group holds a slot of
    max_parallel_tasks only once every task before it has started: no group waits on one after it)."""
    requests = _gated(plan)
    return requests.order if requests is not None else tuple(range(len(plan.tasks)))


def render_job_script(plan: JobPlan, *, launcher: Launcher = "processes", header: str = "") -> str:
    """The bash script for `plan`. `header` goes right after the shebang (e.g. #SBATCH lines)."""
    parts = [
        "#!/usr/bin/env bash\n",
        header,
        f"# ckpteval job for invocation {plan.invocation}: deploy once, run {len(plan.tasks)} task(s), stop.\n",
        f"JOB_DIR={shlex.quote(plan.job_dir)}\n",
        _PRELUDE,
        _SLURM_PRELUDE if launcher == "srun-containers" else "",
        _SLURM_SIGNAL if launcher == "srun-containers" else _LOCAL_SIGNAL,
        _FUNCTIONS,
        'mark state/slurm_job "${SLURM_JOB_ID:-}"\n' if launcher == "srun-containers" else "",
        _env_prefix(plan.env),
        f"TASK_DIRS=({' '.join(shlex.quote(t.dir) for t in plan.tasks)})\n",
        _deployment_section(plan, launcher),
        *(_other_section(dep, launcher) for dep in plan.others),
        *(_task_function(i, t, launcher, _turn_of(plan, i)) for i, t in enumerate(plan.tasks)),
        _clients_need(plan),
        _requests_section(plan),
        f"FAILED=0\nMAX_PARALLEL_TASKS={int(plan.max_parallel_tasks)}\n",
        f"run_tasks {' '.join(f'task_{i}' for i in _run_order(plan))}\n" if plan.tasks else "",
        "stop_deployment\n",
        "stop_others\n" if plan.others else "",
        'if [ "$FAILED" -eq 0 ]; then JOB_RC=0; say "all tasks succeeded"; '
        'else JOB_RC=1; say "$FAILED task(s) failed"; fi\n',
        *(f"{line}\n" for line in plan.after_tasks),
        'exit "$JOB_RC"\n',
    ]
    return "".join(parts)
