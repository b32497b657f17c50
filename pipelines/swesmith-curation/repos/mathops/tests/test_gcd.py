import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.mathops import gcd  # noqa: E402


class TestGcd(unittest.TestCase):
    def test_0(self):
        self.assertEqual(gcd(12, 18), 6)

    def test_1(self):
        self.assertEqual(gcd(7, 5), 1)

if __name__ == "__main__":
    unittest.main()
