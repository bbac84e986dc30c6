"""Scores /app/adults.csv: header, rows and order each count; reward is 1 only when all hold."""

import json
from pathlib import Path

EXPECTED = ["Bruno,Porto", "Chen,Taipei", "Elif,Izmir", "Mira,Lyon"]


def score() -> dict[str, float]:
    path = Path("/app/adults.csv")
    if not path.is_file():
        return {"reward": 0.0, "header": 0.0, "rows": 0.0, "order": 0.0}
    lines = [line.rstrip("\r") for line in path.read_text().splitlines() if line.strip()]
    header = float(bool(lines) and lines[0] == "name,city")
    body = lines[1:] if header else lines
    rows = float(sorted(body) == EXPECTED)
    order = float(body == EXPECTED)
    return {"reward": float(header and rows and order), "header": header, "rows": rows, "order": order}


Path("/logs/verifier").mkdir(parents=True, exist_ok=True)
Path("/logs/verifier/reward.json").write_text(json.dumps(score()))
