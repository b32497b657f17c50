"""textkit: a tiny package for cairn's curation fixtures."""


def shout(s):
    return s.upper() + "!"


def initials(s):
    return "".join(w[0] for w in s.split()).upper()


def count_vowels(s):
    return sum(1 for c in s.lower() if c in "aeiou")


def reverse_words(s):
    return " ".join(reversed(s.split()))


def is_palindrome(s):
    t = "".join(c for c in s.lower() if c.isalnum())
    return t == t[::-1]


def truncate(s):
    return s if len(s) <= 8 else s[:7] + "…"
