#!/bin/bash
# Reward 1 when /app/greeting.txt holds exactly "Hello, STACX!\n".
mkdir -p /logs/verifier
if [ -f /app/greeting.txt ] && [ "$(od -An -c /app/greeting.txt | tr -s ' ')" = "$(printf 'Hello, STACX!\n' | od -An -c | tr -s ' ')" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
