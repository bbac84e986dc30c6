#!/bin/bash
echo apple > /workspace/plan.txt
