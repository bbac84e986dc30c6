#!/bin/bash
echo piano > /workspace/plan.txt
