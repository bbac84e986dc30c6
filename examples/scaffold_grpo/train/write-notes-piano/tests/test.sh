#!/bin/bash
# Reward 1 when /workspace/notes.txt holds exactly "piano" and a newline.
mkdir -p /logs/verifier
file=/workspace/notes.txt
if [ "$(cat "$file" 2>/dev/null)" = "piano" ] && [ "$(wc -c < "$file")" = "6" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
