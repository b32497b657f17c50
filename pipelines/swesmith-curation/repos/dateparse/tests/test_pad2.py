import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.dateparse import pad2  # noqa: E402


class TestPad2(unittest.TestCase):
    def test_0(self):
        self.assertEqual(pad2(7), '07')

if __name__ == "__main__":
    unittest.main()
