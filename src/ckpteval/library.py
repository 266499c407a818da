"""The library calls beyond running an invocation (`ckpteval.api`): compare, report, the task catalog,
packaged checkpoints, squashing images, staging datasets, serving, and watching a training run.

Each returns values and prints nothing; the CLI's commands call these and render what they return. Every
import of a ckpteval module sits in the function that needs it, for start-up speed: `import ckpteval`
and `evaluate --help` load none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.errors import ConfigError

if TYPE_CHECKING:
    from ckpteval.cluster.data_push import PushResult
    from ckpteval.cluster.remote import Remote
    from ckpteval.cluster.squash import SquashEvent, SquashPlan, SquashResult
    from ckpteval.config.profiles import Profile
    from ckpteval.delegate.service import DelegateSettings
    from ckpteval.hfexport.checked import CheckedExport
    from ckpteval.results.answers import DocumentAnswer, TaskFlips
    from ckpteval.results.compare import Comparison
    from ckpteval.server.serve import ServeOptions
    from ckpteval.tasks.data_cache import FetchResult
    from ckpteval.watch.hosted import HostedRef, HostedStatus, HostedSubmission, HostedWatch
    from ckpteval.watch.loop import WatchEvent
    from ckpteval.watch.run import DryRun, Health, StopResult, WatchOutcome
    from ckpteval.watch.state import WatchSpec, WatchState


# -- compare and report -------------------------------------------------------------------------------


def compare(
    invocations: Sequence[str],
    *,
    baseline: str | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    resamples: int = 10_000,
) -> Comparison:
    """Each candidate against the baseline (the first invocation, or `baseline`), per task and metric: the
    difference with its CI, a paired test on the documents both scored, Holm-corrected p, the minimum
    detectable effect and a verdict (docs/compare.md). `Comparison.regressions(max_drop)` lists the
    significant drops."""
    from ckpteval.api import invocation_samples
    from ckpteval.results.compare import compare as compare_samples

    refs = list(invocations)
    if baseline is not None:
        if baseline in refs:
            refs.remove(baseline)
        refs.insert(0, baseline)
    if len(refs) < 2:
        raise ConfigError(
            "compare needs at least two invocations: a baseline and a candidate.",
            hint="evaluate compare BASELINE CANDIDATE [CANDIDATE ...]",
        )
    if not 0 < alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1, not {alpha}.")
    if resamples < 100:
        raise ConfigError(f"--resamples must be at least 100, not {resamples}.")
    loaded = [invocation_samples(r) for r in refs]
    return compare_samples(loaded[0], loaded[1:], alpha=alpha, seed=seed, resamples=resamples)


def report(
    invocations: Sequence[str] = (),
    output: str | Path = "report.html",
    *,
    watch: Sequence[str] = (),
    png: str | Path | None = None,
    seed: int = 0,
) -> list[Path]:
    """Write one self-contained HTML report of `invocations` (scores, charts, each one's comparison with
    the first and the documents whose score changed) and of the `watch` runs' scores against iteration and
    their checkpoints' verdicts; with `png`, each chart also as
    <png>/<task>.png. Returns the files written, the report first."""
    from ckpteval.api import invocation_samples
    from ckpteval.invocation.record import now_iso, write_text_atomic
    from ckpteval.report.charts import bar_chart, watch_curves, write_png
    from ckpteval.report.html import render_report
    from ckpteval.results.answers import comparison_flips
    from ckpteval.results.compare import compare as compare_samples
    from ckpteval.watch.curves import curve_rows, plot_curves, score_columns
    from ckpteval.watch.state import find_run

    if not invocations and not watch:
        raise ConfigError(
            "Name the invocation(s) or watch run(s) to report.",
            hint="evaluate report ID [ID...] [--watch RUN] -o report.html; `evaluate status` lists invocations.",
        )
    output = Path(output)
    if output.is_dir():
        raise ConfigError(f"--output {output} is a directory.", hint="Give a file name, e.g. -o report.html.")
    loaded = [invocation_samples(i) for i in invocations]
    results = [x.results for x in loaded]
    comparison = compare_samples(loaded[0], loaded[1:], seed=seed) if len(loaded) > 1 else None
    flips = comparison_flips(loaded[0], loaded[1:]) if len(loaded) > 1 else []
    states = [find_run(run) for run in watch]
    curves_of = {s.run: watch_curves(s.run, curve_rows(s), score_columns(s)) for s in states}
    curves = [c for s in states for c in curves_of[s.run]]
    verdicts = [
        {"run": state.run, "iteration": i, "vs": vs, **row}
        for state in states
        for i, entry in sorted(state.iterations.items())
        for vs, rows in entry.verdicts.items()
        for row in rows
    ]
    output.parent.mkdir(parents=True, exist_ok=True)
    page = render_report(results, comparison, generated=now_iso(), curves=curves, verdicts=verdicts, flips=flips)
    write_text_atomic(output, page)
    written = [output]
    if png is not None:
        png = Path(png)
        for task in dict.fromkeys(t for r in results for t in r.tasks):
            chart = bar_chart(task, results)
            if chart is not None:
                written.append(write_png(chart, png / f"{task}.png"))
        written += [plot_curves(s, png / f"watch-{s.run}.png") for s in states if curves_of[s.run]]
    return written


@dataclass(frozen=True)
class InvocationAnswers:
    """An invocation's per-sample answers: its full id, and per task the documents' answers."""

    invocation: str
    tasks: dict[str, list[DocumentAnswer]]


def samples(
    invocation: str, *, task: str | None = None, right: bool | None = None, metric: str | None = None
) -> InvocationAnswers:
    """Each document's prompt, answer, target and score, per task (`task`: only that one) of an invocation
    that kept per-sample answers; `right=True/False`: only the documents scored above / at most 0.5 on
    `metric` (default: the task's first)."""
    from ckpteval.api import invocation_samples
    from ckpteval.results.answers import answer_tasks, document_answers, filter_answers

    loaded = invocation_samples(invocation)
    tasks = answer_tasks(loaded, task)
    if not tasks:
        raise ConfigError(f"Invocation {loaded.name} has no task with per-sample answers.")
    return InvocationAnswers(
        loaded.name, {t: filter_answers(document_answers(loaded, t, metric), right=right) for t in tasks}
    )


def sample_flips(invocation: str, other: str, *, task: str | None = None, metric: str | None = None) -> list[TaskFlips]:
    """Per task both invocations scored (`task`: only that one), the documents whose score changed from
    `invocation` to `other`, right → wrong first, with how many documents both scored."""
    from ckpteval.api import invocation_samples
    from ckpteval.results.answers import TaskFlips, answer_tasks, common_documents, flips, primary_metric

    baseline, candidate = invocation_samples(invocation), invocation_samples(other)
    tasks = [t for t in answer_tasks(baseline, task) if task is not None or t in candidate.samples]
    for t in tasks:
        answer_tasks(candidate, t)  # the other invocation must have it too: one clear message otherwise
    if not tasks:
        raise ConfigError(f"Invocations {baseline.name} and {candidate.name} have no task with answers in common.")
    out = []
    for t in tasks:
        changed = flips(baseline, candidate, t, metric)
        used = changed[0].baseline.metric if changed else (metric or primary_metric(baseline, t) or "")
        common = common_documents(baseline, candidate, t)
        out.append(TaskFlips(t, baseline.name, candidate.name, used, common, changed))
    return out


def export_inspect(invocation: str, out_dir: str | Path = "logs") -> dict[str, Path]:
    """Write an invocation as Inspect evaluation logs, one per task with per-sample answers, into `out_dir`
    (default `logs`, the directory `inspect view` opens): task -> the log written. Each sample has the
    prompt as input, the model's answer as output, the target and a score per metric; each log's results
    hold the task's metrics from results.json. Needs the `inspect` extra (inspect-ai); exporting again
    replaces the logs."""
    from ckpteval.api import invocation_samples
    from ckpteval.export.to_inspect import require_inspect_ai, write_inspect_logs

    require_inspect_ai()  # before a Slurm invocation's files are fetched for nothing
    loaded = invocation_samples(invocation)
    if not loaded.samples:
        raise ConfigError(f"Invocation {loaded.name} has no task with per-sample answers to export.")
    return write_inspect_logs(loaded, Path(out_dir))


# -- the task catalog and packaged checkpoints ----------------------------------------------------------


@dataclass(frozen=True)
class TaskInfo:
    """One task of the catalog, as `evaluate tasks` lists it."""

    name: str
    qualified_name: str
    harness: str
    endpoint_types: tuple[str, ...]
    needs_logprobs: bool
    offline_data: bool  # a packaged stand-in dataset lets it run with no hub
    runs_here: str  # "yes", or what this machine lacks to run it (`ckpteval.tasks.runnable.runs_here`)
    container: str
    description: str
    datasets: tuple[dict[str, Any], ...] | None = None  # with datasets=True; None: not known to ckpteval
    judge: str = ""  # "needs": scored by a judge model (set `judge=...`); "can use": takes one; "": none

    @property
    def summary(self) -> str:
        """The description's first sentence (the table's column; `--json` has all of it)."""
        text = self.description.removeprefix("- ").strip()
        end = text.find(". ")
        return text if end < 0 else text[: end + 1]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        data = {**self.__dict__, "endpoint_types": list(self.endpoint_types)}
        data["datasets"] = None if self.datasets is None else list(self.datasets)
        return data


def tasks(pattern: str | None = None, *, harness: str | None = None, datasets: bool = False) -> list[TaskInfo]:
    """The tasks `-t` accepts (those whose name contains `pattern`, of `harness`); with `datasets`, the
    datasets each loads (about a second: it reads lm-eval's task YAML)."""
    from ckpteval.tasks.catalog import load_catalog
    from ckpteval.tasks.datasets import task_data
    from ckpteval.tasks.offline_data import offline_source_key
    from ckpteval.tasks.runnable import runs_here

    def datasets_of(spec: Any) -> tuple[dict[str, Any], ...] | None:
        data = task_data(spec)
        if data.datasets is None:
            return None
        return tuple(
            {"path": r.path, "name": r.name, "revision": r.revision, "splits": list(r.splits)} for r in data.datasets
        )

    return [
        TaskInfo(
            name=t.name,
            qualified_name=t.qualified_name,
            harness=t.harness,
            endpoint_types=tuple(t.endpoint_types),
            needs_logprobs=t.needs_logprobs,
            offline_data=offline_source_key(t) is not None,
            runs_here=runs_here(t),
            container=t.container,
            description=t.description,
            datasets=datasets_of(t) if datasets else None,
            judge="" if t.judge is None else ("needs" if t.judge.required else "can use"),
        )
        for t in load_catalog().search(pattern, harness=harness)
    ]


def prepare(model: str, output: str | Path | None = None, *, force: bool = False) -> Path:
    """Write a packaged model (`smollm2`, `tiny`) as a Megatron checkpoint (torch_dist, args and tokenizer)
    into `output` (default: the cache); a finished one is reused unless `force`. Returns its directory."""
    from ckpteval.server.prepare import PACKAGED_MODELS, default_checkpoint_dir, prepare_checkpoint

    if model not in PACKAGED_MODELS:
        raise ConfigError(f"Unknown packaged model {model!r}.", hint=f"Choose one of: {', '.join(PACKAGED_MODELS)}.")
    target = Path(output) if output is not None else default_checkpoint_dir(model)
    return prepare_checkpoint(model, target, force=force)  # type: ignore[arg-type]


def export_hf(
    checkpoint: str | Path,
    output: str | Path,
    *,
    dtype: str = "checkpoint",
    tokenizer: str | None = None,
    force: bool = False,
    check: bool = True,
) -> CheckedExport:
    """Write a Megatron checkpoint as a Hugging Face directory (for vLLM, SGLang, transformers) and, unless
    `check` is false, prove it computes what the checkpoint computes (config, tensors, tokenizer, logits,
    greedy tokens); DeploymentError naming what differs. An export of the same checkpoint content already at
    `output` is reused. See docs/deploy.md, "vLLM and SGLang on a Megatron checkpoint"."""
    from ckpteval.hfexport.checked import export_checked

    return export_checked(checkpoint, output, dtype=dtype, tokenizer=tokenizer, force=force, check=check)


# -- the cluster: squashed images and staged datasets ------------------------------------------------------


def _cluster_profile(name: str, env_file: str | Path | None, what: str) -> Profile:
    from ckpteval.config.executors import cluster_executors, find_executor
    from ckpteval.config.profiles import load_env_file

    profile = load_env_file(Path(env_file) if env_file else None).profile(name)
    if not find_executor(profile.executor).on_cluster:
        choices = " or ".join(f'executor = "{name}"' for name in cluster_executors())
        raise ConfigError(
            f'Profile [{profile.name}] runs its jobs on this machine (executor = "{profile.executor}").',
            hint=f"{what} is for profiles whose jobs run on another machine; pick one with {choices}.",
        )
    return profile


def _squashed_profile(name: str, env_file: str | Path | None) -> Profile:
    """A profile whose job steps run in squashed images (a Slurm cluster's); ConfigError saying why otherwise."""
    from ckpteval.cluster.squash import squash_applies

    profile = _cluster_profile(name, env_file, "Squashing")
    if not squash_applies(profile):
        raise ConfigError(
            f'Profile [{profile.name}] (executor = "{profile.executor}") runs its job steps in the Python of its '
            "machine, with no container images: there is nothing to squash.",
            hint="Squashing is for Slurm profiles (enroot images); name one, or install what the job needs for "
            "the profile's `python` there.",
        )
    return profile


def _image_refs(images: Sequence[str]) -> list[Any]:
    from ckpteval.cluster.images import ImageRef, validate_image

    for image in images:
        validate_image(image)  # before connecting: a bad reference never reaches the cluster
    return [ImageRef(dotpath="command line", image=image) for image in images]


def squash_plan(
    images: Sequence[str], profile: str, *, check: bool = False, force: bool = False, env_file: str | Path | None = None
) -> SquashPlan:
    """Where each image's .sqsh goes on `profile`'s cluster and whether it is imported; with `check`, the
    cluster is asked (read-only) which files exist, else nothing is connected to."""
    from ckpteval.cluster.squash import containers_dir, plan_squash

    chosen = _squashed_profile(profile, env_file)
    containers_dir(chosen)  # remote_job_dir set and absolute, before connecting
    return plan_squash(_image_refs(images), chosen, check=check, force=force)


def squash(
    images: Sequence[str],
    profile: str,
    *,
    force: bool = False,
    env_file: str | Path | None = None,
    on_event: Callable[[SquashEvent], None] | None = None,
    on_connect: Callable[[Remote], None] | None = None,
) -> SquashResult:
    """Squash Docker images into `${remote_job_dir}/containers/` on `profile`'s cluster, as `run` does
    before it submits (`enroot import` on a compute node; an image already there costs one round trip)."""
    from ckpteval.cluster.connect import connect_remote
    from ckpteval.cluster.squash import containers_dir, ensure_squashed

    chosen = _squashed_profile(profile, env_file)
    containers_dir(chosen)
    refs = _image_refs(images)
    with connect_remote(chosen) as remote:
        if on_connect is not None:
            on_connect(remote)
        return ensure_squashed(refs, chosen, remote=remote, force=force, on_event=on_event or (lambda _e: None))


def fetch_data(
    configs: Sequence[str] = (),
    tasks: Sequence[str] = (),
    *,
    cache: str | Path | None = None,
    env_file: str | Path | None = None,
    on_note: Callable[[str], None] | None = None,
    on_progress: Callable[[Any, str], None] | None = None,
) -> FetchResult:
    """Fetch the datasets of the tasks of `configs` / `tasks` into the local cache (where a hub is reachable)."""
    from ckpteval.config.data_select import datasets_of
    from ckpteval.tasks.data_cache import fetch_datasets

    refs, notes = datasets_of(list(configs), list(tasks), env_file=_path(env_file))
    for note in notes:
        (on_note or (lambda _n: None))(note)
    return fetch_datasets(refs, _path(cache), on_progress=on_progress)


def push_data(
    profile: str,
    configs: Sequence[str] = (),
    tasks: Sequence[str] = (),
    *,
    cache: str | Path | None = None,
    env_file: str | Path | None = None,
    on_connect: Callable[[Remote], None] | None = None,
) -> PushResult:
    """Put the fetched datasets (all, or those of `configs` / `tasks`) into `${remote_job_dir}/datasets` on
    `profile`'s cluster; only what is missing there is sent."""
    from ckpteval.cluster.connect import connect_remote
    from ckpteval.cluster.data_push import datasets_dir, push_datasets
    from ckpteval.config.data_select import datasets_of
    from ckpteval.tasks.data_cache import cached_datasets, default_cache_dir, is_cached

    chosen = _cluster_profile(profile, env_file, "Staging datasets")
    remote_root = datasets_dir(chosen)  # remote_job_dir set and absolute, before connecting
    root = _path(cache) or default_cache_dir()
    if configs or tasks:
        refs, _ = datasets_of(list(configs), list(tasks), env_file=_path(env_file))
        missing = [ref for ref in refs if not is_cached(root, ref)]
        if missing:
            raise ConfigError(
                f"{len(missing)} of these datasets are not fetched yet (first: {missing[0].key}).",
                hint="Fetch them first: evaluate data fetch "
                + " ".join([*(f"-c {c}" for c in configs), *(f"-t {t}" for t in tasks)]),
            )
    else:
        refs = cached_datasets(root)
    with connect_remote(chosen) as remote:
        if on_connect is not None:
            on_connect(remote)
        return push_datasets(remote, remote_root, refs, root)


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None


# -- serving ------------------------------------------------------------------------------------------------


def serve(options: ServeOptions) -> None:
    """Serve a Megatron checkpoint with megatron-core (OpenAI-compatible routes) until interrupted."""
    from ckpteval.server.serve import serve as serve_checkpoint

    serve_checkpoint(options)


def serve_delegate(settings: DelegateSettings, *, host: str = "0.0.0.0", port: int = 9050) -> None:
    """Serve the eval-delegate (GET /health, POST /evaluate) for a training loop until interrupted. Its judge
    (from its overrides) is checked first; the env.toml found where it starts is the one every evaluation reads."""
    import dataclasses

    from ckpteval.config.profiles import find_env_file
    from ckpteval.delegate.server import serve as serve_service
    from ckpteval.delegate.service import ROUTES, judge_summary

    if settings.endpoint_type not in ROUTES:
        raise ConfigError(f"--endpoint-type must be completions or chat, not {settings.endpoint_type!r}.")
    if settings.env_file is None:  # each evaluation compiles in its rollout dir: find env.toml from here
        settings = dataclasses.replace(settings, env_file=find_env_file())
    serve_service(settings, host=host, port=port, judge=judge_summary(settings))


# -- watching a training run ----------------------------------------------------------------------------------


def watch(
    spec: WatchSpec,
    *,
    once: bool = False,
    on_event: Callable[[WatchEvent], None] | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> WatchOutcome:
    """Evaluate each checkpoint saved under `spec.save_dir` as it becomes complete, until `watch_stop` or
    SIGTERM asks it to stop (with `once`: what is there now, then return). One process per watch run (a
    second is refused); starting the same spec again goes on where it stopped. `on_start` gets the watcher
    once it holds the run (its `state`). Returns what was evaluated, given up on and left unfinished."""
    from ckpteval.watch.run import watch as run_watch

    return run_watch(spec, once=once, on_event=on_event or (lambda _e: None), on_start=on_start or (lambda _w: None))


def watch_dry_run(spec: WatchSpec) -> DryRun:
    """What `watch` would do now: the checkpoints there, which it would evaluate, and the first one's job preview."""
    from ckpteval.watch.run import dry_run

    return dry_run(spec)


def watch_stop(run: str, *, timeout: float = 60.0, cancel: bool = False) -> StopResult:
    """Ask a watch run's process to stop after its current step and wait up to `timeout` seconds for it to
    exit; with `cancel`, also cancel its evaluations in flight and wait for them to end. The result says
    whether all of it happened in time, in words too. A run whose watcher lives on the cluster is stopped
    there, over SSH (its Slurm job ends); `cancel` is not offered for it (ConfigError)."""
    from ckpteval.watch.hosted import find_hosted, stop_hosted
    from ckpteval.watch.run import StopResult, request_stop

    hosted = find_hosted(run)
    if hosted is not None:
        if cancel:
            raise ConfigError(
                f"Watch run {hosted.run} lives on the cluster: stopping it with --cancel is not supported there. "
                f"Stop it with `evaluate watch stop {hosted.run}`, then cancel its evaluations with "
                "`evaluate cancel ID` (their ids: `evaluate watch status` on the cluster)."
            )
        message, stopped = stop_hosted(hosted, timeout=timeout)
        return StopResult(message, stopped)

    return request_stop(run, timeout=timeout, cancel=cancel)


def watch_detach(spec: WatchSpec) -> HostedSubmission:
    """Put the watcher of `spec` on its Slurm cluster as a self-chaining CPU-only job (docs/watch.md,
    "A watcher on the cluster"); returns its first job. `watch_status`/`watch_stop` reach it over SSH."""
    from ckpteval.watch.hosted import submit_hosted

    return submit_hosted(spec)


def watch_detach_dry_run(spec: WatchSpec) -> HostedWatch:
    """The cluster-hosted watcher `watch_detach` would submit (its sbatch script and files); contacts nothing."""
    from ckpteval.watch.hosted import plan_hosted

    return plan_hosted(spec)


def watch_hosted(run: str) -> HostedRef | None:
    """The cluster-hosted watch run named `run` (an id or a prefix) submitted from here, or None."""
    from ckpteval.watch.hosted import find_hosted

    return find_hosted(run)


def watch_hosted_runs() -> list[str]:
    """The watch runs whose watcher was put on a cluster from here (`--detach`), by name."""
    from ckpteval.watch.hosted import hosted_runs

    return hosted_runs()


def watch_hosted_status(ref: HostedRef) -> HostedStatus:
    """A cluster-hosted run's state and its watcher's Slurm jobs, read over SSH."""
    from ckpteval.watch.hosted import hosted_status

    return hosted_status(ref)


@dataclass(frozen=True)
class WatchRun:
    """A recorded watch run and its watcher's health (alive, polls, evaluations in flight, errors)."""

    state: WatchState
    health: Health

    @property
    def watching(self) -> bool:
        return self.health.alive

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping: the run's state, `watching` and `health`."""
        import dataclasses

        from ckpteval.watch.state import state_to_json

        return {**state_to_json(self.state), "watching": self.watching, "health": dataclasses.asdict(self.health)}


def watch_runs(run: str | None = None) -> list[WatchRun]:
    """The recorded watch runs (or the one named `run`, an id or a prefix), each with its watcher's health."""
    from ckpteval.watch.run import health
    from ckpteval.watch.state import find_run, list_runs

    states = [find_run(run)] if run else list_runs()
    return [WatchRun(s, health(s)) for s in states]


@dataclass(frozen=True)
class WatchCurves:
    """A watch run's scores against iteration: `columns` (task/metric keys), one row per iteration
    (`iteration`, `state`, `invocation`, `scores`: key -> (value, stderr)), and the plot, if drawn."""

    state: WatchState
    columns: list[str]
    rows: list[dict[str, Any]]
    plot: Path | None


def watch_curves(run: str, *, draw: bool = True, plot: str | Path | None = None) -> WatchCurves:
    """A watch run's scores against iteration; with `draw`, when it has scores, the curves are also drawn
    into `plot` (default: curves.png in the run's directory)."""
    from ckpteval.watch.curves import curve_rows, plot_curves, score_columns
    from ckpteval.watch.state import find_run, watch_dir

    state = find_run(run)
    columns = score_columns(state)
    drawn = None
    if draw and columns:
        drawn = plot_curves(state, Path(plot) if plot is not None else watch_dir() / state.run / "curves.png")
    return WatchCurves(state, columns, curve_rows(state), drawn)
