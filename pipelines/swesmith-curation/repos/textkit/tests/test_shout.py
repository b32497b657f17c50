import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.textkit import shout  # noqa: E402


class TestShout(unittest.TestCase):
    def test_0(self):
        self.assertEqual(shout('hi'), 'HI!')

    def test_1(self):
        self.assertEqual(shout('ok'), 'OK!')

if __name__ == "__main__":
    unittest.main()
