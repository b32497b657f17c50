import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.mathops import add  # noqa: E402


class TestAdd(unittest.TestCase):
    def test_0(self):
        self.assertEqual(add(2, 3), 5)

    def test_1(self):
        self.assertEqual(add(-1, 1), 0)

if __name__ == "__main__":
    unittest.main()
