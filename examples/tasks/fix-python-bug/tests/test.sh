#!/bin/bash
# Reward 1 when the hidden unit tests pass against the agent's /app/stats.py.
mkdir -p /logs/verifier
cd /tmp && if python3 /tests/test_hidden.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
