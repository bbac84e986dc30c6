#!/bin/bash
# Reward 1 when every file sits under /app/sorted/<ext>/ with its content intact and inbox is empty.
mkdir -p /logs/verifier
ok=1
for f in report.pdf notes.txt photo.jpg todo.txt scan.pdf logo.jpg data.csv readme.txt; do
  ext="${f##*.}"
  [ "$(cat "/app/sorted/$ext/$f" 2>/dev/null)" = "content of $f" ] || ok=0
done
[ -d /app/inbox ] && [ -z "$(ls -A /app/inbox)" ] || ok=0
echo "$ok" > /logs/verifier/reward.txt
