"""Submit an invocation's job with nemo-run: `SlurmExecutor` + `SSHTunnel` (or `LocalTunnel` on the login node).

Only submission goes through nemo-run (importing it costs 12-25 s; `status`, `logs` and `cancel` use
squeue/sacct/scancel over our own connection instead, see `ckpteval.cluster.slurm`). Its quirks,
handled here:
- it reads NEMORUN_HOME when it is imported: set to `<ckpteval state dir>/nemo-run` before the import
  (and passed explicitly as the experiments' base dir, in case it was imported earlier);
- its SSHTunnel copies the experiment directory with `rsync` over the `ssh` command (so the host must be
  in known_hosts, and rsync installed), and exits the process (`SystemExit`) when it cannot log in:
  caught, and said plainly (callers check the connection with our own SSH first, so this is rare);
- a failed `sbatch` raises invoke's `UnexpectedExit`, whose stderr holds Slurm's reason;
- it prints rich panels; they go to `nemo-run.log` in the invocation's record directory instead.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import contextlib
import io
import os
import posixpath
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.cluster.sbatch import EXPERIMENT_TITLE, SbatchSpec, executor_settings
from ckpteval.errors import ClusterError
from ckpteval.invocation.record import state_dir

if TYPE_CHECKING:
    from ckpteval.cluster.slurm import ClusterFacts
    from ckpteval.config.profiles import Profile


@dataclass(frozen=True)
class Submission:
    """A submitted job."""

    job_id: str
    experiment_id: str
    nemo_run_dir: str  # on the cluster: nemo-run's files of this job (its sbatch output, srun log)
    sbatch_script: str  # the script nemo-run generated and submitted


def nemorun_home() -> Path:
    """Where nemo-run keeps its experiment records for ckpteval: `<state dir>/nemo-run`."""
    return state_dir() / "nemo-run"


def import_nemo_run() -> Any:
    """`import nemo_run`, with NEMORUN_HOME pointing at ckpteval's directory for it."""
    home = nemorun_home()
    home.mkdir(parents=True, exist_ok=True)
    saved = os.environ.get("NEMORUN_HOME")
    os.environ["NEMORUN_HOME"] = str(home)  # read once, at import; not left for processes we start later
    try:
        import nemo_run
    finally:
        if saved is None:
            os.environ.pop("NEMORUN_HOME", None)
        else:
            os.environ["NEMORUN_HOME"] = saved
    return nemo_run


