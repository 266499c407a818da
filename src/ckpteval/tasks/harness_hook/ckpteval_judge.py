"""Judge-scored tasks in the task client: MT-Bench's result read whatever its judge is called, and its
judge failures counted, never scored silently.

nvidia-mtbench-evaluator 26.3 writes `<judge>-result.json` for any judge but gpt-4, and its own output
parser (`core_evals.mtbench.output.parse_output`) looks only for `result.json`: every other judge's run
ends in "Failed to find `result.json`". Its judgments (`judgements/<judge>_single.jsonl`) score a reply it
could not read (no `[[rating]]` after its retries) -1, and its summary leaves them out of the average.

The patched parser reads the judge's own result and counts the judge errors (judgments that hold no rating
after the harness's retries) into `judge_errors.json` beside the harness output, whether the task then
scores or not: ckpteval's results, table, `status` and exports read them from there. Past
CKPTEVAL_JUDGE_MAX_ERROR_RATE (a fraction) the task fails, with the judge's last replies in its log.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from types import ModuleType
from typing import Any

MAX_ERROR_RATE_ENV = "CKPTEVAL_JUDGE_MAX_ERROR_RATE"
# a judge the job deployed beside the model (ckpteval.job.build spells these too): the identity it was given,
# its base URL on the port it published, and how long to wait for it to load
JUDGE_IDENTITY_ENV = "CKPTEVAL_JUDGE_IDENTITY"
JUDGE_URL_ENV = "CKPTEVAL_JUDGE_URL"
JUDGE_WAIT_ENV = "CKPTEVAL_JUDGE_WAIT_S"
# where it reports that identity: "health" (the builtin server's /v1/health names it) or "models" (vLLM lists
# it as a second served model name in /v1/models); whether it names the deployment on every answer ("1")
JUDGE_IDENTITY_ROUTE_ENV = "CKPTEVAL_JUDGE_IDENTITY_ROUTE"
JUDGE_ANSWERS_NAMED_ENV = "CKPTEVAL_JUDGE_ANSWERS_NAMED"
DEPLOYMENT_HEADER = "x-ckpteval-deployment"  # ckpteval.server.identity's
JUDGE_CHANGED_EXIT = 3
LAST_REPLIES = 3
JUDGE_ERRORS_FILE = "judge_errors.json"  # {"errors": n, "judgments": m, "max_error_rate": x}, in the output dir
FAILED_PREFIX = "ckpteval: judge errors"  # how the failure's message starts (tasks/failure.py looks for it)


class JudgeFailures(RuntimeError):
    """Too many of the judge's replies failed or could not be read for the task's score to stand."""


def _judgments(output_dir: pathlib.Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(output_dir.rglob("judgements/*_single.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def check_judgments(rows: list[dict[str, Any]], max_error_rate: float) -> tuple[int, int]:
    """(errors, judgments) of MT-Bench's judgments; raises JudgeFailures past `max_error_rate`."""
    errors = [r for r in rows if r.get("score") == -1]
    if rows and len(errors) / len(rows) > max_error_rate:
        last = "\n".join(f"  judge reply: {str(r.get('judgment') or '(none)')[:300]!r}" for r in errors[-LAST_REPLIES:])
        raise JudgeFailures(
            f"{FAILED_PREFIX} {len(errors)} of {len(rows)}: more than {max_error_rate:.0%} of the judge's replies "
            f"failed or held no rating; the task is not scored. Its last unreadable replies:\n{last}"
        )
    return len(errors), len(rows)


def write_judge_errors(output_dir: pathlib.Path, errors: int, judgments: int, max_error_rate: float) -> None:
    """Record the task's judge errors beside its harness output (read by `ckpteval.results.collect`)."""
    tally = {"errors": errors, "judgments": judgments, "max_error_rate": max_error_rate}
    (output_dir / JUDGE_ERRORS_FILE).write_text(json.dumps(tally) + "\n", encoding="utf-8")


def patch_mtbench_output(module: ModuleType) -> None:
    """Wrap `parse_output` of `core_evals.mtbench.output` (see the module docstring)."""
    real = module.parse_output
    if getattr(real, "__ckpteval_patched__", False):
        return

    def parse_output(output_dir: str) -> Any:
        root = pathlib.Path(output_dir)
        own = list(root.rglob("**/result.json"))
        named = [p for p in root.rglob("*-result.json") if p.name != "result.json"]
        if not own and len(named) == 1:
            (named[0].parent / "result.json").write_text(named[0].read_text(encoding="utf-8"), encoding="utf-8")
        rate = float(os.environ.get(MAX_ERROR_RATE_ENV) or 0.05)
        rows = _judgments(root)
        write_judge_errors(root, sum(r.get("score") == -1 for r in rows), len(rows), rate)
        check_judgments(rows, rate)
        return real(output_dir)

    parse_output.__ckpteval_patched__ = True  # type: ignore[attr-defined]
    parse_output.__wrapped__ = real  # type: ignore[attr-defined]
    module.parse_output = parse_output  # type: ignore[attr-defined]


