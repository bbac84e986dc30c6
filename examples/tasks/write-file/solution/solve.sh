#!/bin/bash
printf 'Hello, STACX!\n' > /app/greeting.txt
