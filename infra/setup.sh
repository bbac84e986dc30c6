#!/usr/bin/env bash
# Create (or reuse) the shared dependency environment outside the clone and a thin
# per-checkout `.venv` that chains into it and holds the editable `stacx` install.
#
# Shared:   ${STACX_HOME:-~/.cache/stacx}/venv-<hash of the dependency spec>  (torch & co, once per machine)
# Checkout: .venv  (a few kB: a .pth into the shared site-packages + `pip install -e . --no-deps`)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACX_HOME="${STACX_HOME:-$HOME/.cache/stacx}"
PYTHON="${PYTHON:-python3}"
cd "$ROOT"

say() { printf '\033[1;34m[stacx setup]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[stacx setup] error:\033[0m %s\n' "$*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || die "no '$PYTHON' on PATH; install Python >= 3.11 or set PYTHON=/path/to/python3.11"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$("$PYTHON" -V) is too old: STACX needs Python >= 3.11 (set PYTHON=...)"

SPEC_HASH="$("$PYTHON" - <<'PY'
import hashlib, json, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
spec = {"deps": project["dependencies"], "dev": project["optional-dependencies"]["dev"],
        "python": sys.version_info[:2]}
print(hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12])
PY
)"
SHARED="$STACX_HOME/venv-$SPEC_HASH"
mkdir -p "$STACX_HOME"

install_shared() {
  say "creating shared environment $SHARED (torch is a large download: once per machine)"
  rm -rf "$SHARED"
  "$PYTHON" -m venv "$SHARED"
  "$SHARED/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
  # Dependencies only; the project itself is installed editable per checkout below.
  "$SHARED/bin/python" - > "$SHARED/requirements.txt" <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["dev"]))
PY
  local log="$STACX_HOME/logs/setup-pip.log" started=$SECONDS
  mkdir -p "$STACX_HOME/logs"
  say "installing the dependencies (log: $log)"
  "$SHARED/bin/python" -m pip install --progress-bar off -r "$SHARED/requirements.txt" >"$log" 2>&1 &
  local pip_pid=$!
  while kill -0 "$pip_pid" 2>/dev/null; do
    sleep 15
    kill -0 "$pip_pid" 2>/dev/null || break
    say "  ... $((SECONDS - started)) s, $(grep -c '^Collecting' "$log") packages resolved, $(du -sh "$SHARED" 2>/dev/null | cut -f1) installed"
  done
  if ! wait "$pip_pid"; then
    tail -n 15 "$log" >&2
    die "pip could not install the dependencies (last lines above, all in $log). Check that the package index is reachable (pip config list) and retry 'make setup'."
  fi
  say "dependencies installed in $((SECONDS - started)) s"
  touch "$SHARED/.stacx-complete"
}

if [[ -e "$SHARED/.stacx-complete" ]]; then
  say "reusing shared environment $SHARED"
else
  exec 9>"$STACX_HOME/setup.lock"
  flock 9
  [[ -e "$SHARED/.stacx-complete" ]] || install_shared
fi

LOCAL="$ROOT/.venv"
SHARED_SITE="$("$SHARED/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ -L "$LOCAL" || ! -x "$LOCAL/bin/python" ]] || ! grep -qxF "$SHARED_SITE" "$LOCAL/.stacx-shared" 2>/dev/null; then
  say "creating checkout environment .venv -> $SHARED"
  rm -rf "$LOCAL"
  "$SHARED/bin/python" -m venv --without-pip "$LOCAL"
  LOCAL_SITE="$("$LOCAL/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "import site; site.addsitedir('$SHARED_SITE')" > "$LOCAL_SITE/_stacx_shared.pth"
  echo "$SHARED_SITE" > "$LOCAL/.stacx-shared"
  # Tools of the shared environment (pytest, ruff, mypy, pip, torchrun) are reachable from .venv/bin.
  for tool in "$SHARED"/bin/*; do
    name="$(basename "$tool")"
    case "$name" in python*|activate*|Activate*|stacx) continue ;; esac
    [[ -e "$LOCAL/bin/$name" ]] && continue
    if [[ "$(head -c 2 "$tool")" == "#!" ]]; then  # a Python entry point: run it with .venv's python
      printf '#!/usr/bin/env bash\nexec "%s/bin/python" "%s" "$@"\n' "$LOCAL" "$tool" > "$LOCAL/bin/$name"
      chmod +x "$LOCAL/bin/$name"
    else  # a native binary (ruff)
      ln -s "$tool" "$LOCAL/bin/$name"
    fi
  done
fi

if [[ ! -x "$LOCAL/bin/stacx" ]] || ! "$LOCAL/bin/python" -c 'import stacx.infra.cli' 2>/dev/null; then
  say "installing stacx (editable) into .venv"
  if ! "$LOCAL/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$ROOT" \
      >"$LOCAL/install.log" 2>&1; then
    cat "$LOCAL/install.log" >&2
    die "editable install of stacx failed (see above)"
  fi
fi
say "ready: .venv/bin/python ($("$LOCAL/bin/python" -V)), .venv/bin/stacx"
