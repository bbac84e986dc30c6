#!/bin/bash
echo sugar > /workspace/plan.txt
