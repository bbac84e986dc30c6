#!/bin/bash
cd /app/inbox
for f in *.*; do
  ext="${f##*.}"
  mkdir -p "/app/sorted/$ext"
  mv -- "$f" "/app/sorted/$ext/"
done
