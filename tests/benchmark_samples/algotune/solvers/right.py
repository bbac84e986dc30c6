import math


class Solver:
    def solve(self, problem: dict) -> float:
        return math.hypot(*problem["x"])
