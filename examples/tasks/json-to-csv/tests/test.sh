#!/bin/bash
# Writes /logs/verifier/reward.json with partial scores; "reward" is 1 only for a perfect file.
python3 /tests/check.py
