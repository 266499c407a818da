"""`python -m ckpteval.export --job-dir DIR ...`: the export step a cluster job runs after its tasks.

It reads the job's saved config (`config.yaml`) for what to export where, takes the results from
`results.json` (collecting them from the task directories, and saving results.json, when the job
has not written it), reads the W&B key from the owner-only key file given at submission, and
exports. Exit 0 when every destination exported or was skipped, 1 when one failed, 2 on bad input.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.errors import CkptevalError

if TYPE_CHECKING:
    from ckpteval.results.model import InvocationResults


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ckpteval.export", description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True, type=Path, help="the invocation's job directory")
    parser.add_argument("--invocation", help="the invocation id (default: from results.json or job.yaml)")
    parser.add_argument("--to", action="append", choices=("wandb", "mlflow"), help="destination (default: config)")
    parser.add_argument("--wandb-key-file", type=Path, help="owner-only file holding the W&B key")
    parser.add_argument("--wandb-mode", choices=("online", "offline", "disabled"), help="overrides $WANDB_MODE")
    parser.add_argument("--wandb-base-url", help="overrides $WANDB_BASE_URL")
    parser.add_argument("--task", action="append", default=[], metavar="NAME=DIR", help="a task and its directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the export step; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except CkptevalError as exc:
        print(f"[ckpteval] export: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"[ckpteval] {exc.hint}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from ckpteval.export.content import read_saved_config
    from ckpteval.export.credentials import read_key_file
    from ckpteval.export.invocation import export_invocation, export_section
    from ckpteval.invocation.jobdir import JobDir

    job_dir: Path = args.job_dir.resolve()
    config = read_saved_config(job_dir / JobDir.CONFIG)
    tasks = _task_pairs(args.task)
    results = _results(job_dir, config, tasks, invocation=args.invocation)
    environ = dict(os.environ)  # a copy: the flags apply to this export, not to the process
    if args.wandb_mode:
        environ["WANDB_MODE"] = args.wandb_mode
    if args.wandb_base_url:
        environ["WANDB_BASE_URL"] = args.wandb_base_url
    key = None
    if args.wandb_key_file is not None and args.wandb_key_file.exists():
        key = read_key_file(args.wandb_key_file)
    outcomes = export_invocation(
        results,
        job_dir,
        export_section(config),
        destinations=args.to,
        task_dirs=dict(tasks),
        key=key,
        environ=environ,
        report=_print_outcome,
    )
    return 0 if all(o.ok for o in outcomes) else 1


def _print_outcome(outcome: object) -> None:
    """One line per destination in the job's log: exported, export skipped or export failed (plus the hint)."""
    from ckpteval.export.outcome import ExportOutcome

    if not isinstance(outcome, ExportOutcome):
        return
    label = {"exported": "exported", "skipped": "export skipped", "failed": "export failed"}[outcome.status]
    print(f"{label}: {outcome.message}", file=sys.stderr, flush=True)
    if outcome.hint:
        print(outcome.hint, file=sys.stderr, flush=True)


def _task_pairs(values: Sequence[str]) -> list[tuple[str, str]]:
    from ckpteval.errors import ConfigError

    pairs = []
    for value in values:
        name, sep, directory = value.partition("=")
        if not sep or not name or not directory:
            raise ConfigError(f"--task {value!r}: expected NAME=DIR (DIR relative to the job dir, like tasks/mmlu).")
        pairs.append((name, directory))
    return pairs


def _results(
    job_dir: Path, config: dict[str, Any], tasks: list[tuple[str, str]], *, invocation: str | None
) -> InvocationResults:
    """results.json when the job wrote it; otherwise collected from the task dirs now, and saved."""
    from ckpteval.errors import ConfigError
    from ckpteval.invocation.jobdir import JobDir
    from ckpteval.invocation.record import now_iso
    from ckpteval.results.collect import collect_results
    from ckpteval.results.store import read_results, write_results

    path = job_dir / JobDir.RESULTS
    if path.exists():
        return read_results(path)
    if not tasks:
        raise ConfigError(f"{path} does not exist and no --task NAME=DIR was given to collect results from.")
    provenance = _provenance(job_dir)
    invocation = invocation or provenance.get("invocation") or job_dir.name
    _record_allocation(job_dir)
    deployment = config.get("deployment") or {}
    results = collect_results(
        job_dir,
        tasks,
        invocation=str(invocation),
        created=str(provenance.get("created") or now_iso()),
        model=deployment.get("checkpoint_path"),
        label=(config.get("run") or {}).get("name"),
    )
    write_results(job_dir, results)
    return results


def _record_allocation(job_dir: Path) -> None:
    """Inside a Slurm job: the scheduler's accounting of its allocation so far (sacct), for the GPU-hours of the
    results exported now (`results.usage`); collected again, whole, once the job has ended."""
    import json
    import os

    from ckpteval.cluster.remote import LocalRemote
    from ckpteval.cluster.slurm import job_allocation
    from ckpteval.results.usage import ALLOCATION_FILE

    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return
    allocation = job_allocation(LocalRemote(), job_id)
    if allocation is not None:
        (job_dir / ALLOCATION_FILE).write_text(json.dumps(allocation, indent=2) + "\n", encoding="utf-8")


def _provenance(job_dir: Path) -> dict[str, Any]:
    """job.yaml (invocation id, creation time), or {} when it cannot be read."""
    import yaml

    from ckpteval.invocation.jobdir import JobDir

    try:
        data = yaml.safe_load((job_dir / JobDir.PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


if __name__ == "__main__":
    sys.exit(main())
