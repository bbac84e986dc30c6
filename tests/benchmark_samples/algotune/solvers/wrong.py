class Solver:
    def solve(self, problem: dict) -> float:
        return sum(abs(v) for v in problem["x"])
