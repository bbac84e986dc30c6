#!/bin/bash
cut -d' ' -f1 /app/access.log | sort | uniq -c | sort -rn | head -n 3 | awk '{print $1, $2}' > /app/top_ips.txt
