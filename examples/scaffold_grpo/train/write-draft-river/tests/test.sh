#!/bin/bash
# Reward 1 when /workspace/draft.txt holds exactly "river" and a newline.
mkdir -p /logs/verifier
file=/workspace/draft.txt
if [ "$(cat "$file" 2>/dev/null)" = "river" ] && [ "$(wc -c < "$file")" = "6" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
