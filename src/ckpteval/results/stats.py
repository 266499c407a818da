"""The statistics of a paired comparison (see docs/compare.md for the formulas and when each is used).

Two invocations scored the same documents; per document we have the baseline's score a_i and the
candidate's b_i, and the paired difference d_i = b_i - a_i.

- `mcnemar_exact`: for 0/1 scores, the exact (binomial) McNemar test on the discordant pairs;
- `permutation_p`: for other scores, the paired (sign-flip) permutation test of the mean difference;
- `bootstrap_ci`: the percentile confidence interval of the mean difference from resampled documents;
- `minimum_detectable_effect`: the smallest true difference the test finds with the given power;
- `holm`: Holm's step-down adjustment of several p-values (family-wise error rate).

Resampling uses numpy's PCG64 generator with a fixed seed, so a comparison is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

DEFAULT_SEED = 0
DEFAULT_RESAMPLES = 10_000
_CHUNK = 500  # resamples drawn at once (bounds memory at _CHUNK * n indices)
_FEW_VALUES = 256  # up to this many distinct differences, the bootstrap draws counts, not indices


def is_binary(values: Sequence[float]) -> bool:
    """Whether every score is 0 or 1."""
    return all(v in (0.0, 1.0) for v in values)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts: b pairs where only the baseline is right,
    c where only the candidate is. Under no difference, b ~ Binomial(b + c, 1/2):
    p = min(1, 2 * P(X <= min(b, c))); 1 when there is no discordant pair."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def bootstrap_ci(
    diffs: Sequence[float], *, level: float = 0.95, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean paired difference.

    A resample draws n documents with replacement, resample after resample from one generator
    `numpy.random.default_rng(seed)`. With few distinct differences (at most 256; 0/1 scores have three)
    only how often each is drawn matters to the mean, so resample r draws those counts at once:
    `multinomial(n, counts / n)` over the sorted distinct differences (`numpy.unique`), the same
    distribution as drawing n indices and far faster; otherwise it draws the indices,
    `integers(0, n, size=n)`. The interval is the (1-level)/2 and (1+level)/2 quantiles of the
    `resamples` means (numpy's default linear interpolation).
    """
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n == 0:
        raise ValueError("no paired samples")
    values, counts = np.unique(d, return_counts=True)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, _CHUNK):
        size = min(_CHUNK, resamples - start)
        if len(values) <= _FEW_VALUES:
            means[start : start + size] = rng.multinomial(n, counts / n, size=size) @ values / n
        else:
            means[start : start + size] = d[rng.integers(0, n, size=(size, n))].mean(axis=1)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


def permutation_p(diffs: Sequence[float], *, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> float:
    """Two-sided paired permutation (sign-flip) test of the mean difference.

    Under no difference each d_i is as likely as -d_i: flip each sign with probability 1/2
    (`rng.integers(0, 2, size=n)`, resample after resample) and count the resamples whose |mean| reaches
    the observed one: p = (1 + count) / (1 + resamples).
    """
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n == 0:
        raise ValueError("no paired samples")
    observed = abs(d.mean())
    if not d.any():
        return 1.0
    rng = np.random.default_rng(seed)
    count = 0
    for start in range(0, resamples, _CHUNK):
        size = min(_CHUNK, resamples - start)
        signs = rng.integers(0, 2, size=(size, n)) * 2 - 1
        means = np.abs((signs * d).mean(axis=1))
        count += int((means >= observed - 1e-12).sum())
    return (1 + count) / (1 + resamples)


def minimum_detectable_effect(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest true mean difference a two-sided test at `alpha` detects with probability `power`
    from n paired documents whose differences have standard deviation `sd` (normal approximation):
    (z_{1-alpha/2} + z_{power}) * sd / sqrt(n). None when n < 2 or sd is 0."""
    if n < 2 or not sd > 0:
        return None
    z = NormalDist()
    return (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sd / math.sqrt(n)


def sample_sd(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1 in the denominator); 0 for fewer than two values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sort ascending, p_(i) * (m - i + 1)
    (i from 1), made non-decreasing, capped at 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
