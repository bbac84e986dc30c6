#!/bin/bash
# Reward 1 when /workspace/hello.txt holds exactly "robot" and a newline.
mkdir -p /logs/verifier
file=/workspace/hello.txt
if [ "$(cat "$file" 2>/dev/null)" = "robot" ] && [ "$(wc -c < "$file")" = "6" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
