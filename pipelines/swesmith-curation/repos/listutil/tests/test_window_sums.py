import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.listutil import window_sums  # noqa: E402


class TestWindowSums(unittest.TestCase):
    def test_0(self):
        self.assertEqual(window_sums([1, 2, 3], 2), [3, 5])

if __name__ == "__main__":
    unittest.main()
