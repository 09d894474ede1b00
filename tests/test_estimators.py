"""pass@k, majority@k and the summary statistics, against hand-computed values and the combinatorial formula."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.profiling import estimators
from runtime.profiling.estimators import describe, ks, majority_at_k, majority_vote, pass_at_k, spread


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 1, 0.4),  # pass@1 is c/n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 4, 1.0),  # n - c = 3 < k = 4: every 4 of 5 holds a correct one
        (5, 4, 2, 1.0),  # n - c = 1 < k
        (8, 0, 1, 0.0),  # c = 0
        (8, 0, 8, 0.0),  # c = 0, k = n
        (8, 8, 1, 1.0),  # c = n
        (8, 8, 8, 1.0),  # c = n, k = n
        (8, 1, 8, 1.0),  # k = n with one correct
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    "n,c,k,message",
    [
        (4, 1, 0, "1 <= k <= n, got k=0, n=4"),
        (4, 1, 5, "1 <= k <= n, got k=5, n=4"),
        (4, 5, 1, "0 <= c <= n, got n=4, c=5"),
        (0, 0, 1, "n >= 1"),
        (4, -1, 1, "got n=4, c=-1"),
    ],
)
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        pass_at_k(n, c, k)


@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_the_combinatorial_formula(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-9)


@given(st.integers(2, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1), st.integers(1, n - 1))))
def test_pass_at_k_grows_with_k_and_c(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-12
    assert pass_at_k(n, c + 1, k) >= pass_at_k(n, c, k) - 1e-12


@pytest.mark.parametrize(
    "n,expected", [(0, []), (1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (16, [1, 2, 4, 8, 16])]
)
def test_ks_are_powers_of_two_and_n(n: int, expected: list[int]) -> None:
    assert ks(n) == expected


def test_majority_vote_ties_go_to_the_first_answer_and_none_abstains() -> None:
    assert majority_vote(["7", None, "8", "8", "7"]) == "7"
    assert majority_vote(["7", "8", "8"]) == "8"
    assert majority_vote([None, None]) is None


A, B = ("a", True), ("b", False)


@pytest.mark.parametrize(
    "votes,k,expected",
    [
        ([A, B, A, ("c", False)], 1, 0.5),  # k=1 is the pass rate
        ([A, B, A, ("c", False)], 4, 1.0),  # the vote over all: a wins 2-1-1
        ([A, A, B], 2, 2 / 3),  # {a,a} right; {a,b} twice, a tie split in half
        ([A, B], 2, 0.5),  # a tie
        ([B, B, A], 3, 0.0),  # the wrong answer wins
        ([(None, False), (None, False), A], 2, 2 / 3),  # {None,None} abstains: wrong
        ([(None, False)], 1, 0.0),
        ([("a", True), ("a", False)], 2, 0.5),  # an answer is right in the share of its rollouts that passed
    ],
)
def test_majority_at_k_hand_computed(votes: list, k: int, expected: float) -> None:
    assert majority_at_k(votes, k) == pytest.approx(expected)


@given(st.lists(st.tuples(st.sampled_from(["1", "2", "3", None]), st.booleans()), min_size=1, max_size=12))
def test_majority_at_1_is_the_pass_rate_when_answers_decide(raw: list[tuple[str | None, bool]]) -> None:
    votes = [(a, a == "1") for a, _ in raw]  # "1" is the right answer; passing follows the answer
    assert majority_at_k(votes, 1) == pytest.approx(sum(p for _, p in votes) / len(votes))


def test_majority_sampling_estimate_is_close_to_the_exact_value() -> None:
    sizes, right = [2, 5, 4, 3, 1, 1], [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    exact = estimators._exact(sizes, right, 6)
    assert estimators._sampled(sizes, right, 6) == pytest.approx(exact, abs=0.04)
    assert estimators._sampled(sizes, right, 6) == estimators._sampled(sizes, right, 6)  # reproducible


def test_majority_at_k_rejects_k_out_of_range() -> None:
    with pytest.raises(ValueError, match="1 <= k <= 2 votes, got k=3"):
        majority_at_k([A, B], 3)


def test_describe_and_spread() -> None:
    d = describe([1.0, 0.0, 1.0, 1.0])
    assert (d.count, d.mean, d.median, d.min, d.max) == (4, 0.75, 1.0, 0.0, 1.0)
    assert d.std == pytest.approx(math.sqrt(0.1875))
    assert describe([]).mean is None
    s = spread([float(v) for v in range(1, 101)])
    assert (s.p50, s.p90, s.p99, s.max) == pytest.approx((50.5, 90.1, 99.01, 100.0))
    assert spread([2.5]).p99 == 2.5 and spread([]).count == 0


def test_majority_at_k_of_tens_of_thousands_of_repeats() -> None:
    """The split weights outgrow a float (C(30000, 8192) has ~7,000 digits); a 1,000,000-rollout run of
    24 tasks (41,667 repeats each) ended its profile with OverflowError before they were divided exactly."""
    votes = [("1", True)] * 30_000 + [("2", False)] * 11_667
    assert majority_at_k(votes, 8192) == pytest.approx(1.0)
    assert majority_at_k(votes, 1) == pytest.approx(30_000 / 41_667)
    small = [("1", True)] * 3 + [("2", False)] * 2  # and the exact value is unchanged where it fit before
    assert majority_at_k(small, 3) == pytest.approx(float(Fraction(7, 10)))


@given(st.lists(st.integers(0, 6), min_size=1, max_size=4), st.integers(0, 12))
def test_splits_are_counted_as_the_walk_would_enumerate_them(sizes: list[int], k: int) -> None:
    brute = sum(1 for xs in itertools.product(*(range(m + 1) for m in sizes)) if sum(xs) == k)
    assert estimators._splits(sizes, k) == min(brute, estimators.EXACT_SPLITS + 1)


def test_majority_at_k_in_log_space_is_the_exact_fraction() -> None:
    """Past 1,000 samples the split weights are summed in log space; with few splits the value is still
    the exact one: 3 draws from 1,100 right and 100 wrong answers are right when 2 or 3 are."""
    votes = [("1", True)] * 1_100 + [("2", False)] * 100
    right = Fraction(math.comb(1_100, 3) + math.comb(1_100, 2) * 100, math.comb(1_200, 3))
    assert majority_at_k(votes, 3) == pytest.approx(float(right), rel=1e-9)


def test_majority_at_k_over_thousands_of_scattered_answers_is_sampled_close_to_the_vote() -> None:
    """A task with 4,800 repeats over three answers and abstentions (a 1,000,000-rollout run's shape): every
    k past the exact range is sampled, reproducibly, and the large k converge on the clear majority."""
    votes = [("1", True)] * 3_600 + [("2", False)] * 700 + [("3", False)] * 300 + [(None, False)] * 200
    values = {k: majority_at_k(votes, k) for k in estimators.ks(len(votes))}
    assert values[1] == pytest.approx(0.75)
    assert values[2] == pytest.approx(0.75**2 + 0.75 * 0.25 + 0.75 * (200 / 4_800), abs=0.01)
    assert all(values[k] == pytest.approx(1.0, abs=0.01) for k in (64, 1024, 4096, 4800))
    estimators._majority.cache_clear()
    assert majority_at_k(votes, 1024) == values[1024]  # the same inputs draw the same sample
