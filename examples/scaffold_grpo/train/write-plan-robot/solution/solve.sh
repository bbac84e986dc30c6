#!/bin/bash
echo robot > /workspace/plan.txt
