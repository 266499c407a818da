"""A watcher that lives on the cluster: `evaluate watch DIR -c CFG --run PROFILE --detach`.

A feature of the Slurm executor (its registry entry's `hosts_watchers`): the profile is a Slurm cluster's
(`SlurmProfile`: its `watch_*` keys), the watcher's job header is the Slurm side's (`cluster.watcher_job`), and
an executor that hosts no watchers is refused before anything is contacted.

From the user's machine (`submit_hosted`), over the profile's SSH: check that the cluster's Python runs this
version of ckpteval, refuse when a watcher of the run is already queued or running, and submit the watcher's
script with its files into its home on the cluster (`<remote_job_dir>/watch/<run>/`): a CPU-only job (one
CPU, no GPU) that runs `python -m ckpteval.watch.hosted HOME` with `CKPTEVAL_STATE_DIR=HOME/state`.
Submitting, listing and cancelling its jobs go through the executor's backend (`script_host`: the registry's
`hosts_watchers`), the one place that speaks to the scheduler; an executor that hosts no watchers is refused.

On the cluster (`main`), the normal watcher loop runs with the profile's `tunnel = "local"`: the save dir
is listed on the node, each evaluation is submitted with `sbatch` from inside the allocation (nemo-run's
LocalTunnel), its record and the run's state are written under HOME/state. Slurm sends the job SIGUSR1
`watch_signal_lead` seconds before its time limit (`--signal=B:USR1@lead`): the watcher submits the next
link at once through the same backend over this machine (the same script; `--dependency=singleton` holds it
until this one has ended), then stops as
`watch stop` would (state saved, lock released) and exits 0. SIGTERM (`scancel`) stops it without a next
link; the user starts it again with the same command. `watch stop` writes HOME/stopped, so a link that
gets its signal after a stop submits no next one.

`hosted_status` and `stop_hosted` read and act on all of that over SSH, through the same backend; a small
pointer file here (`<state dir>/watch/hosted/<run>.json`) says which profile and home a run's watcher lives in.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import json
import os
import posixpath
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.config.executors import slurm_part
from ckpteval.config.profiles import Profile, toml_value
from ckpteval.errors import ClusterError, ConfigError
from ckpteval.watch.state import WatchSpec, WatchState, run_name

if TYPE_CHECKING:
    from ckpteval.cluster.remote import Remote
    from ckpteval.execution.backend import ScriptHost, ScriptJob
    from ckpteval.watch.run import Health

SPEC_FILE = "spec.json"
ENV_FILE = "env.toml"
SCRIPT_FILE = "watcher.sbatch"
STOPPED_FILE = "stopped"
LINKS_FILE = "links.log"  # one line per link: "<epoch> <job id> <what>"


def job_name(run: str) -> str:
    """The Slurm job name of a run's watcher (every link of the chain has it: `--dependency=singleton`)."""
    return f"ckpteval-watch-{run}"


@dataclass(frozen=True)
class HostedWatch:
    """Where a run's cluster-hosted watcher lives and what it runs (built here; nothing contacted)."""

    run: str
    profile: Profile  # the user's profile (tunnel ssh); the watcher on the cluster uses it with tunnel local
    home: str  # on the cluster: <remote_job_dir>/watch/<run>
    spec: WatchSpec  # as the watcher on the cluster reads it (its env file and configs there)
    uploads: dict[str, str]  # file name in HOME -> text (env.toml, spec.json, configs)

    @property
    def python(self) -> str:
        from ckpteval.cluster.watcher_job import watcher_python

        return watcher_python(slurm_part(self.profile))[1]

    def path(self, name: str) -> str:
        return posixpath.join(self.home, name)

    @property
    def script(self) -> str:
        """The watcher's sbatch script (what `--dry-run` shows)."""
        return self.uploads[SCRIPT_FILE]

    @property
    def env_toml(self) -> str:
        """The env.toml the watcher reads on the cluster."""
        return self.uploads[ENV_FILE]


