import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.dateparse import is_leap  # noqa: E402


class TestIsLeap(unittest.TestCase):
    def test_0(self):
        self.assertEqual(is_leap(2000), True)

    def test_1(self):
        self.assertEqual(is_leap(1900), False)

if __name__ == "__main__":
    unittest.main()
