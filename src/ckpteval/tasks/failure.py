"""Why a task failed, read from its client log: one line for the user, the log's path, and a hint.

A task client's log is mostly noise when it fails (tracebacks, asyncio chatter, the proxy's per-request
lines). `explain_log` picks what the user needs, in this order: the offline-data hook's "no offline copy"
message; a judge whose replies failed past the threshold (`ckpteval_judge`); nemo-evaluator's interruption
marker; the endpoint's last error when the harness gave up on the endpoint after its retries (the proxy's
reason when lm-eval only saw the proxy's generic 500; the failed connection when lm-eval talked to the
endpoint directly and got no HTTP answer); a request timeout (with the setting that bounds it); else the
last exception line. It works on the log's text, so the
same function serves a local job dir and one read over SSH (`evaluate status` on a Slurm job).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ckpteval.tasks.harness_hook import ckpteval_offline_data as offline_data
from ckpteval.tasks.harness_hook.ckpteval_judge import FAILED_PREFIX as JUDGE_FAILED
from ckpteval.tasks.harness_hook.ckpteval_responses import IDENTITY_CHANGED

INTERRUPTED_MARKER = ".nemo_evaluator_interrupted"  # nemo-evaluator writes it into the output dir
LOG_TAIL_LINES = 12
REQUEST_TIMEOUT_SETTING = "evaluation.nemo_evaluator_config.config.params.request_timeout"


@dataclass(frozen=True)
class TaskFailure:
    """Why a task has no result: `reason` (one line), the client log it comes from, what to do if we know."""

    reason: str
    log: str
    hint: str | None = None


_API_ERROR = re.compile(r"API request failed with error message: (.*?)(?:\. Retrying\.\.\.)?\s*$")
# the interceptor proxy's view of a failed upstream call (connection refused, reset, ...)
_PROXY_ERROR = re.compile(r"Request interceptor EndpointInterceptor failed: (.*?)(?: logger=\S+.*)?$")
# exceptions with which lm-eval gives up on the endpoint (after tenacity's retries)
_ENDPOINT_EXCEPTIONS = ("ClientResponseError", "ClientConnectorError", "ServerDisconnectedError", "ClientOSError")
# of those, the ones where the connection itself failed (no HTTP answer)
_CONNECTION_EXCEPTIONS = ("ClientConnectorError", "ServerDisconnectedError", "ClientOSError")
_PROXY_GENERIC = "No adapter interceptor returned response"
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Timeout|Missing)\w*)(?::\s*(.*))?$")
_NOISE = ("Traceback (most recent call last)", "The above exception", "Task exception was never retrieved", "future: <")


def log_tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of `text` that say something (no tracebacks' frames or asyncio chatter)."""
    keep = [
        line
        for line in text.splitlines()
        if line.strip() and not line.startswith((" ", "\t")) and not any(n in line for n in _NOISE)
    ]
    return "\n".join(keep[-lines:])


def explain_log(text: str, *, log: str, interrupted: bool = False) -> TaskFailure:
    """Why the task whose client log is `text` (found at `log`) failed; `interrupted`: nemo-evaluator's marker."""
    lines = text.splitlines()
    for line in reversed(lines):
        if offline_data.MISSING_PREFIX in line:
            found = line[line.index(offline_data.MISSING_PREFIX) + len("ckpteval: ") :].strip()
            message, _, how_to = found.partition(offline_data.MISSING_HOW_TO)
            message = message.strip()
            return TaskFailure(
                message[0].upper() + message[1:], log, f"{offline_data.MISSING_HOW_TO}{how_to}" if how_to else None
            )
    for line in reversed(lines):
        if IDENTITY_CHANGED in line:
            found = line[line.index(IDENTITY_CHANGED) + len("ckpteval: ") :].strip()
            return TaskFailure(
                found[0].upper() + found[1:],
                log,
                "Another server took the deployment's port while the task ran; run the task again.",
            )
    for line in reversed(lines):
        if JUDGE_FAILED in line:
            found = line[line.index(JUDGE_FAILED) + len("ckpteval: ") :].strip()
            return TaskFailure(
                found[0].upper() + found[1:],
                log,
                "The judge's last replies are in the log. Check the judge (its model, its prompt limits), or "
                "raise judge.max_error_rate to accept more unscored judgments.",
            )
    if interrupted:
        return TaskFailure("The task was interrupted before it finished.", log)
    endpoint_errors = [
        (kind, m.group(1).strip())
        for line in lines
        for kind, pattern in (("harness", _API_ERROR), ("proxy", _PROXY_ERROR))
        if (m := pattern.search(line))
    ]
    exceptions = [m.group(0).strip() for line in lines if (m := _EXCEPTION.match(line.strip()))]
    gave_up_on_endpoint = any(any(name in e for name in _ENDPOINT_EXCEPTIONS) for e in exceptions)
    if endpoint_errors and gave_up_on_endpoint:
        kind, last = endpoint_errors[-1]
        proxy = [text for k, text in endpoint_errors if k == "proxy"]
        if kind == "harness" and _PROXY_GENERIC in last and proxy:
            last = proxy[-1]  # lm-eval saw the proxy's generic 500; the proxy logged why the call failed
        return TaskFailure(
            f"The endpoint kept failing and the harness gave up after its retries. Last endpoint error: {last[:500]}",
            log,
            "Check the deployment log; max_retries and request_timeout set how long the harness insists.",
        )
    connection = [e for e in exceptions if any(name in e for name in _CONNECTION_EXCEPTIONS)]
    if connection and not endpoint_errors:
        # lm-eval straight to the endpoint (no proxy): a connection that failed has no HTTP answer to log
        last = connection[-1].split(": ", 1)[-1]
        return TaskFailure(
            f"The endpoint stopped answering and the harness gave up after its retries. Last endpoint error: "
            f"{last[:500]}",
            log,
            "Check the deployment log (did the server exit?); max_retries and request_timeout set how long the "
            "harness insists.",
        )
    if exceptions:
        last = exceptions[-1]
        if last.split(":")[0].endswith("TimeoutError"):
            return TaskFailure(
                f"Requests to the endpoint timed out and the harness gave up after its retries ({last[:300]}).",
                log,
                f"One request took longer than request_timeout: raise {REQUEST_TIMEOUT_SETTING} "
                "for a slow endpoint, or lower parallelism.",
            )
        return TaskFailure(f"The task failed: {last[:500]}", log)
    if not lines:
        return TaskFailure(f"The task wrote no results and no log at {log}.", log)
    tail = log_tail(text, 1)
    return TaskFailure(f"The task wrote no results; its log ends: {tail[:300]}" if tail else "The task failed.", log)


def explain_failure(task_output_dir: str | Path, log_path: str | Path) -> TaskFailure:
    """Why the task in `task_output_dir` has no result, from its client log at `log_path`."""
    try:
        text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return explain_log(text, log=str(log_path), interrupted=(Path(task_output_dir) / INTERRUPTED_MARKER).exists())