def judge_identity_problem(url: str, model_id: str, api_key: str | None, timeout: float = 30) -> str | None:
    """Why the judge at `url` (an OpenAI base, `.../v1`) is not the one named (None: it lists `model_id` among
    its `/v1/models`): checked by the task before its harness sends the judge anything."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url.rstrip("/") + "/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            listed = [str(m.get("id")) for m in (json.loads(response.read() or b"{}").get("data") or [])]
    except urllib.error.HTTPError as exc:
        return f"the judge at {url} answered {exc.code} to GET /models"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"the judge at {url} did not answer GET /models ({getattr(exc, 'reason', exc)})"
    if model_id not in listed:
        return f"the judge at {url} does not serve {model_id} (it lists: {', '.join(listed) or 'nothing'})"
    return None


def deployed_judge_problem(
    url: str, identity: str, wait_s: float, poll_s: float = 1.0, route: str = "health"
) -> str | None:
    """Why the judge the job deployed at `url` (`.../v1`) is not ready as this job's judge (None: it answers,
    naming `identity`: in its /v1/health, or, `route` "models", among its /v1/models), after waiting up to
    `wait_s` for it to load."""
    import time
    import urllib.error
    import urllib.request

    base = url.rstrip("/").rsplit("/v1", 1)[0]
    asked = base + ("/v1/models" if route == "models" else "/v1/health")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with opener.open(asked, timeout=10) as response:
                body = json.loads(response.read() or b"{}")
            break
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if time.monotonic() >= deadline:
                return (
                    f"the judge at {url} did not become healthy within {wait_s:.0f} s ({getattr(exc, 'reason', exc)})"
                )
            time.sleep(poll_s)
    if route == "models":
        listed = [str(m.get("id")) for m in (body.get("data") or [])] if isinstance(body, dict) else []
        if identity not in listed:
            return (
                f"the judge at {url} does not list this job's judge {identity} among its models "
                f"({', '.join(listed) or 'none'}): another server answers on its port"
            )
        return None
    reported = body.get("deployment") if isinstance(body, dict) else None
    if reported != identity:
        return (
            f"the judge at {url} reports deployment {reported or '(none)'}, not this job's judge {identity}: "
            "another server answers on its port"
        )
    return None


def patch_judge_client(module: ModuleType) -> None:
    """MT-Bench's OpenAI client (`fastchat.clients.openai`, which answers the model and judges its answers):
    every answer from the judge the job deployed (a request to CKPTEVAL_JUDGE_URL) must name its identity in
    its `x-ckpteval-deployment` header, as every task client checks the model's answers (`ckpteval_responses`);
    another server on the judge's port stops the task at once. Nothing to check without a deployed judge, or
    for one that does not name its answers (vLLM: its identity was checked in its /v1/models before the task)."""
    if os.environ.get(JUDGE_ANSWERS_NAMED_ENV, "1") != "1":
        return
    identity = os.environ.get(JUDGE_IDENTITY_ENV, "").strip()
    base = os.environ.get(JUDGE_URL_ENV, "").strip().rstrip("/")
    real = getattr(module, "OpenAI", None)
    if not identity or not base or real is None or getattr(real, "__ckpteval_patched__", False):
        return
    try:  # the client openai makes by default (its timeouts, limits, redirects), with our check
        from openai import DefaultHttpxClient as http_client_class
    except ImportError:
        from httpx import Client as http_client_class

    def check(response: Any) -> None:
        if not str(response.request.url).startswith(base):
            return
        named = response.headers.get(DEPLOYMENT_HEADER)
        if named != identity:
            print(
                f"ckpteval: the judge changed mid-task: an answer at {response.request.url} came from deployment "
                f"{named or '(none named)'}, not this job's judge {identity}. The task is stopped; none of its "
                "judgments is scored.",
                file=sys.stderr,
                flush=True,
            )
            os._exit(JUDGE_CHANGED_EXIT)

    def client(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("http_client", http_client_class(event_hooks={"response": [check]}))
        return real(*args, **kwargs)

    client.__ckpteval_patched__ = True  # type: ignore[attr-defined]
    module.OpenAI = client  # type: ignore[attr-defined]


def main(argv: list[str]) -> int:
    """`python ckpteval_judge.py check URL MODEL_ID [KEY_VARIABLE]`: exit 0 when the judge is the one named
    (and, for a judge the job deployed, CKPTEVAL_JUDGE_IDENTITY set, once it is healthy with that identity)."""
    if len(argv) < 3 or argv[0] != "check":
        print("usage: ckpteval_judge.py check URL MODEL_ID [KEY_VARIABLE]", file=sys.stderr)
        return 2
    key = os.environ.get(argv[3]) if len(argv) > 3 else None
    identity = os.environ.get(JUDGE_IDENTITY_ENV, "").strip()
    problem = None
    if identity:
        wait_s = float(os.environ.get(JUDGE_WAIT_ENV) or 600)
        route = os.environ.get(JUDGE_IDENTITY_ROUTE_ENV) or "health"
        problem = deployed_judge_problem(argv[1], identity, wait_s, route=route)
    problem = problem or judge_identity_problem(argv[1], argv[2], key)
    if problem:
        print(f"ckpteval: {problem}; no request was sent to it", file=sys.stderr)
        return 1
    print(f"ckpteval: judge {argv[2]} at {argv[1]} verified" + (f" (identity {identity})" if identity else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
