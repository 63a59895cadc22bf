"""Small number helpers."""


def clamp(x, low, high):
    """Limit ``x`` to the closed interval [low, high]."""
    if x < low:
        return low
    if x > high:
        return high
    return x


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def fizzbuzz(n):
    """The FizzBuzz word for ``n``."""
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)


def running_total(values):
    """Prefix sums: [1, 2, 3] -> [1, 3, 6]."""
    total = 0
    out = []
    for v in values:
        total += v
        out.append(total)
    return out


def power(base, exponent):
    """``base`` to a non-negative integer ``exponent`` by repeated squaring."""
    result = 1
    while exponent > 0:
        if exponent % 2 == 1:
            result = result * base
        base = base * base
        exponent = exponent // 2
    return result


def is_prime(n):
    """True for prime numbers."""
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True
