"""pass@1[avg-of-k], majority@k and pass@k against values computed by hand."""

from __future__ import annotations

import math

import pytest

from ckpteval.tasks.passk import Sample, majority_vote, mode_names, pass_at_k, repeated_scores


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 0, 1, 0.0),  # nothing right: 0 for every k
        (5, 0, 5, 0.0),
        (5, 5, 1, 1.0),  # everything right: 1 for every k
        (5, 5, 3, 1.0),
        (5, 1, 5, 1.0),  # k = n: one right sample among all n is enough
        (5, 0, 5, 0.0),
        (5, 2, 1, 0.4),  # k = 1: c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (4, 3, 2, 1.0),  # n - c < k: every pair holds a right one
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
    ],
)
def test_unbiased_pass_at_k(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_majority_ties_go_to_the_smallest_answer_whatever_the_order() -> None:
    one = [Sample("b", 0.0), Sample("a", 1.0), Sample("b", 0.0), Sample("a", 1.0)]
    assert majority_vote(one) == Sample("a", 1.0)
    assert majority_vote(list(reversed(one))) == Sample("a", 1.0)


def test_majority_ignores_samples_without_an_answer() -> None:
    # two samples found no answer; the one answered sample decides
    assert majority_vote([Sample(None, 0.0), Sample(None, 0.0), Sample("7", 1.0)]) == Sample("7", 1.0)
    assert majority_vote([Sample(None, 0.0), Sample(None, 0.0)]) is None


def runs_from(problems: dict[str, list[tuple[str | None, float]]]) -> list[dict[str, Sample]]:
    k = len(next(iter(problems.values())))
    return [{p: Sample(*samples[i]) for p, samples in problems.items()} for i in range(k)]


def test_modes_of_four_runs_computed_by_hand() -> None:
    runs = runs_from(
        {
            # answers and scores of runs 0..3
            "A": [("18", 1.0), ("18", 1.0), ("12", 0.0), (None, 0.0)],  # majority 18 (right), 2 of 4 right
            "B": [("5", 1.0), ("7", 0.0), ("7", 0.0), ("7", 0.0)],  # majority 7 (wrong), 1 of 4 right
            "C": [(None, 0.0), (None, 0.0), ("3", 0.0), ("4", 0.0)],  # tie 3/4 -> "3", nothing right
        }
    )
    modes = repeated_scores(runs)
    assert list(modes) == ["pass@1[avg-of-4]", "majority@4", "pass@4"]
    # per problem means .5, .25, 0 -> 0.25; per run means 2/3, 1/3, 0, 0
    avg = modes["pass@1[avg-of-4]"]
    assert avg.value == pytest.approx(0.25)
    assert avg.n_problems == 3
    std = math.sqrt(((2 / 3 - 0.25) ** 2 + (1 / 3 - 0.25) ** 2 + 2 * 0.25**2) / 3)  # sample std of run means
    assert avg.std_dev == pytest.approx(std) == pytest.approx(0.3191423)
    assert avg.stderr == pytest.approx(std / 2)
    assert modes["majority@4"].value == pytest.approx(1 / 3)
    assert modes["pass@4"].value == pytest.approx(2 / 3)
    # per problem: majority 1, 0, 0 and pass@4 1, 1, 0; sample std sqrt(1/3) each, over sqrt(3) problems
    assert modes["majority@4"].stderr == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))
    assert modes["pass@4"].stderr == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))
    assert modes["majority@4"].std_dev is None and modes["pass@4"].std_dev is None


def test_identical_runs_have_no_spread_and_every_mode_equal() -> None:
    runs = runs_from({"A": [("1", 1.0)] * 3, "B": [("2", 0.0)] * 3})
    modes = repeated_scores(runs)
    assert {m.value for m in modes.values()} == {0.5}
    assert modes["pass@1[avg-of-3]"].std_dev == 0.0


def test_one_run_is_plain_pass_at_1() -> None:
    modes = repeated_scores(runs_from({"A": [("1", 1.0)], "B": [("2", 0.0)], "C": [(None, 0.0)]}))
    assert list(modes) == ["pass@1"] == list(mode_names(1))
    assert modes["pass@1"].value == pytest.approx(1 / 3)
    assert modes["pass@1"].std_dev is None
    assert modes["pass@1"].stderr == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))  # scores 1, 0, 0


def test_scores_that_are_not_0_or_1_take_the_best_of_k() -> None:
    modes = repeated_scores(runs_from({"A": [("x", 0.5), ("y", 0.2)], "B": [("z", 0.0), ("z", 0.0)]}))
    assert modes["pass@2"].value == pytest.approx((0.5 + 0.0) / 2)
    assert modes["pass@1[avg-of-2]"].value == pytest.approx((0.35 + 0.0) / 2)


def test_runs_over_different_problems_are_refused() -> None:
    with pytest.raises(ValueError, match="same problems"):
        repeated_scores([{"A": Sample("1", 1.0)}, {"B": Sample("1", 1.0)}])
