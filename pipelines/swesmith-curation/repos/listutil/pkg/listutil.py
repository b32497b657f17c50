"""listutil: a tiny package for cairn's curation fixtures."""


def chunk(xs, n):
    return [xs[i:i + n] for i in range(0, len(xs), n)]


def flatten(xss):
    return [x for xs in xss for x in xs]


def dedupe(xs):
    seen = set()
    return [x for x in xs if not (x in seen or seen.add(x))]


def last(xs, default=None):
    return xs[-1] if xs else default


def window_sums(xs, k):
    return [sum(xs[i:i + k]) for i in range(len(xs) - k + 1)]


def rotate(xs, k):
    k %= len(xs) or 1
    return xs[k:] + xs[:k]
