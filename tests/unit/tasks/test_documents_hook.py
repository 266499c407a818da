"""The harness hook's document count (`ckpteval_documents`) through lm-eval's own `CachingLM` and `Instance`s:
a document is done when the last of its requests is answered, by the model or from lm-eval's cache.

The model stands in for lm-eval's API model at the seam the hook patches (`TemplateAPI`'s request methods):
it answers through the cache hook, as the API model does (a real run against a served model:
tests/e2e/tasks/test_offline_tasks.py::test_hellaswag_on_smollm2)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM, CachingLM

from ckpteval.tasks.harness_hook import ckpteval_documents as documents
from ckpteval.tasks.progress import read_progress


class Model(LM):
    """Answers log-likelihood requests one by one through its cache hook; at a continuation named in `fail` it
    gives up, as a run whose endpoint died (what it answered before is in lm-eval's cache)."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.fail = fail
        self.asked: list[tuple[str, str]] = []

    def loglikelihood(self, requests):  # type: ignore[no-untyped-def]
        answers = []
        for request in sorted(requests, key=lambda r: -len(r.args[1])):  # lm-eval's order: not per document
            self.asked.append(request.args)
            if request.args[1] in self.fail:
                raise ConnectionError("the endpoint died")
            answer = (-float(len(request.args[1])), False)
            self.cache_hook.add_partial("loglikelihood", request.args, answer)
            answers.append(answer)
        return answers

    def loglikelihood_rolling(self, requests):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def generate_until(self, requests):  # type: ignore[no-untyped-def]
        raise NotImplementedError


# the hook patches the classes it is given: these, not lm-eval's own (other tests use those)
documents.patch_api_models(SimpleNamespace(TemplateAPI=Model))
Caching = type("Caching", (CachingLM,), {})
documents.patch_model(SimpleNamespace(CachingLM=Caching))


def _requests(docs: int, choices: int) -> list[Instance]:
    return [
        Instance("loglikelihood", {}, (f"question {d}?", f" choice {c}" + "!" * c), d * choices + c, ("hs", d, 1))
        for d in range(docs)
        for c in range(choices)
    ]


@pytest.fixture
def output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    out = tmp_path / "output"
    out.mkdir()
    monkeypatch.setenv(documents.OUTPUT_ENV, str(out))
    return out


def _run(output: Path, model: Model, requests: list[Instance], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(documents, "_counter", None)  # one harness process per run
    with contextlib.suppress(ConnectionError):
        Caching(model, str(output / "lm_cache" / "db")).loglikelihood(requests)
    return (output / documents.DOCS_FILE).read_text().strip()


def test_a_document_is_done_when_all_its_choices_are_answered(output: Path, monkeypatch: pytest.MonkeyPatch):
    # longest continuations first: every document's choices 3 and 2 are answered, none's 1 and 0
    assert _run(output, Model(fail=(" choice 1!",)), _requests(3, 4), monkeypatch) == "0 3"
    assert _run(output, Model(), _requests(3, 4), monkeypatch) == "3 3"
    assert read_progress(output).docs == 3 and read_progress(output).docs_total == 3


def test_answers_from_lm_evals_cache_complete_their_documents(output: Path, monkeypatch: pytest.MonkeyPatch):
    first = Model(fail=(" choice 0",))  # both documents' choice 1 answered, then the endpoint died
    assert _run(output, first, _requests(2, 2), monkeypatch) == "0 2"
    again = Model()
    assert _run(output, again, _requests(2, 2), monkeypatch) == "2 2"
    assert sorted(again.asked) == [("question 0?", " choice 0"), ("question 1?", " choice 0")]  # the rest: cached
    nothing_left = Model()
    assert _run(output, nothing_left, _requests(2, 2), monkeypatch) == "2 2"
    assert nothing_left.asked == []  # every answer from the cache; the model is not called at all


def test_without_the_job_asking_nothing_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(documents.OUTPUT_ENV, raising=False)
    monkeypatch.setattr(documents, "_counter", None)
    assert len(Caching(Model(), str(tmp_path / "db")).loglikelihood(_requests(1, 2))) == 2
    assert list(tmp_path.glob(f"**/{documents.DOCS_FILE}")) == []
