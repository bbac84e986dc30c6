#!/bin/bash
# SWE-bench grading: reset the test files, apply the test patch, run pytest -rA, apply the rule.
mkdir -p /logs/verifier
cd /app
cp /tests/test_inflection.py /app/test_inflection.py   # the snapshot's test file with the test patch applied
uvx --with pytest==8.4.1 pytest -rA -p no:cacheprovider test_inflection.py > /logs/verifier/pytest.log 2>&1
python3 /tests/grade.py /tests/config.json /logs/verifier/pytest.log /logs/verifier
