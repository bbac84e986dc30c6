#!/bin/bash
# The gold patch: the planted line restored.
python3 - <<'EOF'
import json, pathlib
path, bad, good = json.loads('["/app/inflection/__init__.py", "    if number % 100 in (11, 12):\\n", "    if number % 100 in (11, 12, 13):\\n"]')
p = pathlib.Path(path)
p.write_text(p.read_text().replace(bad, good, 1))
EOF
