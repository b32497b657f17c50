import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.textkit import is_palindrome  # noqa: E402


class TestIsPalindrome(unittest.TestCase):
    def test_0(self):
        self.assertEqual(is_palindrome('Racecar'), True)

    def test_1(self):
        self.assertEqual(is_palindrome('abc'), False)

if __name__ == "__main__":
    unittest.main()
