#!/bin/bash
echo river > /workspace/plan.txt
