import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.mathops import factorial  # noqa: E402


class TestFactorial(unittest.TestCase):
    def test_0(self):
        self.assertEqual(factorial(5), 120)

    def test_1(self):
        self.assertEqual(factorial(1), 1)

if __name__ == "__main__":
    unittest.main()
