#!/bin/bash
echo green > /workspace/report.txt
