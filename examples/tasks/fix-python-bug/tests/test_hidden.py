import sys
import unittest

sys.path.insert(0, "/app")
from stats import mean, median  # noqa: E402


class HiddenStatsTest(unittest.TestCase):
    def test_mean(self) -> None:
        self.assertEqual(mean([1, 2, 3]), 2)
        self.assertEqual(mean([]), 0.0)

    def test_median_odd(self) -> None:
        self.assertEqual(median([3, 1, 2]), 2)

    def test_median_even(self) -> None:
        self.assertEqual(median([4, 1, 3, 2]), 2.5)
        self.assertEqual(median([10, 20]), 15)


if __name__ == "__main__":
    unittest.main()