def hosted_home(profile: Profile, run: str) -> str:
    """The watcher's home on the cluster: its script, env, spec, log and the run's state (under state/)."""
    remote_job_dir = profile.part.files_dir()
    if not remote_job_dir:
        raise ConfigError(
            f"Profile [{profile.name}] has no remote_job_dir: the cluster-hosted watcher keeps its state there.",
            hint='Set remote_job_dir = "/lustre/.../ckpteval" (absolute, on the cluster) in the profile.',
        )
    return posixpath.join(remote_job_dir, "watch", run)


def cluster_env_toml(profile: Profile, wandb: dict[str, str | None]) -> str:
    """The env.toml the watcher reads on the cluster: the profile as it is, but reached `tunnel = "local"`
    (it runs there: listings and sbatch without SSH) and without the SSH keys it no longer needs."""
    values = profile.to_config()
    name = values.pop("name")
    values.pop("extends", None)
    values["tunnel"] = "local"
    for key in ("host", "user", "port", "identity"):
        values.pop(key)
    lines = []
    if any(wandb.values()):
        lines += ["[wandb]"] + [f"{k} = {toml_value(v)}" for k, v in wandb.items() if v] + [""]
    lines.append(f"[{json.dumps(name)}]")
    lines += [f"{key} = {toml_value(v)}" for key, v in values.items() if v is not None]
    return "\n".join(lines) + "\n"


def render_watcher_script(hosted: HostedWatch) -> str:
    """The watcher's sbatch script: CPU-only, one CPU, its time limit and the signal ahead of it, one link
    at a time (singleton), requeued if its node fails; the Python runs as the batch shell (exec), so the
    `B:` signal reaches it."""
    from ckpteval.cluster.watcher_job import watcher_header

    lines = watcher_header(slurm_part(hosted.profile), name=job_name(hosted.run), output=hosted.path("watcher-%j.out"))
    lines += [
        "# the evaluation jobs this watcher submits get no GPU request from here: sbatch's own settings only",
        f"export CKPTEVAL_STATE_DIR={shlex.quote(hosted.path('state'))}",
        "export PYTHONUNBUFFERED=1",
        f"exec {shlex.quote(hosted.python)} -m ckpteval.watch.hosted {shlex.quote(hosted.home)}",
    ]
    return "\n".join(lines) + "\n"


def plan_hosted(spec: WatchSpec) -> HostedWatch:
    """The cluster-hosted watcher of `spec` (a Slurm profile, an absolute save dir); nothing contacted."""
    from ckpteval.config.executors import find_executor
    from ckpteval.config.profiles import load_env_file
    from ckpteval.watch.run import absolute_save_dir

    env = load_env_file(Path(spec.env_file) if spec.env_file else None)
    profile = env.profile(spec.profile)
    if not find_executor(profile.executor).hosts_watchers or profile.part.files_here():
        raise ConfigError(
            "--detach puts the watcher on a Slurm cluster reached over SSH: name such a profile with --run.",
            hint="evaluate watch /lustre/run42/checkpoints -c sft --run MY-CLUSTER --detach",
        )
    spec = dataclasses.replace(spec, save_dir=absolute_save_dir(spec.save_dir, profile))
    run = run_name(spec.save_dir, spec.profile)
    home = hosted_home(profile, run)
    uploads: dict[str, str] = {}
    configs = []
    for i, config in enumerate(spec.configs):
        path = Path(config).expanduser()
        if path.is_file():  # a YAML of this machine: it goes along; a stage name is resolved there
            name = f"config-{i}-{path.name}"
            uploads[name] = path.read_text(encoding="utf-8")
            configs.append(posixpath.join(home, name))
        else:
            configs.append(config)
    wandb = {"entity": env.wandb.entity, "project": env.wandb.project}
    uploads[ENV_FILE] = cluster_env_toml(profile, wandb)
    cluster_spec = dataclasses.replace(spec, configs=configs, env_file=posixpath.join(home, ENV_FILE))
    uploads[SPEC_FILE] = json.dumps(dataclasses.asdict(cluster_spec), indent=2) + "\n"
    hosted = HostedWatch(run=run, profile=profile, home=home, spec=cluster_spec, uploads=uploads)
    uploads[SCRIPT_FILE] = render_watcher_script(hosted)
    return hosted


