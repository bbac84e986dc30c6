#!/bin/bash
# Reward 1 when /workspace/plan.txt holds exactly "apple" and a newline.
mkdir -p /logs/verifier
file=/workspace/plan.txt
if [ "$(cat "$file" 2>/dev/null)" = "apple" ] && [ "$(wc -c < "$file")" = "6" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
