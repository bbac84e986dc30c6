#!/bin/bash
# The gold patch: the planted line restored.
python3 - <<'EOF'
import json, pathlib
path, bad, good = json.loads('["/app/inflection/__init__.py", "def parameterize(string: str, separator: str = \'_\') -> str:\\n", "def parameterize(string: str, separator: str = \'-\') -> str:\\n"]')
p = pathlib.Path(path)
p.write_text(p.read_text().replace(bad, good, 1))
EOF
