#!/bin/bash
# Reward 1 when /app/top_ips.txt lists the three most frequent IPs with their counts.
mkdir -p /logs/verifier
expected=$'41 10.0.0.7\n33 192.168.1.20\n27 172.16.5.4'
actual=$(sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' /app/top_ips.txt 2>/dev/null | tr -s ' ' | sed '/^$/d')
if [ "$actual" = "$expected" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
