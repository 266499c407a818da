"""Know the Export-Deploy entry point of a NeMo image before the job is queued: probe it once, cache the answer.

The probe is a short `srun` in the (squashed) image on a compute node: it lists which of Export-Deploy's
entry points exist under `/opt/Export-Deploy` and runs each with `--help`. The answer (the script chosen,
the flags it takes, the ones it requires) is cached beside the squashed image,
`<remote_job_dir>/containers/<name>.export-deploy.json`, and is valid while it is newer than the `.sqsh`
(a re-import probes again). A real run resolves it after squashing and before anything is submitted; a
dry run with `--check` does the same for an image already squashed; a plain dry run uses the default
(`ckpteval.deploy.export_deploy.DEFAULT_ENTRY_POINT`) and says so.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import hashlib
import posixpath
import re
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ckpteval.config.schema import MegatronDeployment
from ckpteval.deploy.export_deploy import (
    CANDIDATES,
    DEFAULT_ENTRY_POINT,
    EXPORT_DEPLOY_ROOT,
    EntryPoint,
    export_deploy_argv,
    export_deploy_command,
    mixes_settings,
    parse_help,
)
from ckpteval.errors import ClusterError

if TYPE_CHECKING:
    from ckpteval.cluster.remote import Remote
    from ckpteval.cluster.squash import SquashPlan
    from ckpteval.config.compile import CompiledConfig
    from ckpteval.config.preview import PreviewPanel
    from ckpteval.config.profiles import Profile
    from ckpteval.job.plan import JobPlan

CACHE_SUFFIX = ".export-deploy.json"
PROBE_TIMEOUT_S = 900  # the srun may wait for a node; `--help` imports torch and Ray in the image
_MARK = "@@ckpteval-export-deploy"

# runs inside the image: for each candidate that exists, its path, its `--help` and that exit code
_PROBE_SCRIPT = f"""root="$1"; shift
for rel in "$@"; do
  p="$root/$rel"
  [ -f "$p" ] || continue
  echo "{_MARK} script $p"
  timeout 600 python "$p" --help 2>&1
  echo "{_MARK} rc $?"
done
echo "{_MARK} end"
"""


def cache_path(containers_dir: str, image_path: str) -> str:
    """`<containers>/<name>.export-deploy.json` for `<containers>/<name>.sqsh`; an image elsewhere (a .sqsh the
    config names) gets a name from its path, in the same containers directory."""
    directory, base = posixpath.split(image_path)
    stem = base[: -len(".sqsh")] if base.endswith(".sqsh") else base
    if posixpath.normpath(directory) != posixpath.normpath(containers_dir):
        digest = hashlib.sha256(image_path.encode()).hexdigest()[:10]
        stem = f"{re.sub(r'[^A-Za-z0-9._-]+', '+', stem).strip('+.') or 'image'}-{digest}"
    return posixpath.join(containers_dir, stem + CACHE_SUFFIX)


def read_cached(remote: Remote, cache: str, image_path: str) -> EntryPoint | None:
    """The cached probe of `image_path`, if there is one newer than the image (one round trip)."""
    script = 'if [ -s "$1" ] && ! [ "$2" -nt "$1" ]; then cat "$1"; fi'
    result = remote.run(["sh", "-c", script, "ckpteval-cache", cache, image_path], timeout=60, check=False)
    if not result.ok or not result.stdout.strip():
        return None
    try:
        return EntryPoint.from_json(result.stdout, source="cache", where=cache)
    except ValueError:
        return None  # a damaged cache file is probed again and overwritten


def probe_argv(profile: Profile, image_path: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The `srun` that runs the probe in `image_path` on a compute node (squash's build settings), with the
    deployment step's environment `env` (execution.env_vars, deployment.env_vars)."""
    from ckpteval.cluster.squash import build_settings

    argv = build_settings(profile).srun_argv()
    argv = [a for a in argv if not a.startswith("--job-name=")]
    argv += ["--job-name=ckpteval-probe", f"--container-image={image_path}", "--no-container-mount-home"]
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted((env or {}).items()))
    return [*argv, "bash", "-c", exports + _PROBE_SCRIPT, "ckpteval-probe", EXPORT_DEPLOY_ROOT, *CANDIDATES]


def parse_probe(output: str, *, image: str) -> EntryPoint:
    """The entry point to use from the probe's output (ClusterError when the image has none that works)."""
    sections: list[tuple[str, list[str], int | None]] = []
    for line in output.splitlines():
        if line.startswith(f"{_MARK} script "):
            sections.append((line.split(" ", 2)[2].strip(), [], None))
        elif line.startswith(f"{_MARK} rc ") and sections:
            script, lines, _ = sections[-1]
            sections[-1] = (script, lines, int(line.split()[-1]))
        elif line.startswith(f"{_MARK} end"):
            break
        elif sections:
            sections[-1][1].append(line)
    if not sections:
        wanted = ", ".join(f"{EXPORT_DEPLOY_ROOT}/{c}" for c in CANDIDATES)
        raise ClusterError(
            f"Image {image} has no Export-Deploy entry point: none of {wanted} exists in it.",
            hint="Use a NeMo container that ships Export-Deploy (/opt/Export-Deploy), or deployment.backend=builtin.",
        )
    for script, lines, rc in sections:
        if rc == 0:
            flags, required = parse_help("\n".join(lines))
            if flags:
                return EntryPoint(script=script, flags=flags, required=required, source="probe")
    script, lines, rc = sections[0]
    tail = "\n".join(lines[-15:])
    raise ClusterError(
        f"{script} in image {image} does not run: `python {posixpath.basename(script)} --help` exited {rc}.\n{tail}",
        hint="The image's Python environment is broken or not the NeMo container's; check deployment.image.",
    )


