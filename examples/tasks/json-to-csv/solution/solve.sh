#!/bin/bash
python3 - <<'PY'
import json
users = json.load(open("/app/users.json"))
rows = sorted((u["name"], u["city"]) for u in users if u["age"] >= 18)
with open("/app/adults.csv", "w") as out:
    out.write("name,city\n")
    out.writelines(f"{name},{city}\n" for name, city in rows)
PY
