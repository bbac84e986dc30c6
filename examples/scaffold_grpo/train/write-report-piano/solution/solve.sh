#!/bin/bash
echo piano > /workspace/report.txt