def check_local_tools(profile: Profile) -> None:
    """nemo-run's SSHTunnel shells out to `rsync` and `ssh`: refuse early (before the slow import) without them."""
    from ckpteval.config.executors import remote_part

    if remote_part(profile).tunnel != "ssh":
        return
    missing = [tool for tool in ("rsync", "ssh") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(
            f"nemo-run copies its job files to the cluster with rsync over ssh, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed here.",
            hint="Install them (e.g. `apt-get install rsync openssh-client`).",
        )


def _host(profile: Profile) -> str | None:
    from ckpteval.config.executors import remote_part

    return remote_part(profile).host


def _tunnel(nemo_run: Any, profile: Profile, tunnel_dir: str, home: Path) -> Any:
    from nemo_run.core.tunnel.client import LocalTunnel, SSHTunnel

    from ckpteval.config.executors import remote_part

    reach = remote_part(profile)
    if reach.tunnel == "local":
        # LocalTunnel copies nothing: its job dir must be the experiment dir itself (base/experiments/...)
        return LocalTunnel(job_dir=str(home / "experiments"))
    from ckpteval.cluster.ssh_hosts import resolve_target

    target = resolve_target(reach.host or "", user=reach.user, port=reach.port, identity=reach.identity)
    tunnel = SSHTunnel(
        host=reach.host or target.hostname,  # an alias stays an alias: fabric reads ~/.ssh/config too
        user=target.user,
        port=reach.port,
        identity=os.path.expanduser(reach.identity) if reach.identity else None,
        job_dir=tunnel_dir,
    )
    # when key authentication fails it would ask for a password on the terminal: refuse instead
    tunnel.auth_handler = _no_password
    tunnel.fallback_auth_handler = _no_password
    return tunnel


def _no_password(*_args: Any) -> Any:
    raise PermissionError("ckpteval does not type passwords for nemo-run")


@contextlib.contextmanager
def _without_credentials() -> Iterator[None]:
    """sbatch exports the submitting environment to the job: with a LocalTunnel that is ours, so the
    credential variables (WANDB_API_KEY, HF_TOKEN, ...) are taken out while it runs."""
    from ckpteval.config.secrets import CREDENTIAL_ENV_VARS

    saved = {name: os.environ.pop(name) for name in CREDENTIAL_ENV_VARS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@contextlib.contextmanager
def _no_stdin() -> Iterator[None]:
    saved = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        yield
    finally:
        sys.stdin = saved


def submit(spec: SbatchSpec, profile: Profile, *, log_path: Path, facts: ClusterFacts | None = None) -> Submission:
    """Submit the job with nemo-run (detached) and return its Slurm job id; ClusterError if it fails.

    `facts` (partitions, accounts) make the hint for a refused job more specific.
    """
    check_local_tools(profile)
    nemo_run = import_nemo_run()
    from invoke.exceptions import UnexpectedExit

    home = nemorun_home()
    executor = nemo_run.SlurmExecutor(
        **executor_settings(spec),
        tunnel=_tunnel(nemo_run, profile, spec.tunnel_dir, home),
        packager=nemo_run.Packager(),  # the job needs no code from here: its files are already uploaded
    )
    # Script(path=...) runs `bash <job.sh>` as the step; nothing is copied for it
    script = nemo_run.Script(path=spec.job_script)
    buffer = io.StringIO()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with (
            _without_credentials(),
            _no_stdin(),  # invoke forwards stdin to the commands it runs; they need none
            contextlib.redirect_stdout(buffer),
            contextlib.redirect_stderr(buffer),
            nemo_run.Experiment(
                EXPERIMENT_TITLE,
                executor=executor,
                base_dir=str(home),
                log_level="WARN",
                enable_goodbye_message=False,
                skip_status_at_exit=True,
            ) as exp,
        ):
            exp.add(script, name=spec.invocation)
            exp.run(detach=True, tail_logs=False)
            job = exp.jobs[0]
            handle = job.handle
            experiment_id = exp._id
            local_exp_dir = Path(exp._exp_dir)
            remote_exp_dir = job.executor.tunnel.job_dir
    except SystemExit:
        raise ClusterError(
            f"nemo-run could not log in to {_host(profile)} (it asks for a password when key authentication fails).",
            hint="Check `host`, `user`, `port` and `identity` in the env.toml profile; `ssh HOST` must work "
            "without a password (key in ssh-agent or `identity`).",
        ) from None
    except UnexpectedExit as exc:
        from ckpteval.cluster.slurm import explain_sbatch_error

        result = exc.result
        command = str(getattr(result, "command", ""))
        stderr = str(getattr(result, "stderr", "") or getattr(result, "stdout", ""))
        if command.startswith("sbatch"):
            text, hint = explain_sbatch_error(stderr, facts)
            raise ClusterError(f"Slurm refused the job (sbatch):\n{text}", hint=hint) from None
        if command.startswith("rsync") or "rsync" in stderr:
            raise ClusterError(
                f"nemo-run could not copy its job files to {_host(profile)} with rsync:\n{stderr.strip()[-1500:]}",
                hint="`ssh` must reach the host without a prompt: its key must be in ~/.ssh/known_hosts "
                "(`ssh-keyscan -p PORT HOST >> ~/.ssh/known_hosts`) and rsync installed on both ends.",
            ) from None
        raise ClusterError(f"nemo-run failed running `{command[:200]}`:\n{stderr.strip()[-1500:]}") from None
    finally:
        log_path.write_text(buffer.getvalue(), encoding="utf-8")
    if not handle:
        raise ClusterError("nemo-run did not submit the job.", hint=f"Its output is in {log_path}.")
    job_id = str(handle).rstrip("/").rsplit("/", 1)[-1]
    sbatch_path = local_exp_dir / f"{spec.invocation}_sbatch.sh"
    sbatch_text = sbatch_path.read_text(encoding="utf-8") if sbatch_path.is_file() else ""
    return Submission(
        job_id=job_id,
        experiment_id=experiment_id,
        nemo_run_dir=posixpath.join(remote_exp_dir, spec.invocation),
        sbatch_script=sbatch_text,
    )
