import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.textkit import initials  # noqa: E402


class TestInitials(unittest.TestCase):
    def test_0(self):
        self.assertEqual(initials('ada lovelace'), 'AL')

if __name__ == "__main__":
    unittest.main()
