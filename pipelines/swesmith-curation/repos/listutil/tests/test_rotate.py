import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.listutil import rotate  # noqa: E402


class TestRotate(unittest.TestCase):
    def test_0(self):
        self.assertEqual(rotate([1, 2, 3], 1), [2, 3, 1])

if __name__ == "__main__":
    unittest.main()
