import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.dateparse import weekday_name  # noqa: E402


class TestWeekdayName(unittest.TestCase):
    def test_0(self):
        self.assertEqual(weekday_name(6), 'Sun')

    def test_1(self):
        self.assertEqual(weekday_name(8), 'Tue')

if __name__ == "__main__":
    unittest.main()
