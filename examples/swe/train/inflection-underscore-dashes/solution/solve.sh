#!/bin/bash
# The gold patch: the planted line restored.
python3 - <<'EOF'
import json, pathlib
path, bad, good = json.loads('["/app/inflection/__init__.py", "    word = word.replace(\\"-\\", \\"-\\")\\n", "    word = word.replace(\\"-\\", \\"_\\")\\n"]')
p = pathlib.Path(path)
p.write_text(p.read_text().replace(bad, good, 1))
EOF
