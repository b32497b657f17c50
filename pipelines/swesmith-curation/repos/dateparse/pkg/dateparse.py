"""dateparse: a tiny package for cairn's curation fixtures."""


def is_leap(y):
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def days_in_month(y, m):
    return [31, 29 if is_leap(y) else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m - 1]


def parse_iso(s):
    y, m, d = (int(p) for p in s.split("-"))
    return (y, m, d)


def quarter(m):
    return (m - 1) // 3 + 1


def pad2(n):
    return f"{n:02d}"


def weekday_name(i):
    return ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"][i % 7]
