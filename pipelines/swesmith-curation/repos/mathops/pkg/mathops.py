"""mathops: a tiny package for cairn's curation fixtures."""


def add(a, b):
    return a + b


def clamp(x, lo, hi):
    return max(lo, min(x, hi))


def mean(xs):
    return sum(xs) / len(xs)


def factorial(n):
    r = 1
    for k in range(2, n + 1):
        r *= k
    return r


def gcd(a, b):
    while b:
        a, b = b, a % b
    return a


def sign(x):
    return (x > 0) - (x < 0)
