#!/bin/bash
echo ocean > /workspace/data.txt
