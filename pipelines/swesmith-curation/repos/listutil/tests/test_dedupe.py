import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.listutil import dedupe  # noqa: E402


class TestDedupe(unittest.TestCase):
    def test_0(self):
        self.assertEqual(dedupe([3, 1, 3, 2]), [3, 1, 2])

if __name__ == "__main__":
    unittest.main()
