"""Export-Deploy's Ray Serve deployment of a Megatron checkpoint: which entry point an image has, and its command.

Export-Deploy (NVIDIA-NeMo/Export-Deploy, at `/opt/Export-Deploy` in the NeMo container) has shipped two
entry points for Megatron checkpoints; which one an image holds depends on its release (checked: v0.1.1,
v0.2.1, v0.3.1, v0.4.0, v0.5.0, v0.6.0 and main of 2026-07):
- `scripts/deploy/llm/mlm/deploy_ray.py` (0.4+): `--megatron_checkpoint`, `--num_gpus` (all of the
  deployment's GPUs), TP/PP/EP/CP sizes, `--num_layers_in_first/last_pipeline_stage`, `--max_batch_size`,
  `--micro_batch_size`, `--enable_cuda_graphs`, `--enable_flash_decode`, `--num_replicas`, `--model_type` ...
- `scripts/deploy/nlp/deploy_ray_inframework.py`: in 0.1 NeMo-2 checkpoints only (`--nemo_checkpoint`,
  required; `--num_gpus` per node with `--num_nodes`, no batch settings); 0.2-0.3 take either
  `--nemo_checkpoint` or `--megatron_checkpoint`; 0.4+ `--megatron_checkpoint` only.

An `EntryPoint` says which script and which flags; it comes from a probe of the image on the cluster
(`ckpteval.cluster.export_deploy_probe`), from that probe's cache, or — unprobed — the 0.4+ layout.
`export_deploy_command` builds the command for it and refuses, before anything is queued, a setting the
image's script cannot take.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from ckpteval.config.schema import MegatronDeployment
from ckpteval.errors import ConfigError

EXPORT_DEPLOY_ROOT = "/opt/Export-Deploy"
MLM_SCRIPT = "scripts/deploy/llm/mlm/deploy_ray.py"
NLP_SCRIPT = "scripts/deploy/nlp/deploy_ray_inframework.py"
CANDIDATES = (MLM_SCRIPT, NLP_SCRIPT)  # preferred first
RAY_PORT = 6379
# one `ray start`, bounded: 2 minutes, then SIGKILL 10 s after its SIGTERM (coreutils, in every image)
RAY_ATTEMPT = "timeout -k 10 120"
CHECKED_RELEASES = "Export-Deploy v0.1.1, v0.2.1, v0.3.1, v0.4.0, v0.5.0, v0.6.0, main (2026-07)"

# `scripts/deploy/llm/mlm/deploy_ray.py` as of Export-Deploy 0.5-0.6 (0.4 lacks --batch_wait_timeout_s)
MLM_FLAGS = frozenset(
    {
        "--megatron_checkpoint",
        "--num_gpus",
        "--tensor_model_parallel_size",
        "--pipeline_model_parallel_size",
        "--num_layers_in_first_pipeline_stage",
        "--num_layers_in_last_pipeline_stage",
        "--expert_model_parallel_size",
        "--context_parallel_size",
        "--account_for_embedding_in_pipeline_split",
        "--account_for_loss_in_pipeline_split",
        "--model_id",
        "--host",
        "--port",
        "--num_cpus",
        "--num_cpus_per_replica",
        "--include_dashboard",
        "--cuda_visible_devices",
        "--enable_cuda_graphs",
        "--enable_flash_decode",
        "--num_replicas",
        "--legacy_ckpt",
        "--max_batch_size",
        "--random_seed",
        "--model_type",
        "--micro_batch_size",
        "--batch_wait_timeout_s",
    }
)

Source = Literal["default", "probe", "cache"]


@dataclass(frozen=True)
class EntryPoint:
    """An Export-Deploy script in an image and the flags it accepts (`required`: those it cannot run without)."""

    script: str  # absolute path inside the image
    flags: frozenset[str]
    required: frozenset[str] = frozenset()
    source: Source = "default"
    where: str = ""  # the cache file (probe, cache), or why the default was used

    def to_json(self) -> str:
        """The cache file's content."""
        data = {"script": self.script, "flags": sorted(self.flags), "required": sorted(self.required)}
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: Source, where: str) -> EntryPoint:
        """Read a cache file (ValueError if it is not one)."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("script"), str):
            raise ValueError("not an Export-Deploy entry point record")
        return cls(
            script=data["script"],
            flags=frozenset(data.get("flags") or ()),
            required=frozenset(data.get("required") or ()),
            source=source,
            where=where,
        )

    def describe(self) -> str:
        """One paragraph for the dry run: the script, the flags, where that knowledge came from."""
        origin = {
            "default": f"default (not probed: {self.where})" if self.where else "default (not probed)",
            "probe": f"probed now, cached in {self.where}",
            "cache": f"cached probe {self.where}",
        }[self.source]
        return f"{self.script}\nknown from: {origin}\naccepts: {' '.join(sorted(self.flags))}"


DEFAULT_ENTRY_POINT = EntryPoint(
    script=f"{EXPORT_DEPLOY_ROOT}/{MLM_SCRIPT}",
    flags=MLM_FLAGS,
    where="the Export-Deploy 0.4-0.6 layout; `--dry-run --check` or a real run probes the image",
)


def mixes_settings(entry: EntryPoint) -> str:
    """Why `entry` answers concurrent requests with one request's settings ('' when it is not known to).

    Export-Deploy 0.5+ batches concurrent requests (Ray Serve's `serve.batch`, PR #629) and applies the first
    request's settings to the whole batch (`nemo_deploy/llm/megatronllm_deployable_ray.py`, v0.5.0 to main);
    0.1-0.4 answer each request alone. Of the entry point's flags, `--batch_wait_timeout_s` came with it."""
    if "--batch_wait_timeout_s" not in entry.flags:
        return ""
    return (
        f"{entry.script.rsplit('/', 1)[-1]} takes --batch_wait_timeout_s (Export-Deploy 0.5+), which batches "
        "concurrent requests and applies the first one's max_tokens, temperature, top_k, top_p, logprobs, echo "
        "and stop words to the whole batch"
    )


def parse_help(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(every long flag, the required ones) from an argparse `--help` output.

    Required options are those the usage line shows outside `[...]`.
    """
    flags = frozenset(re.findall(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*", text))
    usage = text.split("usage:", 1)[1] if "usage:" in text else ""
    usage = usage.split("\n\n", 1)[0]
    previous = None
    while previous != usage:  # drop bracketed groups, innermost first
        previous = usage
        usage = re.sub(r"\[[^\[\]]*\]", " ", usage)
    required = frozenset(re.findall(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*", usage)) & flags
    return flags, required


def replicas(deployment: MegatronDeployment) -> int:
    """`num_replicas`, or as many model copies as fit: num_gpus / (TP×PP×CP×EP)."""
    if deployment.num_replicas is not None:
        return deployment.num_replicas
    per_replica = (
        deployment.tensor_model_parallel_size
        * deployment.pipeline_model_parallel_size
        * deployment.context_parallel_size
        * deployment.expert_model_parallel_size
    )
    return max(1, deployment.num_gpus // per_replica)


@dataclass
class _Argv:
    entry: EntryPoint
    argv: list[str] = field(default_factory=list)

    def add(self, flag: str, value: Any, *, setting: str | None = "", optional: bool = False) -> None:
        """`flag value` (`flag` alone for True) if the script takes `flag`; else, unless `optional`, an error
        naming `setting` (default: `deployment.<flag name>`)."""
        if flag not in self.entry.flags:
            if optional:
                return
            raise _unsupported(self.entry, flag, setting or f"deployment.{flag[2:]}")
        if value is True:
            self.argv.append(flag)
        elif value is not False:
            self.argv += [flag, str(value)]


def _unsupported(entry: EntryPoint, flag: str, setting: str) -> ConfigError:
    return ConfigError(
        f"{setting} needs Export-Deploy's {flag}, which {entry.script} in this image does not take "
        f"(known from {entry.source}).",
        hint="Use a newer NeMo container (Export-Deploy 0.4+: scripts/deploy/llm/mlm/deploy_ray.py), "
        f"or leave {setting} at its default.",
    )


def export_deploy_argv(deployment: MegatronDeployment, entry: EntryPoint, *, port: int) -> list[str]:
    """The entry point's command line for `deployment` (ConfigError for a setting the script cannot take)."""
    if "--megatron_checkpoint" not in entry.flags:
        raise ConfigError(
            f"{entry.script} in image {deployment.image} serves NeMo-2 checkpoints only (--nemo_checkpoint); "
            "it cannot load a Megatron checkpoint.",
            hint="Use a NeMo container with Export-Deploy 0.2 or newer, or convert the checkpoint.",
        )
    d = deployment
    args = _Argv(entry, ["python", entry.script])
    args.add("--megatron_checkpoint", d.checkpoint_path, setting="deployment.checkpoint_path")
    args.add("--model_id", d.served_model_name, setting="deployment.served_model_name")
    args.add("--host", "0.0.0.0", setting="deployment.port")
    args.add("--port", port)
    if "--num_nodes" in entry.flags:  # 0.1: GPUs per node, and the nodes
        args.add("--num_gpus", d.num_gpus // d.num_nodes)
        args.add("--num_nodes", d.num_nodes)
    else:  # 0.2+: all of the deployment's GPUs (divided among the replicas)
        args.add("--num_gpus", d.num_gpus)
    args.add("--tensor_model_parallel_size", d.tensor_model_parallel_size)
    args.add("--pipeline_model_parallel_size", d.pipeline_model_parallel_size)
    args.add("--expert_model_parallel_size", d.expert_model_parallel_size)
    if d.context_parallel_size != 1:
        args.add("--context_parallel_size", d.context_parallel_size)
    args.add("--num_replicas", replicas(d))
    # speed settings: passed where the script takes them; an explicit one it cannot take is an error
    args.add("--max_batch_size", d.max_batch_size, optional=True)
    for flag, value in (
        ("--micro_batch_size", d.micro_batch_size),
        ("--enable_cuda_graphs", d.enable_cuda_graphs),
        ("--enable_flash_decode", d.enable_flash_decode),
        ("--num_layers_in_first_pipeline_stage", d.num_layers_in_first_pipeline_stage),
        ("--num_layers_in_last_pipeline_stage", d.num_layers_in_last_pipeline_stage),
    ):
        if value is not None and value is not False:
            args.add(flag, value)
    if d.model_type != "gpt":
        args.add("--model_type", d.model_type)
    missing = sorted(entry.required - set(args.argv))
    if missing:
        raise ConfigError(
            f"{entry.script} in image {d.image} requires {', '.join(missing)}, which ckpteval does not "
            "pass for a Megatron checkpoint.",
            hint="Use a NeMo container with Export-Deploy 0.4 or newer (scripts/deploy/llm/mlm/deploy_ray.py).",
        )
    return args.argv


def export_deploy_command(deployment: MegatronDeployment, entry: EntryPoint, *, port: int) -> str:
    """The deployment step's shell command: the entry point, and on several nodes the Ray cluster around it.

    On several nodes the script joins a Ray cluster (`address="auto"`): rank 0 starts the Ray head, then
    the script; the other ranks join the head (`$PRIMARY_NODE`, exported by the job script), retrying
    while it starts, and wait. Every rank stops its Ray node when the step ends (`ray stop`), whatever
    ended it. No `exec`: the shell stays to do that.
    """
    serve = shlex.join(export_deploy_argv(deployment, entry, port=port))
    if deployment.extra_args:
        serve += f" {deployment.extra_args}"
    nodes = deployment.num_nodes
    if nodes <= 1:
        return f"exec {serve}"
    per_node = max(1, deployment.num_gpus // nodes)
    ray = f"--num-gpus={per_node} --disable-usage-stats"
    if deployment.ray_start_args:
        ray += f" {deployment.ray_start_args}"
    head = f"$PRIMARY_NODE:{RAY_PORT}"
    return (
        # on every way out, at once (Slurm's SIGKILL follows its SIGTERM soon): whatever this rank started
        # (Ray's daemons leave the process tree, where Slurm's proctrack/linuxproc would look, but stay in
        # this session), then `ray stop` for anything that left the session too
        "stop_ray() { trap '' TERM INT; "
        'for p in $(pgrep -s 0 2>/dev/null); do [ "$p" = $$ ] || kill -KILL "$p" 2>/dev/null; done; '
        "ray stop --force >/dev/null 2>&1; }; "
        "trap stop_ray EXIT; trap 'exit 143' TERM INT; n=0; "
        'if [ "${SLURM_PROCID:-0}" = 0 ]; then '
        # a busy node can fail `ray start` (its raylet gives the dashboard agent 15 s to start, then aborts)
        # or leave it waiting on a raylet that is gone: each attempt is bounded, then tried again, a few times
        f"until {RAY_ATTEMPT} ray start --head --port={RAY_PORT} {ray} --include-dashboard=false; do "
        '[ "$((n += 1))" -lt 5 ] || { echo "ckpteval: the Ray head did not start on $(hostname) in 5 attempts '
        "(ray's own words above)\" >&2; exit 1; }; "
        "ray stop --force >/dev/null 2>&1; sleep 5; done; "
        f"{serve} & wait $!; "
        # a worker joins the head (retrying while it starts; `--port` belongs to the head alone) and stays
        # while its raylet lives: when the head goes, so does the raylet, and the worker's rank ends
        f'else until {RAY_ATTEMPT} ray start --address="{head}" {ray}; do '
        '[ "$((n += 1))" -lt 60 ] || { echo "ckpteval: this node ($(hostname)) could not join the Ray head at '
        f'{head} in 60 attempts" >&2; exit 1; }}; sleep 5; done; '
        "while pgrep -s 0 -f ray/raylet >/dev/null; do sleep 5; done; fi"
    )
