import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.listutil import flatten  # noqa: E402


class TestFlatten(unittest.TestCase):
    def test_0(self):
        self.assertEqual(flatten([[1, 2], [3]]), [1, 2, 3])

if __name__ == "__main__":
    unittest.main()
