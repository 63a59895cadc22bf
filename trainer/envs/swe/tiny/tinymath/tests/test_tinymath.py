import pytest
from tinymath import clamp, fizzbuzz, is_prime, mean, power, running_total


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_below_and_above():
    assert clamp(-3, 0, 10) == 0
    assert clamp(12, 0, 10) == 10


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_mean_of_nothing_fails():
    with pytest.raises(ValueError):
        mean([])


def test_fizzbuzz():
    assert [fizzbuzz(i) for i in (1, 3, 5, 15, 7)] == ["1", "Fizz", "Buzz", "FizzBuzz", "7"]


def test_running_total():
    assert running_total([1, 2, 3, 4]) == [1, 3, 6, 10]


def test_power():
    assert power(3, 5) == 243
    assert power(2, 0) == 1


def test_primes():
    assert [n for n in range(20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]
