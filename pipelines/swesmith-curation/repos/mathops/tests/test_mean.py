import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.mathops import mean  # noqa: E402


class TestMean(unittest.TestCase):
    def test_0(self):
        self.assertEqual(mean([1, 2, 3]), 2.0)

if __name__ == "__main__":
    unittest.main()
