#!/bin/bash
echo green > /workspace/data.txt
