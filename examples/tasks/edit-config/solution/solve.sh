#!/bin/bash
set -e
cd /app
sed -i 's/^port = 8000$/port = 8080/; s/^level = INFO$/level = DEBUG/' service.ini
sed -i '/^beta = no$/a cache = yes' service.ini
