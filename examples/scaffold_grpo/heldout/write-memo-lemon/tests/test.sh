#!/bin/bash
# Reward 1 when /workspace/memo.txt holds exactly "lemon" and a newline.
mkdir -p /logs/verifier
file=/workspace/memo.txt
if [ "$(cat "$file" 2>/dev/null)" = "lemon" ] && [ "$(wc -c < "$file")" = "6" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