# -- from the user's machine, over SSH ---------------------------------------------------------------------


def _pointer(run: str) -> Path:
    from ckpteval.watch.state import watch_dir

    return watch_dir() / "hosted" / f"{run}.json"


@dataclass(frozen=True)
class HostedRef:
    """What this machine remembers of a cluster-hosted watch run: where to reach it."""

    run: str
    profile: str
    env_file: str | None
    home: str
    save_dir: str


def remember(hosted: HostedWatch, env_file: str | None) -> None:
    """Write the pointer that lets `watch status/stop RUN` find the run on the cluster."""
    from ckpteval.invocation.record import write_text_atomic

    ref = HostedRef(hosted.run, hosted.profile.name, env_file, hosted.home, hosted.spec.save_dir)
    path = _pointer(hosted.run)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(dataclasses.asdict(ref), indent=2) + "\n")


def hosted_runs() -> list[str]:
    """The runs whose watcher was put on a cluster from here (`--detach`), by name."""
    base = _pointer("x").parent
    return sorted(p.stem for p in base.glob("*.json")) if base.is_dir() else []


def find_hosted(ref: str) -> HostedRef | None:
    """The cluster-hosted run named `ref` (or the only one starting with it); None when there is none."""
    names = hosted_runs()
    matches = [n for n in names if n == ref] or [n for n in names if n.startswith(ref)]
    if len(matches) != 1:
        return None
    return HostedRef(**json.loads(_pointer(matches[0]).read_text(encoding="utf-8")))


