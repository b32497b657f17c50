import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.dateparse import parse_iso  # noqa: E402


class TestParseIso(unittest.TestCase):
    def test_0(self):
        self.assertEqual(parse_iso('2026-11-29'), (2026, 11, 29))

if __name__ == "__main__":
    unittest.main()
