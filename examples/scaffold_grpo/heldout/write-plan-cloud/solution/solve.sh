#!/bin/bash
echo cloud > /workspace/plan.txt
