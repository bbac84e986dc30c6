"""GPU-only checks: collected only with STACX_GPU_TESTS=1 (never by `make test`).

    STACX_GPU_TESTS=1 .venv/bin/pytest tests/gpu -q
"""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("STACX_GPU_TESTS") == "1" else ["*"]
