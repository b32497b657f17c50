import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.dateparse import quarter  # noqa: E402


class TestQuarter(unittest.TestCase):
    def test_0(self):
        self.assertEqual(quarter(3), 1)

    def test_1(self):
        self.assertEqual(quarter(12), 4)

if __name__ == "__main__":
    unittest.main()
