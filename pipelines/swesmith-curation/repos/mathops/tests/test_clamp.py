import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.mathops import clamp  # noqa: E402


class TestClamp(unittest.TestCase):
    def test_0(self):
        self.assertEqual(clamp(5, 0, 3), 3)

    def test_1(self):
        self.assertEqual(clamp(-2, 0, 3), 0)

if __name__ == "__main__":
    unittest.main()
