import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pkg.listutil import chunk  # noqa: E402


class TestChunk(unittest.TestCase):
    def test_0(self):
        self.assertEqual(chunk([1, 2, 3], 2), [[1, 2], [3]])

if __name__ == "__main__":
    unittest.main()