def python_problem(remote: Remote, python: str) -> str | None:
    """None when `python` on the cluster imports this version of ckpteval; else what is wrong, in words."""
    from importlib.metadata import version  # the installed distribution's: what `import ckpteval` reports

    probe = "import ckpteval, importlib.metadata as m, sys; sys.stdout.write(m.version('ckpteval'))"
    result = remote.run([python, "-c", probe], check=False, timeout=60)
    if not result.ok:
        lines = [ln.strip() for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
        return f"it cannot import ckpteval ({lines[-1] if lines else f'exit status {result.returncode}'})"
    here = version("ckpteval")
    if result.stdout.strip() != here:
        return f"it has ckpteval {result.stdout.strip()}, this machine {here}"
    return None


@dataclass(frozen=True)
class HostedSubmission:
    """A submitted cluster-hosted watcher."""

    run: str
    job_id: str
    home: str
    where: str


def submit_hosted(spec: WatchSpec) -> HostedSubmission:
    """Put the watcher of `spec` on the cluster (see the module's docstring); ConfigError/ClusterError with
    one clear message when its Python lacks this ckpteval, a watcher of the run is already there, or sbatch
    refuses it. Checks the config here first, so a bad one fails before anything is contacted."""
    from ckpteval.execution.backends import script_host
    from ckpteval.watch import submit

    hosted = plan_hosted(spec)
    submit.watch_settings(dataclasses.replace(spec, save_dir=hosted.spec.save_dir), run=hosted.run)
    with script_host(hosted.profile) as host:
        remote = host.remote
        problem = python_problem(remote, hosted.python)
        if problem:
            from ckpteval.cluster.watcher_job import watcher_python

            key = watcher_python(slurm_part(hosted.profile))[0]
            raise ConfigError(
                f"Profile [{hosted.profile.name}]: {key} = {shlex.quote(hosted.python)} on {host.description} "
                f"runs the watcher, but {problem}.",
                hint="Install this ckpteval for a Python on the cluster (`pip install ckpteval==VERSION` in a venv "
                'on the shared filesystem) and name it: watch_python = "/path/to/venv/bin/python".',
            )
        running = host.jobs(job_name(hosted.run))
        if running:
            job = running[-1]
            raise ConfigError(
                f"A watcher of {hosted.run} is already on the cluster (Slurm job {job.job_id}, {job.state}).",
                hint=f"`evaluate watch status {hosted.run}` shows it; `evaluate watch stop {hosted.run}` ends it.",
            )
        remote.run(["mkdir", "-p", hosted.path("state")], timeout=60)
        remote.run(["rm", "-f", hosted.path(STOPPED_FILE)], timeout=60)
        job = host.submit(hosted.home, hosted.uploads, SCRIPT_FILE, what="the watcher's job")
        _append_link(remote, hosted.path(LINKS_FILE), job.job_id, "submitted by the user")
        remember(hosted, spec.env_file)
        return HostedSubmission(hosted.run, job.job_id, hosted.home, host.description)


def _append_link(remote: Remote, path: str, job_id: str, what: str) -> None:
    line = shlex.quote(f"{time.time():.0f} {job_id} {what}")
    remote.run(["sh", "-c", f"echo {line} >> {shlex.quote(path)}"], timeout=60)


def _open(ref: HostedRef) -> ScriptHost:
    from ckpteval.config.profiles import load_env_file
    from ckpteval.execution.backends import script_host

    return script_host(load_env_file(Path(ref.env_file) if ref.env_file else None).profile(ref.profile))


@dataclass(frozen=True)
class HostedStatus:
    """A cluster-hosted run as `watch status` shows it: its state (read on the cluster) and its watcher
    jobs (Slurm's view is its health), with the chain's links so far."""

    ref: HostedRef
    state: WatchState | None
    jobs: list[ScriptJob]
    links: list[str]  # "<epoch> <job id> <what>", oldest first
    where: str

    @property
    def health(self) -> Health | None:
        """The run's polls, evaluations in flight and errors, from its state (its liveness is `jobs`)."""
        from ckpteval.watch.run import health

        return health(self.state) if self.state else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping: where it is, its watcher jobs, its links and its state."""
        from ckpteval.watch.state import state_to_json

        return {
            "run": self.ref.run,
            "hosted": dataclasses.asdict(self.ref),
            "watcher_jobs": [dataclasses.asdict(j) for j in self.jobs],
            "links": self.links,
            "state": state_to_json(self.state) if self.state else None,
        }


def hosted_status(ref: HostedRef) -> HostedStatus:
    """Read the run's state and its watcher's Slurm jobs over SSH (two round trips)."""
    from ckpteval.watch.state import _from_json

    with _open(ref) as host:
        state_path = posixpath.join(ref.home, "state", "watch", ref.run, "state.json")
        text = host.remote.read_text_if_exists(state_path)
        links = host.remote.read_text_if_exists(posixpath.join(ref.home, LINKS_FILE)) or ""
        state = _from_json(json.loads(text)) if text else None
        return HostedStatus(ref, state, host.jobs(job_name(ref.run)), links.splitlines(), host.description)


def stop_hosted(ref: HostedRef, *, timeout: float = 60.0) -> tuple[str, bool]:
    """Stop the run's watcher on the cluster: HOME/stopped (no next link), the stop file its loop checks, and
    SIGTERM to its job (`scancel --signal=TERM --batch`); then wait up to `timeout` s for every link to
    leave Slurm, and scancel what is left. (message, stopped)."""
    name = job_name(ref.run)
    with _open(ref) as host:
        jobs = host.jobs(name)
        stop = posixpath.join(ref.home, "state", "watch", ref.run, "stop")
        host.remote.run(
            [
                "sh",
                "-c",
                f"mkdir -p {shlex.quote(posixpath.dirname(stop))} && date +%s > {shlex.quote(stop)}"
                f" && date +%s > {shlex.quote(posixpath.join(ref.home, STOPPED_FILE))}",
            ],
            timeout=60,
        )
        if not jobs:
            return f"no watcher of {ref.run} is on the cluster (nothing to stop)", True
        ids = [j.job_id for j in jobs]
        host.cancel([j for j in jobs if j.state == "PENDING"])  # a next link not started yet: nothing to save
        host.cancel([j for j in jobs if j.state != "PENDING"], signal="TERM")  # the running link saves and ends
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not host.jobs(name):
                return f"stopped the watcher of {ref.run} (Slurm job {', '.join(ids)}); evaluations go on", True
            time.sleep(1.0)
        host.cancel_named(name)
        return (
            f"the watcher of {ref.run} (Slurm job {', '.join(ids)}) did not end within {timeout:g} s: "
            "cancelled; its state is as it last saved it",
            False,
        )


# -- on the cluster: one link of the chain -----------------------------------------------------------------


def _clean_slurm_env() -> None:
    """The evaluation jobs this watcher submits must not inherit its own allocation's settings (sbatch
    exports the environment): every SLURM_*/SBATCH_* variable is dropped before anything is submitted."""
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))]:
        del os.environ[key]


def _say(message: str) -> None:
    """A line of the link's own story on its stdout (its `watcher-<job>.out`), as the builtin server tells its
    own on its log (server/serve.py): through a logger, not print."""
    import logging

    story = logging.getLogger("ckpteval.watch.link")
    if not story.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
        story.addHandler(handler)
        story.setLevel(logging.INFO)
        story.propagate = False
    story.info(message)


def main(argv: list[str] | None = None) -> int:
    """One link of a cluster-hosted watcher (what watcher.sbatch runs): the watcher loop until a stop, the
    chain's signal or scancel; on the signal the next link is submitted first. The handler is installed
    before the heavy imports (USR1's default action ends the process)."""
    from ckpteval.watch.state import stop_file

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m ckpteval.watch.hosted HOME\n")
        return 2
    home = args[0]
    spec = WatchSpec(**json.loads(Path(home, SPEC_FILE).read_text(encoding="utf-8")))
    run = run_name(spec.save_dir, spec.profile)
    job_id = os.environ.get("SLURM_JOB_ID", "?")
    _clean_slurm_env()
    chained = threading.Event()
    next_link: list[threading.Thread] = []

    def resubmit() -> None:
        from ckpteval.config.profiles import load_env_file
        from ckpteval.errors import CkptevalError
        from ckpteval.execution.backends import script_host

        try:  # the profile as the watcher reads it here (tunnel local): the backend's transport over this machine
            profile = load_env_file(Path(spec.env_file) if spec.env_file else None).profile(spec.profile)
            with script_host(profile) as host:
                new_id = host.submit(home, {}, SCRIPT_FILE, what="the watcher's next link").job_id
        except CkptevalError as exc:
            _say(f"could not submit the next link: {exc.message[-500:]}")
            return
        with Path(home, LINKS_FILE).open("a") as links:
            links.write(f"{time.time():.0f} {new_id} chained by {job_id}\n")
        _say(f"next link submitted: Slurm job {new_id}")

    def on_time_limit(_signum: int, _frame: Any) -> None:
        if chained.is_set():
            return
        chained.set()
        if Path(home, STOPPED_FILE).exists():
            _say("time limit near, but a stop was asked: no next link")
        else:
            thread = threading.Thread(target=resubmit, name="next-link")
            thread.start()
            next_link.append(thread)
        path = stop_file(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{time.time()}\n")  # the loop checks it several times a second

    signal.signal(signal.SIGUSR1, on_time_limit)
    from ckpteval.watch.run import watch

    _say(f"watcher link {job_id} on {os.uname().nodename}: watching {spec.save_dir} as run {run}")
    status = 0
    try:
        outcome = watch(spec, on_event=lambda e: _say(e.message))
        status = 1 if outcome.failed else 0
        _say(f"watcher link {job_id} ended ({'chained' if chained.is_set() else outcome.ended})")
    except (ConfigError, ClusterError) as exc:
        _say(f"error: {exc.message}")
        status = 1
    for thread in next_link:
        thread.join(timeout=120)
    return status


if __name__ == "__main__":
    sys.exit(main())
