#!/bin/bash
# Reward 1 when /workspace/todo.txt holds exactly "sugar" and a newline.
mkdir -p /logs/verifier
file=/workspace/todo.txt
if [ "$(cat "$file" 2>/dev/null)" = "sugar" ] && [ "$(wc -c < "$file")" = "6" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
