"""The layout of a job directory: every file name the job script writes and the readers look for.

```
<job_dir>/
  config.yaml                 the compiled config (secrets redacted)
  job.yaml                    provenance: command line, profile, config files, versions, time
  job.sh                      the job script
  hook/                       the harness's offline-data hook (Slurm: uploaded beside the job)
  .secrets/                   owner-only files the job reads (the W&B key of a detached export)
  state/{started,deployment,ended,finished,slurm_job}   started/ended: UTC times the job script wrote
  state/deployment_port, state/deployment_identity, state/served_checkpoint.json   the model's server's
  state/<role>{,_port,_identity,_served_checkpoint.json}, logs/<role>.log   another role's (judge: state/judge)
  state/requests              how the tasks' requests go: side by side, or in groups (and why)
  state/request_probe.json    the request-settings probe's verdict and what it saw; state/turn-<g>: group g may send
  state/hf_export.json        vLLM/SGLang on a Megatron checkpoint: what its export step did
  hf_export                   ... and the link to the export the engine serves
  logs/{job.log,deployment.log,request_probe.log,export.log}
  tasks/<task>/run_config.yml nemo-evaluator's run config (a repeated task: run_config-rs<i>.yml)
  tasks/<task>/repeats        a repeated task only: its number of samples per problem
  tasks/<task>/{state,.done,client.log,output/}   (a repeated task: client-rs<i>.log, output-rs<i>/{...,.done})
  results.json                written when the job's results are collected
```

`JobDir(root)` joins these names to a root: a local path (`path`) or a POSIX path on the cluster (`join`).
The per-run names inside a task directory (`output/`, `client.log`, ...) are `ckpteval.tasks.repeats.RunLayout`'s.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from ckpteval.tasks.repeats import DONE_MARKER, REPEATS_FILE, run_layouts


@dataclass(frozen=True)
class JobDir:
    """A job directory at `root` (on this machine, or on the cluster)."""

    root: str

    CONFIG = "config.yaml"
    PROVENANCE = "job.yaml"
    SCRIPT = "job.sh"
    RESULTS = "results.json"  # the invocation's collected results (not the harness's results.yml)
    HOOK = "hook"
    SECRETS = ".secrets"
    STATE = "state"
    STARTED = "state/started"
    DEPLOYMENT_STATE = "state/deployment"
    DEPLOYMENT_PORT = "state/deployment_port"  # the port the builtin server holds, written by it
    DEPLOYMENT_MOVED = "state/deployment_moved"  # the job's words when that is not the port planned (taken)
    DEPLOYMENT_IDENTITY = "state/deployment_identity"  # the identity the job verified its endpoint reports
    SERVED_CHECKPOINT = "state/served_checkpoint.json"  # what the builtin server loaded (server.loaded)
    # vLLM/SGLang on a Megatron checkpoint: the directory the engine serves (a link into the export cache),
    # what the export step did (`ckpteval.hfexport.cache.CachedExport`) and its log
    HF_EXPORT = "hf_export"
    HF_EXPORT_REPORT = "state/hf_export.json"
    EXPORT_LOG = "logs/export.log"
    FINISHED = "state/finished"  # the job's exit code
    ENDED = "state/ended"  # when the job ended (UTC, ISO 8601), written just before FINISHED
    SLURM_JOB = "state/slurm_job"
    REQUESTS = "state/requests"
    REQUEST_PROBE = "state/request_probe.json"
    LOGS = "logs"
    JOB_LOG = "logs/job.log"
    DEPLOYMENT_LOG = "logs/deployment.log"
    REQUEST_PROBE_LOG = "logs/request_probe.log"
    TASKS = "tasks"
    TOKENIZER = "tokenizer"  # the tokenizer the builtin server serves with, published for the task clients
    SAMPLES = "samples.jsonl"  # in each task dir: its normalized per-sample scores (ckpteval.results.samples)
    # files written before the job starts that the invocation's record keeps a copy of
    RECORDED = (CONFIG, PROVENANCE)

    def join(self, rel: str) -> str:
        """`rel` under the root, as a POSIX path (the cluster's)."""
        return posixpath.join(self.root, rel)

    def path(self, rel: str = "") -> Path:
        """`rel` under the root, as a local path."""
        return Path(self.root) / rel if rel else Path(self.root)

    # Each deployment's files, by its role's stem (`ckpteval.job.roles`): the model's stem is "deployment",
    # so its names are the ones above, which every earlier job wrote.
    @staticmethod
    def deployment_state(stem: str) -> str:
        return f"{JobDir.STATE}/{stem}"

    @staticmethod
    def deployment_port(stem: str) -> str:
        return f"{JobDir.STATE}/{stem}_port"

    @staticmethod
    def deployment_identity(stem: str) -> str:
        return f"{JobDir.STATE}/{stem}_identity"

    @staticmethod
    def deployment_log(stem: str) -> str:
        return f"{JobDir.LOGS}/{stem}.log"

    @staticmethod
    def served_checkpoint(stem: str) -> str:
        return JobDir.SERVED_CHECKPOINT if stem == "deployment" else f"{JobDir.STATE}/{stem}_served_checkpoint.json"

    @staticmethod
    def task(dir_name: str) -> str:
        """A task's directory (relative): `tasks/<dir_name>`."""
        return f"{JobDir.TASKS}/{dir_name}"

    @staticmethod
    def turn(group: int) -> str:
        """The file that opens group `group`'s turn to send requests (1-based)."""
        return f"{JobDir.STATE}/turn-{group}"

    @staticmethod
    def task_state(task_dir: str) -> str:
        return f"{task_dir}/state"

    @staticmethod
    def task_done(task_dir: str) -> str:
        return f"{task_dir}/{DONE_MARKER}"

    @staticmethod
    def task_repeats(task_dir: str) -> str:
        return f"{task_dir}/{REPEATS_FILE}"

    @staticmethod
    def task_logs(task_dir: str, repeats: int) -> list[str]:
        """The client log of each run of a task (one for a greedy task), in run order."""
        return [f"{task_dir}/{layout.log}" for layout in run_layouts(repeats)]

    @staticmethod
    def state_dirs(tasks: list[tuple[str, str, int]]) -> list[str]:
        """The directories whose small files make up a snapshot: state/, each task dir and its outputs.

        `tasks` are (name, task dir, repeats)."""
        dirs = [JobDir.STATE]
        for _name, task_dir, repeats in tasks:
            dirs += [task_dir, *(f"{task_dir}/{layout.output}" for layout in run_layouts(repeats))]
        return dirs
