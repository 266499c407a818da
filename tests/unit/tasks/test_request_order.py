"""The harness hook sends the requests that share a prefix together (the server's prefix cache then computes
the prefix once), and lm-eval gets the same answers in its own order. Real lm-eval
(`TemplateAPI._loglikelihood_tokens` and `generate_until`), started as the job starts it (the hook directory
first on PYTHONPATH), with the HTTP call replaced by a recorder that answers each prompt with a value derived
from it; and the hook's order on MMLU-shaped requests, through lm-eval's own `Collator`."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys

from lm_eval.models.utils import Collator

from ckpteval.tasks.client import hook_dir
from ckpteval.tasks.harness_hook.ckpteval_request_order import by_prefix

SCRIPT = """
import json, sys
from lm_eval.models.openai_completions import LocalCompletionsAPI

sent = []

class Recorder(LocalCompletionsAPI):  # what nemo-evaluator's lm-eval tasks run (local-completions)
    def model_call(self, messages, generate=False, **kwargs):
        if generate:
            sent.extend(messages)
            return [m.upper() for m in messages]
        sent.extend(list(m) for m in messages)
        return [sum(m) for m in messages]

    def parse_generations(self, outputs, **kwargs):
        return list(outputs)

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
api.tokenized_requests = False  # nemo-evaluator's setting: prompts go as text
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

class Request:  # an lm-eval Instance as generate_until reads it
    def __init__(self, prompt):
        self.args = (prompt, {"until": ["\\n"], "max_gen_toks": 2})

# MMLU's items: two subjects' 5-shot prefixes, questions of different lengths
prompts = ["shots B: a long question?", "shots A: q?", "shots B: q?", "shots A: a longer question?"]
for name, function in (("hooked", Recorder.generate_until), ("plain", Recorder.generate_until.__wrapped__)):
    api._batch_size = 1
    sent.clear()
    answers = function(api, [Request(p) for p in prompts], disable_tqdm=True)
    out[f"{name} generate"] = {"sent": list(sent), "answers": answers}
print(json.dumps(out))
"""


def run(pythonpath: str) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_requests_of_one_prefix_go_together_and_the_answers_keep_lm_evals_order() -> None:
    out = run(hook_dir())  # one process (lm-eval's import takes long): the hook's function and lm-eval's own
    assert out["hooked"], "the hook did not patch lm-eval's API models"
    assert out["plain 1"]["sent"] == [1, 2, 3, 2, 1]  # lm-eval alone: longest first, the two items' choices apart
    assert out["hooked 1"]["sent"] == [1, 1, 2, 2, 3]  # in the tokens' order: each context's requests together
    assert out["plain 1"]["answers"] == out["hooked 1"]["answers"] == out["expected"]
    # generation (MMLU's `adlr_mmlu`): lm-eval sends the longest prompt first, the two subjects interleaved;
    # the hook sends each subject's items together, and lm-eval gets each prompt's answer in its order
    prompts = ["shots B: a long question?", "shots A: q?", "shots B: q?", "shots A: a longer question?"]
    assert out["plain generate"]["sent"] == [prompts[3], prompts[0], prompts[1], prompts[2]]
    assert out["hooked generate"]["sent"] == sorted(prompts)
    assert out["hooked generate"]["answers"] == out["plain generate"]["answers"] == [p.upper() for p in prompts]
    # with several prompts per request body, the order decides which share one (and its response-cache key):
    # lm-eval's own order is kept
    assert out["hooked 2"]["sent"] == out["plain 2"]["sent"] and out["hooked 2"]["answers"] == out["expected"]


def mmlu_like_requests() -> list[tuple[tuple[str, str], list[int], list[int]]]:
    """(cache key, context, continuation) as lm-eval builds them: per subject a 5-shot prefix, per item a
    question of its own length, four one-token choices; shuffled as the harness gathers tasks."""
    rng = random.Random(45)
    requests = []
    for subject in range(6):
        shots = [1000 + subject] + [rng.randrange(2, 900) for _ in range(rng.randrange(40, 80))]
        for item in range(4):
            question = [rng.randrange(2, 900) for _ in range(rng.randrange(5, 60))]
            for choice in range(4):
                context = shots + question
                requests.append(((f"s{subject}", f"{item}-{choice}"), context, [950 + choice]))
    rng.shuffle(requests)
    return requests


def runs(order: list[tuple[tuple[str, str], list[int], list[int]]], key) -> int:
    """How many runs of equal `key` the order makes (one per key when every group is sent together)."""
    keys = [key(r) for r in order]
    return 1 + sum(a != b for a, b in itertools.pairwise(keys))


def test_each_few_shot_prefix_and_each_items_choices_are_sent_in_one_run() -> None:
    requests = mmlu_like_requests()
    sent = [req for batch in Collator(requests, sort_fn=by_prefix).get_batched(n=1) for req in batch]
    assert sorted(map(str, sent)) == sorted(map(str, requests))
    # one run per subject (its 5 shots computed once, then reused by its every item), one per item
    assert runs(sent, lambda r: r[0][0]) == 6
    assert runs(sent, lambda r: (r[0][0], r[0][1].split("-")[0])) == 24
    # lm-eval's own order (longest first) spreads both apart: what the hook replaces
    longest_first = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
    default = [req for batch in longest_first.get_batched(n=1) for req in batch]
    assert runs(default, lambda r: r[0][0]) > 12


def test_answers_go_back_in_the_harness_order() -> None:
    requests = mmlu_like_requests()
    collator = Collator(requests, sort_fn=by_prefix)
    answers = [(req[0], len(req[1])) for batch in collator.get_batched(n=1) for req in batch]
    assert collator.get_original(answers) == [(req[0], len(req[1])) for req in requests]
