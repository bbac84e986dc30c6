import math
import random


class VectorNorm:
    def generate_problem(self, n: int, random_seed: int = 1) -> dict:
        rng = random.Random(random_seed)
        return {"x": [rng.uniform(-1, 1) for _ in range(n)]}

    def solve(self, problem: dict) -> float:
        return math.sqrt(sum(v * v for v in problem["x"]))

    def is_solution(self, problem: dict, solution: float) -> bool:
        return abs(solution - self.solve(problem)) < 1e-9
