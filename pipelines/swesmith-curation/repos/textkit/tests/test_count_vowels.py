import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.textkit import count_vowels  # noqa: E402


class TestCountVowels(unittest.TestCase):
    def test_0(self):
        self.assertEqual(count_vowels('queue'), 4)

    def test_1(self):
        self.assertEqual(count_vowels('sky'), 0)

if __name__ == "__main__":
    unittest.main()
