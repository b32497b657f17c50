import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.mathops import sign  # noqa: E402


class TestSign(unittest.TestCase):
    def test_0(self):
        self.assertEqual(sign(-4), -1)

    def test_1(self):
        self.assertEqual(sign(0), 0)

if __name__ == "__main__":
    unittest.main()
