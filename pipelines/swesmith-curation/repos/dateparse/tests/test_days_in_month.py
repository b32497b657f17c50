import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.dateparse import days_in_month  # noqa: E402


class TestDaysInMonth(unittest.TestCase):
    def test_0(self):
        self.assertEqual(days_in_month(2024, 2), 29)

    def test_1(self):
        self.assertEqual(days_in_month(2023, 4), 30)

if __name__ == "__main__":
    unittest.main()
