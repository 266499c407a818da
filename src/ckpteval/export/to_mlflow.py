"""Export an invocation to MLflow: one run per invocation with params, metrics, tags and the result files.

The run is found again by its tag `ckpteval.invocation`, so exporting the same invocation twice
updates that run: metrics whose latest value is already there are not logged again, params already
set are left alone (MLflow params cannot change), artifacts are rewritten in place.

The tracking URI comes from `export.mlflow.tracking_uri`, else `$MLFLOW_TRACKING_URI`; credentials
are MLflow's own (`MLFLOW_TRACKING_TOKEN`, `MLFLOW_TRACKING_USERNAME`/`PASSWORD` in the environment).
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from ckpteval.config.schema import MlflowExport
from ckpteval.errors import ExportError
from ckpteval.export.content import ExportContent, metric_values, sample_tables, usage_values
from ckpteval.export.context import Curves
from ckpteval.export.outcome import ExportOutcome

INVOCATION_TAG = "ckpteval.invocation"
WATCH_TAG = "ckpteval.watch"  # a watch run's curves: one run tagged with its name
CONNECT_TIMEOUT_S = 10.0
_PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value
_PARAM_KEY_LIMIT = 250
_BATCH = 100  # MLflow's limit on params per log_batch
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")


def tracking_uri(settings: MlflowExport, environ: Mapping[str, str] | None = None) -> str:
    """The tracking URI to use; ExportError when none is configured."""
    env = os.environ if environ is None else environ
    uri = settings.tracking_uri or env.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ExportError(
            "MLflow export is on but no tracking URI is set.",
            hint="Set export.mlflow.tracking_uri=http://HOST:5000 (or sqlite:///path/mlflow.db), "
            "or $MLFLOW_TRACKING_URI.",
        )
    return uri


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> `a.b.c: value` strings within MLflow's key and value limits."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, prefix=f"{name}."))
            continue
        text = "" if value is None else str(value)
        out[_KEY_UNSAFE.sub("_", name)[:_PARAM_KEY_LIMIT]] = text[:_PARAM_VALUE_LIMIT]
    return out


def _check_reachable(uri: str) -> None:
    """Fail fast when an HTTP tracking server does not answer: MLflow's own client retries for minutes."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ExportError(
            f"The MLflow tracking server {uri} cannot be reached: {exc.strerror or exc}.",
            hint="Check export.mlflow.tracking_uri and that the server runs; the results stay on disk: "
            "retry with `evaluate export INVOCATION --to mlflow`.",
        ) from None


def _chunks(items: list[Any], size: int = _BATCH) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def export_to_mlflow(content: ExportContent, settings: MlflowExport) -> ExportOutcome:
    """Create (or update) the invocation's MLflow run. Raises ExportError on failure."""
    uri = tracking_uri(settings)
    _check_reachable(uri)
    from mlflow.exceptions import MlflowException

    try:
        run_id = _write_run(content, settings, uri)
    except MlflowException as exc:
        raise ExportError(
            f"MLflow ({uri}) refused the export: {_first_line(exc)}",
            hint=f"Retry with `evaluate export {content.invocation} --to mlflow` once it is fixed.",
        ) from None
    return ExportOutcome(
        destination="mlflow",
        status="exported",
        message=f"MLflow run {run_id} in experiment '{settings.experiment_name}' at {uri}",
        locations=(run_id,),
    )


def _write_run(content: ExportContent, settings: MlflowExport, uri: str) -> str:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(settings.experiment_name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(settings.experiment_name)
    results = content.results
    tags = {
        INVOCATION_TAG: content.invocation,
        "ckpteval.status": results.status,
        "ckpteval.model": results.model or "",
        **{str(k): str(v) for k, v in settings.tags.items()},
    }
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{INVOCATION_TAG}` = '{content.invocation}'", max_results=1
    )
    if found:
        run = found[0]
    else:
        run = client.create_run(experiment_id, run_name=results.label or f"eval-{content.invocation}", tags=tags)
    run_id = run.info.run_id
    have_params = dict(run.data.params)
    have_metrics = dict(run.data.metrics)
    now = int(time.time() * 1000)
    from ckpteval.results.provenance import provenance_summary

    produced_by = {"ckpteval": {"provenance": provenance_summary(results.provenance)}}
    every = {**flat_params(content.config), **flat_params(produced_by)}
    params = [Param(k, v) for k, v in every.items() if k not in have_params]
    values = {**metric_values(results), **usage_values(results)}
    metrics = [Metric(k, v, now, 0) for k, v in values.items() if have_metrics.get(k) != v]
    run_tags = [RunTag(k, v) for k, v in tags.items()]
    for batch in _chunks(params):
        client.log_batch(run_id, params=batch)
    for batch in _chunks(metrics, 1000):
        client.log_batch(run_id, metrics=batch)
    client.log_batch(run_id, tags=run_tags)
    for name, path in sorted(content.files.items()):
        directory = name.rpartition("/")[0] or None
        client.log_artifact(run_id, str(path), artifact_path=directory)
    for task, table in sample_tables(content).items():  # per-sample scores, shown as a table by MLflow's UI
        columns = {c: [row[i] for row in table.rows] for i, c in enumerate(table.columns)}
        client.log_table(run_id, data=columns, artifact_file=f"samples/{task}.json")
    client.set_terminated(run_id, status="FINISHED" if results.status == "succeeded" else "FAILED")
    return str(run_id)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def write_curves(curves: Curves, settings: MlflowExport) -> str:
    """A watch run's points in MLflow: one run tagged `ckpteval.watch=<run>`, each metric at `step = iteration`."""
    uri = tracking_uri(settings)
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        name = settings.experiment_name
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        found = client.search_runs([experiment_id], filter_string=f"tags.`{WATCH_TAG}` = '{curves.run}'", max_results=1)
        run = found[0] if found else client.create_run(experiment_id, run_name=curves.run, tags={WATCH_TAG: curves.run})
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, iteration) for iteration, points in curves.points for k, v in points.items()]
        for i in range(0, len(metrics), 1000):
            client.log_batch(run.info.run_id, metrics=metrics[i : i + 1000])
    except MlflowException as exc:
        raise ExportError(f"MLflow ({uri}) refused the curves: {_first_line(exc)}") from None
    return f"MLflow run {run.info.run_id}: {len(curves.points)} iteration(s)"
