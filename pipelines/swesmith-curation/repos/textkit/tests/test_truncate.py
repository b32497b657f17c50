import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.textkit import truncate  # noqa: E402


class TestTruncate(unittest.TestCase):
    def test_0(self):
        self.assertEqual(truncate('12345678'), '12345678')

    def test_1(self):
        self.assertEqual(truncate('123456789'), '1234567…')

if __name__ == "__main__":
    unittest.main()
