import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.listutil import last  # noqa: E402


class TestLast(unittest.TestCase):
    def test_0(self):
        self.assertEqual(last([1, 2]), 2)

    def test_1(self):
        self.assertEqual(last([]), None)

if __name__ == "__main__":
    unittest.main()