def probe(
    remote: Remote, profile: Profile, image_path: str, cache: str, env: Mapping[str, str] | None = None
) -> EntryPoint:
    """Run the probe on the cluster, cache its answer beside the image, and return it."""
    result = remote.run(probe_argv(profile, image_path, env), timeout=PROBE_TIMEOUT_S, check=False)
    output = result.stdout + ("\n" + result.stderr if result.stderr else "")
    if _MARK not in result.stdout:
        raise ClusterError(
            f"The Export-Deploy probe of {image_path} did not run on the cluster (srun exit {result.returncode}).\n"
            + output.strip()[-1500:],
            hint="Check the profile's account/partition (the probe uses squash's build settings).",
        )
    entry = parse_probe(result.stdout, image=image_path)
    remote.run(["mkdir", "-p", posixpath.dirname(cache)], timeout=60)
    remote.write_text_atomic(cache, entry.to_json())
    return dataclasses.replace(entry, where=cache)


def resolve_entry_point(
    remote: Remote, profile: Profile, image_path: str, env: Mapping[str, str] | None = None
) -> EntryPoint:
    """The entry point of the image at `image_path` on the cluster: cached, else probed now (and cached)."""
    from ckpteval.cluster.squash import containers_dir

    cache = cache_path(containers_dir(profile), image_path)
    return read_cached(remote, cache, image_path) or probe(remote, profile, image_path, cache, env)


def _step_env(plan: JobPlan) -> dict[str, str]:
    """The environment the deployment step runs with (the job's, then the step's own)."""
    step = plan.deployment.step
    return {**plan.env, **(step.env if step else {})}


def _export_deploy(compiled: CompiledConfig, plan: JobPlan) -> MegatronDeployment | None:
    deployment = compiled.config.deployment
    if plan.deployment.kind != "megatron/export-deploy" or not isinstance(deployment, MegatronDeployment):
        return None
    return deployment


def with_entry_point(plan: JobPlan, compiled: CompiledConfig, entry: EntryPoint) -> JobPlan:
    """`plan` with its Export-Deploy step built for `entry` (ConfigError for settings the script lacks), and its
    tasks' request groups run one after another where `entry` is known to mix request settings (0.5+)."""
    deployment = _export_deploy(compiled, plan)
    step = plan.deployment.step
    if deployment is None or step is None or plan.deployment.port is None:
        return plan
    command = export_deploy_command(deployment, entry, port=plan.deployment.port)
    new_step = dataclasses.replace(step, command=command)
    requests = plan.requests
    if requests is not None and requests.probe:
        requests = dataclasses.replace(requests, known_mixing=mixes_settings(entry))
    return dataclasses.replace(plan, deployment=dataclasses.replace(plan.deployment, step=new_step), requests=requests)


def resolve_for_run(plan: JobPlan, compiled: CompiledConfig, remote: Remote) -> tuple[JobPlan, str | None]:
    """Before submission (images already squashed): the plan built for the entry point the image really has,
    and a line saying which one and whence (None: no Export-Deploy deployment)."""
    step = plan.deployment.step
    if _export_deploy(compiled, plan) is None or step is None or not step.image:
        return plan, None
    entry = resolve_entry_point(remote, compiled.profile, step.image, _step_env(plan))
    where = f"probed, cached in {entry.where}" if entry.source == "probe" else f"cached probe {entry.where}"
    return with_entry_point(plan, compiled, entry), f"Export-Deploy entry point {entry.script} ({where})"


def preview_entry_point(
    plan: JobPlan, compiled: CompiledConfig, squash: SquashPlan, *, check: bool
) -> tuple[JobPlan, PreviewPanel | None]:
    """For the dry run: the plan built for the entry point (probed or cached with `check` when the image is
    squashed already; the default otherwise) and a panel that says which script, which flags, and whence."""
    from ckpteval.config.preview import PreviewPanel

    step = plan.deployment.step
    if _export_deploy(compiled, plan) is None or step is None or not step.image:
        return plan, None
    image = squash.mapping.get(step.image, step.image)
    present = image == step.image or any(i.path == image and i.status == "present" for i in squash.items)
    if check and present:
        from ckpteval.cluster.connect import connect_remote

        with connect_remote(compiled.profile) as remote:
            entry = resolve_entry_point(remote, compiled.profile, image, _step_env(plan))
    elif check:
        entry = dataclasses.replace(
            DEFAULT_ENTRY_POINT, where="the image is not squashed yet; the run probes it after squashing"
        )
    else:
        entry = DEFAULT_ENTRY_POINT
    plan = with_entry_point(plan, compiled, entry)
    deployment = _export_deploy(compiled, plan)
    assert deployment is not None and plan.deployment.port is not None
    argv = export_deploy_argv(deployment, entry, port=plan.deployment.port)
    body = entry.describe() + f"\npasses: {' '.join(w for w in argv if w.startswith('--'))}"
    return plan, PreviewPanel(title="Export-Deploy entry point", body=body)
