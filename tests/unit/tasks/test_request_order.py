"""The harness hook sends the log-likelihood requests of one context together (the server's prefix cache
then computes the context once), and lm-eval gets the same answers in its own order. Real lm-eval
(`TemplateAPI._loglikelihood_tokens`), started as the job starts it (the hook directory first on PYTHONPATH),
with the HTTP call replaced by a recorder that answers each prompt with a value derived from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ckpteval.tasks.client import hook_dir

SCRIPT = """
import json, sys
from lm_eval.models.openai_completions import LocalCompletionsAPI

sent = []

class Recorder(LocalCompletionsAPI):  # what nemo-evaluator's lm-eval tasks run (local-completions)
    def model_call(self, messages, **kwargs):
        sent.extend(list(m) for m in messages)
        return [sum(m) for m in messages]

    def parse_logprobs(self, outputs, tokens, ctxlens, **kwargs):
        return [(-float(o), False) for o in outputs]

class Hook:
    def add_partial(self, *args):
        pass

api = object.__new__(Recorder)
api.tokenizer = object()
api.max_length = 10_000
api._concurrent = 1
api.max_retries = 1
api.cache_hook = Hook()
# two items of two choices (contexts 1 and 2) and an item of one (context 3); lengths interleave them
contexts = {1: [1] * 10, 2: [2] * 11, 3: [3] * 3}
requests = [
    (("a", 1), contexts[1], [7] * 9),
    (("b", 1), contexts[1], [8]),
    (("c", 2), contexts[2], [9] * 5),
    (("d", 2), contexts[2], [5] * 2),
    (("e", 3), contexts[3], [6] * 12),
]
patched = Recorder._loglikelihood_tokens
# the hook's function keeps lm-eval's as __wrapped__: lm-eval's own order, in the same process
plain = getattr(patched, "__wrapped__", None)
out = {"hooked": hasattr(patched, "__wrapped__")}
for name, function in (("hooked", patched), ("plain", plain or patched)):
    for batch_size in (1, 2):
        api._batch_size = batch_size
        sent.clear()
        answers = function(api, requests)
        out[f"{name} {batch_size}"] = {"sent": [m[0] for m in sent], "answers": [a[0] for a in answers]}
out["expected"] = [-float(sum(c + x)) for _, c, x in requests]
print(json.dumps(out))
"""


def run(pythonpath: str) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_requests_of_one_context_go_together_and_the_answers_keep_lm_evals_order() -> None:
    out = run(hook_dir())  # one process (lm-eval's import takes long): the hook's function and lm-eval's own
    assert out["hooked"], "the hook did not patch lm-eval's API models"
    assert out["plain 1"]["sent"] == [1, 2, 3, 2, 1]  # lm-eval alone: longest first, the two items' choices apart
    assert out["hooked 1"]["sent"] == [2, 2, 1, 1, 3]  # grouped by context, longest context first
    assert out["plain 1"]["answers"] == out["hooked 1"]["answers"] == out["expected"]
    # with several prompts per request body, the order decides which share one (and its response-cache key):
    # lm-eval's own order is kept
    assert out["hooked 2"]["sent"] == out["plain 2"]["sent"] and out["hooked 2"]["answers"] == out["expected"]
