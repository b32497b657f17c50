import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.textkit import reverse_words  # noqa: E402


class TestReverseWords(unittest.TestCase):
    def test_0(self):
        self.assertEqual(reverse_words('c b a'), 'a b c')

    def test_1(self):
        self.assertEqual(reverse_words('one two'), 'two one')

if __name__ == "__main__":
    unittest.main()
