#!/bin/bash
# Reward 1 when /workspace/list.txt holds exactly "cloud" and a newline.
mkdir -p /logs/verifier
file=/workspace/list.txt
if [ "$(cat "$file" 2>/dev/null)" = "cloud" ] && [ "$(wc -c < "$file")" = "6" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
